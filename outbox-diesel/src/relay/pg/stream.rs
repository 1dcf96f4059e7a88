//! Stream mode (`Mode::Stream`, `ClaimOrder::Stream`) on PostgreSQL: publishing reads event
//! rows by commit-safe snapshots and never updates them (the technique of PgQ/pgque).
//!
//! Each row records its writer's transaction (`outbox_events.xid`, default
//! `pg_current_xact_id()`). Per shard, `outbox_stream_positions` holds the last snapshot
//! whose rows are all published. A claim takes the current snapshot and returns the rows of
//! the relay's leased shards visible in it and not in the shard's last one (in `seq` order,
//! at most a batch): exactly the transactions that committed in between. A transaction still
//! open at the current snapshot is in neither, so its rows come with a later delta: an
//! `id > last_id` cursor would skip them, this never does, and nothing uncommitted is read.
//!
//! A delta larger than a batch is consumed in parts: the position then also stores the
//! snapshot being consumed (`cur_snapshot`) and the last `seq` of it published
//! (`cur_seq`). The positions advance when the batch is settled (`complete`, `fail`,
//! `release`), once per batch, in one statement fenced by the shard leases of
//! `outbox_shard_leases` and by the version of each position the claim read; up to the
//! first event of each shard that was not published (a failure or an outage), so the next
//! claim starts there again.
//!
//! One batch in flight (the engine's window is 1 in this mode): a batch's position is where
//! the next claim starts, so a second claim before the first batch settles would read the
//! same rows (but see "Beside the publish" below). Failures are held in memory (the rows are never written): the failed event's
//! shard is not claimed until its retry time, and its attempt count lives in the relay (a
//! restarted relay counts from 1 again).
//!
//! A claim reads at least [`PgRelayStore::stream_read_ahead`] rows (3,000 by default) and
//! keeps those past its batch for the next claims, which hand them out a batch at a time
//! without a statement while every batch before them was published (or parked) and its
//! `ADVANCE` moved every position it meant to (each applied to the positions kept with the
//! rows, so the next batch's `ADVANCE` is fenced on the versions it wrote). Anything else
//! drops them, and the next claim reads from the positions in the database again: an event
//! that failed (its shard is held), an outage (the batch comes back), a dead letter or a
//! malformed row (the aggregate's later events must be parked, which the read did not know),
//! a fenced position, a release of dead letters, and age (a quarter of the lease: the read's
//! lease check is that old).
//!
//! ## Beside the publish
//!
//! With one batch in flight, the database would wait for each publish and the broker for each
//! statement. So the store does its statements while the next batch is published
//! (`RelayStore::overlap`, called by the relay once each publish has started):
//! - a batch passed whole (every event published or parked) and followed by rows read ahead
//!   is settled in memory; its `ADVANCE` is *owed* (`StreamState::owed`) and written beside
//!   the next batch's publish. The next batch may be published first because nothing of this
//!   one holds an aggregate back; an event that failed, an outage or a dead letter writes at
//!   once, as before. One write is owed at most: every other statement that reads or moves
//!   positions (a read, an `ADVANCE`, a release, a rebalance, `release_all` on shutdown)
//!   writes it first, so the positions in the database never move back or skip;
//! - when a batch takes the last rows read ahead, the next rows are read while it is
//!   published, from where its `ADVANCE` will leave the positions if it is passed whole
//!   (`POSITIONS` takes them given, and adds those of the table for the shards it was not
//!   given); the read is kept only if the batch is passed whole and every position written,
//!   else the next claim reads from the database again.
//!
//! A fault costs nothing but timing: a write owed and not made (the relay killed) leaves the
//! positions where the last write put them, and the batch is published again (at least once);
//! a write or read that fails beside the publish is made by the next call that needs it, which
//! reports the error as ever. A write owed that is fenced (the shard moved on) drops the rows
//! read ahead; the next owner publishes from the last position written.
//!
//! Retention (the store's `cleanup`, `outbox cleanup`, the relay's `--retention-hours`)
//! deletes the rows the positions passed once they committed more than the retention ago,
//! known from the ticks the cleanup records (see `CLEANUP` in `sql.rs`): deletes, so their
//! space is reused after a `VACUUM`; or, on a table turned into a partition ring
//! (`Admin::partition_events`), empties whole partitions with `TRUNCATE` (see
//! `partition.rs`).
//!
//! ## Dead letters
//!
//! An event the relay gives up on (`max_attempts`, or a row that cannot be published as it
//! is) is copied into `outbox_stream_dead_letters` by the statement that moves its shard's
//! position past it ([`ADVANCE`]: both or neither, and only where the relay still holds the
//! shard). While an aggregate has rows there, the claim parks its later events the same way
//! (copied, `parked_behind` the dead letter, passed by the position) unless the relay runs
//! with `DeadLetterPolicy::Skip`: so nothing of the aggregate is published out of order.
//! `outbox dead retry` marks dead letters `retry_requested_at`, `outbox dead purge` deletes
//! them; an aggregate whose first row there is then retry-requested or parked is *released*
//! by the relay holding its shard ([`RELEASABLE`], at most every [`RELEASE_CHECK`] and at once
//! after a release batch): its rows are published from the copies in `seq` order, each deleted
//! once published ([`SETTLE_RELEASE`]); one that fails for itself past `max_attempts` is a
//! dead letter again and holds the rest.
//!
//! ## The claim's cost
//!
//! `EXPLAIN (ANALYZE, BUFFERS)` on 100,000 rows: see [`CANDIDATES`] (17 ms in steady state,
//! 5 ms a claim of a 100,000-row backlog with bounded deltas; 0.4 s a claim when one
//! transaction wrote the 100,000 rows).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, SmallInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::relay::{OutboxMessage, StoreError};

use super::PgRelayStore;
use crate::relay::common::{ClaimedColumns, CountRow, CreatedAt, Prepared};

/// How often a relay looks for aggregates to release (dead letters retried or purged by the
/// operator): at most this often while none are found, at every claim while some are.
const RELEASE_CHECK: Duration = Duration::from_secs(1);

/// How often a stream relay looks for partitions of the ring that hold rows but have no
/// statistics, and analyses them (migration `20261203000001_stream_partition_stats`: until
/// then its claims are planned as if the partition were empty, and took seconds each in the
/// ring's first turn). A look is one catalogue query (none on a table that is not partitioned
/// but the function call).
const STATS_CHECK: Duration = Duration::from_secs(1);

/// How long the statistics check waits after it failed.
const STATS_RETRY: Duration = Duration::from_secs(60);

