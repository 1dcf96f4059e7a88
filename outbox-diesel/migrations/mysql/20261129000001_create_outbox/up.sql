-- The outbox: one row per event, written in the same transaction as the business rows.
-- All times are UTC. MySQL/MariaDB have no partial indexes: the pending indexes lead with
-- the state columns instead.
CREATE TABLE outbox_events (
    seq            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id             CHAR(36)     CHARACTER SET ascii NOT NULL,   -- UUIDv7, hyphenated
    aggregate_type VARCHAR(255) NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    event_type     VARCHAR(255) NOT NULL,
    event_version  INT          NOT NULL,
    payload        JSON         NOT NULL,
    headers        JSON         NOT NULL,
    topic          VARCHAR(255) NULL,
    shard          SMALLINT     NOT NULL,
    created_at     DATETIME(6)  NOT NULL,
    available_at   DATETIME(6)  NOT NULL,
    attempts       INT          NOT NULL DEFAULT 0,
    locked_by      VARCHAR(255) NULL,
    locked_until   DATETIME(6)  NULL,
    published_at   DATETIME(6)  NULL,
    dead_at        DATETIME(6)  NULL,
    last_error     TEXT         NULL,
    CONSTRAINT outbox_events_id UNIQUE (id),
    CONSTRAINT outbox_events_version CHECK (event_version > 0),
    CONSTRAINT outbox_events_shard CHECK (shard >= 0 AND shard < 256),
    INDEX outbox_events_pending (published_at, dead_at, seq),
    INDEX outbox_events_pending_aggregate (aggregate_type, aggregate_id, published_at, dead_at, seq),
    INDEX outbox_events_pending_shard (shard, published_at, dead_at, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE outbox_inbox (
    consumer     VARCHAR(255) NOT NULL,
    message_id   VARCHAR(255) NOT NULL,
    processed_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer, message_id),
    INDEX outbox_inbox_processed_at (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
