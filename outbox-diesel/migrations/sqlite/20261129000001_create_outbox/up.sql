-- The outbox: one row per event, written in the same transaction as the business rows.
-- Times are UTC text 'YYYY-MM-DD HH:MM:SS.ffffff' (six digits, so text order is time order).
-- AUTOINCREMENT: a seq is never reused, even after the newest rows are deleted.
CREATE TABLE outbox_events (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT    NOT NULL UNIQUE,              -- UUIDv7, hyphenated
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    event_type     TEXT    NOT NULL,
    event_version  INTEGER NOT NULL CHECK (event_version > 0),
    payload        TEXT    NOT NULL CHECK (json_valid(payload)),
    headers        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
    topic          TEXT,
    shard          INTEGER NOT NULL CHECK (shard >= 0 AND shard < 256),
    created_at     TEXT    NOT NULL,
    available_at   TEXT    NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 0,
    locked_by      TEXT,
    locked_until   TEXT,
    published_at   TEXT,
    dead_at        TEXT,
    last_error     TEXT
);

CREATE INDEX outbox_events_pending ON outbox_events (seq)
    WHERE published_at IS NULL AND dead_at IS NULL;
CREATE INDEX outbox_events_pending_aggregate ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

CREATE TABLE outbox_inbox (
    consumer     TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000', 'now')),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX outbox_inbox_processed_at ON outbox_inbox (processed_at);
