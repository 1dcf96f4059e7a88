//! What the relay needs of a database: [`RelayStore`].

use std::time::Duration;

use super::{OutboxMessage, RelayHealth};
use crate::BoxError;

/// How a claim picks rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOrder {
    /// Any pending rows not leased by another relay (`FOR UPDATE SKIP LOCKED`): any number of
    /// relays, no ordering promise.
    Unordered,
    /// Per-aggregate order: a row is claimed only if no earlier pending row of its aggregate
    /// is blocked (leased by another relay, waiting for a retry, or dead-lettered while
    /// `dead_letters_block`). In sharded mode only rows of shards this relay holds a live lease
    /// on; in leader mode only while this relay holds the leadership lease. Both checks are
    /// part of the claim statement itself, so a relay that lost its lease claims nothing.
    Ordered {
        /// Restrict to the shards this relay owns (sharded mode).
        owned_shards_only: bool,
        /// Require the leadership lease (leader mode).
        leader_only: bool,
        /// Whether a dead-lettered event blocks the later events of its aggregate.
        dead_letters_block: bool,
    },
    /// Stream mode ([`Mode::Stream`](super::Mode::Stream)), PostgreSQL only: the rows of the
    /// shards this relay holds a live lease on that committed since the shard's stored
    /// position, in `seq` order; no row is updated. `complete`, `fail` and `release` of the
    /// batch then advance the positions (up to the first event not published, a dead letter
    /// counting as passed: it is copied aside). Stores that cannot do it return
    /// [`UnsupportedMode`] from `claim`.
    Stream {
        /// Whether a dead-lettered event parks the later events of its aggregate (copied aside
        /// with it, published once it is retried or purged) instead of letting them pass.
        dead_letters_block: bool,
    },
}

/// The store cannot run the relay in this mode, e.g. [`Mode::Stream`](super::Mode::Stream)
/// on MySQL or SQLite. Returned (as the source of a [`StoreError`]) by `claim`.
///
/// ```
/// use outbox_core::relay::{StoreError, UnsupportedMode};
/// let e = StoreError::new("claim", UnsupportedMode::new("stream", "MySQL"));
/// assert!(e.to_string().contains("`stream` mode"));
/// assert_eq!(e.unsupported_mode().unwrap().mode, "stream");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnsupportedMode {
    /// The mode's name, as `--mode` takes it.
    pub mode: &'static str,
    /// The database, e.g. `MySQL`.
    pub backend: &'static str,
}

impl UnsupportedMode {
    /// `backend` cannot run `mode`.
    pub fn new(mode: &'static str, backend: &'static str) -> Self {
        UnsupportedMode { mode, backend }
    }
}

impl std::fmt::Display for UnsupportedMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the relay's `{}` mode is not supported on {} (it is PostgreSQL only): choose \
             `sharded`, `leader` or `unordered`",
            self.mode, self.backend
        )
    }
}

impl std::error::Error for UnsupportedMode {}

/// One claim request.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The claiming relay's id; becomes the rows' `locked_by`.
    pub relay: &'a str,
    /// At most this many rows.
    pub limit: usize,
    /// The rows are leased until now (database clock) plus this.
    pub lease: Duration,
    /// Which rows may be claimed.
    pub order: ClaimOrder,
    /// Consider only the first this many pending rows (in `seq` order, of the relay's shards);
    /// `None`: as many as it takes to fill the batch. A hint: a store may ignore it (the
    /// PostgreSQL store honours it; the MySQL and SQLite stores do not yet).
    ///
    /// The relay sets it on an ordered claim made beside batches in flight. Such a claim finds
    /// rows only near the head of the backlog (every aggregate in flight holds back its later
    /// rows), and one that finds nothing walks the whole backlog to prove it, which on a large
    /// backlog takes seconds and stalls the drain; bounded, it costs about as much as a claim
    /// that fills its batch. With nothing in flight the relay claims without a bound, so no
    /// pending row is out of reach. Measured: `docs/design/relay-loop.md`, section "The
    /// look-ahead of a claim beside batches in flight".
    pub look_ahead: Option<usize>,
    /// Rows of this relay that the broker acknowledged and whose mark as published is being
    /// written beside this claim (on the store's [`settler`](RelayStore::settler)): an ordered
    /// claim treats those still leased by `relay` as published, so that they hold back no
    /// later row of their aggregate. Empty unless the relay settles beside its claims.
    ///
    /// A store with a settler must honour it in ordered claims, or an ordered relay claims
    /// far less than it could: an ordered claim made while the last batch's mark is still
    /// running finds that batch's aggregates leased (its head-of-line window all blocked) and
    /// takes the slower walk, and settling beside the claims then loses to settling between
    /// them. Measured: `docs/design/relay-loop.md`, section "Claims told which rows are being
    /// settled". Order is kept: a row is in here only once its publish was acknowledged, so
    /// every later row of its aggregate is published after it.
    pub settling: &'a [i64],
}

