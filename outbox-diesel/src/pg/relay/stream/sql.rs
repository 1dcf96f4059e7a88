//! Stream mode's statements and the rows they return.

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, SmallInt, Text};

use crate::relay::common::{ClaimedColumns, CreatedAt};

/// `outbox_analyze_partitions`, waiting at most 200 ms for each partition's lock, and the
/// ring's layout (none on a table that is not partitioned).
pub(super) const ANALYZE_PARTITIONS: &str = "SELECT outbox_analyze_partitions('200 milliseconds')::bigint AS n, \
     (SELECT slots::int8 FROM outbox_stream_partitioning) AS slots, \
     (SELECT slot_xids FROM outbox_stream_partitioning) AS slot_xids";

#[derive(QueryableByName)]
pub(super) struct StatsRow {
    #[diesel(sql_type = BigInt)]
    pub(super) n: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) slots: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) slot_xids: Option<i64>,
}

/// The positions of the shards `$1` holds a live lease on, with the snapshot their next
/// delta ends at: the one being consumed; else a bounded one (PgQ's tick, made after the
/// fact): `X:X:` (every transaction below X visible) where X - 1 is the xid of the shard's
/// k-th row from the last snapshot's xmin on (k = `$2` / the shards held, at least 1), raised
/// to the last snapshot's xmax (so `X:X:` sees everything the last snapshot saw: a lower X
/// would forget transactions above it that were already published, and publish them again),
/// if every transaction below X has ended (X at most the
/// current snapshot's xmin); else the current snapshot. A delta then holds about k rows a
/// shard (more when one transaction wrote more), which keeps a claim's scan about a batch
/// long however large the backlog (see [`CANDIDATES`]). X is above the last snapshot's
/// xmin, so positions always move on.
///
/// The positions of the shards in `$3` are taken as given (`$3`..`$7`: shard, last snapshot,
/// the snapshot being consumed or null, cursor, version) instead of from the table: a read
/// made while a batch is in flight starts where that batch's `ADVANCE` will leave them (see
/// `overlap`). Empty arrays: every position from the table.
pub const POSITIONS: &str = "WITH mine AS MATERIALIZED ( \
         SELECT g.shard, g.last_snap::pg_snapshot AS last_snapshot, \
             g.cur_snap::pg_snapshot AS cur_snapshot, g.cur_seq, g.version \
         FROM unnest($3::smallint[], $4::text[], $5::text[], $6::int8[], $7::int8[]) \
             AS g(shard, last_snap, cur_snap, cur_seq, version) \
         JOIN outbox_shard_leases l ON l.shard = g.shard \
         WHERE l.owner = $1 AND l.lease_until > now() \
         UNION ALL \
         SELECT p.shard, p.last_snapshot, p.cur_snapshot, p.cur_seq, p.version \
         FROM outbox_stream_positions p JOIN outbox_shard_leases l ON l.shard = p.shard \
         WHERE l.owner = $1 AND l.lease_until > now() AND p.shard <> ALL($3::smallint[])), \
     per AS (SELECT greatest(1, $2 / greatest(1, count(*)))::bigint AS k FROM mine), \
     snap AS (SELECT pg_current_snapshot() AS s) \
     SELECT m.shard, m.last_snapshot::text AS last_snap, \
         coalesce(m.cur_snapshot::text, \
             CASE WHEN b.x IS NOT NULL AND b.x <= pg_snapshot_xmin(snap.s)::text::bigint \
                  THEN b.x::text || ':' || b.x::text || ':' \
                  ELSE snap.s::text END) AS cur_snap, \
         (m.cur_snapshot IS NULL AND b.x IS NOT NULL \
          AND b.x <= pg_snapshot_xmin(snap.s)::text::bigint) AS bounded, \
         m.cur_seq, m.version \
     FROM mine m CROSS JOIN snap \
     LEFT JOIN LATERAL ( \
         SELECT greatest(o.xid::text::bigint + 1, \
                         pg_snapshot_xmax(m.last_snapshot)::text::bigint) AS x \
         FROM outbox_events o \
         WHERE m.cur_snapshot IS NULL AND o.shard = m.shard \
           AND o.xid >= pg_snapshot_xmin(m.last_snapshot) \
           AND o.published_at IS NULL AND o.dead_at IS NULL \
         ORDER BY o.xid OFFSET (SELECT k FROM per) LIMIT 1) b ON true \
     ORDER BY m.shard";

