//! What every relay store does the same way: one connection, made on first use and
//! configured for the relay; dropped after an error, so that the next call reconnects (the
//! error may be a lost connection, and the relay survives a database restart); and, on the
//! backends that record relay sessions, the guard of the relay's id (a new connection
//! repeats the last heartbeat before anything else runs on it).
//!
//! Each backend's [`Connector`] holds what differs: the connection type, the session's
//! settings, and how a heartbeat records the relay's session. Connections come from a
//! [`Source`]: the store's URL, or the application's own factory (custom TLS, per-connection
//! credentials, a pool); the session's settings run on each either way.
//!
//! **The statement timeout follows the relay's lease.** The relay renews its shard and
//! leadership leases every third of a lease, so a statement that can wait longer than that
//! (an ordered claim waiting for a row lock) could act on a lease that ran out and passed to
//! another relay meanwhile. Every call that carries the relay's lease (claim, leadership,
//! rebalance, heartbeat) tells the base, and the session's timeout is kept at most a third of
//! it ([`StatementTimeout`]), whoever built the store: the connection is configured with it
//! when it is made, and again when the lease it derives from changes. What it sets is the
//! backend's own: PostgreSQL's `statement_timeout`; on MariaDB `max_statement_time` and, on
//! MySQL and MariaDB, `innodb_lock_wait_timeout` (whole seconds, at least 1, at most 10);
//! on SQLite, which has no statement timeout, `busy_timeout`, the wait for the write lock
//! (at most 5 s).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::AsyncConnection;
use outbox_core::BoxError;
use outbox_core::relay::{RelayHealth, RelayIdInUse, StoreError};

use super::common::{IdGuard, connect_error, store_error};

/// The per-backend parts of a relay store's connection.
pub(crate) trait Connector: Send + 'static {
    /// The connection the store runs on.
    type Conn: AsyncConnection + Send + 'static;
    /// The backend's name, as connection errors give it.
    const NAME: &'static str;
    /// What a failed heartbeat on a new connection says it was doing.
    const BEAT_ON_CONNECT: &'static str = "record the relay's session";

    /// Opens a connection to `url`.
    fn establish(url: &str) -> impl Future<Output = Result<Self::Conn, StoreError>> + Send {
        async move {
            Self::Conn::establish(url)
                .await
                .map_err(|e| connect_error(Self::NAME, e))
        }
    }

    /// Opens a connection to `url` for a unit of work run [per
    /// transaction](Self::per_transaction) (by default as [`establish`](Self::establish)).
    fn establish_pooled(url: &str) -> impl Future<Output = Result<Self::Conn, StoreError>> + Send {
        Self::establish(url)
    }

    /// Configures a new session: `timeout` is the longest a statement may run.
    fn configure(
        &mut self,
        conn: &mut Self::Conn,
        timeout: Duration,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;

    /// Whether a kept connection may run the next unit of work.
    fn reusable(_conn: &mut Self::Conn) -> bool {
        true
    }

    /// Whether each unit of work runs in a transaction of its own, with the settings
    /// [`configure`](Self::configure) would give the session made local to it: behind a
    /// transaction pooler, where a session's settings would stay with a server connection
    /// that other clients get next.
    fn per_transaction(&self) -> bool {
        false
    }

    /// Begins a unit of work's transaction (only called when [`per_transaction`]).
    ///
    /// [`per_transaction`]: Self::per_transaction
    fn begin(
        &mut self,
        _conn: &mut Self::Conn,
        _timeout: Duration,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send {
        async { Ok(()) }
    }

    /// Commits a unit of work's transaction (only called when [`per_transaction`]).
    ///
    /// [`per_transaction`]: Self::per_transaction
    fn commit(_conn: &mut Self::Conn) -> impl Future<Output = diesel::QueryResult<()>> + Send {
        async { Ok(()) }
    }

    /// Writes the heartbeat row, recording the relay's session; `Some` when another live
    /// relay holds the id (nothing written). Backends that record no sessions never call it:
    /// their stores do not remember heartbeats in the [`IdGuard`].
    fn heartbeat(
        &mut self,
        _conn: &mut Self::Conn,
        _relay: &str,
        _lease: Duration,
        _health: &RelayHealth,
    ) -> impl Future<Output = diesel::QueryResult<Option<RelayIdInUse>>> + Send {
        async { Ok(None) }
    }

    /// Reaps the relays whose recorded session is gone; returns their ids.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    fn reap(
        _conn: &mut Self::Conn,
        _relay: &str,
    ) -> impl Future<Output = diesel::QueryResult<Vec<String>>> + Send {
        async { Ok(Vec::new()) }
    }
}

