//! [`Error`]: what a write to the outbox can fail with, re-exported as `outbox::Error`.

use std::fmt;

use outbox_core::EventError;

/// What can go wrong when writing outbox events: the event was refused before anything was
/// written ([`Error::Event`]), `publish` was called outside a transaction, or the database
/// failed.
///
/// `?` turns a `diesel::result::Error` into it and back (so it works in closures of either
/// error type): a database error comes back as the original Diesel error, any other as
/// `QueryBuilderError` with this error as its source.
///
/// ```
/// use outbox_core::EventError;
/// use outbox_diesel::Error;
///
/// let refused = Error::from(EventError::InvalidEvent {
///     event_type: "OrderCreated".into(),
///     reason: "the aggregate id is empty".into(),
/// });
/// assert_eq!(refused.to_string(), "invalid event `OrderCreated`: the aggregate id is empty");
/// assert!(matches!(refused, Error::Event(EventError::InvalidEvent { .. })));
///
/// let db = Error::from(diesel::result::Error::NotFound);
/// assert!(matches!(diesel::result::Error::from(db), diesel::result::Error::NotFound));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The event was refused before anything was written: its payload did not serialise, it
    /// is invalid, its payload is over the publish limit, or its claim check failed. The
    /// transaction that tried to publish it writes nothing.
    Event(EventError),
    /// `publish(conn, &event)` was called on a connection that is not inside a transaction:
    /// the event would have been committed on its own, so nothing was written.
    NotInTransaction,
    /// The database failed.
    Database(diesel::result::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Event(e) => e.fmt(f),
            Error::NotInTransaction => f.write_str(
                "outbox publish called outside a transaction: call it inside \
                 `conn.transaction(...)` or use `transaction_with_outbox`; nothing was written",
            ),
            Error::Database(e) => write!(f, "outbox database error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the event error's message is this error's, so its source is too.
            Error::Event(e) => e.source(),
            Error::Database(e) => Some(e),
            Error::NotInTransaction => None,
        }
    }
}

impl From<EventError> for Error {
    fn from(e: EventError) -> Self {
        Error::Event(e)
    }
}

impl From<diesel::result::Error> for Error {
    fn from(e: diesel::result::Error) -> Self {
        Error::Database(e)
    }
}

/// So that `?` on an outbox call works inside a closure whose error type is
/// `diesel::result::Error`: a database error comes back as the original Diesel error; any other
/// error travels as `QueryBuilderError`, with the outbox error as its source.
impl From<Error> for diesel::result::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Database(inner) => inner,
            other => diesel::result::Error::QueryBuilderError(Box::new(other)),
        }
    }
}