/// `outbox_analyze_partitions`, waiting at most 200 ms for each partition's lock, and the
/// ring's layout (none on a table that is not partitioned).
const ANALYZE_PARTITIONS: &str = "SELECT outbox_analyze_partitions('200 milliseconds')::bigint AS n, \
     (SELECT slots::int8 FROM outbox_stream_partitioning) AS slots, \
     (SELECT slot_xids FROM outbox_stream_partitioning) AS slot_xids";

#[derive(QueryableByName)]
struct StatsRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    slots: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    slot_xids: Option<i64>,
}

/// The partition ring's layout (`outbox_stream_partitioning`), as the store last read it.
///
/// A read whose transaction ids all fall in one slot reads that partition by its name
/// instead of the partitioned table: measured (`EXPLAIN (ANALYZE, BUFFERS)` of `CANDIDATES`
/// on a ring of 4, 9,000 rows in one partition, three runs each on a busy machine), through
/// the parent 16.7–25.6 ms of planning (1,167 buffers: every partition's indexes) and
/// 105–198 ms of execution (an `Append` at each of the 256 shard scans and each of the 3,000
/// payload lookups), by the partition's name 1.0–15.1 ms (435 buffers) and 56–96 ms, as the
/// plain table's 1.8–15.0 ms and 46–148 ms; pruning by slot through the parent
/// (`slot = ANY(…)`, and the row's slot in the lookup) removed the other partitions'
/// nodes but left both costs. The bench's drain (one relay, null publisher) went from
/// 0.74x / 0.72x the plain table's at batch 100 / 1,000 to 0.80x / 0.98x (two relays:
/// 0.85x / 0.99x to 0.97x / 1.05x; docs/BENCHMARKS.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ring {
    slots: i64,
    slot_xids: i64,
}

impl Ring {
    /// The slot whose partition holds every row of the transactions in `[lo, hi)`, if one
    /// does (the range lies within one slot).
    fn slot_of(self, lo: i64, hi: i64) -> Option<i64> {
        if self.slots <= 0 || self.slot_xids <= 0 || lo < 0 || hi <= lo {
            return None;
        }
        let first = lo / self.slot_xids;
        ((hi - 1) / self.slot_xids == first).then_some(first % self.slots)
    }

    /// The slot of transaction id `xid`.
    fn slot(self, xid: i64) -> Option<i64> {
        self.slot_of(xid, xid.checked_add(1)?)
    }
}

/// `sql` reading the event table through partition `slot` of the ring instead of through the
/// partitioned table: every `FROM outbox_events ` is renamed (the statements name no other
/// table starting so).
fn on_partition(sql: &str, slot: i64) -> String {
    sql.replace(
        "FROM outbox_events ",
        &format!("FROM outbox_events_slot_{slot} "),
    )
}

/// A snapshot's xmin and xmax, from its text (`xmin:xmax:xip,…`).
fn snapshot_bounds(snap: &str) -> Option<(i64, i64)> {
    let mut parts = snap.split(':');
    let xmin = parts.next()?.parse().ok()?;
    let xmax = parts.next()?.parse().ok()?;
    Some((xmin, xmax))
}

/// How often a relay with nothing to publish moves its idle shards' positions up to the
/// current snapshot (so their next delta scans start from a recent `xmin`).
const IDLE_ADVANCE: Duration = Duration::from_secs(1);

/// The positions of the shards `$1` holds a live lease on, with the snapshot their next
/// delta ends at: the one being consumed; else a bounded one (PgQ's tick, made after the
/// fact): `X:X:` (every transaction below X visible) where X - 1 is the xid of the shard's
/// k-th row from the last snapshot's xmin on (k = `$2` / the shards held, at least 1), raised
/// to the last snapshot's xmax (so `X:X:` sees everything the last snapshot saw: a lower X
/// would forget transactions above it that were already published, and publish them again;
/// the trap test caught that), if every transaction below X has ended (X at most the
/// current snapshot's xmin); else the current snapshot. A delta then holds about k rows a
/// shard (more when one transaction wrote more), which keeps a claim's scan about a batch
/// long however large the backlog (see [`CANDIDATES`]). X is above the last snapshot's
/// xmin, so positions always move on.
///
/// The positions of the shards in `$3` are taken as given (`$3`..`$7`: shard, last snapshot,
/// the snapshot being consumed or null, cursor, version) instead of from the table: a read
/// made while a batch is in flight starts where that batch's `ADVANCE` will leave them (see
/// `overlap_stream`). Empty arrays: every position from the table.
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
/// The xid range `[xmin(last), xmax(cur))` is the scan of `outbox_events_stream
/// (shard, xid)`; the visibility functions are filters on it. The scan sits behind an
/// `OFFSET 0` fence, the `ORDER BY seq LIMIT` outside it: with the order and the limit on the
/// scan itself, PostgreSQL planned it, on a table whose statistics lagged behind its size, as a
/// walk of the `seq`-ordered pending index filtered by shard, from the cursor on: every claim
/// read each held shard's whole backlog again (stream SIGKILL storm, full form, 40 s in:
/// 3.5 s a claim, 43,124 rows filtered out per shard, 1.48 million buffers; claims then ran
/// into the statement timeout and the relays published nothing more). For the same reason the
/// cursor's condition is `seq + 0 > cursor`, which no index serves: else the `(shard, seq)`
/// pending index was chosen (found on an empty table's statistics), reading every row of the
/// shard past the cursor, which stream mode never marks: the shard's whole history once a
/// delta starts (cursor 0). And the fenced scan is ordered by `xid`, the stream index's own
/// order (no sort): with both shard indexes estimated alike (an empty table's statistics) that
/// is what makes PostgreSQL take the stream index, whose xid range bounds the scan. The
/// batch's rows are then read again for their payloads, one TID scan each (`ctid`, as the
/// scan saw it: the statement's snapshot keeps that version), behind a fence too: on 20,000
/// analysed rows the plain join was planned as a hash join over a scan of the whole table,
/// which stream mode never shrinks (the candidates estimated at one a shard). The sort and
/// the window carry only (tableoid, ctid, seq, shard): the delta of a shard can be far larger than a
/// batch (one transaction's rows), and its payloads are read for the batch only. By `ctid`
/// rather than by primary key: 100,000 rows written 1,000 a transaction, a claim of 1,000
/// from the start (`EXPLAIN (ANALYZE, BUFFERS)`, three runs interleaved, a build running
/// beside them) read 4,766 shared buffers by primary key and 2,766 by `ctid`, in 15–20 ms
/// against 10–14 ms. A `ctid` names a row within one table only: on a table partitioned into
/// a ring (`partition.rs`) each partition has a row at `(0,1)`, so the lookup also matches
/// the `tableoid` the scan saw (a TID scan of each partition, the others' finding nothing;
/// without it the relays published other partitions' rows in place of the batch's, found by
/// the randomized test over rotating partitions).
///
/// What a claim costs in the steady state, on a backlog and at batch 100, measured:
/// `docs/design/stream-mode.md`.
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
struct PositionRow {
    #[diesel(sql_type = SmallInt)]
    shard: i16,
    #[diesel(sql_type = Text)]
    last_snap: String,
    #[diesel(sql_type = Text)]
    cur_snap: String,
    /// `cur_snap` is a bound (`X:X:`), not the current snapshot.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    bounded: bool,
    #[diesel(sql_type = BigInt)]
    cur_seq: i64,
    #[diesel(sql_type = BigInt)]
    version: i64,
}