/// A connection factory, as the store keeps it: every connection the store opens comes from
/// it (see the stores' `from_connect`).
pub(crate) type Factory<Conn> =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>> + Send + Sync>;

/// Where a store's connections come from: a URL, or the application's factory.
pub(crate) enum Source<Conn> {
    /// Opened by the backend's `establish`, with the URL's TLS parameters.
    Url(String),
    /// Opened by the application's factory (the PostgreSQL and MySQL stores take one).
    #[cfg_attr(
        not(any(feature = "postgres_backend", feature = "mysql_backend")),
        allow(dead_code)
    )]
    Factory(Factory<Conn>),
}

impl<Conn> Clone for Source<Conn> {
    fn clone(&self) -> Self {
        match self {
            Source::Url(url) => Source::Url(url.clone()),
            Source::Factory(f) => Source::Factory(f.clone()),
        }
    }
}

impl<Conn: Send + 'static> Source<Conn> {
    /// Wraps an application's factory, boxing its future and its error.
    #[cfg_attr(
        not(any(feature = "postgres_backend", feature = "mysql_backend")),
        allow(dead_code)
    )]
    pub fn factory<F, Fut, E>(f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Conn, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        Source::Factory(Arc::new(move || {
            let fut = f();
            Box::pin(async move { fut.await.map_err(Into::into) })
        }))
    }

    /// A new connection, through the backend's `establish` (`establish_pooled` if `pooled`)
    /// or the factory; a factory's error is a connection error (an outage: the relay waits
    /// and retries) with its own text.
    pub async fn open<C: Connector<Conn = Conn>>(&self, pooled: bool) -> Result<Conn, StoreError> {
        match self {
            Source::Url(url) if pooled => C::establish_pooled(url).await,
            Source::Url(url) => C::establish(url).await,
            Source::Factory(f) => f().await.map_err(|e| {
                StoreError::new(
                    "connect",
                    format!("the connection factory for {} failed: {e}", C::NAME),
                )
            }),
        }
    }
}

/// The longest a statement of a store may run: what the store's builder set (if anything),
/// and never more than a third of the relay's lease once a call has carried it.
#[derive(Clone, Copy, Default)]
pub(crate) struct StatementTimeout {
    /// Set on the store's builder.
    pub explicit: Option<Duration>,
    /// The relay's lease, as the last call that carried it gave it.
    pub lease: Option<Duration>,
}

impl StatementTimeout {
    /// Before the relay's lease is known and without a setting: a third of the default lease.
    pub const DEFAULT: Duration = Duration::from_secs(10);

    /// The timeout in force (at least 1 ms).
    pub fn get(self) -> Duration {
        let derived = self.lease.map(|lease| lease / 3);
        let t = match (self.explicit, derived) {
            (Some(set), Some(derived)) => set.min(derived),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => Self::DEFAULT,
        };
        t.max(Duration::from_millis(1))
    }
}

/// A relay store's connection, made on first use and after errors. See the [module
/// docs](self).
pub(crate) struct Base<C: Connector> {
    source: Source<C::Conn>,
    conn: Option<C::Conn>,
    /// The per-backend state.
    pub connector: C,
    /// When the current connection was made (reaping waits `REAP_GRACE` after it).
    connected_at: Option<Instant>,
    /// The relay id this store heartbeats for, and whether another live relay holds it.
    pub guard: IdGuard,
    /// The longest a statement may run.
    pub timeout: StatementTimeout,
    /// The timeout the current connection was configured with.
    applied: Option<Duration>,
    /// Whether a unit of work's transaction is open on the connection (only when the
    /// connector runs [`per_transaction`](Connector::per_transaction)); [`check`](Self::check)
    /// commits it.
    in_unit: bool,
}

