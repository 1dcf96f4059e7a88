ALTER TABLE outbox_relays
    DROP COLUMN session_start,
    DROP COLUMN session_pid,
    DROP COLUMN last_error,
    DROP COLUMN state_since,
    DROP COLUMN state,
    DROP COLUMN mode;
