//! Stream mode's retention without `VACUUM`: the event table as a ring of partitions, emptied
//! by `TRUNCATE` (the SQL is the migration `20261202000003_stream_partitions`).
//!
//! [`partition_events`] converts `outbox_events` (once, opt-in: `outbox partition`) into
//! `slots` partitions `outbox_events_slot_<k>`, a row's slot being its writer's transaction id
//! divided by `slot_xids`, modulo `slots`: consecutive transactions fill one partition for
//! `slot_xids` transaction ids, then the next, round the ring. Retention ([`rotate`], run by
//! every cleanup after its `DELETE`, which records the tick that dates stream rows) empties a
//! partition with one `TRUNCATE` once every row in it is visible in its shard's position and
//! in the retention tick (the check `outbox_slot_passed`: a range probe of the partition's
//! stream index per shard, rows read one by one only where a transaction was open; repeated
//! under an `ACCESS EXCLUSIVE` lock on that partition alone, taken within
//! [`ROTATE_LOCK_WAIT`] or not at all). Writers insert
//! into the partition of their own transaction id, so a rotation never waits for them unless
//! a writer's transaction id falls in the partition being emptied (a transaction older than a
//! turn of the ring is in progress, or the ring came round): that writer waits for the lock,
//! then writes into the emptied partition. The cleanup's `DELETE` then takes only rows older
//! than a whole turn of the ring (`slots × slot_xids` transaction ids), which a partition
//! could not be emptied of because newer rows share it: none, when the ring holds more than
//! the retention. No other DDL ever runs: the partitions exist from the conversion on.
//!
//! Sizing: a turn of the ring should outlast the retention plus the relays' lag, so
//! `slots × slot_xids` above the transaction ids the database uses in that time (every write
//! transaction uses one, the relay's advances and cleanups too, about 15 a second a relay;
//! and the counter is the server's, shared by all its databases, so it is the whole server's
//! rate that counts: `SELECT pg_current_xact_id()` twice an hour apart tells it). A stream
//! read whose transactions all fall in one slot reads that partition by its name (`Ring` in
//! `stream/ring.rs`); one across a slot's end reads through the partitioned table, every
//! partition's stream index, so fewer, larger slots make cheaper claims: the default is
//! [`DEFAULT_SLOTS`]. `Status::stream`'s `ring` gives the headroom left before writers reach
//! a partition not yet emptied.

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double, Integer};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

pub use crate::relay::admin::Rotated;

/// How long a rotation waits for the lock on the partition it empties before it leaves it
/// for the next cleanup: what a reader of the table (a relay's claim) or a writer into that
/// partition may wait behind it, plus the `TRUNCATE` itself.
pub const ROTATE_LOCK_WAIT: Duration = Duration::from_millis(200);

/// Partitions of a table converted by `outbox partition` without `--slots`.
pub const DEFAULT_SLOTS: u16 = 4;

/// Transaction ids per partition without `--slot-xids`: 10,000,000 (at 100 write
/// transactions a second, a partition fills in 28 hours and the ring of [`DEFAULT_SLOTS`]
/// turns in 4.6 days).
pub const DEFAULT_SLOT_XIDS: u64 = 10_000_000;

/// The fewest partitions in a ring.
pub const MIN_SLOTS: u16 = 2;

/// The most partitions in a ring.
pub const MAX_SLOTS: u16 = 64;

/// The most transaction ids a turn of the ring (`slots × slot_xids`) may span: 2^62. The
/// ring's arithmetic (a writer's slot, the headroom in `outbox status`, the cleanup's floor)
/// adds a turn to a current transaction id in `bigint`; this leaves 2^62 ids for those.
pub const MAX_RING_XIDS: u64 = 1 << 62;

/// The largest `slot_xids` for `slots` partitions: [`MAX_RING_XIDS`] / `slots`.
///
/// ```
/// use outbox_diesel::relay::partitions::{MAX_RING_XIDS, max_slot_xids};
/// assert_eq!(max_slot_xids(4), MAX_RING_XIDS / 4);
/// ```
pub fn max_slot_xids(slots: u16) -> u64 {
    MAX_RING_XIDS / u64::from(slots.max(1))
}

#[derive(QueryableByName)]
struct Moved {
    #[diesel(sql_type = BigInt)]
    moved: i64,
}

/// Converts `outbox_events` into `slots` partitions of `slot_xids` transaction ids each,
/// copying its rows (under an `ACCESS EXCLUSIVE` lock for the whole conversion); returns how
/// many rows were copied. Refused, with nothing changed, on a table already partitioned or
/// with `slots` outside 2–64 or `slot_xids` below 1.
pub(crate) async fn partition_events(
    conn: &mut AsyncPgConnection,
    slots: u16,
    slot_xids: u64,
) -> diesel::QueryResult<i64> {
    // Beyond i64, the SQL function refuses nothing: clamp into its range so that it names
    // the value in its own error rather than the bind failing.
    let slot_xids = i64::try_from(slot_xids).unwrap_or(i64::MAX);
    diesel::sql_query("SELECT outbox_partition_events($1, $2) AS moved")
        .bind::<Integer, _>(i32::from(slots))
        .bind::<BigInt, _>(slot_xids)
        .get_result::<Moved>(conn)
        .await
        .map(|m| m.moved)
}

/// Empties the partitions whose rows may all go (passed by every position, committed more
/// than `keep` ago), one `TRUNCATE` each; nothing on a table that is not partitioned.
pub(crate) async fn rotate(
    conn: &mut AsyncPgConnection,
    keep: Duration,
) -> diesel::QueryResult<Vec<Rotated>> {
    let mut rotated = Vec::new();
    // One partition a statement (each its own transaction, so its lock ends at once); at most
    // one turn of the ring.
    for _ in 0..64 {
        let row = diesel::sql_query(
            "SELECT slot, bytes FROM outbox_rotate_partitions( \
                 make_interval(secs => $1), make_interval(secs => $2))",
        )
        .bind::<Double, _>(crate::relay::common::secs(keep))
        .bind::<Double, _>(ROTATE_LOCK_WAIT.as_secs_f64())
        .get_result::<Rotated>(conn)
        .await;
        match row {
            Ok(r) => {
                tracing::info!(slot = r.slot, bytes = r.bytes, "outbox partition emptied");
                rotated.push(r);
            }
            Err(diesel::result::Error::NotFound) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(rotated)
}
