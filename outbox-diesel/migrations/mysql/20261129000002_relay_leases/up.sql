-- Relay coordination. Leases are rows with an expiry on the database clock (UTC), so they
-- work through connection poolers (no session state such as GET_LOCK) and every relay sees
-- the same time.
CREATE TABLE outbox_shard_leases (
    shard       SMALLINT     NOT NULL PRIMARY KEY,
    owner       VARCHAR(255) NULL,
    lease_until DATETIME(6)  NULL,
    CONSTRAINT outbox_shard_leases_shard CHECK (shard >= 0 AND shard < 256)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT INTO outbox_shard_leases (shard)
    WITH RECURSIVE s (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n < 255)
    SELECT n FROM s;

CREATE TABLE outbox_relays (
    relay_id        VARCHAR(255) NOT NULL PRIMARY KEY,
    heartbeat_until DATETIME(6)  NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE outbox_leader (
    name        VARCHAR(64)  NOT NULL PRIMARY KEY,
    holder      VARCHAR(255) NOT NULL,
    lease_until DATETIME(6)  NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE INDEX outbox_events_dead_aggregate ON outbox_events (aggregate_type, aggregate_id, dead_at, published_at, seq);