#[derive(QueryableByName)]
struct CandidateRow {
    #[diesel(embed)]
    columns: ClaimedColumns,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: uuid::Uuid,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    created_at: CreatedAt,
    #[diesel(sql_type = SmallInt)]
    stream_shard: i16,
    #[diesel(sql_type = BigInt)]
    shard_rows: i64,
    /// The first row of its aggregate in `outbox_stream_dead_letters`, if any (it is parked).
    #[diesel(sql_type = Nullable<BigInt>)]
    parked_behind: Option<i64>,
}

/// What became of an event of the batch in flight.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    Published,
    /// Failed: retried after this long.
    Failed(Duration),
    /// Failed for good (past `max_attempts`): a dead letter, with why.
    Dead(String),
    /// Cannot be published as it is (found by the claim, never attempted): a dead letter.
    Malformed(String),
    /// Not published: its aggregate has a dead letter (this seq), so it is parked with it.
    Parked(i64),
    /// Not published, no attempt counted (an outage).
    Released,
}

impl Outcome {
    /// Whether the position may pass the event: published, or copied aside.
    fn passed(&self) -> bool {
        matches!(
            self,
            Outcome::Published | Outcome::Dead(_) | Outcome::Malformed(_) | Outcome::Parked(_)
        )
    }
}

/// The batch in flight: what is needed to advance its shards' positions (a delta), or to
/// settle its rows in `outbox_stream_dead_letters` (a release: no positions).
#[derive(Clone)]
struct Pending {
    /// A release batch: its rows are copies in `outbox_stream_dead_letters`.
    release: bool,
    positions: Vec<PositionRow>,
    /// Per shard, how many rows its delta offered (at most the read + 1, less the rows of the
    /// read handed out in earlier batches), for the shards with a row in the batch.
    offered: HashMap<i16, i64>,
    /// The claim returned a whole batch: the shards with no row in it may have rows past
    /// it, so their positions stay.
    full: bool,
    /// The batch's rows (seq, shard), in seq order.
    rows: Vec<(i64, i16)>,
    outcomes: HashMap<i64, Outcome>,
}

/// How many rows a stream claim reads at least, by default
/// ([`PgRelayStore::stream_read_ahead`]).
pub const READ_AHEAD: usize = 3_000;

/// A row read ahead: its seq and shard, and its message, or what became of it at once
/// (parked, malformed).
struct AheadRow {
    seq: i64,
    shard: i16,
    row: Result<OutboxMessage, Outcome>,
}

/// The rows of a read (`CANDIDATES`) not yet handed out, with what advances their shards'
/// positions: the positions as they are in the database once every batch handed out so far
/// is settled (each `ADVANCE` applied to them), and the read's counts.
struct Ahead {
    positions: Vec<PositionRow>,
    /// Per shard, the rows its delta offers past the batches handed out (the read's
    /// `shard_rows`, less those), so that the batch with a shard's last row exhausts it.
    offered: HashMap<i16, i64>,
    /// The read was full: shards with no row in it may have rows past it.
    full: bool,
    rows: std::collections::VecDeque<AheadRow>,
    read_at: Instant,
    /// Read while the batch in flight was published (`overlap_stream`): `positions` are
    /// already where that batch's `ADVANCE` leaves them, so the rows are kept only if the
    /// batch is passed whole.
    assumes: bool,
}

/// Stream mode's state in the store (in memory: the database holds only the positions).
#[derive(Default)]
pub(super) struct StreamState {
    /// Rows a claim reads at least.
    pub(super) read_ahead: usize,
    /// Rows read past the batch in flight, for the next claims (see `claim_stream_round`).
    ahead: Option<Ahead>,
    pending: Option<Pending>,
    /// A batch settled in memory whose `ADVANCE` is not yet written: a clean batch followed by
    /// rows read ahead, written while the next batch is published (see the module's notes).
    owed: Option<Pending>,
    /// Shards not to claim before then (a failed event waits for its retry).
    holds: HashMap<i16, Instant>,
    /// Failed attempts so far of events that failed and are not yet published.
    attempts: HashMap<i64, i32>,
    last_idle_advance: Option<Instant>,
    /// Not before then, look for partitions with no statistics (`None`: at the next claim).
    next_stats_check: Option<Instant>,
    /// The partition ring, if the table is one (read with the statistics check).
    ring: Option<Ring>,
    /// The lowest xmin of the positions of the last read: its slot's partition is where the
    /// next `POSITIONS` looks for the bounds.
    last_xmin: Option<i64>,
    /// Not before then, look for aggregates to release (`None`: at the next claim).
    next_release_check: Option<Instant>,
    /// The aggregates of malformed rows read since the last read from the table's positions,
    /// with the first such row: their later rows are parked behind it while its dead letter
    /// is not yet written (a read beside the publish; after that `CANDIDATES` parks them).
    malformed: HashMap<(String, String), i64>,
}

impl StreamState {
    pub(super) fn new() -> Self {
        StreamState {
            read_ahead: READ_AHEAD,
            ..StreamState::default()
        }
    }

    /// Forgets the rows read ahead: the next claim reads from the positions again.
    pub(super) fn drop_ahead(&mut self) {
        self.ahead = None;
    }

    /// Whether a stream batch is in flight (so `complete`, `fail` and `release` are its).
    pub(super) fn in_flight(&self) -> bool {
        self.pending.is_some()
    }
}

/// A shard's next position: the row, the delta being consumed (`None`: exhausted) and the
/// rows of the batch it passes.
struct Advance {
    next: PositionRow,
    cur: Option<String>,
    passed: Vec<i64>,
}

