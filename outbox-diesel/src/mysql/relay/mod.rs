//! The MySQL/MariaDB relay store: its statements in `sql`, its `RelayStore` methods in
//! `store`, the units of work that run in a transaction in `units`, relay sessions in
//! `sessions`.

pub(crate) mod sessions;
pub(crate) mod sql;
mod store;
mod units;

use std::time::Duration;

use diesel::mysql::Mysql;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, TransactionManager};
use outbox_core::relay::{RelayHealth, RelayIdInUse, StoreError};

use crate::relay::base::{Base, Connector, Source};
use crate::relay::common::CountRow;
use crate::relay::common::Statement;

use sql::{CLEANUP, IS_MARIADB, SESSION_SQL, session_timeouts};

/// [`CLEANUP`] for the events published more than `older_than` (microseconds, clamped to a
/// century) ago, at most `limit`: the store's `cleanup` and the admin API's.
pub(crate) fn cleanup_query(older_than: Duration, limit: i64) -> Statement<Mysql> {
    diesel::sql_query(CLEANUP)
        .into_boxed()
        .bind::<BigInt, _>(crate::relay::common::micros(older_than))
        .bind::<BigInt, _>(limit)
}

/// MySQL's part of the store's connection: the session settings, the server's kind, and
/// the ids of the store's connections, the current and recent ones.
pub(crate) struct MysqlConnector {
    own_connections: Vec<i64>,
    /// Whether the server is MariaDB, once a connection has asked.
    mariadb: Option<bool>,
}

impl Connector for MysqlConnector {
    type Conn = AsyncMysqlConnection;
    const NAME: &'static str = "MySQL";
    const BEAT_ON_CONNECT: &'static str = "take the relay's session lock";

    /// Through [`crate::connect::mysql`], so the URL's `ssl-mode` holds for every connection
    /// the store makes.
    async fn establish(url: &str) -> Result<Self::Conn, StoreError> {
        crate::connect::mysql(url)
            .await
            .map_err(|e| StoreError::new("connect", e))
    }

    async fn configure(
        &mut self,
        conn: &mut Self::Conn,
        timeout: Duration,
    ) -> diesel::QueryResult<()> {
        for sql in SESSION_SQL {
            diesel::sql_query(sql).execute(conn).await?;
        }
        let mariadb = match self.mariadb {
            Some(known) => known,
            None => {
                let row = diesel::sql_query(IS_MARIADB)
                    .get_result::<CountRow>(conn)
                    .await?;
                *self.mariadb.insert(row.n == 1)
            }
        };
        for sql in session_timeouts(timeout, mariadb) {
            diesel::sql_query(sql).execute(conn).await?;
        }
        Ok(())
    }

    /// A call whose future was dropped mid-transaction leaves the connection inside it:
    /// start over rather than run the next unit of work in someone else's transaction.
    fn reusable(conn: &mut Self::Conn) -> bool {
        let status =
            <AsyncMysqlConnection as AsyncConnection>::TransactionManager::transaction_manager_status_mut(conn);
        matches!(status.transaction_depth(), Ok(None))
    }

    async fn heartbeat(
        &mut self,
        conn: &mut Self::Conn,
        relay: &str,
        lease: Duration,
        health: &RelayHealth,
    ) -> diesel::QueryResult<Option<RelayIdInUse>> {
        sessions::heartbeat(conn, relay, lease, health, &mut self.own_connections).await
    }

    async fn reap(conn: &mut Self::Conn, relay: &str) -> diesel::QueryResult<Vec<String>> {
        sessions::reap(conn, relay).await
    }
}