/// The batch: per shard (`$1`, with its last snapshot `$2`, the snapshot `$3` the delta ends
/// at and the cursor `$4`), the rows committed between the two snapshots after the cursor,
/// the first `$5 + 1` in `seq` order (the `+ 1` tells a delta that is exhausted from one
/// that is not); of all shards' rows, the first `$5` in `seq` order, each with its shard's
/// count of candidates (`shard_rows`). Rows already published or dead-lettered by a lease
/// mode (before the switch to stream) are skipped. With `$6` (dead letters block), each row
/// whose aggregate has a row in `outbox_stream_dead_letters` carries the first one's seq
/// (`parked_behind`): one index probe a row, and none while the table is empty (the
/// `EXISTS` is evaluated once).
///
/// The plan is pinned, as PostgreSQL mis-plans it on statistics that lag the table's size:
/// - the scan is `outbox_events_stream (shard, xid)` over `[xmin(last), xmax(cur))`, behind an
///   `OFFSET 0` fence and ordered by `xid`, with the visibility functions as filters and the
///   `ORDER BY seq LIMIT` outside the fence;
/// - the cursor's condition is `seq + 0 > cursor`, which no index serves;
/// - the payloads are read afterwards for the batch only, by `(tableoid, ctid)` as the scan saw
///   them (a `ctid` alone is ambiguous across a ring's partitions), behind a fence too.
///
/// Each rule, the plan it prevents and its measurement, and what a claim costs in the steady
/// state, on a backlog and at batch 100: `docs/design/stream-mode.md`.
pub const CANDIDATES: &str = "WITH cand AS ( \
     SELECT c.rel, c.tid, c.seq, c.shard, count(*) OVER (PARTITION BY c.shard) AS shard_rows \
     FROM unnest($1::smallint[], $2::text[], $3::text[], $4::int8[]) AS p(shard, last_snap, cur_snap, cur_seq) \
     CROSS JOIN LATERAL ( \
         SELECT d.rel, d.tid, d.seq, d.shard FROM ( \
             SELECT o.tableoid AS rel, o.ctid AS tid, o.seq, o.shard FROM outbox_events o \
             WHERE o.shard = p.shard \
               AND o.xid >= pg_snapshot_xmin(p.last_snap::pg_snapshot) \
               AND o.xid < pg_snapshot_xmax(p.cur_snap::pg_snapshot) \
               AND pg_visible_in_snapshot(o.xid, p.cur_snap::pg_snapshot) \
               AND NOT pg_visible_in_snapshot(o.xid, p.last_snap::pg_snapshot) \
               AND o.seq + 0 > p.cur_seq \
               AND o.published_at IS NULL AND o.dead_at IS NULL \
             ORDER BY o.xid OFFSET 0) d \
         ORDER BY d.seq LIMIT $5 + 1) c \
     ORDER BY c.seq LIMIT $5) \
     SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.event_version, \
         o.payload::text AS payload, o.headers::text AS headers, o.topic, o.shard, \
         o.created_at, 0 AS attempts, o.shard AS stream_shard, cand.shard_rows, \
         CASE WHEN $6 AND EXISTS (SELECT 1 FROM outbox_stream_dead_letters) THEN \
             (SELECT min(d.seq) FROM outbox_stream_dead_letters d \
              WHERE d.aggregate_type = o.aggregate_type AND d.aggregate_id = o.aggregate_id) \
         END AS parked_behind \
     FROM cand CROSS JOIN LATERAL ( \
         SELECT * FROM outbox_events e \
         WHERE e.ctid = cand.tid AND e.tableoid = cand.rel OFFSET 0) o \
     ORDER BY o.seq";

/// Moves positions on, once per batch: only where `$1` still holds the shard's lease and the
/// position is still the version the claim read; in the same statement, copies the dead
/// letters and parked events the positions pass (`$7`..`$10`: seq, attempts, error, the dead
/// letter a parked event waits behind) into `outbox_stream_dead_letters`, for the shards
/// whose position moved only. Returns how many positions moved.
pub(crate) const ADVANCE: &str = "WITH adv AS (UPDATE outbox_stream_positions p \
     SET last_snapshot = u.last_snap::pg_snapshot, cur_snapshot = u.cur_snap::pg_snapshot, \
         cur_seq = u.cur_seq, version = p.version + 1, updated_at = now() \
     FROM unnest($2::smallint[], $3::text[], $4::text[], $5::int8[], $6::int8[]) \
         AS u(shard, last_snap, cur_snap, cur_seq, version) \
     WHERE p.shard = u.shard AND p.version = u.version \
       AND EXISTS (SELECT 1 FROM outbox_shard_leases l \
                   WHERE l.shard = u.shard AND l.owner = $1 AND l.lease_until > now()) \
     RETURNING p.shard), \
     dl AS (INSERT INTO outbox_stream_dead_letters (seq, id, aggregate_type, aggregate_id, \
             event_type, event_version, payload, headers, topic, shard, created_at, attempts, \
             last_error, parked_behind) \
         SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.event_version, \
             o.payload, o.headers, o.topic, o.shard, o.created_at, d.attempts, d.error, d.behind \
         FROM unnest($7::int8[], $8::int4[], $9::text[], $10::int8[]) \
             AS d(seq, attempts, error, behind) \
         JOIN outbox_events o ON o.seq = d.seq \
         WHERE o.shard IN (SELECT shard FROM adv) \
         ON CONFLICT DO NOTHING) \
     SELECT count(*) AS n FROM adv";