impl<C: Connector> Base<C> {
    pub fn new(source: Source<C::Conn>, connector: C) -> Self {
        Base {
            source,
            conn: None,
            connector,
            connected_at: None,
            guard: IdGuard::default(),
            timeout: StatementTimeout::default(),
            applied: None,
            in_unit: false,
        }
    }

    /// Where the store's connections come from (the PostgreSQL store's listener and settler
    /// connect through it too).
    #[cfg(feature = "postgres_backend")]
    pub fn source(&self) -> &Source<C::Conn> {
        &self.source
    }

    /// Takes in the relay's lease, as a call carried it: the statement timeout follows it.
    pub fn lease(&mut self, lease: Duration) {
        self.timeout.lease = Some(lease);
    }

    /// The connection, made (configured, and the last heartbeat repeated on it) if there is
    /// none or the kept one cannot be reused. Per transaction (see
    /// [`Connector::per_transaction`]), a unit of work's transaction is begun on it if none is
    /// open, before anything else runs; [`check`](Self::check) or [`finish`](Self::finish)
    /// ends it.
    pub async fn conn(&mut self) -> Result<&mut C::Conn, StoreError> {
        if let Some(conn) = self.conn.as_mut()
            && !C::reusable(conn)
        {
            self.conn = None;
        }
        let timeout = self.timeout.get();
        let per_transaction = self.connector.per_transaction();
        if let Some(conn) = self.conn.as_mut() {
            if per_transaction {
                if !self.in_unit {
                    // Each transaction carries the timeout in force as it begins.
                    if let Err(e) = self.connector.begin(conn, timeout).await {
                        self.conn = None;
                        return Err(StoreError::new("begin a transaction", e));
                    }
                    self.in_unit = true;
                }
            } else if self.applied != Some(timeout) {
                // The relay's lease changed (or became known): configure the session again.
                if let Err(e) = self.connector.configure(conn, timeout).await {
                    self.conn = None;
                    return Err(StoreError::new("configure the session", e));
                }
                self.applied = Some(timeout);
            }
        }
        if self.conn.is_none() {
            self.in_unit = false;
            let mut conn = self.source.open::<C>(per_transaction).await?;
            self.connector
                .configure(&mut conn, timeout)
                .await
                .map_err(|e| StoreError::new("configure the session", e))?;
            self.applied = Some(timeout);
            if per_transaction {
                self.connector
                    .begin(&mut conn, timeout)
                    .await
                    .map_err(|e| StoreError::new("begin a transaction", e))?;
            }
            if let Some((relay, lease, health)) = &self.guard.beat {
                // A new connection: record the relay's session at once, before a peer takes
                // the old one's end for this relay's death, and before anything else runs on
                // it, so that this connection never claims for an id another live relay
                // holds.
                self.guard.in_use = self
                    .connector
                    .heartbeat(&mut conn, relay, *lease, health)
                    .await
                    .map_err(|e| StoreError::new(C::BEAT_ON_CONNECT, e))?;
            }
            self.connected_at = Some(Instant::now());
            self.in_unit = per_transaction;
            self.conn = Some(conn);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::new("connect", "no connection"))
    }

    /// Ends the unit of work: commits its transaction, if one is open (per transaction);
    /// otherwise nothing. After a failed commit the connection is dropped.
    pub async fn finish(&mut self, op: &'static str) -> Result<(), StoreError> {
        if !std::mem::take(&mut self.in_unit) {
            return Ok(());
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        if let Err(e) = C::commit(conn).await {
            self.conn = None;
            return Err(store_error(op, e));
        }
        Ok(())
    }

    /// The connection for `op`, a call that carries the relay's `lease` and must not run
    /// while another live relay holds the id.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub async fn guarded(
        &mut self,
        op: &'static str,
        lease: Duration,
    ) -> Result<&mut C::Conn, StoreError> {
        self.lease(lease);
        self.conn().await?;
        if let Err(e) = self.guard.refuse(op) {
            self.finish(op).await?;
            return Err(e);
        }
        self.conn().await
    }

