//! The PostgreSQL relay store: its statements in `sql`, its `RelayStore` methods in `store`,
//! relay sessions in `sessions`.

pub(crate) mod handover;
mod lease;
mod listener;
pub(crate) mod partition;
pub(crate) mod sessions;
mod shards;
pub(crate) mod sql;
mod store;
pub(crate) mod stream;

use std::time::Duration;

use diesel::QueryableByName;
use diesel::pg::Pg;
use diesel::sql_types::{BigInt, Double, Timestamptz};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use outbox_core::relay::{OutboxMessage, RelayHealth, RelayIdInUse, StoreError};

use crate::relay::base::{Base, Connector, Source};
use crate::relay::common::Statement;
use crate::relay::common::{ClaimedColumns, CreatedAt, Malformed};

use sql::{APPLICATION_NAME_SQL, ASYNC_COMMIT_SQL, CLEANUP, SESSION_SQL};

/// [`CLEANUP`] for the events published more than `older_than` (seconds) ago, at most
/// `limit`: the store's `cleanup` and the admin API's.
pub(crate) fn cleanup_query(older_than: Duration, limit: i64) -> Statement<Pg> {
    diesel::sql_query(CLEANUP)
        .into_boxed()
        .bind::<Double, _>(crate::relay::common::secs(older_than))
        .bind::<BigInt, _>(limit)
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(embed)]
    columns: ClaimedColumns,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: uuid::Uuid,
    #[diesel(sql_type = Timestamptz)]
    created_at: CreatedAt,
}

impl Row {
    fn into_message(self) -> Result<OutboxMessage, Malformed> {
        self.columns.into_message(Ok(self.id), self.created_at)
    }
}

/// What a relay connection runs first: [`SESSION_SQL`], [`APPLICATION_NAME_SQL`] if
/// `name_session`, the statement timeout, and [`ASYNC_COMMIT_SQL`] unless
/// `synchronous_commit`.
fn session_sql(timeout: Duration, synchronous_commit: bool, name_session: bool) -> String {
    let commit = if synchronous_commit {
        ""
    } else {
        ASYNC_COMMIT_SQL
    };
    let name = if name_session {
        format!("{APPLICATION_NAME_SQL}; ")
    } else {
        String::new()
    };
    format!(
        "{SESSION_SQL}; {name}SET statement_timeout = {}; {commit}",
        timeout.as_millis()
    )
}

/// What begins a unit of work's transaction behind a transaction pooler: the settings of
/// [`session_sql`] (but `application_name`, which PgBouncer keeps per client), local to the
/// transaction.
fn local_sql(timeout: Duration, synchronous_commit: bool) -> String {
    let commit = if synchronous_commit {
        ""
    } else {
        "SET LOCAL synchronous_commit = off; "
    };
    format!(
        "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL jit = off; \
         SET LOCAL statement_timeout = {}; {commit}",
        timeout.as_millis()
    )
}

/// PostgreSQL's part of the store's connection: the session settings, and the session the
/// last heartbeat recorded.
pub(crate) struct PgConnector {
    session: Option<sessions::Session>,
    /// Keep the server's `synchronous_commit` for the relay's writes (see
    /// [`ASYNC_COMMIT_SQL`]).
    synchronous_commit: bool,
    /// Set `application_name` (not for the application's own factory: its name is kept).
    name_session: bool,
    /// Behind a transaction pooler ([`PgRelayStore::transaction_pooler`]).
    pooler: bool,
}

impl Connector for PgConnector {
    type Conn = AsyncPgConnection;
    const NAME: &'static str = "PostgreSQL";

    /// Through [`crate::connect::postgres`], so the URL's TLS parameters hold for every
    /// connection the store makes.
    async fn establish(url: &str) -> Result<Self::Conn, StoreError> {
        crate::connect::postgres(url)
            .await
            .map_err(|e| StoreError::new("connect", e))
    }

