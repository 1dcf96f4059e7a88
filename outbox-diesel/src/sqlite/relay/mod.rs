//! The SQLite relay store: its statements in `sql`, its `RelayStore` methods in `store`.

pub(crate) mod sql;
mod store;

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::SqliteConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::sqlite::Sqlite;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use outbox_core::relay::StoreError;

use crate::relay::base::{Base, Connector, Source};
use crate::relay::common::MAX_INTERVAL;
use crate::relay::common::Statement;
use crate::sqlite::sqlite_timestamp;

use sql::{CLEANUP, SESSION_SQL, busy_timeout};

/// [`CLEANUP`] with its parameters bound (the cut-off on the caller's clock, now): the
/// store's `cleanup` and the admin API's.
pub(crate) fn cleanup_query(older_than: Duration, limit: i64) -> Statement<Sqlite> {
    diesel::sql_query(CLEANUP)
        .into_boxed()
        .bind::<Text, _>(before(Utc::now(), older_than))
        .bind::<BigInt, _>(limit)
}

/// SQLite's part of the store's connection: the session settings. SQLite records no relay
/// sessions (it runs in the relay's process).
pub(crate) struct SqliteConnector;

impl Connector for SqliteConnector {
    type Conn = SyncConnectionWrapper<SqliteConnection>;
    const NAME: &'static str = "SQLite";

    async fn configure(
        &mut self,
        conn: &mut Self::Conn,
        timeout: Duration,
    ) -> diesel::QueryResult<()> {
        let sql = format!("{} {SESSION_SQL}", busy_timeout(timeout));
        conn.spawn_blocking(move |c| diesel::connection::SimpleConnection::batch_execute(c, &sql))
            .await
    }
}

/// `at + d` as stored (`d` clamped to a century).
pub(super) fn after(at: DateTime<Utc>, d: Duration) -> String {
    let d = chrono::Duration::from_std(d.min(MAX_INTERVAL)).unwrap_or(chrono::Duration::MAX);
    sqlite_timestamp(at.checked_add_signed(d).unwrap_or(at))
}

/// `at - d` as stored (`d` clamped to a century).
pub(super) fn before(at: DateTime<Utc>, d: Duration) -> String {
    let d = chrono::Duration::from_std(d.min(MAX_INTERVAL)).unwrap_or(chrono::Duration::MAX);
    sqlite_timestamp(at.checked_sub_signed(d).unwrap_or(at))
}

/// The relay store on SQLite: one `UPDATE … WHERE seq IN (SELECT …) RETURNING …` per claim
/// (SQLite ≥ 3.35; the bundled library is newer), with the same conditions as PostgreSQL's
/// in every mode, set-based marks (`IN (?, …)`), and no wake-up notifications: the relay
/// polls at its poll interval.
///
/// **SQLite is for one relay.** It has one writer at a time for the whole database, so
/// several relays on one file take turns rather than work in parallel (and compete with the
/// application's writes). Every mode works, and several relays stay correct (each waits
/// for the lock up to `busy_timeout`, 5 s or a third of the lease if shorter, then fails the
/// call and retries), but a second relay only makes sense as a standby in leader mode.
/// The application's own connections need a `PRAGMA busy_timeout` too (SQLite's default is
/// 0): without one, a write that meets the relay's claim or mark fails at once with
/// "database is locked" instead of waiting the few milliseconds that statement takes.
///
/// Differences of means from `PgRelayStore`:
///
/// - **Times are the relay's clock**, not the database's: SQLite runs in-process. They are
///   computed in Rust and bound in the stored format, `YYYY-MM-DD HH:MM:SS.ffffff` UTC
///   (six fraction digits, so text order is time order); SQLite's own `datetime('now')` is
///   never compared with them, as its text has another format. Relays sharing one file are
///   on one host, so they share that clock.
/// - **No row locks**: a statement runs alone on the database, so a claim cannot race
///   another. Its `now` is taken before it waits for the write lock; a late clock only makes
///   leases and backoffs look longer, and the statement reads the database as it is once it
///   runs, so a lease another relay took meanwhile is seen. Multi-statement units (shard rebalance, failures, release on shutdown) run in
///   `BEGIN IMMEDIATE` transactions, which take the write lock up front: a deferred
///   transaction that read first could fail to upgrade, and SQLite reports that at once
///   instead of waiting.
/// - **The connection** runs with `journal_mode = WAL` and `PRAGMA busy_timeout` at 5 s,
///   or a third of the relay's lease if that is shorter (SQLite has no statement timeout).
///   Each call runs on Tokio's blocking pool (diesel-async's `SyncConnectionWrapper`), and
///   a call's unit of work runs to its end even if the relay stops waiting for it. Dropping
///   a running relay's future while a call is in flight (killing it, e.g. by `select!` or
///   `timeout`) waits for that call in place, which needs Tokio's multi-threaded runtime:
///   on a current-thread runtime diesel-async panics there ("can call blocking only when
///   running on the multi-threaded runtime"). On a current-thread runtime stop the relay
///   through its shutdown future, which finishes the call first.
///
/// The database must be a file (or a shared-cache URI): `:memory:` would give the store a
/// database of its own, without the application's outbox.
///
/// ```
/// # include!("../../doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use diesel::Connection;
/// use outbox_core::relay::{MemoryBroker, Relay, RelayConfig};
/// use outbox_diesel::OutboxConnection;
/// use outbox_diesel::relay::SqliteRelayStore;
///
/// let dir = std::env::temp_dir().join(format!("outbox-sqlite-relay-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("app.db").to_string_lossy().into_owned();
///
/// // The application commits an event with its business rows.
/// let mut conn = diesel::SqliteConnection::establish(&path)?;
/// outbox_diesel::migrations::run(&mut conn)?;
/// conn.transaction_with_outbox(|tx| {
///     tx.publish(&OrderCreated { order_id: 1, total_cents: 1250 })?;
///     Ok::<_, outbox_diesel::Error>(())
/// })?;
///
/// // The relay publishes it, then shuts down gracefully.
/// let broker = Arc::new(MemoryBroker::new());
/// let config = RelayConfig { poll_interval: Duration::from_millis(20), ..RelayConfig::default() };
/// let relay = Relay::new(SqliteRelayStore::new(&path), broker.clone(), config)?;
/// let published = broker.clone();
/// relay
///     .run(async move {
///         while published.all_records().is_empty() {
///             tokio::time::sleep(Duration::from_millis(10)).await;
///         }
///     })
///     .await;
/// assert_eq!(broker.records("order").len(), 1);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
pub struct SqliteRelayStore {
    base: Base<SqliteConnector>,
}

impl SqliteRelayStore {
    /// A store for the database at `url` (a file path, or a `file:` URI); it connects on
    /// first use and after errors.
    pub fn new(url: impl Into<String>) -> Self {
        SqliteRelayStore {
            base: Base::new(Source::Url(url.into()), SqliteConnector),
        }
    }

    /// Connects now (otherwise the first call does), so that an unusable path is reported
    /// at start-up.
    pub async fn connect(&mut self) -> Result<(), StoreError> {
        self.base.conn().await.map(|_| ())
    }

    /// Runs `f` on the connection in Tokio's blocking pool. After an error the connection is
    /// dropped and the next call reconnects.
    async fn run<T: Send + 'static>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&mut SqliteConnection) -> diesel::QueryResult<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.base.conn().await?;
        let r = conn.spawn_blocking(f).await;
        self.base.check(op, r).await
    }
}