    /// The connection for the store's `release_all`; `None` while another live relay holds
    /// the id: the leases of this id are the other relay's, to be left alone.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub async fn releasing(&mut self) -> Result<Option<&mut C::Conn>, StoreError> {
        if self.guard.in_use.is_some() {
            return Ok(None);
        }
        self.conn().await.map(Some)
    }

    /// Passes a result through, ending the unit of work (see [`finish`](Self::finish));
    /// after an error the connection is dropped (with the unit's transaction, if one is open)
    /// and the next call reconnects (the error may be a lost connection).
    pub async fn check<T>(
        &mut self,
        op: &'static str,
        r: diesel::QueryResult<T>,
    ) -> Result<T, StoreError> {
        match r {
            Ok(v) => {
                self.finish(op).await?;
                Ok(v)
            }
            Err(e) => {
                self.conn = None;
                self.in_unit = false;
                Err(store_error(op, e))
            }
        }
    }

    /// The store's `heartbeat`: remembers it for new connections and writes it (a new
    /// connection writes it as it connects); `Err` while another live relay holds the id.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub async fn heartbeat(
        &mut self,
        relay: &str,
        lease: Duration,
        health: &RelayHealth,
    ) -> Result<(), StoreError> {
        self.lease(lease);
        self.guard.remember(relay, lease, health);
        // A new connection repeats the heartbeat just remembered as it connects.
        let fresh = self.conn.is_none() && self.guard.beat.is_some();
        self.conn().await?;
        if !fresh {
            let conn = self
                .conn
                .as_mut()
                .ok_or_else(|| StoreError::new("connect", "no connection"))?;
            let r = self.connector.heartbeat(conn, relay, lease, health).await;
            self.guard.in_use = self.check("heartbeat", r).await?;
        } else {
            self.finish("heartbeat").await?;
        }
        self.guard.refuse("heartbeat")
    }

    /// The store's `reap_dead_relays`: nothing while another live relay holds the id or
    /// before the connection is `REAP_GRACE` old.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub async fn reap(&mut self, relay: &str) -> Result<Vec<String>, StoreError> {
        self.conn().await?;
        if !self.guard.may_reap(self.connected_at) {
            self.finish("reap dead relays").await?;
            return Ok(Vec::new());
        }
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| StoreError::new("connect", "no connection"))?;
        let r = C::reap(conn, relay).await;
        self.check("reap dead relays", r).await
    }
}

/// The `heartbeat` and `reap_dead_relays` of a store on a backend that records relay
/// sessions (the [`Base`]'s), and its `cleanup` (the backend's `cleanup_query`, as the
/// admin API runs it), in the store's `impl RelayStore` (its base in `self.base`);
/// `server_methods!(sessions)` leaves `cleanup` to the store (PostgreSQL's also empties its
/// partitions).
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
macro_rules! server_methods {
    () => {
        $crate::relay::base::server_methods!(sessions);

        async fn cleanup(
            &mut self,
            older_than: std::time::Duration,
            limit: usize,
        ) -> Result<u64, outbox_core::relay::StoreError> {
            let q = cleanup_query(older_than, i64::try_from(limit).unwrap_or(i64::MAX));
            let r = q.execute(self.base.conn().await?).await;
            self.base.check("clean up", r).await.map(|n| n as u64)
        }
    };
    (sessions) => {
        async fn heartbeat(
            &mut self,
            relay: &str,
            lease: std::time::Duration,
            health: &outbox_core::relay::RelayHealth,
        ) -> Result<(), outbox_core::relay::StoreError> {
            self.base.heartbeat(relay, lease, health).await
        }

        async fn reap_dead_relays(
            &mut self,
            relay: &str,
        ) -> Result<Vec<String>, outbox_core::relay::StoreError> {
            self.base.reap(relay).await
        }
    };
}
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
pub(crate) use server_methods;