/// The relay store on MySQL 8 and MariaDB ≥ 10.6 (InnoDB): `FOR UPDATE SKIP LOCKED` claims
/// for unordered mode, head-of-line ordered claims fenced by shard or leadership leases for
/// the ordered modes, set-based marks (`IN (?, …)`), and no wake-up notifications: the relay
/// polls at its poll interval.
///
/// Same semantics as `PgRelayStore`, with these differences of means:
///
/// - **Claims are one short transaction**, as MySQL has no `UPDATE … RETURNING`:
///   `SELECT seq … ORDER BY seq LIMIT n FOR UPDATE [SKIP LOCKED]` (with the same conditions
///   as PostgreSQL's claim, the shard-lease and leadership checks included), `UPDATE … WHERE
///   seq IN (…)` on exactly the rows it locked (checking the shard or leadership lease
///   again, see below), `SELECT` them back, `COMMIT`. Nothing else happens inside that
///   transaction, and no transaction is ever open across a publish.
/// - **Times are the database's clock in UTC**: `UTC_TIMESTAMP(6)` and
///   `+ INTERVAL ? MICROSECOND`; the `DATETIME(6)` columns hold naive UTC, whatever the
///   session's `time_zone`.
/// - **Sessions run at `READ COMMITTED`** with `innodb_lock_wait_timeout = 10`, so that a
///   locking read neither takes gap locks nor keeps the rows it only scanned past.
/// - **Leadership is a lease row** in `outbox_leader` (`INSERT … ON DUPLICATE KEY UPDATE`
///   that takes the row if it is ours or expired, then a read of who holds it, in one
///   transaction), not `GET_LOCK`. `GET_LOCK` belongs to the server session that took it:
///   it is lost silently when a pooler or proxy hands the relay another server connection,
///   and released when the relay reconnects after an error; and as long as that session
///   lives it never expires, so a hung leader whose connection stays open keeps it. Fencing
///   needs the lease where the claim can read it, from whatever connection it runs on: the
///   lease row is on the database clock, survives reconnects, and the ordered claim checks
///   it in its own statements, which is what fences a deposed leader.
/// - **Failures** are recorded with one `UPDATE` per failed row, in one transaction.
/// - **Shard rebalancing** is pg.rs's algorithm: the heartbeat and the removal of long-dead
///   relays as statements of their own, then the count of live relays, the renewal, and
///   giving up surplus or taking free shards (`FOR UPDATE SKIP LOCKED`) in one transaction.
///
/// **Ordered modes and InnoDB locking.** The ordering guarantee is PostgreSQL's, but InnoDB
/// gets there differently, and it costs more waiting:
///
/// - InnoDB locks every row a locking read examines *before* the conditions outside the
///   index (shard, lease, head-of-line) are tested, and lets go of the rejected ones at once
///   (`READ COMMITTED`). An ordered claim therefore cannot use `SKIP LOCKED`: another
///   relay scanning past the head of an aggregate holds its lock for an instant, and a claim
///   that skipped it would take the aggregate's next event. So ordered claims wait for
///   every lock on a pending row they scan in `seq` order, in any shard: other relays'
///   claims and marks in flight (milliseconds).
/// - InnoDB's locking reads also wait for *uncommitted inserts*. An ordered claim that
///   reaches a row an application transaction has inserted but not committed waits for that
///   transaction, up to `innodb_lock_wait_timeout` (10 s; then the claim fails, and the
///   relay backs off and retries). A long application transaction that writes to the outbox
///   thus stalls the ordered relays; PostgreSQL's claim does not see uncommitted rows and
///   does not wait. (The other side of it: a MariaDB ordered claim never overtakes an
///   earlier event whose transaction commits late.) Unordered claims skip such rows.
/// - The `SELECT`'s checks (leases, head-of-line) are as of its start: its clock is
///   `UTC_TIMESTAMP(6)` at the statement's start, and its subqueries are consistent reads.
///   A claim that waited long enough for its shard or leadership lease to run out and pass
///   to another relay could otherwise claim rows of an aggregate the other relay is already
///   publishing. So the `UPDATE` that leases the locked rows checks the shard or leadership
///   lease again, on a fresh clock and snapshot, and if it cannot lease every locked row the
///   whole claim is rolled back and returns nothing. What remains is the instant between
///   that `UPDATE` and the `COMMIT`, as on PostgreSQL, where the claim is one statement.
///
/// ```no_run
/// # async fn run() -> Result<(), outbox_core::relay::StoreError> {
/// use outbox_diesel::relay::MysqlRelayStore;
/// let mut store = MysqlRelayStore::new("mysql://relay@127.0.0.1/app");
/// store.connect().await?; // optional: report a bad URL at start-up
/// # Ok(())
/// # }
/// ```
pub struct MysqlRelayStore {
    base: Base<MysqlConnector>,
}

