ALTER TABLE outbox_relays
    DROP COLUMN session_lock,
    DROP COLUMN last_error,
    DROP COLUMN state_since,
    DROP COLUMN state,
    DROP COLUMN mode;
