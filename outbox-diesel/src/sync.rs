//! The write path on synchronous Diesel connections.

use diesel::Connection;
use diesel::connection::TransactionManager;
use outbox_core::{Headers, NewMessage, OutboxEvent};

use crate::{Error, OutboxBackend, OutboxTx};

/// `transaction_with_outbox` for every Diesel connection on a supported backend:
/// `PgConnection`, `MysqlConnection`, `SqliteConnection`, and pooled connections
/// (`r2d2::PooledConnection`) of those.
pub trait OutboxConnection: Connection<Backend: OutboxBackend> {
    /// Runs `f` in a database transaction and commits the events it publishes with it.
    ///
    /// `f` gets an [`OutboxTx`]: run Diesel queries on [`tx.conn()`](OutboxTx::conn) and
    /// publish events with [`tx.publish(&event)`](OutboxTx::publish). If `f` returns `Ok`, the
    /// events are written with one multi-row `INSERT` and the transaction commits: the business
    /// rows and the events are stored together, in the order they were published (a nested
    /// write first writes the events published before it; see [`OutboxTx`]). If `f` returns `Err`, or the `INSERT` fails,
    /// the transaction is rolled back: neither is stored, and the error is returned.
    ///
    /// Like [`Connection::transaction`], on which it is built: called inside another
    /// transaction it uses a savepoint, so its events are discarded if that savepoint rolls
    /// back. A panic inside `f` leaves the transaction open without committing; the database
    /// rolls it back when the connection is closed, and pools discard such connections.
    ///
    /// # Example
    ///
    /// ```
    /// # include!("doctest_setup.rs");
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = establish();
    /// use diesel::prelude::*;
    /// use outbox_diesel::OutboxConnection;
    ///
    /// let order_id = conn.transaction_with_outbox(|tx| {
    ///     diesel::sql_query("INSERT INTO orders (id, total_cents) VALUES (1, 1250)")
    ///         .execute(tx.conn())?;
    ///     tx.publish(&OrderCreated { order_id: 1, total_cents: 1250 })?;
    ///     Ok::<_, outbox_diesel::Error>(1)
    /// })?;
    ///
    /// assert_eq!(order_id, 1);
    /// assert_eq!(count_events(&mut conn), 1);
    ///
    /// // An error from the closure rolls back the order and its event together.
    /// let failed = conn.transaction_with_outbox(|tx| {
    ///     diesel::sql_query("INSERT INTO orders (id, total_cents) VALUES (2, 99)")
    ///         .execute(tx.conn())?;
    ///     tx.publish(&OrderCreated { order_id: 2, total_cents: 99 })?;
    ///     Err::<(), _>(diesel::result::Error::RollbackTransaction)
    /// });
    /// assert!(failed.is_err());
    /// assert_eq!(count_events(&mut conn), 1);
    /// # Ok(())
    /// # }
    /// ```
    fn transaction_with_outbox<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut OutboxTx<'_, Self>) -> Result<T, E>,
        E: From<diesel::result::Error>;
}

impl<C> OutboxConnection for C
where
    C: Connection<Backend: OutboxBackend>,
{
    fn transaction_with_outbox<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut OutboxTx<'_, Self>) -> Result<T, E>,
        E: From<diesel::result::Error>,
    {
        // Events the enclosing transactions published so far are written before this one
        // opens its savepoint, so they come first (see `crate::order`).
        crate::order::flush_enclosing(self)?;
        self.transaction(|conn| {
            let (key, depth) = crate::order::position(
                C::TransactionManager::transaction_manager_status_mut(conn),
            )?;
            let registered = crate::order::Registered::new(key, depth);
            let out = f(&mut OutboxTx::new(conn, registered.frame()))?;
            let own = crate::order::take_own(&registered.frame());
            if !own.messages.is_empty() {
                crate::order::write(conn, &own)?;
            }
            Ok(out)
        })
    }
}

/// Publishes `event` on a connection that is already inside a transaction, e.g. in code that
/// runs in `conn.transaction(|conn| ...)` and cannot switch to
/// [`transaction_with_outbox`](OutboxConnection::transaction_with_outbox).
///
/// The event is inserted at once, in the caller's transaction, so it commits or rolls back
/// with it. Called on a connection that is not in a transaction, it returns
/// [`Error::NotInTransaction`] and writes nothing: an event committed on its own, apart from
/// the business rows it describes, is exactly what an outbox exists to prevent.
///
/// ```
/// # include!("doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = establish();
/// use diesel::prelude::*;
/// let event = OrderCreated { order_id: 7, total_cents: 500 };
///
/// conn.transaction(|conn| outbox_diesel::publish(conn, &event))?;
/// assert_eq!(count_events(&mut conn), 1);
///
/// let outside = outbox_diesel::publish(&mut conn, &event);
/// assert!(matches!(outside, Err(outbox_diesel::Error::NotInTransaction)));
/// assert_eq!(count_events(&mut conn), 1);
/// # Ok(())
/// # }
/// ```
pub fn publish<C, E>(conn: &mut C, event: &E) -> Result<(), Error>
where
    C: Connection<Backend: OutboxBackend>,
    E: OutboxEvent + ?Sized,
{
    publish_with_headers(conn, event, Headers::new())
}

/// [`publish`] with headers for the event.
///
/// ```
/// # include!("doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = establish();
/// use diesel::Connection;
/// let mut headers = outbox_core::Headers::new();
/// headers.insert("correlation-id".into(), "req-7".into());
/// let event = OrderCreated { order_id: 7, total_cents: 500 };
/// conn.transaction(|conn| outbox_diesel::publish_with_headers(conn, &event, headers))?;
/// assert_eq!(count_events(&mut conn), 1);
/// # Ok(())
/// # }
/// ```
pub fn publish_with_headers<C, E>(conn: &mut C, event: &E, headers: Headers) -> Result<(), Error>
where
    C: Connection<Backend: OutboxBackend>,
    E: OutboxEvent + ?Sized,
{
    let depth = C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth()?;
    if depth.is_none() {
        return Err(Error::NotInTransaction);
    }
    let message = NewMessage::from_event(event, headers)?;
    crate::order::flush_enclosing(conn)?;
    C::Backend::write(conn, std::slice::from_ref(&message))?;
    Ok(())
}
