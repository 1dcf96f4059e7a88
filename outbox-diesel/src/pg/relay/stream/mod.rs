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
//! A claim reads at least [`PgRelayStore::stream_read_ahead`](super::PgRelayStore::stream_read_ahead) rows (3,000 by default) and
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
//!   is settled in memory; its `ADVANCE` is *owed* (`StreamStore::owed`) and written beside
//!   the next batch's publish. The next batch may be published first because nothing of this
//!   one holds an aggregate back; an event that failed, an outage or a dead letter writes at
//!   once. One write is owed at most: every other statement that reads or moves
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
//! position past it ([`ADVANCE`](sql::ADVANCE): both or neither, and only where the relay still holds the
//! shard). While an aggregate has rows there, the claim parks its later events the same way
//! (copied, `parked_behind` the dead letter, passed by the position) unless the relay runs
//! with `DeadLetterPolicy::Skip`: so nothing of the aggregate is published out of order.
//! `outbox dead retry` marks dead letters `retry_requested_at`, `outbox dead purge` deletes
//! them; an aggregate whose first row there is then retry-requested or parked is *released*
//! by the relay holding its shard ([`RELEASABLE`](sql::RELEASABLE), at most every [`RELEASE_CHECK`] and at once
//! after a release batch): its rows are published from the copies in `seq` order, each deleted
//! once published ([`SETTLE_RELEASE`](sql::SETTLE_RELEASE)); one that fails for itself past `max_attempts` is a
//! dead letter again and holds the rest.
//!
//! ## The claim's cost
//!
//! See [`CANDIDATES`]: a claim's scan stays about a batch long however large the backlog, with
//! bounded deltas, except where one transaction wrote a delta far larger than a batch, which
//! each claim reads whole. Measured (`EXPLAIN (ANALYZE, BUFFERS)` on 100,000 rows):
//! `docs/design/stream-mode.md`.

mod claim;
mod pending;
mod ring;
mod settle;
mod sql;

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use sql::CANDIDATES;

use pending::{Ahead, Pending};
use ring::Ring;

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

/// How often a relay with nothing to publish moves its idle shards' positions up to the
/// current snapshot (so their next delta scans start from a recent `xmin`).
const IDLE_ADVANCE: Duration = Duration::from_secs(1);

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

/// How many rows a stream claim reads at least, by default
/// ([`PgRelayStore::stream_read_ahead`](super::PgRelayStore::stream_read_ahead)).
pub const READ_AHEAD: usize = 3_000;

/// What a stream claim is asked for (from the relay's `Claim`): for whom, how many rows, the
/// lease its positions are fenced by, and whether dead letters hold their aggregates back.
#[derive(Clone, Copy)]
pub(in crate::pg::relay) struct Ask<'a> {
    pub(in crate::pg::relay) relay: &'a str,
    pub(in crate::pg::relay) limit: usize,
    pub(in crate::pg::relay) lease: Duration,
    pub(in crate::pg::relay) dead_letters_block: bool,
}

impl<'a> Ask<'a> {
    pub(in crate::pg::relay) fn of(
        claim: &outbox_core::relay::Claim<'a>,
        dead_letters_block: bool,
    ) -> Self {
        Ask {
            relay: claim.relay,
            limit: claim.limit,
            lease: claim.lease,
            dead_letters_block,
        }
    }
}

/// Stream mode's store: its claims, settles and positions (see the module's notes), on the
/// connection of the [`PgRelayStore`](super::PgRelayStore) it serves. What it keeps is in
/// memory; the database holds only the positions.
#[derive(Default)]
pub(super) struct StreamStore {
    /// Whether a claim that keeps dead letters blocking found no dead letter of the lease
    /// modes (see [`handover`](super::handover)); looked for until it does.
    no_lease_dead: bool,
    /// Rows a claim reads at least.
    pub(super) read_ahead: usize,
    /// Rows read past the batch in flight, for the next claims (see `claim_round`).
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

impl StreamStore {
    pub(super) fn new(read_ahead: usize) -> Self {
        StreamStore {
            read_ahead,
            ..StreamStore::default()
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
