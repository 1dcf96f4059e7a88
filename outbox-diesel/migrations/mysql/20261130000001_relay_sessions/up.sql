-- Every relay (all modes) heartbeats a row here with its health, shown by `outbox status`,
-- and, unless session detection is off, the name of a session lock (GET_LOCK) its
-- connection holds, so that live relays can tell that it died (IS_USED_LOCK is NULL once the
-- connection is gone) and take its work over in seconds instead of waiting for its lease.
ALTER TABLE outbox_relays
    ADD COLUMN mode         VARCHAR(16) NOT NULL DEFAULT 'sharded',
    ADD COLUMN state        VARCHAR(32) NOT NULL DEFAULT 'running',
    ADD COLUMN state_since  DATETIME(6) NULL,
    ADD COLUMN last_error   TEXT        NULL,
    ADD COLUMN session_lock VARCHAR(64) NULL;
