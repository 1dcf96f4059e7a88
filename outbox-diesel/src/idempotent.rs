//! What `#[idempotent]` generates calls to: open the transaction and claim the inbox row
//! ([`begin`]), then commit or roll back with the body's result ([`finish`]); and their async
//! twins. Not public API: reached through `__private`.
//!
//! The steps are diesel's own `TransactionManager::transaction`, split in two so that the body
//! can stay in the user's function (its `return`, `?` and `.await` keep their meaning, and the
//! function's future stays `Send` whenever the body's is).

use std::fmt::Display;

use diesel::Connection;
use diesel::connection::TransactionManager;
use outbox_core::{Envelope, Outcome};

use crate::rollback::keep_error;
use crate::{OutboxBackend, inbox};

/// How [`begin`] went, and how to end the transaction it opened.
///
/// It carries the connection type's commit and rollback, so that [`finish`] needs no bound on
/// the connection: a parameter that is no connection is reported once, at [`begin`].
pub struct Begun<C: ?Sized> {
    state: State,
    commit: fn(&mut C) -> diesel::QueryResult<()>,
    rollback: fn(&mut C) -> diesel::QueryResult<()>,
}

#[derive(Debug)]
enum State {
    /// The transaction is open and holds the new inbox row: run the body.
    Claimed,
    /// The inbox already held the key; the transaction is closed. Do not run the body.
    Duplicate,
    /// The database failed; the transaction is closed. Do not run the body.
    Failed(diesel::result::Error),
}

impl<C: ?Sized> Begun<C> {
    /// Whether to run the body.
    pub fn is_claimed(&self) -> bool {
        matches!(self.state, State::Claimed)
    }
}

impl<C: ?Sized> std::fmt::Debug for Begun<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.fmt(f)
    }
}

/// A synchronous Diesel connection on a supported backend.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a synchronous Diesel connection on a backend the outbox supports",
    label = "the connection parameter of this `#[idempotent] fn`",
    note = "a sync `#[idempotent] fn` takes `&mut PgConnection`, `&mut MysqlConnection` or `&mut SqliteConnection` (or a pooled one); for a diesel-async connection make it an `async fn`"
)]
pub trait IdempotentConnection: Connection<Backend: OutboxBackend> {}

impl<C: Connection<Backend: OutboxBackend>> IdempotentConnection for C {}

/// A diesel-async connection on a supported backend.
#[cfg(feature = "async")]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a diesel-async connection on a backend the outbox supports",
    label = "the connection parameter of this `#[idempotent] async fn`",
    note = "an `#[idempotent] async fn` takes `&mut AsyncPgConnection`, `&mut AsyncMysqlConnection` or `&mut SyncConnectionWrapper<SqliteConnection>` (or a pooled one); for a synchronous connection drop the `async`"
)]
pub trait AsyncIdempotentConnection: diesel_async::AsyncConnection<Backend: OutboxBackend> {}

#[cfg(feature = "async")]
impl<C: diesel_async::AsyncConnection<Backend: OutboxBackend>> AsyncIdempotentConnection for C {}

/// An error type an `#[idempotent]` function can return a database failure as.
#[diagnostic::on_unimplemented(
    message = "an `#[idempotent]` function cannot return a database error as `{Self}`",
    label = "the transaction and the inbox can fail with a `diesel::result::Error`",
    note = "implement `From<diesel::result::Error>` for `{Self}`, or return `diesel::QueryResult<T>`"
)]
pub trait IdempotentError: From<diesel::result::Error> {}

impl<E: From<diesel::result::Error>> IdempotentError for E {}

/// Opens a transaction (a savepoint inside one) and claims `(consumer, key)` in the inbox. On a
/// duplicate or a failure the transaction is closed again.
pub fn begin<C: IdempotentConnection>(conn: &mut C, consumer: &str, key: &str) -> Begun<C> {
    let state = match C::TransactionManager::begin_transaction(conn) {
        Err(e) => State::Failed(e),
        Ok(()) => match inbox::claim(conn, consumer, key) {
            Ok(true) => State::Claimed,
            Ok(false) => match C::TransactionManager::commit_transaction(conn) {
                Ok(()) => State::Duplicate,
                Err(e) => State::Failed(e),
            },
            Err(e) => State::Failed(keep_error(
                C::TransactionManager::rollback_transaction(conn),
                e,
            )),
        },
    };
    Begun {
        state,
        commit: C::TransactionManager::commit_transaction,
        rollback: C::TransactionManager::rollback_transaction,
    }
}