/// The new position of each shard of `p`, given the outcomes: up to the first event of the
/// shard neither published nor copied aside (dead, parked); the whole delta (last snapshot :=
/// the delta's end) when every row it offered was passed. A shard whose position stays is left
/// out: among them the shards with no row in a full batch, whose deltas may hold rows the
/// batch had no room for (treating them as empty lost those rows: 796 of 3,000 events
/// published in `stream_delta_larger_than_a_batch_loses_nothing`).
fn advanced(p: &Pending) -> Vec<Advance> {
    // Each shard's rows, in seq order, grouped in one pass: a filter of the batch's rows for
    // each position was O(shards × batch): 270 µs a call against 40 µs at 256 shards and
    // 1,000 rows (both loops in a standalone release build), and a batch passed whole and
    // followed by rows read ahead makes three calls.
    let mut by_shard: HashMap<i16, Vec<i64>> = HashMap::new();
    for (seq, shard) in &p.rows {
        by_shard.entry(*shard).or_default().push(*seq);
    }
    let mut out = Vec::new();
    for pos in &p.positions {
        let rows = by_shard.get(&pos.shard).cloned().unwrap_or_default();
        if rows.is_empty() && p.full {
            continue;
        }
        let done = rows
            .iter()
            .take_while(|seq| p.outcomes.get(seq).is_some_and(Outcome::passed))
            .count();
        let offered = p.offered.get(&pos.shard).copied().unwrap_or(0);
        let passed = rows[..done].to_vec();
        if done == rows.len() && rows.len() as i64 == offered {
            // The delta is exhausted: every row it offered is passed.
            let next = PositionRow {
                last_snap: pos.cur_snap.clone(),
                cur_seq: 0,
                ..pos.clone()
            };
            out.push(Advance {
                next,
                cur: None,
                passed,
            });
        } else if done > 0 {
            let next = PositionRow {
                cur_seq: rows[done - 1],
                ..pos.clone()
            };
            out.push(Advance {
                next,
                cur: Some(pos.cur_snap.clone()),
                passed,
            });
        }
    }
    out
}

/// Whether every event of `p` was published or parked: nothing of it holds an aggregate back
/// (a failure holds its shard, an outage hands the batch back, a new dead letter parks the
/// aggregate's later events, which a read made before it did not know of).
fn clean(p: &Pending) -> bool {
    p.outcomes
        .values()
        .all(|o| matches!(o, Outcome::Published | Outcome::Parked(_)))
}

/// Where `p`'s `ADVANCE` will leave its positions if every event of it is passed: each
/// position, with the snapshot being consumed (`None`: the delta is exhausted, the next one
/// starts), as `POSITIONS` takes them given. (Without the consumed deltas of the batches
/// before `p`, which were passed on as deltas ending where they start, the reads beside the
/// publish came back with a few rows each: 30 reads of the 20,000-row drain where 17 did.)
fn assumed_positions(p: &Pending) -> Vec<(PositionRow, Option<String>)> {
    let mut all = p.clone();
    for (seq, _) in &p.rows {
        all.outcomes.entry(*seq).or_insert(Outcome::Published);
    }
    let next = advanced(&all);
    p.positions
        .iter()
        .map(
            |pos| match next.iter().find(|a| a.next.shard == pos.shard) {
                Some(a) => (
                    PositionRow {
                        version: a.next.version + 1,
                        ..a.next.clone()
                    },
                    a.cur.clone(),
                ),
                // A delta consumed by an earlier batch of the read (`advanced` left its end as
                // its new start: a delta never ends where it starts) is over: the next starts.
                None => (
                    pos.clone(),
                    (pos.cur_snap != pos.last_snap).then(|| pos.cur_snap.clone()),
                ),
            },
        )
        .collect()
}

/// The rows of `batch` to copy into `outbox_stream_dead_letters`, as `ADVANCE`'s and
/// `SETTLE_RELEASE`'s arrays: seq, attempts, error, and the dead letter a parked row waits
/// behind.
#[derive(Default)]
struct DeadRows {
    seqs: Vec<i64>,
    attempts: Vec<i32>,
    errors: Vec<String>,
    behind: Vec<Option<i64>>,
}

impl DeadRows {
    fn push(&mut self, seq: i64, outcome: &Outcome, attempts: &HashMap<i64, i32>) {
        let (error, behind) = match outcome {
            Outcome::Dead(error) | Outcome::Malformed(error) => (error.clone(), None),
            Outcome::Parked(behind) => (
                format!(
                    "parked: an earlier event of its aggregate is a dead letter (seq {behind})"
                ),
                Some(*behind),
            ),
            _ => return,
        };
        self.seqs.push(seq);
        self.attempts.push(attempts.get(&seq).copied().unwrap_or(0));
        self.errors.push(error);
        self.behind.push(behind);
    }
}

impl PgRelayStore {
    /// A stream claim (see the module's documentation): a release batch if an aggregate is
    /// due for one, else the next delta.
    pub(super) async fn claim_stream(
        &mut self,
        relay: &str,
        limit: usize,
        lease: Duration,
        dead_letters_block: bool,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        if dead_letters_block && !self.no_lease_dead {
            let conn = self.base.guarded("claim", lease).await?;
            let dead = super::handover::lease_dead_letters(conn).await;
            if let Some(dead) = self.base.check("claim", dead).await? {
                return Err(StoreError::new("claim", dead));
            }
            self.no_lease_dead = true;
        }
        if self.stream.pending.take().is_some() {
            // The engine claims only after the batch in flight settled; one left means its
            // settle gave up (the database was away past the lease): its rows come again.
            tracing::warn!("stream batch was not settled; its rows will be published again");
            self.stream.ahead = None;
        }
        if self
            .stream
            .next_release_check
            .is_none_or(|t| Instant::now() >= t)
        {
            let batch = self.claim_release(relay, limit, lease).await?;
            if !batch.is_empty() {
                // The rows read ahead were parked behind what this releases: read again.
                self.stream.ahead = None;
                self.stream.next_release_check = None;
                return Ok(batch);
            }
            self.stream.next_release_check = Some(Instant::now() + RELEASE_CHECK);
        }
        if self
            .stream
            .next_stats_check
            .is_none_or(|t| Instant::now() >= t)
        {
            self.stream.next_stats_check = Some(Instant::now() + STATS_CHECK);
            let conn = self.base.conn().await?;
            let r = Prepared(diesel::sql_query(ANALYZE_PARTITIONS))
                .get_result::<StatsRow>(conn)
                .await;
            // Not the claim's failure: an ANALYZE cut by the statement timeout (a slow disk,
            // a huge partition) would otherwise fail every claim, each second, for as long as
            // it lasts. The claim goes on (a database outage fails it next, as any claim);
            // the check waits STATS_RETRY, and the ring's layout stays as last read.
            match self.base.check("analyse new partitions", r).await {
                Ok(row) => {
                    self.stream.ring = match (row.slots, row.slot_xids) {
                        (Some(slots), Some(slot_xids)) => Some(Ring { slots, slot_xids }),
                        _ => None,
                    };
                    if row.n > 0 {
                        tracing::info!(
                            analysed = row.n,
                            "outbox partitions analysed (they had no statistics)"
                        );
                    }
                }
                Err(e) => {
                    self.stream.next_stats_check = Some(Instant::now() + STATS_RETRY);
                    tracing::warn!(error = %e, retry_in = ?STATS_RETRY, "could not analyse new partitions");
                }
            }
        }
        // A bounded delta can hold nothing for this relay (its rows were all seen by the last
        // snapshot, or are other shards'), or only rows to copy aside (parked, malformed):
        // its positions move on at once and the claim looks again, so that an event committed
        // after the bound is not held back until the next idle advance. Each round moves
        // every such position past at least one row.
        for _ in 0..8 {
            if let Some(batch) = self
                .claim_stream_round(relay, limit, lease, dead_letters_block)
                .await?
            {
                return Ok(batch);
            }
        }
        Ok(Vec::new())
    }

