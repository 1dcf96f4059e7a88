//! The errors of events, before any storage is involved.
//!
//! The error users see from a write, `outbox::Error`, is defined where the database is known
//! (the Diesel store, `outbox_diesel::Error`); it carries an [`EventError`] for everything that
//! is the event's own fault. This crate knows no database.

use std::fmt;

/// A boxed error from a lower layer (the database driver, the broker client).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an event was refused before anything was written: it could not be serialised, it is
/// invalid, its payload is too large, or its claim check failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum EventError {
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
        /// The event's size in bytes as a Kafka producer counts it
        /// ([`NewMessage::record_size`](crate::NewMessage::record_size): payload, key, headers
        /// and framing).
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
}

impl fmt::Display for EventError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventError::Serialize { event_type, .. } => {
                write!(f, "failed to serialize the payload of event `{event_type}`")
            }
            EventError::InvalidEvent { event_type, reason } => {
                write!(f, "invalid event `{event_type}`: {reason}")
            }
            EventError::PayloadTooLarge {
                event_type,
                size,
                limit,
            } => write!(
                f,
                "event `{event_type}` is {size} bytes with its key and headers, over the limit \
                 of {limit} bytes: publish a claim check (a reference to the body stored elsewhere) or \
                 raise the limit; nothing was written"
            ),
            EventError::ClaimCheck { key, reason } => write!(f, "claim check `{key}`: {reason}"),
        }
    }
}

impl std::error::Error for EventError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EventError::Serialize { source, .. } => Some(source),
            EventError::InvalidEvent { .. }
            | EventError::PayloadTooLarge { .. }
            | EventError::ClaimCheck { .. } => None,
        }
    }
}
