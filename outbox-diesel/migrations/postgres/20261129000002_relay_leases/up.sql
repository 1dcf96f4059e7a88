-- Relay coordination. Leases are rows with an expiry on the database clock, so they work
-- through connection poolers (no session state) and every relay sees the same time.

-- Sharded mode: one row per virtual shard (0..255); `owner` holds it until `lease_until`.
CREATE TABLE outbox_shard_leases (
    shard       SMALLINT PRIMARY KEY CHECK (shard >= 0 AND shard < 256),
    owner       TEXT,
    lease_until TIMESTAMPTZ
);
INSERT INTO outbox_shard_leases (shard) SELECT generate_series(0, 255);

-- Sharded mode: live relays (heartbeat), to compute each one's fair share of shards.
CREATE TABLE outbox_relays (
    relay_id        TEXT PRIMARY KEY,
    heartbeat_until TIMESTAMPTZ NOT NULL
);

-- Leader mode: the single leadership lease.
CREATE TABLE outbox_leader (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    lease_until TIMESTAMPTZ NOT NULL
);

-- Ordered modes check, for each candidate, whether an earlier event of its aggregate is
-- blocked (leased, or waiting for a retry). Only rows that are or were in flight can be: a
-- small index of just those keeps the check cheap and its plan stable however large the
-- backlog and however stale the statistics.
CREATE INDEX outbox_events_inflight_aggregate ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE published_at IS NULL AND dead_at IS NULL
      AND (locked_by IS NOT NULL OR attempts > 0 OR available_at > created_at);

-- Dead letters that block their aggregate (ordered modes), and retention cleanup.
CREATE INDEX outbox_events_dead_aggregate ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE dead_at IS NOT NULL AND published_at IS NULL;
CREATE INDEX outbox_events_published ON outbox_events (published_at)
    WHERE published_at IS NOT NULL;