    /// One claim: `None` when it found nothing to publish but moved positions on. The batch is
    /// the next `limit` rows read ahead by an earlier claim, if there are any and they were
    /// read less than a quarter of the lease ago (the positions they were read at are then
    /// still this relay's: each batch's `ADVANCE` is fenced by the shard leases and by the
    /// versions, and one fenced drops them); else the first `limit` of a new read of at least
    /// `read_ahead` rows, whose rest is kept.
    async fn claim_stream_round(
        &mut self,
        relay: &str,
        limit: usize,
        lease: Duration,
        dead_letters_block: bool,
    ) -> Result<Option<Vec<OutboxMessage>>, StoreError> {
        let now = Instant::now();
        self.stream.holds.retain(|_, until| *until > now);
        let kept = self
            .stream
            .ahead
            .take()
            .filter(|a| a.rows.len() >= limit && a.read_at.elapsed() < lease / 4 && !a.assumes);
        let (mut ahead, bounded) = match kept {
            Some(ahead) => (ahead, false),
            None => {
                // Whole batches: a short one tells the engine the outbox is drained.
                let batches = self.stream.read_ahead.div_ceil(limit.max(1)).max(1);
                let read = limit.saturating_mul(batches);
                match self
                    .read_delta(relay, read, limit, lease, dead_letters_block, None)
                    .await?
                {
                    Some(read) => read,
                    None => return Ok(Some(Vec::new())),
                }
            }
        };
        let take = limit.min(ahead.rows.len());
        let mut rows = Vec::with_capacity(take);
        let mut messages = Vec::with_capacity(take);
        let mut outcomes = HashMap::new();
        for r in ahead.rows.drain(..take) {
            rows.push((r.seq, r.shard));
            match r.row {
                Ok(m) => messages.push(m),
                Err(outcome) => {
                    outcomes.insert(r.seq, outcome);
                }
            }
        }
        // What the delta offers from this batch on: the rows handed out before were passed.
        let offered = ahead.offered.clone();
        for (_, shard) in &rows {
            if let Some(n) = ahead.offered.get_mut(shard) {
                *n -= 1;
            }
        }
        let pending = Pending {
            release: false,
            positions: ahead.positions.clone(),
            offered,
            full: ahead.full || !ahead.rows.is_empty(),
            rows,
            outcomes,
        };
        if !ahead.rows.is_empty() {
            self.stream.ahead = Some(ahead);
        }
        if messages.is_empty() {
            if bounded || !pending.outcomes.is_empty() {
                self.advance(relay, &pending).await?;
                return Ok(None);
            }
            // Nothing to publish: move the idle shards on, at most once per IDLE_ADVANCE.
            if self
                .stream
                .last_idle_advance
                .is_none_or(|t| t.elapsed() >= IDLE_ADVANCE)
            {
                self.stream.last_idle_advance = Some(Instant::now());
                self.advance(relay, &pending).await?;
            }
            return Ok(Some(messages));
        }
        self.stream.pending = Some(pending);
        Ok(Some(messages))
    }