    /// Through [`crate::connect::postgres_pooled`]: nothing prepared outside a transaction.
    async fn establish_pooled(url: &str) -> Result<Self::Conn, StoreError> {
        crate::connect::postgres_pooled(url)
            .await
            .map_err(|e| StoreError::new("connect", e))
    }

    /// Behind a transaction pooler nothing is set on the session (see [`Self::begin`]), and
    /// no statement is kept prepared: a server connection other than the one a statement was
    /// prepared on may run the next transaction.
    async fn configure(
        &mut self,
        conn: &mut Self::Conn,
        timeout: Duration,
    ) -> diesel::QueryResult<()> {
        if self.pooler {
            use diesel_async::AsyncConnection;
            conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
            return Ok(());
        }
        conn.batch_execute(&session_sql(
            timeout,
            self.synchronous_commit,
            self.name_session,
        ))
        .await
    }

    fn per_transaction(&self) -> bool {
        self.pooler
    }

    /// `BEGIN` and the session's settings as `SET LOCAL`, in one round trip.
    async fn begin(&mut self, conn: &mut Self::Conn, timeout: Duration) -> diesel::QueryResult<()> {
        conn.batch_execute(&local_sql(timeout, self.synchronous_commit))
            .await
    }

    async fn commit(conn: &mut Self::Conn) -> diesel::QueryResult<()> {
        conn.batch_execute("COMMIT").await
    }

    async fn heartbeat(
        &mut self,
        conn: &mut Self::Conn,
        relay: &str,
        lease: Duration,
        health: &RelayHealth,
    ) -> diesel::QueryResult<Option<RelayIdInUse>> {
        // Behind a transaction pooler a server session is no relay's: none is recorded, and
        // the lease is the only rule.
        let untracked;
        let health = if self.pooler && health.track_session {
            untracked = RelayHealth {
                track_session: false,
                ..health.clone()
            };
            &untracked
        } else {
            health
        };
        match sessions::heartbeat(conn, relay, lease, health, self.session.as_ref()).await? {
            sessions::Beat::Ours(session) => {
                self.session = Some(session);
                Ok(None)
            }
            sessions::Beat::InUse(conflict) => Ok(Some(conflict)),
        }
    }

    async fn reap(conn: &mut Self::Conn, relay: &str) -> diesel::QueryResult<Vec<String>> {
        sessions::reap(conn, relay).await
    }
}

/// The relay store on PostgreSQL: `FOR UPDATE SKIP LOCKED` claims for unordered mode,
/// head-of-line ordered claims fenced by shard or leadership leases for the ordered modes,
/// set-based marks (`= ANY($seqs)`, `unnest` for failures), and `LISTEN outbox_events` on a
/// second connection to wake up early.
///
/// Retention (`cleanup`) deletes the rows a lease mode marked published more than the
/// retention ago, and the rows stream mode published (its shards' positions passed them)
/// whose transaction committed more than the retention ago. Stream mode records no time on
/// a row, so each cleanup records a tick (the time and the snapshot, at most one a second,
/// in `outbox_stream_ticks`) and goes by the newest tick at least the retention old: a stream
/// row is deleted up to a cleanup interval later than its age alone would allow, never
/// earlier. A transaction left open keeps only its own rows.
///
/// ```no_run
/// # async fn run() {
/// use outbox_diesel::relay::PgRelayStore;
/// let store = PgRelayStore::new("postgres://postgres@127.0.0.1/app");
/// # }
/// ```
pub struct PgRelayStore {
    base: Base<PgConnector>,
    listener: Option<listener::Listener>,
    listen: bool,
    /// Whether the relay settles on a connection of its own ([`PgRelayStore::settle_beside`]).
    settle_beside: bool,
    /// The lease modes' store (unordered, leader, sharded).
    lease: lease::LeaseStore,
    /// Stream mode's store, from the relay's first stream claim on (a relay runs in one mode,
    /// told by its claims; before the first claim the two do the same: a shard rebalance owes
    /// no position and drops no rows read ahead).
    stream: Option<stream::StreamStore>,
    /// Stream mode: rows a claim reads at least ([`PgRelayStore::stream_read_ahead`]).
    read_ahead: usize,
}

