//! Operating the outbox: status, dead letters, replay and cleanup, on every backend.
//!
//! [`Admin`] wraps one diesel-async connection (`AsyncPgConnection`,
//! `AsyncMysqlConnection`, or `SyncConnectionWrapper<SqliteConnection>`) and runs each
//! operation as short statements of that backend's own SQL (in `pg/admin.rs`, `mysql/admin.rs`,
//! `sqlite/admin.rs`). Nothing here holds a lock across statements, so an operator can run it next
//! to live relays.
//!
//! - [`Admin::status`]: counts by state, the oldest pending event, aggregates blocked behind
//!   a dead letter, the relays with their state and shards, the leader.
//! - [`Admin::dead_letters`], [`Admin::retry_dead`], [`Admin::purge_dead`]: dead letters,
//!   selected by a [`Filter`].
//! - [`Admin::replay`]: publish already published events again, with their original ids.
//! - [`Admin::cleanup`]: retention, in bounded batches.
//!
//! ```no_run
//! # async fn run() -> Result<(), outbox_diesel::relay::admin::AdminError> {
//! use diesel_async::{AsyncConnection, AsyncPgConnection};
//! use outbox_diesel::relay::admin::{Admin, Filter};
//! let conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1/app").await?;
//! let mut admin = Admin::new(conn);
//! let status = admin.status().await?;
//! println!("{} pending, {} dead", status.pending, status.dead);
//! // Free every dead letter of one aggregate: its later events follow in order.
//! let filter = Filter { aggregate_type: Some("order".into()), aggregate_id: Some("42".into()), ..Filter::default() };
//! admin.retry_dead(&filter).await?;
//! # Ok(()) }
//! ```

pub(crate) mod connection;
pub(crate) mod types;

pub use connection::AdminConnection;
pub use types::{
    AdminError, DeadLetter, Filter, OpenTransaction, RelayInfo, RingStatus, Rotated, Sample,
    Status, StreamStatus,
};

use std::time::Duration;

/// Rows per retention batch of [`Admin::cleanup`] by default: no statement near one second
/// on any backend (ten times as many take MariaDB's slowest batch to about two seconds).
/// Measured: `docs/design/mysql-sqlite.md`, section "The default retention batch".
pub const DEFAULT_CLEANUP_BATCH: usize = 1_000;

/// Rows per replay batch of [`Admin::replay`] by default.
pub const DEFAULT_REPLAY_BATCH: usize = 10_000;

/// The admin operations over one connection. See the [module docs](self).
pub struct Admin<C> {
    pub(crate) conn: C,
}

impl<C: AdminConnection> Admin<C> {
    /// Admin operations over `conn` (the outbox's migrations must have run).
    ///
    /// The connection may come from the application's own setup or pool. A deadpool
    /// connection is detached from its pool with `Object::take` (the pool opens a replacement
    /// for its other users, and this one closes when the `Admin` is dropped); from a bb8 pool,
    /// take `Pool::dedicated_connection`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    /// use diesel_async::pooled_connection::deadpool::{Object, Pool};
    /// use outbox_diesel::relay::admin::Admin;
    ///
    /// let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new("postgres://app@db/app");
    /// let pool = Pool::builder(manager).build()?;
    /// let mut admin = Admin::new(Object::take(pool.get().await?));
    /// println!("{} pending", admin.status().await?.pending);
    /// # Ok(()) }
    /// ```
    pub fn new(conn: C) -> Self {
        Admin { conn }
    }

    /// The connection back.
    pub fn into_inner(self) -> C {
        self.conn
    }

    /// The outbox's state: see [`Status`].
    pub async fn status(&mut self) -> Result<Status, AdminError> {
        self.conn.admin_status().await
    }

    /// The figures a metrics sampler needs ([`Sample`]: pending, the oldest pending event's
    /// age, dead letters, blocked aggregates, stream mode's state), cheaply and bounded: only
    /// index lookups of pending and dead rows (never the published rows, which the full
    /// [`status`](Self::status) counts), each statement cancelled after `timeout` (PostgreSQL
    /// `SET LOCAL statement_timeout` in a transaction of its own; MariaDB
    /// `max_statement_time`, MySQL `MAX_EXECUTION_TIME`; SQLite has none). A timed-out sample
    /// is an [`AdminError::Database`]: skip it and sample again later.
    pub async fn sample(&mut self, timeout: Duration) -> Result<Sample, AdminError> {
        self.conn.admin_sample(timeout).await
    }

