//! The write path on diesel-async connections.

use diesel_async::{AsyncConnection, TransactionManager};
use outbox_core::{Headers, NewMessage, OutboxEvent};

use crate::{Error, OutboxBackend, OutboxTx};

/// The shape of an async closure whose future can be required to be `Send`.
///
/// Rust cannot yet name the future of an `AsyncFnOnce` to bound it, so, like diesel-async's
/// own transactions, [`AsyncOutboxConnection::transaction_with_outbox`] asks for this trait
/// too. It is implemented for every async closure: write `async |tx| { ... }` and it holds.
pub trait OutboxFunc<T, R>:
    AsyncFnOnce(T) -> R + FnOnce(T) -> <Self as OutboxFunc<T, R>>::Fut
{
    /// The future the closure returns.
    type Fut: Future<Output = R>;
}

impl<F, T, Fut, R> OutboxFunc<T, R> for F
where
    F: AsyncFnOnce(T) -> R + FnOnce(T) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// `transaction_with_outbox` for diesel-async connections: `AsyncPgConnection`,
/// `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`, and pooled connections
/// (deadpool, bb8) of those.
pub trait AsyncOutboxConnection: AsyncConnection<Backend: OutboxBackend> {
    /// Runs the async closure `f` in a database transaction and commits the events it
    /// publishes with it: the same contract as the synchronous
    /// [`OutboxConnection::transaction_with_outbox`](crate::OutboxConnection::transaction_with_outbox).
    ///
    /// On `Ok` the events are written with one multi-row `INSERT` and the transaction commits;
    /// on `Err` it rolls back and neither business rows nor events are stored. Inside another
    /// transaction it uses a savepoint.
    ///
    /// Canceling the returned future does currently **not** close an already open
    /// transaction (as with diesel-async's `transaction`): the connection must then be
    /// dropped, which pools do for connections left in a transaction.
    ///
    /// # Example
    ///
    /// ```
    /// # include!("doctest_setup.rs");
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = establish_async().await;
    /// use diesel_async::RunQueryDsl;
    /// use outbox_diesel::AsyncOutboxConnection;
    ///
    /// let total_cents = 1250;
    /// conn.transaction_with_outbox(async |tx| {
    ///     diesel::sql_query("INSERT INTO orders (id, total_cents) VALUES (1, 1250)")
    ///         .execute(tx.conn())
    ///         .await?;
    ///     tx.publish(&OrderCreated { order_id: 1, total_cents })?; // borrows from outside
    ///     Ok::<_, outbox_diesel::Error>(())
    /// })
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    fn transaction_with_outbox<'a, 'conn, R, E, F>(
        &'conn mut self,
        f: F,
    ) -> impl Future<Output = Result<R, E>> + Send + 'conn
    where
        for<'r, 'c> F: AsyncFnOnce(&'r mut OutboxTx<'c, Self>) -> Result<R, E>
            + OutboxFunc<&'r mut OutboxTx<'c, Self>, Result<R, E>, Fut: Send>
            + Send
            + 'a,
        E: From<diesel::result::Error> + Send + 'a,
        R: Send + 'a,
        'a: 'conn;
}

impl<C> AsyncOutboxConnection for C
where
    C: AsyncConnection<Backend: OutboxBackend>,
{
    // Not an `async fn`: the trait promises a `Send` future, which `async fn` in an impl
    // cannot state.
    #[allow(clippy::manual_async_fn)]
    fn transaction_with_outbox<'a, 'conn, R, E, F>(
        &'conn mut self,
        f: F,
    ) -> impl Future<Output = Result<R, E>> + Send + 'conn
    where
        for<'r, 'c> F: AsyncFnOnce(&'r mut OutboxTx<'c, Self>) -> Result<R, E>
            + OutboxFunc<&'r mut OutboxTx<'c, Self>, Result<R, E>, Fut: Send>
            + Send
            + 'a,
        E: From<diesel::result::Error> + Send + 'a,
        R: Send + 'a,
        'a: 'conn,
    {
        async move {
            // The same steps as diesel-async's `TransactionManager::transaction`, with the
            // events written between the closure and the commit.
            // Events the enclosing transactions published so far are written before this
            // one opens its savepoint, so they come first (see `crate::order`).
            crate::order::flush_enclosing_async(&mut *self).await?;
            C::TransactionManager::begin_transaction(self).await?;
            let result = match crate::order::position(
                C::TransactionManager::transaction_manager_status_mut(self),
            ) {
                Err(e) => Err(E::from(e)),
                Ok((key, depth)) => {
                    let registered = crate::order::Registered::new(key, depth);
                    let mut tx = OutboxTx::new(&mut *self, registered.frame());
                    let returned = f(&mut tx).await;
                    drop(tx);
                    match returned {
                        Ok(value) => {
                            let own = crate::order::take_own(&registered.frame());
                            if own.messages.is_empty() {
                                Ok(value)
                            } else {
                                crate::order::write_async(&mut *self, &own)
                                    .await
                                    .map(|()| value)
                                    .map_err(E::from)
                            }
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            match result {
                Ok(value) => {
                    C::TransactionManager::commit_transaction(self).await?;
                    Ok(value)
                }
                Err(user_error) => Err(crate::rollback::keep_error(
                    C::TransactionManager::rollback_transaction(self).await,
                    user_error,
                )),
            }
        }
    }
}

/// The async twin of [`publish`](crate::publish): publishes `event` on a diesel-async
/// connection that is already inside a transaction; outside one it returns
/// [`Error::NotInTransaction`] and writes nothing.
///
/// ```
/// # include!("doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = establish_async().await;
/// use diesel_async::AsyncConnection;
/// let event = OrderCreated { order_id: 7, total_cents: 500 };
/// conn.transaction(async |c| outbox_diesel::publish_async(c, &event).await).await?;
/// let outside = outbox_diesel::publish_async(&mut conn, &event).await;
/// assert!(matches!(outside, Err(outbox_diesel::Error::NotInTransaction)));
/// # Ok(())
/// # }
/// ```
pub async fn publish_async<C, E>(conn: &mut C, event: &E) -> Result<(), Error>
where
    C: AsyncConnection<Backend: OutboxBackend>,
    E: OutboxEvent + ?Sized,
{
    publish_with_headers_async(conn, event, Headers::new()).await
}

/// [`publish_async`] with headers for the event.
///
/// ```
/// # include!("doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = establish_async().await;
/// use diesel_async::AsyncConnection;
/// let event = OrderCreated { order_id: 7, total_cents: 500 };
/// conn.transaction(async |c| {
///     let mut headers = outbox_core::Headers::new();
///     headers.insert("correlation-id".into(), "req-7".into());
///     outbox_diesel::publish_with_headers_async(c, &event, headers).await
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
pub async fn publish_with_headers_async<C, E>(
    conn: &mut C,
    event: &E,
    headers: Headers,
) -> Result<(), Error>
where
    C: AsyncConnection<Backend: OutboxBackend>,
    E: OutboxEvent + ?Sized,
{
    let depth = C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth()?;
    if depth.is_none() {
        return Err(Error::NotInTransaction);
    }
    let message = NewMessage::from_event(event, headers)?;
    crate::order::flush_enclosing_async(conn).await?;
    C::Backend::write_async(conn, std::slice::from_ref(&message)).await?;
    Ok(())
}