/// Ends what [`begin`] started: commits the body's `Ok` as `Applied`, rolls back on its `Err`.
pub fn finish<C: ?Sized, T, E>(
    conn: &mut C,
    begun: Begun<C>,
    body: Option<Result<T, E>>,
) -> Result<Outcome<T>, E>
where
    E: IdempotentError,
{
    match end(begun.state, body) {
        End::Commit(value) => {
            (begun.commit)(conn)?;
            Ok(Outcome::Applied(value))
        }
        End::Rollback(e) => Err(keep_error((begun.rollback)(conn), e)),
        End::Done(outcome) => outcome,
    }
}

/// How [`finish`] and [`finish_async`] end what they were given.
enum End<T, E> {
    /// Commit, then the body's value is `Applied`.
    Commit(T),
    /// Roll back, keeping the body's error.
    Rollback(E),
    /// Nothing left to do on the connection.
    Done(Result<Outcome<T>, E>),
}

fn end<T, E: IdempotentError>(state: State, body: Option<Result<T, E>>) -> End<T, E> {
    match (state, body) {
        (State::Claimed, Some(Ok(value))) => End::Commit(value),
        (State::Claimed, Some(Err(e))) => End::Rollback(e),
        (State::Claimed, None) => unreachable!("#[idempotent] runs the body of a claimed message"),
        (State::Duplicate, _) => End::Done(Ok(Outcome::Duplicate)),
        (State::Failed(e), _) => End::Done(Err(e.into())),
    }
}

/// A boxed commit or rollback of a diesel-async connection.
#[cfg(feature = "async")]
type AsyncStep<C> =
    for<'c> fn(
        &'c mut C,
    ) -> std::pin::Pin<Box<dyn Future<Output = diesel::QueryResult<()>> + Send + 'c>>;

/// [`Begun`] for diesel-async connections.
#[cfg(feature = "async")]
pub struct AsyncBegun<C: ?Sized> {
    state: State,
    commit: AsyncStep<C>,
    rollback: AsyncStep<C>,
}

#[cfg(feature = "async")]
impl<C: ?Sized> AsyncBegun<C> {
    /// Whether to run the body.
    pub fn is_claimed(&self) -> bool {
        matches!(self.state, State::Claimed)
    }
}

#[cfg(feature = "async")]
impl<C: ?Sized> std::fmt::Debug for AsyncBegun<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.fmt(f)
    }
}

/// The async twin of [`begin`].
#[cfg(feature = "async")]
pub async fn begin_async<C: AsyncIdempotentConnection>(
    conn: &mut C,
    consumer: &str,
    key: &str,
) -> AsyncBegun<C> {
    use diesel_async::TransactionManager;
    let state = match C::TransactionManager::begin_transaction(conn).await {
        Err(e) => State::Failed(e),
        Ok(()) => match inbox::claim_async(conn, consumer, key).await {
            Ok(true) => State::Claimed,
            Ok(false) => match C::TransactionManager::commit_transaction(conn).await {
                Ok(()) => State::Duplicate,
                Err(e) => State::Failed(e),
            },
            Err(e) => State::Failed(keep_error(
                C::TransactionManager::rollback_transaction(conn).await,
                e,
            )),
        },
    };
    AsyncBegun {
        state,
        commit: |conn| Box::pin(C::TransactionManager::commit_transaction(conn)),
        rollback: |conn| Box::pin(C::TransactionManager::rollback_transaction(conn)),
    }
}

/// The async twin of [`finish`].
#[cfg(feature = "async")]
pub async fn finish_async<C: ?Sized, T, E: IdempotentError>(
    conn: &mut C,
    begun: AsyncBegun<C>,
    body: Option<Result<T, E>>,
) -> Result<Outcome<T>, E> {
    match end(begun.state, body) {
        End::Commit(value) => {
            (begun.commit)(conn).await?;
            Ok(Outcome::Applied(value))
        }
        End::Rollback(e) => Err(keep_error((begun.rollback)(conn).await, e)),
        End::Done(outcome) => outcome,
    }
}

/// The inbox key a `key = ...` option computes.
pub fn key_of<E, K: Display>(
    envelope: &Envelope<E>,
    key: impl FnOnce(&Envelope<E>) -> K,
) -> String {
    key(envelope).to_string()
}

/// The default inbox key: the event id.
pub fn default_key<E>(envelope: &Envelope<E>) -> String {
    envelope.inbox_key()
}