    /// Reads the next `read` rows (at least the batch, `limit`) of the held shards' deltas
    /// (`POSITIONS`, then `CANDIDATES`), and whether a delta's end is a bound; `None` if the
    /// relay holds no shard it may claim. The positions are the table's, but those `given`
    /// (with the snapshot being consumed, if any), which are where the batch in flight will
    /// leave them; without `given`, the batch settled last is written first.
    async fn read_delta(
        &mut self,
        relay: &str,
        read: usize,
        limit: usize,
        lease: Duration,
        dead_letters_block: bool,
        given: Option<&[(PositionRow, Option<String>)]>,
    ) -> Result<Option<(Ahead, bool)>, StoreError> {
        if given.is_none() {
            self.flush_owed(relay).await?;
            self.stream.malformed.clear();
        }
        let given = given.unwrap_or_default();
        let g_shards: Vec<i16> = given.iter().map(|(p, _)| p.shard).collect();
        let g_lasts: Vec<&str> = given.iter().map(|(p, _)| p.last_snap.as_str()).collect();
        let g_curs: Vec<Option<&str>> = given.iter().map(|(_, c)| c.as_deref()).collect();
        let g_cursors: Vec<i64> = given.iter().map(|(p, _)| p.cur_seq).collect();
        let g_versions: Vec<i64> = given.iter().map(|(p, _)| p.version).collect();
        // Reading ahead, the deltas are bounded at twice the read, so that a read is full (its
        // batches whole) however the bounds of the shards fall: read 1,000 at batch 100 with
        // deltas bounded at 1,000 rows, reads came back with 268 and 732 rows once the shards'
        // positions had parted, and each short batch made the relay wait for its poll interval.
        // A read of one batch keeps the bound at the batch: at batch 1,000 twice that made
        // each read scan the other half of its deltas again (one relay, 0.9x).
        let bound = if read > limit {
            read.saturating_mul(2)
        } else {
            read
        };
        // On the ring, the bounds are looked for in the partition of the last read's lowest
        // xmin. Any bound is correct (it is only taken where every transaction below it has
        // ended); one found there sizes the deltas as the parent would, and none (the
        // positions moved on to the next slot) ends them at the current snapshot, whose read
        // goes through the parent.
        let ring = self.stream.ring;
        let positions_sql = match ring.zip(self.stream.last_xmin).and_then(|(r, x)| r.slot(x)) {
            Some(slot) => std::borrow::Cow::Owned(on_partition(POSITIONS, slot)),
            None => std::borrow::Cow::Borrowed(POSITIONS),
        };
        let conn = self.base.guarded("claim", lease).await?;
        let r = Prepared(
            diesel::sql_query(positions_sql)
                .bind::<Text, _>(relay)
                .bind::<BigInt, _>(i64::try_from(bound).unwrap_or(i64::MAX))
                .bind::<Array<SmallInt>, _>(&g_shards)
                .bind::<Array<Text>, _>(&g_lasts)
                .bind::<Array<Nullable<Text>>, _>(&g_curs)
                .bind::<Array<BigInt>, _>(&g_cursors)
                .bind::<Array<BigInt>, _>(&g_versions),
        )
        .load::<PositionRow>(conn)
        .await;
        let mut positions = self.base.check("claim", r).await?;
        positions.retain(|p| !self.stream.holds.contains_key(&p.shard));
        if positions.is_empty() {
            return Ok(None);
        }
        let read_at = Instant::now();
        let bounded = positions.iter().any(|p| p.bounded);
        let shards: Vec<i16> = positions.iter().map(|p| p.shard).collect();
        let lasts: Vec<&str> = positions.iter().map(|p| p.last_snap.as_str()).collect();
        let curs: Vec<&str> = positions.iter().map(|p| p.cur_snap.as_str()).collect();
        let cursors: Vec<i64> = positions.iter().map(|p| p.cur_seq).collect();
        let batch = i64::try_from(read).unwrap_or(i64::MAX - 1);
        // The xid range of the deltas: `[lowest xmin of the last snapshots, highest xmax of
        // the snapshots they end at)`, the range the scans read.
        // (On the ring only.)
        let range = ring.and_then(|_| {
            positions
                .iter()
                .try_fold((i64::MAX, i64::MIN), |(lo, hi), p| {
                    let (xmin, _) = snapshot_bounds(&p.last_snap)?;
                    let (_, xmax) = snapshot_bounds(&p.cur_snap)?;
                    Some((lo.min(xmin), hi.max(xmax)))
                })
        });
        self.stream.last_xmin = range.map(|(lo, _)| lo);
        let candidates_sql = match ring.zip(range).and_then(|(r, (lo, hi))| r.slot_of(lo, hi)) {
            Some(slot) => std::borrow::Cow::Owned(on_partition(CANDIDATES, slot)),
            None => std::borrow::Cow::Borrowed(CANDIDATES),
        };
        let conn = self.base.conn().await?;
        let r = Prepared(
            diesel::sql_query(candidates_sql)
                .bind::<Array<SmallInt>, _>(&shards)
                .bind::<Array<Text>, _>(&lasts)
                .bind::<Array<Text>, _>(&curs)
                .bind::<Array<BigInt>, _>(&cursors)
                .bind::<BigInt, _>(batch)
                .bind::<Bool, _>(dead_letters_block),
        )
        .load::<CandidateRow>(conn)
        .await;
        let candidates = self.base.check("claim", r).await?;
        let full = candidates.len() >= read;

        let mut offered = HashMap::new();
        let mut rows = std::collections::VecDeque::with_capacity(candidates.len());
        for c in candidates {
            offered.insert(c.stream_shard, c.shard_rows);
            let seq = c.columns.seq;
            let shard = c.stream_shard;
            let row = if let Some(behind) = c.parked_behind {
                Err(Outcome::Parked(behind))
            } else {
                match c.columns.into_message(Ok(c.id), c.created_at) {
                    // Looked up only while there are malformed rows (the key is two copies).
                    Ok(m) if dead_letters_block && !self.stream.malformed.is_empty() => {
                        match self
                            .stream
                            .malformed
                            .get(&(m.aggregate_type.clone(), m.aggregate_id.clone()))
                        {
                            Some(behind) => Err(Outcome::Parked(*behind)),
                            None => Ok(m),
                        }
                    }
                    Ok(m) => Ok(m),
                    Err(bad) => {
                        // A row that does not decode (the table's checks refuse most such
                        // rows; one from before them, or a time out of range) is a dead
                        // letter at once, as in the lease modes.
                        tracing::error!(
                            seq, error = %bad.failure.error,
                            "stream: malformed event dead-lettered"
                        );
                        self.stream
                            .malformed
                            .entry(bad.key().clone())
                            .or_insert(seq);
                        Err(Outcome::Malformed(bad.failure.error))
                    }
                }
                .map(|mut m| {
                    m.attempts += self.stream.attempts.get(&m.seq).copied().unwrap_or(0) + 1;
                    m
                })
            };
            rows.push_back(AheadRow { seq, shard, row });
        }
        let ahead = Ahead {
            positions,
            offered,
            full,
            rows,
            read_at,
            assumes: false,
        };
        Ok(Some((ahead, bounded)))
    }

    /// A release batch (see the module docs): the copies of the aggregates due, in `seq`
    /// order, as messages; empty if none is due.
    async fn claim_release(
        &mut self,
        relay: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let now = Instant::now();
        self.stream.holds.retain(|_, until| *until > now);
        let held: Vec<i16> = self.stream.holds.keys().copied().collect();
        let conn = self.base.guarded("claim", lease).await?;
        let r = Prepared(
            diesel::sql_query(RELEASABLE)
                .bind::<Text, _>(relay)
                .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
                .bind::<Array<SmallInt>, _>(&held),
        )
        .load::<CandidateRow>(conn)
        .await;
        let candidates = self.base.check("claim dead letters to release", r).await?;
        let mut rows = Vec::new();
        let mut messages = Vec::new();
        let mut outcomes = HashMap::new();
        for c in candidates {
            let seq = c.columns.seq;
            rows.push((seq, c.stream_shard));
            match c.columns.into_message(Ok(c.id), c.created_at) {
                Ok(mut m) => {
                    m.attempts += self.stream.attempts.get(&m.seq).copied().unwrap_or(0) + 1;
                    messages.push(m);
                }
                Err(bad) => {
                    outcomes.insert(seq, Outcome::Malformed(bad.failure.error));
                }
            }
        }
        if rows.is_empty() {
            return Ok(messages);
        }
        tracing::info!(
            events = rows.len(),
            "stream: releasing dead letters retried or purged, in order"
        );
        let pending = Pending {
            release: true,
            positions: Vec::new(),
            offered: HashMap::new(),
            full: false,
            rows,
            outcomes,
        };
        if messages.is_empty() {
            // Only malformed copies: dead letters again.
            self.settle_release(relay, &pending).await?;
            return Ok(messages);
        }
        self.stream.pending = Some(pending);
        Ok(messages)
    }