impl PgRelayStore {
    /// A store for the database at `url`; it connects on first use and after errors.
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_source(Source::Url(url.into()))
    }

    /// A store whose every connection comes from `connect`, the application's own connection
    /// setup (custom TLS roots, an IAM token fetched per connection, …): the first one, each
    /// one after an error, the `LISTEN` connection and the settler's. The store's session
    /// settings still run on each. An error of `connect` is an outage, as a refused
    /// connection is: the relay waits and retries, and reports it with the error's text.
    ///
    /// ```no_run
    /// use diesel_async::{AsyncConnection, AsyncPgConnection};
    /// use outbox_diesel::relay::PgRelayStore;
    ///
    /// let store = PgRelayStore::from_connect(|| async {
    ///     // e.g. a fresh IAM token as the password of each connection
    ///     let token = "…";
    ///     AsyncPgConnection::establish(&format!(
    ///         "postgres://relay:{token}@db.internal/app?application_name=relay"
    ///     ))
    ///     .await
    /// });
    /// ```
    pub fn from_connect<F, Fut, E>(connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<AsyncPgConnection, E>> + Send + 'static,
        E: Into<outbox_core::BoxError>,
    {
        Self::with_source(Source::factory(connect))
    }

    /// A store whose connections come from the application's deadpool `pool`: each one is
    /// taken from the pool and detached from it ([`Object::take`]), since the relay holds its
    /// connections for its whole life (two or three, see [`settle_beside`]); the pool then
    /// opens replacements for its other users. A connection lost later is replaced by
    /// another taken from the pool. For a bb8 pool, see [`from_bb8`](Self::from_bb8).
    ///
    /// [`Object::take`]: diesel_async::pooled_connection::deadpool::Object::take
    /// [`settle_beside`]: Self::settle_beside
    ///
    /// ```no_run
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    /// use diesel_async::pooled_connection::deadpool::Pool;
    /// use outbox_diesel::relay::PgRelayStore;
    ///
    /// let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new("postgres://app@db/app");
    /// let pool = Pool::builder(manager).max_size(16).build().expect("a pool");
    /// let store = PgRelayStore::from_pool(pool.clone());
    /// ```
    pub fn from_pool(
        pool: diesel_async::pooled_connection::deadpool::Pool<AsyncPgConnection>,
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
    /// use diesel_async::AsyncPgConnection;
    /// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    /// use diesel_async::pooled_connection::bb8::Pool;
    /// use outbox_diesel::relay::PgRelayStore;
    ///
    /// let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new("postgres://app@db/app");
    /// let pool = Pool::builder().max_size(16).build(manager).await?;
    /// let store = PgRelayStore::from_bb8(pool.clone());
    /// # Ok(()) }
    /// ```
    pub fn from_bb8(pool: diesel_async::pooled_connection::bb8::Pool<AsyncPgConnection>) -> Self {
        Self::from_connect(move || {
            let pool = pool.clone();
            async move { pool.dedicated_connection().await }
        })
    }

    /// A store on connections from `source`.
    fn with_source(source: Source<AsyncPgConnection>) -> Self {
        let name_session = matches!(source, Source::Url(_));
        PgRelayStore {
            base: Base::new(
                source,
                PgConnector {
                    session: None,
                    synchronous_commit: false,
                    name_session,
                    pooler: false,
                },
            ),
            listener: None,
            listen: true,
            settle_beside: true,
            lease: lease::LeaseStore::default(),
            stream: None,
            read_ahead: stream::READ_AHEAD,
        }
    }

    /// Whether the relay settles its batches (marks, failures, releases) on a connection of
    /// its own, beside the next claim on this one (default `true`; every mode but stream, see
    /// [`RelayStore::settler`](outbox_core::relay::RelayStore::settler)). A relay then holds
    /// three connections: this one, the settler's, and the listener's (unless
    /// [`listen(false)`](Self::listen)); `false` keeps it to two, settling between claims.
    ///
    /// ```no_run
    /// # use outbox_diesel::relay::PgRelayStore;
    /// let store = PgRelayStore::new("postgres://postgres@127.0.0.1/app").settle_beside(false);
    /// ```
    pub fn settle_beside(mut self, on: bool) -> Self {
        self.settle_beside = on;
        self
    }

    /// Stream mode: how many rows a claim reads at least (default
    /// [`PG_STREAM_READ_AHEAD`](crate::relay::PG_STREAM_READ_AHEAD), 3,000; at most the batch
    /// size, such as 0, reads one batch a claim). The rows past the batch are held in memory,
    /// with their payloads (lower it where payloads are large), and handed out a batch at a
    /// time by the next claims, which run no statement. A stream claim costs about as much
    /// for 100 rows as for 1,000 (one index descent per held shard, and a delta that one
    /// writer's transaction spread over every shard is read whole by each claim), so reading
    /// ahead makes small batches cost what large ones do. The positions still advance once
    /// per batch, fenced as ever. The rows read ahead are dropped, and read again from the
    /// positions, once a batch has an event that was not published (a failure, a dead letter,
    /// an outage), when dead letters are released, and once they were read a quarter of the
    /// lease ago.
    ///
    /// ```no_run
    /// # use outbox_diesel::relay::PgRelayStore;
    /// let store = PgRelayStore::new("postgres://postgres@127.0.0.1/app").stream_read_ahead(0);
    /// ```
    pub fn stream_read_ahead(mut self, rows: usize) -> Self {
        self.read_ahead = rows;
        self
    }

    /// The longest any statement of the store may run, at most (PostgreSQL's
    /// `statement_timeout`). Without it the store takes a third of the relay's lease (10 s
    /// before the first call that carries it); with it, the shorter of the two. The relay
    /// renews its shard or leadership lease every third of a lease, so a claim that cannot
    /// outlast that never acts on a lease that ran out while it waited for a lock: the store
    /// keeps to it whatever is set here.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.base.timeout.explicit = Some(timeout.max(Duration::from_millis(1)));
        self
    }

    /// Whether the relay's own writes (claims, marks, leases, stream positions) wait for
    /// their WAL flush (default `false`: `SET synchronous_commit = off` in the store's
    /// session). A crash of the server may then lose the last fraction of a second of them,
    /// which costs duplicates, never an event nor order; `true` trades that for a disk flush
    /// per claim and per mark. Writers' transactions are not affected either way.
    ///
    /// ```no_run
    /// # use outbox_diesel::relay::PgRelayStore;
    /// let store = PgRelayStore::new("postgres://postgres@127.0.0.1/app").synchronous_commit(true);
    /// ```
    pub fn synchronous_commit(mut self, on: bool) -> Self {
        self.base.connector.synchronous_commit = on;
        self
    }

    /// Whether the store's connections go through a pooler in transaction mode, such as
    /// PgBouncer's `pool_mode = transaction` (default `false`). A server connection then
    /// serves one transaction of a client at a time, so the store:
    /// - runs each unit of work (a claim, a mark, a rebalance, …) in a transaction of its
    ///   own and gives its settings (`statement_timeout`, `synchronous_commit`, …) as
    ///   `SET LOCAL` inside it: nothing it sets stays on a server connection that the
    ///   application's writers get next;
    /// - keeps no statement prepared across transactions (PgBouncer before 1.21 does not
    ///   track prepared statements);
    /// - does not `LISTEN` (a notification goes to whichever client holds the server
    ///   connection): it polls at the relay's poll interval;
    /// - records no session for its relay id (a server session is no relay's): the lease is
    ///   the only rule, as with [`RelayConfig::session_check`] off, so a dead relay's work is
    ///   taken over when its leases run out, not within a second.
    ///
    /// Each unit of work costs two round trips more (`BEGIN` with the settings, `COMMIT`) and
    /// each statement one more (prepared, then run). The store opens its connections with
    /// [`connect::postgres_pooled`](crate::connect::postgres_pooled); a connection factory
    /// ([`from_connect`](Self::from_connect)) should too.
    ///
    /// [`RelayConfig::session_check`]: outbox_core::relay::RelayConfig::session_check
    ///
    /// ```no_run
    /// # use outbox_diesel::relay::PgRelayStore;
    /// let store = PgRelayStore::new("postgres://relay@pgbouncer.internal:6432/app")
    ///     .transaction_pooler(true);
    /// ```
    pub fn transaction_pooler(mut self, on: bool) -> Self {
        self.base.connector.pooler = on;
        if on {
            self.listen = false;
        }
        self
    }

    /// Whether to `LISTEN` for writers' notifications (default `true`; never behind a
    /// [transaction pooler](Self::transaction_pooler)); without it the relay polls at its
    /// poll interval.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen && !self.base.connector.pooler;
        self
    }

    /// Connects now (otherwise the first call does), so that a bad URL or an unreachable
    /// server is reported at start-up.
    pub async fn connect(&mut self) -> Result<(), StoreError> {
        self.base.conn().await?;
        self.base.finish("connect").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settler_is_a_plain_second_session_of_the_same_store() {
        use outbox_core::relay::RelayStore;
        let mut store = PgRelayStore::new("postgres://x")
            .synchronous_commit(true)
            .statement_timeout(Duration::from_secs(2));
        let mut settler = store.settler().expect("a settler by default");
        assert!(matches!(settler.base.source(), Source::Url(url) if url == "postgres://x"));
        assert!(settler.base.connector.synchronous_commit);
        assert_eq!(settler.base.timeout.get(), Duration::from_secs(2));
        assert!(!settler.listen, "only the relay's own store listens");
        assert!(settler.settler().is_none(), "no settler of its own");
        assert!(store.settle_beside(false).settler().is_none());
    }

    #[tokio::test]
    async fn a_factory_error_is_a_connect_error_with_its_text() {
        use outbox_core::relay::RelayStore;
        let mut store = PgRelayStore::from_connect(|| async {
            Err::<AsyncPgConnection, _>("the token service is unavailable")
        });
        let settler = store.settler().expect("a settler by default");
        for mut store in [store, settler] {
            let e = store.connect().await.expect_err("the factory fails");
            assert_eq!(e.operation, "connect");
            assert_eq!(
                e.to_string(),
                "outbox store failed to connect: the connection factory for PostgreSQL \
                 failed: the token service is unavailable"
            );
        }
    }

    #[test]
    fn a_factory_keeps_its_application_name() {
        let by_url = PgRelayStore::new("postgres://x");
        assert!(by_url.base.connector.name_session);
        let by_factory =
            PgRelayStore::from_connect(|| async { Err::<AsyncPgConnection, _>("unused") });
        assert!(!by_factory.base.connector.name_session);
        let sql = session_sql(Duration::from_secs(1), false, false);
        assert!(!sql.contains("application_name"), "{sql}");
    }

    #[test]
    fn relay_sessions_commit_asynchronously_unless_asked() {
        let default = session_sql(Duration::from_secs(10), false, true);
        assert!(default.ends_with("SET statement_timeout = 10000; SET synchronous_commit = off"));
        assert!(default.starts_with(SESSION_SQL));
        assert!(default.contains(APPLICATION_NAME_SQL));
        let synchronous = session_sql(Duration::from_secs(10), true, true);
        assert!(!synchronous.contains("synchronous_commit"), "{synchronous}");
        let store = PgRelayStore::new("postgres://x");
        assert!(!store.base.connector.synchronous_commit);
        assert!(
            store
                .synchronous_commit(true)
                .base
                .connector
                .synchronous_commit
        );
    }
}
