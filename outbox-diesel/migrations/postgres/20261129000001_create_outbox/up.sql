-- The outbox: one row per event, written in the same transaction as the business rows.
-- Pending = published_at IS NULL AND dead_at IS NULL. Relays poll by that state, never by an
-- id cursor: ids are assigned in insert order but become visible in commit order.
CREATE TABLE outbox_events (
    seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id             UUID        NOT NULL UNIQUE,           -- UUIDv7; the consumers' dedup key
    aggregate_type TEXT        NOT NULL,
    aggregate_id   TEXT        NOT NULL,
    event_type     TEXT        NOT NULL,
    event_version  INTEGER     NOT NULL CHECK (event_version > 0),
    payload        JSONB       NOT NULL,
    headers        JSONB       NOT NULL DEFAULT '{}',
    topic          TEXT,                                  -- NULL: route by aggregate type
    shard          SMALLINT    NOT NULL CHECK (shard >= 0 AND shard < 256),
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    available_at   TIMESTAMPTZ NOT NULL DEFAULT now(),    -- not before: retry backoff
    attempts       INTEGER     NOT NULL DEFAULT 0,
    locked_by      TEXT,                                  -- lease holder (a relay id)
    locked_until   TIMESTAMPTZ,
    published_at   TIMESTAMPTZ,
    dead_at        TIMESTAMPTZ,                           -- dead-lettered after max attempts
    last_error     TEXT
);

CREATE INDEX outbox_events_pending ON outbox_events (seq)
    WHERE published_at IS NULL AND dead_at IS NULL;
CREATE INDEX outbox_events_pending_aggregate ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;
CREATE INDEX outbox_events_pending_shard ON outbox_events (shard, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- The inbox: one row per (consumer, message) applied, written in the same transaction as
-- the consumer's effect.
CREATE TABLE outbox_inbox (
    consumer     TEXT        NOT NULL,
    message_id   TEXT        NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX outbox_inbox_processed_at ON outbox_inbox (processed_at);