/// A failed publish to record on a leased row.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The row.
    pub seq: i64,
    /// What went wrong (stored in `last_error`).
    pub error: String,
    /// Retry after this long (database clock), or `None` to dead-letter the row.
    pub retry_after: Option<Duration>,
}

/// What happens to a published row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Completion {
    /// Set `published_at` (and delete it later with retention cleanup).
    #[default]
    MarkPublished,
    /// Delete the row at once.
    Delete,
}

/// Shards held after a rebalance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardAssignment {
    /// The shards this relay now holds leases on.
    pub owned: Vec<i16>,
    /// How many relays are alive (heartbeat not expired), this one included.
    pub live_relays: usize,
}

/// An error from the store. The relay logs it, backs off, and tries again: a store is
/// expected to reconnect on its next call after a lost connection.
#[derive(Debug)]
pub struct StoreError {
    /// What the store was doing, e.g. `"claim"`.
    pub operation: &'static str,
    /// The underlying error.
    pub source: BoxError,
}

impl StoreError {
    /// An error during `operation`.
    pub fn new(operation: &'static str, source: impl Into<BoxError>) -> Self {
        StoreError {
            operation,
            source: source.into(),
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "outbox store failed to {}: {}",
            self.operation, self.source
        )
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

impl StoreError {
    /// The store refused to work because another live relay uses this relay's id (see
    /// [`RelayIdInUse`]).
    pub fn relay_id_in_use(&self) -> Option<&RelayIdInUse> {
        self.source.downcast_ref()
    }

    /// The store cannot run the relay's mode (see [`UnsupportedMode`]).
    pub fn unsupported_mode(&self) -> Option<&UnsupportedMode> {
        self.source.downcast_ref()
    }
}

/// Another live relay, on another database session, uses this relay's id.
///
/// Two relays with one id are one owner as far as the database knows: both would hold every
/// shard (or the leadership) and claim from them at once, which breaks the per-aggregate
/// order. A store that records relay sessions (PostgreSQL, MySQL/MariaDB with
/// [`RelayConfig::session_check`](super::RelayConfig::session_check) on) detects it at the
/// heartbeat and then refuses to claim, take shards or lead (each returns a [`StoreError`]
/// with this as its source) until a later heartbeat finds the id free again: the relay that
/// had the id first keeps working, the duplicate waits as in an outage.
///
/// ```
/// use outbox_core::relay::{RelayIdInUse, StoreError};
/// let e = StoreError::new("claim", RelayIdInUse::new("relay-1", "PostgreSQL backend pid 42"));
/// assert_eq!(e.relay_id_in_use().unwrap().relay_id, "relay-1");
/// assert!(e.to_string().contains("give every relay its own --relay-id"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayIdInUse {
    /// The relay id in use.
    pub relay_id: String,
    /// The other relay's session, e.g. `PostgreSQL backend pid 4242, client 10.0.0.7`.
    pub holder: String,
}

impl RelayIdInUse {
    /// `relay_id` is in use by the session described by `holder`.
    pub fn new(relay_id: impl Into<String>, holder: impl Into<String>) -> Self {
        RelayIdInUse {
            relay_id: relay_id.into(),
            holder: holder.into(),
        }
    }
}

impl std::fmt::Display for RelayIdInUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "relay id `{}` is in use by another live relay ({}); this relay claims nothing and \
             takes no shards or leadership while it is: give every relay its own --relay-id / \
             OUTBOX_RELAY_ID, or leave it unset",
            self.relay_id, self.holder
        )
    }
}

impl std::error::Error for RelayIdInUse {}

