-- Stream mode's dead letters (PostgreSQL only). Stream mode never updates an event row, so an
-- event it gives up on is copied here, in the statement that moves its shard's position past
-- it; so are the later events of its aggregate (parked: `parked_behind` is the dead letter's
-- seq), unless the relay runs with `--skip-dead-letters`. The copy is whole, so the event row
-- itself may go with retention.
--
-- While an aggregate has a row here, the relay parks its new events too, and publishes none
-- of them: per-aggregate order holds. `outbox dead retry` sets `retry_requested_at` on dead
-- letters and `outbox dead purge` deletes them; an aggregate whose first row here (the lowest
-- seq) is then retry-requested or parked is released: the relay that holds its shard
-- publishes its rows from here in seq order (same ids) and deletes each one once published;
-- a release that fails for the event itself makes it a dead letter again.
CREATE TABLE outbox_stream_dead_letters (
    seq                BIGINT      PRIMARY KEY,           -- the event's seq in outbox_events
    id                 UUID        NOT NULL UNIQUE,
    aggregate_type     TEXT        NOT NULL,
    aggregate_id       TEXT        NOT NULL,
    event_type         TEXT        NOT NULL,
    event_version      INTEGER     NOT NULL,
    payload            JSONB       NOT NULL,
    headers            JSONB       NOT NULL,
    topic              TEXT,
    shard              SMALLINT    NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL,
    attempts           INTEGER     NOT NULL DEFAULT 0,
    dead_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error         TEXT,
    parked_behind      BIGINT,                            -- NULL: a dead letter; else parked
    retry_requested_at TIMESTAMPTZ                        -- set by `outbox dead retry`
);
-- The claim's parking check (is there a row of this aggregate?) and a release's rows in order.
CREATE INDEX outbox_stream_dead_letters_aggregate
    ON outbox_stream_dead_letters (aggregate_type, aggregate_id, seq);
