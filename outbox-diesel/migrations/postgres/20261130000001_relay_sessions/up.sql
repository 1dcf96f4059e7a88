-- Every relay (all modes) heartbeats a row here with its health, shown by `outbox status`,
-- and, unless session detection is off, the identity of its database session, so that live
-- relays can tell from pg_stat_activity that it died and take its work over in seconds
-- instead of waiting for its lease. A backend pid alone is not an identity (pids are reused),
-- the pair (pid, backend_start) is.
ALTER TABLE outbox_relays
    ADD COLUMN mode          TEXT        NOT NULL DEFAULT 'sharded',
    ADD COLUMN state         TEXT        NOT NULL DEFAULT 'running',
    ADD COLUMN state_since   TIMESTAMPTZ NOT NULL DEFAULT now(),
    ADD COLUMN last_error    TEXT,
    ADD COLUMN session_pid   INTEGER,
    ADD COLUMN session_start TIMESTAMPTZ;