    /// Dead letters (`dead_at` set, not published) matching `filter`, in `seq` order: at most
    /// `limit`, after `after_seq` (pass the last `seq` of a page to get the next page). On
    /// PostgreSQL, stream mode's dead letters too (in `outbox_stream_dead_letters`:
    /// [`DeadLetter::stream`]; one whose retry waits for a stream relay has
    /// [`DeadLetter::retry_requested_at`]); the events parked behind them are not dead letters.
    pub async fn dead_letters(
        &mut self,
        filter: &Filter,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, AdminError> {
        filter.validate()?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.conn.admin_dead(filter, after_seq, limit).await
    }

    /// How many dead letters (`dead`) or published events (`!dead`) match `filter`: what
    /// [`retry_dead`](Self::retry_dead) / [`purge_dead`](Self::purge_dead) or
    /// [`replay`](Self::replay) would touch now (stream mode's dead letters whose retry is
    /// asked for already are counted: a purge deletes them, a retry leaves them as they are).
    pub async fn count(&mut self, filter: &Filter, dead: bool) -> Result<i64, AdminError> {
        filter.validate()?;
        self.conn.admin_count(filter, dead).await
    }

    /// Makes the dead letters matching `filter` pending again: `attempts = 0`,
    /// `dead_at = NULL`, `available_at = now`, lease cleared; `last_error` is kept (the
    /// last failure stays visible until the next one). In ordered modes the aggregate's
    /// later events then follow it, in order. Stream mode's dead letters (PostgreSQL) stay
    /// where they are with `retry_requested_at` set and `attempts = 0` (those asked for
    /// already are left as they are): the stream relay holding their shard then publishes
    /// each, and its aggregate's parked events after it, in order. Both kinds in one
    /// transaction. Returns how many dead letters were retried.
    pub async fn retry_dead(&mut self, filter: &Filter) -> Result<u64, AdminError> {
        filter.validate()?;
        self.conn.admin_retry(filter).await
    }

    /// Deletes the dead letters matching `filter` (only dead rows: never a pending or
    /// published one). In ordered modes the aggregate's later events then move on without
    /// them. Stream mode's dead letters (PostgreSQL) are deleted from
    /// `outbox_stream_dead_letters`, never the events parked behind them: the stream relay
    /// then publishes those, in order. Both kinds in one transaction. Returns how many dead
    /// letters were deleted.
    pub async fn purge_dead(&mut self, filter: &Filter) -> Result<u64, AdminError> {
        filter.validate()?;
        self.conn.admin_purge(filter).await
    }

    /// Makes the published events matching `filter` pending again (`published_at = NULL`,
    /// `attempts = 0`, `available_at = now`), in batches of `batch` rows in `seq` order, so
    /// that the relay publishes them again with their original ids (idempotent consumers
    /// see duplicates and skip them). `progress` is called with the running total after each
    /// batch. Returns how many rows were replayed.
    ///
    /// Order: a replayed event keeps its `seq`. In ordered modes it is published before any
    /// *pending* event of its aggregate with a higher `seq` (those wait behind it, as behind
    /// any earlier pending event); events of the aggregate that were already published are
    /// not sent again unless selected too, so a consumer sees the replayed event after them.
    /// Rows deleted by `Completion::Delete` or retention cannot be replayed.
    pub async fn replay(
        &mut self,
        filter: &Filter,
        batch: usize,
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<u64, AdminError> {
        filter.validate()?;
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut after = i64::MIN;
        let mut total = 0u64;
        loop {
            let Some(last) = self.conn.admin_replay_bound(filter, after, batch).await? else {
                return Ok(total);
            };
            total += self.conn.admin_replay(filter, after, last).await?;
            progress(total);
            after = last;
        }
    }

    /// Empties the partitions of a partitioned table (PostgreSQL, `partition_events`) whose
    /// rows are all past every stream position and committed more than `keep` ago, one
    /// `TRUNCATE` each, and returns them; nothing elsewhere. [`Admin::cleanup`] and the
    /// relay's retention run it after they delete (the delete records the tick by which a
    /// stream row's age is known).
    pub async fn rotate_partitions(&mut self, keep: Duration) -> Result<Vec<Rotated>, AdminError> {
        self.conn.admin_rotate(keep).await
    }

    /// Deletes published events older than `older_than` (by `published_at`; on PostgreSQL
    /// also those stream mode published, by their commit: see `PgRelayStore`; then a partitioned
    /// table's partitions are emptied, see [`Admin::rotate_partitions`]), `batch` rows
    /// per statement (each a short transaction of its own) until none is left; `progress`
    /// is called with the running total after each batch. Returns how many rows were
    /// deleted. The relay's own `Retention` runs the same statement.
    pub async fn cleanup(
        &mut self,
        older_than: Duration,
        batch: usize,
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<u64, AdminError> {
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut total = 0u64;
        loop {
            let n = self.conn.admin_cleanup(older_than, batch).await?;
            total += n;
            if n > 0 {
                progress(total);
            }
            if n < batch as u64 {
                self.rotate_partitions(older_than).await?;
                return Ok(total);
            }
        }
    }
}
