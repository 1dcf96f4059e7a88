//! The error type of the outbox.

use std::fmt;

/// A boxed error from a lower layer (the database driver, the broker client).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What can go wrong when writing, relaying or consuming outbox events.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The payload (or the headers) of an event could not be serialised to JSON. The
    /// transaction that tried to publish it writes nothing.
    Serialize {
        /// The event type whose payload failed, e.g. `"OrderCreated"`.
        event_type: &'static str,
        /// What serde reported.
        source: serde_json::Error,
    },
    /// An event was rejected before anything was written, e.g. its aggregate id is empty.
    InvalidEvent {
        /// The event type that was rejected.
        event_type: String,
        /// Why it was rejected.
        reason: String,
    },
    /// An event's serialised payload is larger than the publish limit
    /// ([`DEFAULT_MAX_PAYLOAD_BYTES`](crate::DEFAULT_MAX_PAYLOAD_BYTES) unless changed with
    /// [`set_max_payload_bytes`](crate::set_max_payload_bytes) or per transaction). Nothing was
    /// written. Store the body elsewhere and publish a reference
    /// ([`ClaimCheck`](crate::claim_check::ClaimCheck)), or raise the limit together with the
    /// broker's (`message.max.bytes`).
    PayloadTooLarge {
        /// The event type whose payload is too large.
        event_type: String,
        /// The payload's size in bytes (JSON text).
        size: usize,
        /// The limit it exceeds, in bytes.
        limit: usize,
    },
    /// A claim check's body could not be stored or fetched, or did not match its reference.
    ClaimCheck {
        /// The body's key in the store.
        key: String,
        /// What went wrong.
        reason: String,
    },
    /// `publish(conn, &event)` was called on a connection that is not inside a transaction:
    /// the event would have been committed on its own, so nothing was written.
    NotInTransaction,
    /// The database failed. The source is the driver's error (for Diesel, a
    /// `diesel::result::Error`; `From` conversions go both ways).
    Database(BoxError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Serialize { event_type, .. } => {
                write!(f, "failed to serialize the payload of event `{event_type}`")
            }
            Error::InvalidEvent { event_type, reason } => {
                write!(f, "invalid event `{event_type}`: {reason}")
            }
            Error::PayloadTooLarge {
                event_type,
                size,
                limit,
            } => write!(
                f,
                "the payload of event `{event_type}` is {size} bytes, over the limit of {limit} \
                 bytes: publish a claim check (a reference to the body stored elsewhere) or \
                 raise the limit; nothing was written"
            ),
            Error::ClaimCheck { key, reason } => write!(f, "claim check `{key}`: {reason}"),
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
            Error::Serialize { source, .. } => Some(source),
            Error::Database(e) => Some(&**e),
            Error::InvalidEvent { .. }
            | Error::PayloadTooLarge { .. }
            | Error::ClaimCheck { .. }
            | Error::NotInTransaction => None,
        }
    }
}

#[cfg(feature = "diesel")]
impl From<diesel::result::Error> for Error {
    fn from(e: diesel::result::Error) -> Self {
        Error::Database(Box::new(e))
    }
}

/// Turns an outbox error into a Diesel error, so that `?` works inside a closure whose error
/// type is `diesel::result::Error`. A database error comes back as the original Diesel error;
/// any other error travels as `QueryBuilderError`, with the outbox error as its source.
#[cfg(feature = "diesel")]
impl From<Error> for diesel::result::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Database(inner) => match inner.downcast::<diesel::result::Error>() {
                Ok(diesel_error) => *diesel_error,
                Err(other) => diesel::result::Error::QueryBuilderError(other),
            },
            other => diesel::result::Error::QueryBuilderError(Box::new(other)),
        }
    }
}