impl MysqlRelayStore {
    /// A store for the database at `url` (`mysql://user:password@host:port/database`); it
    /// connects on first use and after errors.
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_source(Source::Url(url.into()))
    }

    /// A store whose every connection comes from `connect`, the application's own connection
    /// setup (custom TLS roots, an IAM token fetched per connection, …): the first one and
    /// each one after an error. The store's session settings still run on each. An error of
    /// `connect` is an outage, as a refused connection is: the relay waits and retries, and
    /// reports it with the error's text.
    ///
    /// ```no_run
    /// use diesel_async::{AsyncConnection, AsyncMysqlConnection};
    /// use outbox_diesel::relay::MysqlRelayStore;
    ///
    /// let store = MysqlRelayStore::from_connect(|| async {
    ///     let token = "…"; // e.g. a fresh IAM token as the password of each connection
    ///     AsyncMysqlConnection::establish(&format!("mysql://relay:{token}@db.internal/app")).await
    /// });
    /// ```
    pub fn from_connect<F, Fut, E>(connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<AsyncMysqlConnection, E>> + Send + 'static,
        E: Into<outbox_core::BoxError>,
    {
        Self::with_source(Source::factory(connect))
    }

    /// A store whose connection comes from the application's deadpool `pool`: it is taken
    /// from the pool and detached from it ([`Object::take`]), since the relay holds its
    /// connection for its whole life; the pool then opens a replacement for its other users.
    /// A connection lost later is replaced by another taken from the pool. For a bb8 pool,
    /// see [`from_bb8`](Self::from_bb8).
    ///
    /// [`Object::take`]: diesel_async::pooled_connection::deadpool::Object::take
    ///
    /// ```no_run
    /// use diesel_async::AsyncMysqlConnection;
    /// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    /// use diesel_async::pooled_connection::deadpool::Pool;
    /// use outbox_diesel::relay::MysqlRelayStore;
    ///
    /// let manager = AsyncDieselConnectionManager::<AsyncMysqlConnection>::new("mysql://app@db/app");
    /// let pool = Pool::builder(manager).max_size(16).build().expect("a pool");
    /// let store = MysqlRelayStore::from_pool(pool.clone());
    /// ```
    pub fn from_pool(
        pool: diesel_async::pooled_connection::deadpool::Pool<AsyncMysqlConnection>,
    ) -> Self {
        Self::from_connect(move || {
            let pool = pool.clone();
            async move {
                let conn = pool.get().await?;
                Ok::<_, outbox_core::BoxError>(
                    diesel_async::pooled_connection::deadpool::Object::take(conn),
                )
            }
        })
    }

    /// A store whose connections come from the application's bb8 `pool`, opened by the
    /// pool's manager (with its setup) but never checked into the pool
    /// ([`dedicated_connection`]): bb8 cannot hand a pooled connection over for good, and the
    /// relay holds its connections for its whole life. The pool's own connections are left to
    /// the application.
    ///
    /// [`dedicated_connection`]: diesel_async::pooled_connection::bb8::Pool::dedicated_connection
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel_async::AsyncMysqlConnection;
    /// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    /// use diesel_async::pooled_connection::bb8::Pool;
    /// use outbox_diesel::relay::MysqlRelayStore;
    ///
    /// let manager = AsyncDieselConnectionManager::<AsyncMysqlConnection>::new("mysql://app@db/app");
    /// let pool = Pool::builder().max_size(16).build(manager).await?;
    /// let store = MysqlRelayStore::from_bb8(pool.clone());
    /// # Ok(()) }
    /// ```
    pub fn from_bb8(
        pool: diesel_async::pooled_connection::bb8::Pool<AsyncMysqlConnection>,
    ) -> Self {
        Self::from_connect(move || {
            let pool = pool.clone();
            async move { pool.dedicated_connection().await }
        })
    }

    /// A store on connections from `source`.
    fn with_source(source: Source<AsyncMysqlConnection>) -> Self {
        MysqlRelayStore {
            base: Base::new(
                source,
                MysqlConnector {
                    own_connections: Vec::new(),
                    mariadb: None,
                },
            ),
        }
    }

    /// Connects now (otherwise the first call does), so that a bad URL or an unreachable
    /// server is reported at start-up.
    pub async fn connect(&mut self) -> Result<(), StoreError> {
        self.base.conn().await.map(|_| ())
    }
}
