-- Stream mode (PostgreSQL only): relays read events by commit-safe snapshots instead of
-- claiming rows, so publishing never updates an event row (like PgQ/pgque).
--
-- `xid`: the writer's transaction. `pg_current_xact_id()` is STABLE, not VOLATILE, so
-- PostgreSQL 15 adds the column without rewriting the table (a "fast default": the value is
-- computed once, here, and kept in the catalog as every existing row's value; existing rows
-- thus carry this migration's transaction id). Measured (PostgreSQL 15.20, 200,000 rows):
-- the ALTER takes 0.9 ms and the heap stays 13,656,064 bytes. On the write path the default
-- costs no new work: an INSERT has a transaction id already (pg_current_xact_id() returns
-- it), the row is 8 bytes wider: EXPLAIN ANALYZE of a 100,000-row INSERT of a small row,
-- twice each, 224/199 ms without the column, 243/220 ms with it (+0.2 µs a row; heap 13.7 MB
-- -> 15.3 MB). `transaction_with_outbox` is unchanged: it leaves the column to its default.
ALTER TABLE outbox_events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();

-- The stream reads, per shard it owns, the rows whose transaction committed between two
-- snapshots: xid from the older snapshot's xmin up to the newer one's xmax. (shard, xid) is
-- that range scan; (xid) alone would read every shard's rows for each shard. The delta is
-- then sorted by seq (per-aggregate order), which needs no index: a delta is bounded by what
-- committed between two claims (see the EXPLAIN in outbox-diesel/src/relay/pg/stream.rs).
-- Partial, as the lease modes' pending indexes: every mode pays one more B-tree entry per
-- insert, but the lease modes' mark (a non-HOT update that sets `published_at`) adds none
-- (their claims stay HOT: no index reads the lease columns). Stream mode never sets
-- `published_at`, so its rows stay in the index, and its reads skip rows a lease mode
-- published or dead-lettered. Measured before it was partial, on the benchmark's private
-- cluster (`outbox-bench --quick`, scale section, 1,000,000 rows, unordered relay): the
-- drain's postgres CPU rose from 20 s to 39 s, the mark inserting into this index too.
-- A 100,000-row INSERT into a table with (shard, seq) took 442 and 491 ms without this
-- index, 790 and 481 ms with it: within the shared machine's noise.
--
-- `xid IS NOT NULL` (always true: the column is NOT NULL) keeps the lease modes' statements
-- off it: PostgreSQL considers a partial index for any query whose conditions imply its
-- predicate, and with only the pending predicate the ordered claim's head-of-line walk was
-- planned on this index on a table never analysed (found by the sharded takeover test: 9 ms
-- a probe, 0.9 s a claim of 100 instead of 2 ms). The stream's own conditions
-- (`xid >= …`, strict) imply `xid IS NOT NULL`.
CREATE INDEX outbox_events_stream ON outbox_events (shard, xid)
    WHERE published_at IS NULL AND dead_at IS NULL AND xid IS NOT NULL;

-- One row per shard: how far the stream has published it.
--   last_snapshot: every row visible in it has been published (or was there before the
--                  stream started and is left to `published_at`: see the claim).
--   cur_snapshot:  the snapshot a delta is being published toward when it held more rows
--                  than one batch; rows visible in it but not in last_snapshot with
--                  seq <= cur_seq have been published. NULL when no delta is half done.
--   version:       bumped by every update; a relay advances a position only from the
--                  version it read (and only while it holds the shard's lease in
--                  outbox_shard_leases), so a relay whose shard moved on writes nothing.
-- Initial position: the snapshot of this migration, in which its own transaction is in
-- progress, so the rows already there (which carry its xid) are the first delta; the claim
-- skips those already published or dead-lettered by a lease mode.
CREATE TABLE outbox_stream_positions (
    shard         SMALLINT    PRIMARY KEY CHECK (shard >= 0 AND shard < 256),
    last_snapshot pg_snapshot NOT NULL,
    cur_snapshot  pg_snapshot,
    cur_seq       BIGINT      NOT NULL DEFAULT 0,
    version       BIGINT      NOT NULL DEFAULT 0,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO outbox_stream_positions (shard, last_snapshot)
    SELECT generate_series(0, 255), pg_current_snapshot();
