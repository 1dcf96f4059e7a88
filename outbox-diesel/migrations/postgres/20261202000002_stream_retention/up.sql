-- Retention for stream mode (PostgreSQL only). Stream mode writes nothing on a row it
-- publishes, so "published more than N ago" cannot be read from the row. Instead the
-- retention statement (`CLEANUP` in outbox-diesel/src/relay/pg/sql.rs) records a tick, the
-- time and the snapshot of the moment, at most once a second, and deletes a row that is
-- visible both in its shard's position (published) and in the newest tick at least N old
-- (committed before it): a range scan of the stream index `(shard, xid)` up to that tick's
-- xmax, like PgQ's ticks. Ticks older than the one a cleanup used are deleted by it, so the
-- table holds about `keep / cleanup interval` rows.
--
-- The tick made here lets the first cleanup after the migration find a tick: a row
-- written before it is in progress in its snapshot and is kept until a later tick.
CREATE TABLE outbox_stream_ticks (
    tick_at  TIMESTAMPTZ PRIMARY KEY,
    snapshot pg_snapshot NOT NULL
);
INSERT INTO outbox_stream_ticks (tick_at, snapshot) VALUES (now(), pg_current_snapshot());