/// The rows to release (see the module docs) in the shards `$1` holds a live lease on, but
/// for the shards `$3` (waiting for a retry): of each aggregate whose first row in
/// `outbox_stream_dead_letters` is retry-requested or parked (its dead letter purged), the
/// rows before its next dead letter that is not retry-requested (there is one only where
/// `DeadLetterPolicy::Skip` let the aggregate pass an earlier one); the first `$2` in `seq`
/// order, with the claim's columns.
pub(crate) const RELEASABLE: &str = "WITH mine AS MATERIALIZED ( \
         SELECT l.shard FROM outbox_shard_leases l \
         WHERE l.owner = $1 AND l.lease_until > now() AND l.shard <> ALL($3::smallint[])), \
     aggs AS (SELECT d.aggregate_type, d.aggregate_id, min(d.seq) FILTER ( \
             WHERE d.parked_behind IS NULL AND d.retry_requested_at IS NULL) AS stop \
         FROM outbox_stream_dead_letters d WHERE d.shard IN (SELECT shard FROM mine) \
         GROUP BY d.aggregate_type, d.aggregate_id) \
     SELECT d.seq, d.id, d.aggregate_type, d.aggregate_id, d.event_type, d.event_version, \
         d.payload::text AS payload, d.headers::text AS headers, d.topic, d.shard, \
         d.created_at, d.attempts, d.shard AS stream_shard, 0::bigint AS shard_rows, \
         NULL::bigint AS parked_behind \
     FROM outbox_stream_dead_letters d \
     JOIN aggs a ON a.aggregate_type = d.aggregate_type AND a.aggregate_id = d.aggregate_id \
     WHERE a.stop IS NULL OR d.seq < a.stop \
     ORDER BY d.seq LIMIT $2";

/// Settles a release batch, where `$1` still holds the rows' shards: deletes the rows
/// published (`$2`) and makes those that failed for good (`$3`..`$5`: seq, attempts, error)
/// dead letters again (no longer retry-requested nor parked). Returns the rows written.
pub(crate) const SETTLE_RELEASE: &str = "WITH gone AS (DELETE FROM outbox_stream_dead_letters d \
         WHERE d.seq = ANY($2::int8[]) \
           AND EXISTS (SELECT 1 FROM outbox_shard_leases l \
                       WHERE l.shard = d.shard AND l.owner = $1 AND l.lease_until > now()) \
         RETURNING 1), \
     again AS (UPDATE outbox_stream_dead_letters d \
         SET retry_requested_at = NULL, parked_behind = NULL, attempts = u.attempts, \
             last_error = u.error, dead_at = now() \
         FROM unnest($3::int8[], $4::int4[], $5::text[]) AS u(seq, attempts, error) \
         WHERE d.seq = u.seq \
           AND EXISTS (SELECT 1 FROM outbox_shard_leases l \
                       WHERE l.shard = d.shard AND l.owner = $1 AND l.lease_until > now()) \
         RETURNING 1) \
     SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM again) AS n";

#[derive(QueryableByName, Clone)]
pub(super) struct PositionRow {
    #[diesel(sql_type = SmallInt)]
    pub(super) shard: i16,
    #[diesel(sql_type = Text)]
    pub(super) last_snap: String,
    #[diesel(sql_type = Text)]
    pub(super) cur_snap: String,
    /// `cur_snap` is a bound (`X:X:`), not the current snapshot.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub(super) bounded: bool,
    #[diesel(sql_type = BigInt)]
    pub(super) cur_seq: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) version: i64,
}

#[derive(QueryableByName)]
pub(super) struct CandidateRow {
    #[diesel(embed)]
    pub(super) columns: ClaimedColumns,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub(super) id: uuid::Uuid,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub(super) created_at: CreatedAt,
    #[diesel(sql_type = SmallInt)]
    pub(super) stream_shard: i16,
    #[diesel(sql_type = BigInt)]
    pub(super) shard_rows: i64,
    /// The first row of its aggregate in `outbox_stream_dead_letters`, if any (it is parked).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) parked_behind: Option<i64>,
}