    /// Records the outcome of `seqs` of the stream batch in flight; once every event of the
    /// batch has one, advances the positions (or settles the release). Returns how many of
    /// `seqs` count as settled (0 if the write was fenced: another relay owns the shards now).
    pub(super) async fn settle_stream(
        &mut self,
        relay: &str,
        seqs: impl Iterator<Item = (i64, Outcome)>,
    ) -> Result<u64, StoreError> {
        let Some(mut p) = self.stream.pending.take() else {
            return Ok(0);
        };
        let mut n = 0u64;
        for (seq, outcome) in seqs {
            // `rows` is in seq order: a binary search, and the scan only for a seq it missed
            // (the scan alone is O(batch²): 254 µs a settle of 1,000 rows against 10 µs,
            // measured with both loops in a standalone release build).
            if p.rows.binary_search_by_key(&seq, |(s, _)| *s).is_ok()
                || p.rows.iter().any(|(s, _)| *s == seq)
            {
                p.outcomes.insert(seq, outcome);
                n += 1;
            }
        }
        if p.outcomes.len() < p.rows.len() {
            self.stream.pending = Some(p);
            return Ok(n);
        }
        let now = Instant::now();
        let mut holds = Vec::new();
        // The attempt just made, of each event that failed (undone if nothing is written).
        let mut counted = Vec::new();
        for (seq, shard) in &p.rows {
            match p.outcomes.get(seq) {
                Some(Outcome::Failed(after)) => {
                    counted.push(*seq);
                    holds.push((*shard, now + *after));
                }
                Some(Outcome::Dead(_)) => counted.push(*seq),
                Some(Outcome::Published) => {
                    self.stream.attempts.remove(seq);
                }
                _ => {}
            }
        }
        for seq in &counted {
            *self.stream.attempts.entry(*seq).or_insert(0) += 1;
        }
        if !p.release && clean(&p) && self.stream.ahead.is_some() {
            // Passed whole, and rows read ahead follow it: their next batch may be published
            // before these positions are written (`overlap_stream` writes them meanwhile),
            // since nothing of this batch holds an aggregate back. One write owed at most.
            if let Err(e) = self.flush_owed(relay).await {
                self.stream.pending = Some(p);
                return Err(e);
            }
            let next = advanced(&p);
            self.keep_ahead(&p, &next, true);
            if !next.is_empty() {
                self.stream.owed = Some(p);
            }
            return Ok(n);
        }
        // Put back if not written: the engine calls again.
        let written = if p.release {
            self.settle_release(relay, &p).await
        } else {
            self.advance(relay, &p).await
        };
        match written {
            Ok(fenced) => {
                for (shard, until) in holds {
                    let e = self.stream.holds.entry(shard).or_insert(until);
                    *e = (*e).max(until);
                }
                // A dead letter's count went with its copy.
                for (seq, _) in &p.rows {
                    if matches!(
                        p.outcomes.get(seq),
                        Some(Outcome::Dead(_) | Outcome::Malformed(_))
                    ) {
                        self.stream.attempts.remove(seq);
                    }
                }
                Ok(if fenced { 0 } else { n })
            }
            Err(e) => {
                for seq in &counted {
                    if let Some(a) = self.stream.attempts.get_mut(seq) {
                        *a -= 1;
                    }
                }
                self.stream.pending = Some(p);
                Err(e)
            }
        }
    }

    /// Writes the positions `p` comes to, with the copies of the dead letters and parked
    /// events they pass (after the write owed, if any); `true` if some were fenced (not
    /// written).
    async fn advance(&mut self, relay: &str, p: &Pending) -> Result<bool, StoreError> {
        self.flush_owed(relay).await?;
        let next = advanced(p);
        if next.is_empty() {
            self.keep_ahead(p, &next, true);
            return Ok(false);
        }
        let all = self.write_advance(relay, p, &next).await?;
        self.keep_ahead(p, &next, all);
        Ok(!all)
    }

