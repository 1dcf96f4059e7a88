-- Relay coordination (see the PostgreSQL migration). Times are UTC text with six fraction
-- digits, as in outbox_events.
CREATE TABLE outbox_shard_leases (
    shard       INTEGER PRIMARY KEY CHECK (shard >= 0 AND shard < 256),
    owner       TEXT,
    lease_until TEXT
);
INSERT INTO outbox_shard_leases (shard)
    WITH RECURSIVE s (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n < 255)
    SELECT n FROM s;

CREATE TABLE outbox_relays (
    relay_id        TEXT PRIMARY KEY,
    heartbeat_until TEXT NOT NULL
);

CREATE TABLE outbox_leader (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    lease_until TEXT NOT NULL
);

CREATE INDEX outbox_events_dead_aggregate ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE dead_at IS NOT NULL AND published_at IS NULL;
CREATE INDEX outbox_events_published ON outbox_events (published_at)
    WHERE published_at IS NOT NULL;