/// The relay's view of the database. Every method is one short, committed unit of work:
/// the relay never holds a transaction, a row lock or a connection checkout across a
/// publish.
///
/// `outbox-diesel` implements it for PostgreSQL, MySQL/MariaDB and SQLite.
pub trait RelayStore: Send + 'static {
    /// Leases up to `claim.limit` pending rows (`attempts + 1`, `locked_by`, `locked_until`)
    /// and returns them in `seq` order.
    fn claim(
        &mut self,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<Vec<OutboxMessage>, StoreError>> + Send;

    /// Marks `seqs` published (or deletes them), only where `relay` still holds the lease.
    /// Returns how many rows it changed.
    fn complete(
        &mut self,
        relay: &str,
        seqs: &[i64],
        completion: Completion,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Records failures (backoff or dead letter), only where `relay` still holds the lease.
    fn fail(
        &mut self,
        relay: &str,
        failures: &[Failure],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Gives leased rows back without counting an attempt (`attempts - 1`), only where `relay`
    /// still holds the lease.
    fn release(
        &mut self,
        relay: &str,
        seqs: &[i64],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Takes or renews the leadership lease; `true` if `relay` is the leader until now plus
    /// `lease`.
    fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Heartbeats `relay`, renews its shard leases and moves toward a fair share
    /// (`ceil(SHARD_COUNT / live relays)`): takes free or expired shards, gives up surplus.
    fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<ShardAssignment, StoreError>> + Send;

    /// Gives up everything `relay` holds: shard leases, leadership, its heartbeat, and row
    /// leases (without counting an attempt). Called on graceful shutdown.
    fn release_all(&mut self, relay: &str) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records that `relay` is alive until now plus `lease`, with its health (mode, state,
    /// since when, last outage error) and, when `health.track_session`, the identity of its
    /// database session (PostgreSQL: `pg_backend_pid()` and that backend's start time;
    /// MySQL/MariaDB: a session lock `GET_LOCK` held by its connection), so that
    /// [`reap_dead_relays`](RelayStore::reap_dead_relays) can tell when it died. One row per
    /// relay in `outbox_relays`; `outbox status` shows them.
    ///
    /// The relay calls it on its liveness cadence
    /// ([`RelayConfig::session_check`](super::RelayConfig::session_check), else a third of
    /// its lease) and whenever its state changes. The default does nothing.
    ///
    /// A store that records sessions must not take over the row of a relay with the same id
    /// whose recorded session is another, live one: it then returns a [`StoreError`] whose
    /// [`relay_id_in_use`](StoreError::relay_id_in_use) says so, and refuses `claim`,
    /// `rebalance_shards` and `acquire_leadership` (and does nothing in `release_all`) until a
    /// later heartbeat succeeds.
    fn heartbeat(
        &mut self,
        relay: &str,
        lease: Duration,
        health: &RelayHealth,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (relay, lease, health);
        async { Ok(()) }
    }

    /// Replaces dead peers: every relay (other than `relay`) whose recorded database session
    /// no longer exists is reaped in one short transaction: its shard leases and leadership
    /// are freed, its row leases expire (its claimed rows can be claimed at once; the attempt
    /// they cost stays counted, as when a lease runs out), and its heartbeat row is deleted.
    /// Returns the ids of the relays reaped, so the caller can take their work at once.
    ///
    /// Relays that recorded no session (session detection off, SQLite) are never reaped here:
    /// for them the lease stays the rule. A relay that is alive but paused or partitioned
    /// keeps its session, so it is not reaped, and is fenced as ever by its leases. The
    /// default (a store with no view of sessions) reaps nothing.
    fn reap_dead_relays(
        &mut self,
        relay: &str,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send {
        let _ = relay;
        async { Ok(Vec::new()) }
    }

    /// Deletes up to `limit` rows published more than `older_than` ago; returns how many.
    /// (PostgreSQL's stream mode records no publication time on a row: there a row goes once
    /// it is published and was committed more than `older_than` ago; see `PgRelayStore`.)
    fn cleanup(
        &mut self,
        older_than: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Waits until new rows may be there: a notification (PostgreSQL `LISTEN`) or `timeout`.
    /// The default just sleeps.
    fn wait_for_work(&mut self, timeout: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(timeout)
    }

    /// Database work the store may do while the batch `claim` returned is being published:
    /// the relay calls it once after it starts each publish, and settles that batch when both
    /// have finished. It must change nothing the relay sees but timing: whatever it leaves
    /// undone (an error, a fault) is done by the next call that needs it, which reports the
    /// error. The default does nothing.
    ///
    /// PostgreSQL's stream mode uses it to write the positions of the batch settled last and
    /// to read the rows after the batch in flight (see `PgRelayStore`'s stream notes): without
    /// it the database waits for each publish and the broker for each write.
    fn overlap(&mut self, claim: &Claim<'_>) -> impl Future<Output = ()> + Send {
        let _ = claim;
        async {}
    }

    /// A second handle on the same database, with a connection of its own, on which the relay
    /// settles its batches ([`complete`](RelayStore::complete), [`fail`](RelayStore::fail),
    /// [`release`](RelayStore::release)) while it claims on this one: the next claim and the
    /// last batch's settle then run at the same time, on two server sessions. Called once,
    /// when the relay starts in any mode but [`Mode::Stream`](super::Mode::Stream) (a stream
    /// batch's settle moves the position its next claim starts from). An ordered claim made
    /// while a batch is settled beside it is told which of that batch's rows were published
    /// ([`Claim::settling`]), and must treat them as published. The settler runs nothing but
    /// settles, each fenced by the row leases as ever.
    ///
    /// `None` (the default): the relay settles on this store, between its claims.
    fn settler(&mut self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
}