    /// Writes the positions of the batch settled last, if they are owed (see `owed`); the
    /// rows read ahead go if some were fenced. Kept owed if the write fails.
    pub(super) async fn flush_owed(&mut self, relay: &str) -> Result<(), StoreError> {
        let Some(p) = self.stream.owed.take() else {
            return Ok(());
        };
        match self.write_advance(relay, &p, &advanced(&p)).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.stream.ahead = None;
                Ok(())
            }
            Err(e) => {
                self.stream.owed = Some(p);
                Err(e)
            }
        }
    }

    /// `ADVANCE` of `next`, batch `p`'s positions; whether every one was written (else some
    /// were fenced, and logged).
    async fn write_advance(
        &mut self,
        relay: &str,
        p: &Pending,
        next: &[Advance],
    ) -> Result<bool, StoreError> {
        let mut dead = DeadRows::default();
        for a in next {
            for seq in &a.passed {
                if let Some(outcome) = p.outcomes.get(seq) {
                    dead.push(*seq, outcome, &self.stream.attempts);
                }
            }
        }
        let shards: Vec<i16> = next.iter().map(|a| a.next.shard).collect();
        let lasts: Vec<&str> = next.iter().map(|a| a.next.last_snap.as_str()).collect();
        let curs: Vec<Option<&str>> = next.iter().map(|a| a.cur.as_deref()).collect();
        let cursors: Vec<i64> = next.iter().map(|a| a.next.cur_seq).collect();
        let versions: Vec<i64> = next.iter().map(|a| a.next.version).collect();
        let conn = self.base.conn().await?;
        let r = Prepared(
            diesel::sql_query(ADVANCE)
                .bind::<Text, _>(relay)
                .bind::<Array<SmallInt>, _>(&shards)
                .bind::<Array<Text>, _>(&lasts)
                .bind::<Array<Nullable<Text>>, _>(&curs)
                .bind::<Array<BigInt>, _>(&cursors)
                .bind::<Array<BigInt>, _>(&versions)
                .bind::<Array<BigInt>, _>(&dead.seqs)
                .bind::<Array<Integer>, _>(&dead.attempts)
                .bind::<Array<Text>, _>(&dead.errors)
                .bind::<Array<Nullable<BigInt>>, _>(&dead.behind),
        )
        .get_result::<CountRow>(conn)
        .await;
        let written = self.base.check("advance stream positions", r).await?.n as usize;
        if written < next.len() {
            tracing::warn!(
                fenced = next.len() - written,
                "stream positions not advanced: their shards moved to another relay"
            );
        }
        Ok(written == next.len())
    }

    /// After `ADVANCE` wrote `next` for batch `p` (`all`: every position of it), the rows
    /// read ahead either follow (their positions are now `next`, one version on) or are
    /// dropped: when a position was fenced, or when an event of `p` was not published nor
    /// parked (a failure holds its shard, an outage hands the batch back, and a new dead
    /// letter must park its aggregate's later events, which the read did not know of).
    fn keep_ahead(&mut self, p: &Pending, next: &[Advance], all: bool) {
        let Some(ahead) = self.stream.ahead.as_mut() else {
            return;
        };
        if !(all && clean(p)) {
            self.stream.ahead = None;
            return;
        }
        if std::mem::take(&mut ahead.assumes) {
            // Read at the positions `next` (see `overlap_stream`).
            return;
        }
        for a in next {
            if let Some(pos) = ahead.positions.iter_mut().find(|q| q.shard == a.next.shard) {
                *pos = PositionRow {
                    version: a.next.version + 1,
                    ..a.next.clone()
                };
            }
        }
    }

    /// While the batch in flight is published (`RelayStore::overlap`): writes the positions
    /// owed by the batch before it, then, if the batch took the last rows read ahead, reads the
    /// next ones from where its `ADVANCE` will leave the positions (every row passed), so that
    /// the claim after it is served from memory. The read is kept only if the batch is passed
    /// whole and every position written (`keep_ahead`), and for a quarter of the lease as any
    /// read. Errors are left to the calls that need the work: the next settle writes what is
    /// owed, the next claim reads.
    pub(super) async fn overlap_stream(
        &mut self,
        relay: &str,
        limit: usize,
        lease: Duration,
        dead_letters_block: bool,
    ) {
        if let Err(e) = self.flush_owed(relay).await {
            tracing::debug!(error = %e, "stream positions not written beside the publish");
            return;
        }
        let Some(p) = self.stream.pending.as_ref().filter(|p| !p.release) else {
            return;
        };
        if self
            .stream
            .ahead
            .as_ref()
            .is_some_and(|a| a.rows.len() >= limit)
        {
            return;
        }
        let given = assumed_positions(p);
        let batches = self.stream.read_ahead.div_ceil(limit.max(1)).max(1);
        let read = limit.saturating_mul(batches);
        match self
            .read_delta(relay, read, limit, lease, dead_letters_block, Some(&given))
            .await
        {
            Ok(Some((mut ahead, _))) if ahead.rows.len() >= limit => {
                ahead.assumes = true;
                self.stream.ahead = Some(ahead);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "stream rows not read beside the publish"),
        }
    }

    /// Settles a release batch: deletes the copies published, makes those that failed for
    /// good dead letters again; `true` if some were fenced (their shard moved on).
    async fn settle_release(&mut self, relay: &str, p: &Pending) -> Result<bool, StoreError> {
        self.flush_owed(relay).await?;
        let published: Vec<i64> = p
            .rows
            .iter()
            .filter(|(seq, _)| p.outcomes.get(seq) == Some(&Outcome::Published))
            .map(|(seq, _)| *seq)
            .collect();
        let mut dead = DeadRows::default();
        for (seq, _) in &p.rows {
            if let Some(outcome @ (Outcome::Dead(_) | Outcome::Malformed(_))) = p.outcomes.get(seq)
            {
                dead.push(*seq, outcome, &self.stream.attempts);
            }
        }
        let expected = published.len() + dead.seqs.len();
        if expected == 0 {
            return Ok(false);
        }
        let conn = self.base.conn().await?;
        let r = Prepared(
            diesel::sql_query(SETTLE_RELEASE)
                .bind::<Text, _>(relay)
                .bind::<Array<BigInt>, _>(&published)
                .bind::<Array<BigInt>, _>(&dead.seqs)
                .bind::<Array<Integer>, _>(&dead.attempts)
                .bind::<Array<Text>, _>(&dead.errors),
        )
        .get_result::<CountRow>(conn)
        .await;
        let written = self.base.check("settle released dead letters", r).await?.n as usize;
        if written < expected {
            tracing::warn!(
                fenced = expected - written,
                "released dead letters not settled: their shards moved to another relay"
            );
        }
        Ok(written < expected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_within_one_slot_has_that_slot_and_one_across_two_none() {
        let ring = Ring {
            slots: 4,
            slot_xids: 1000,
        };
        assert_eq!(ring.slot_of(1000, 2000), Some(1));
        assert_eq!(ring.slot_of(3999, 4000), Some(3));
        // A turn on, the same partitions again.
        assert_eq!(ring.slot_of(4000, 4500), Some(0));
        assert_eq!(ring.slot_of(1999, 2001), None);
        assert_eq!(ring.slot_of(0, 40_000), None);
        assert_eq!(ring.slot_of(5, 5), None);
        assert_eq!(ring.slot_of(-1, 5), None);
        assert_eq!(ring.slot(7_654), Some(3));
        assert_eq!(ring.slot(i64::MAX), None);
        let broken = Ring {
            slots: 0,
            slot_xids: 1000,
        };
        assert_eq!(broken.slot_of(1, 2), None);
    }

    #[test]
    fn reads_on_a_partition_name_it_in_place_of_the_table_and_nothing_else() {
        for (sql, n) in [(CANDIDATES, 2), (POSITIONS, 1)] {
            let on = on_partition(sql, 3);
            assert_eq!(on.matches("FROM outbox_events_slot_3 ").count(), n);
            assert!(!on.contains("FROM outbox_events "));
            assert_eq!(
                on.replace("outbox_events_slot_3 ", "outbox_events "),
                sql,
                "only the table's name changes"
            );
        }
    }

    #[test]
    fn snapshot_bounds_are_read_from_its_text() {
        assert_eq!(snapshot_bounds("100:105:101,103"), Some((100, 105)));
        assert_eq!(snapshot_bounds("7:7:"), Some((7, 7)));
        assert_eq!(snapshot_bounds("x:7:"), None);
        assert_eq!(snapshot_bounds(""), None);
    }
}
