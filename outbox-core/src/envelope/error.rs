//! [`DecodeError`], everything that can be wrong with a message, and the reading of a
//! message's metadata that reports it.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::HEADER_EVENT_VERSION;
use crate::{EventType, Headers};

/// The metadata of a message, read but not yet checked against `E`.
pub(super) struct Meta<'a> {
    pub(super) id: Uuid,
    pub(super) aggregate_type: &'a str,
    pub(super) event_type: &'a str,
    pub(super) version: u32,
    pub(super) created_at: DateTime<Utc>,
    pub(super) headers: Headers,
}

pub(super) fn describe(t: &EventType) -> String {
    crate::catalog::version_name(t.aggregate_type, t.event_type, t.version)
}

pub(super) fn required<'a>(
    name: &'static str,
    value: Option<Option<&'a [u8]>>,
) -> Result<&'a str, DecodeError> {
    let bytes = value.flatten().ok_or(DecodeError::MissingHeader { name })?;
    std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidHeader {
        name,
        value: String::from_utf8_lossy(bytes).into_owned(),
        reason: "not UTF-8".to_owned(),
    })
}

pub(super) fn invalid(name: &'static str, value: &str, reason: String) -> DecodeError {
    DecodeError::InvalidHeader {
        name,
        value: value.to_owned(),
        reason,
    }
}

pub(super) fn parse_version(value: &str) -> Result<u32, DecodeError> {
    match value.parse::<u32>() {
        Ok(0) => Err(invalid(
            HEADER_EVENT_VERSION,
            value,
            "versions start at 1".to_owned(),
        )),
        Ok(v) if v <= i32::MAX as u32 => Ok(v),
        _ => Err(invalid(
            HEADER_EVENT_VERSION,
            value,
            "not a version from 1 to 2147483647".to_owned(),
        )),
    }
}

/// Why a message could not be decoded into an [`Envelope<E>`](crate::Envelope). Each message names what was
/// wrong; none of them gets better by retrying, so a consumer dead-letters or skips the message
/// (see the Kafka consumer's `UndecodablePolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// A header every outbox message carries is missing (or null): the message was not
    /// published by an outbox relay, or was altered.
    MissingHeader {
        /// The header, e.g. `"id"`.
        name: &'static str,
    },
    /// A header is present but its value is not what it should be: an `id` that is no UUID, a
    /// version that is no positive number, a `created_at` that is no RFC 3339 time, a value
    /// that is not UTF-8.
    InvalidHeader {
        /// The header, e.g. `"event_version"`.
        name: &'static str,
        /// Its value (lossily UTF-8).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The event type (with its aggregate type) is none of those the target type carries
    /// ([`OutboxEvent::EVENT_TYPES`](crate::OutboxEvent::EVENT_TYPES)).
    UnknownEventType {
        /// The message's aggregate type.
        aggregate_type: String,
        /// The message's event type.
        event_type: String,
        /// The Rust type it was decoded as.
        target: &'static str,
        /// What the target type carries, as `aggregate/EventType vN`.
        known: Vec<String>,
    },
    /// The event was written with a newer schema version than the target type knows: deploy
    /// a consumer that knows it, then replay the message.
    VersionTooNew {
        /// The event type.
        event_type: String,
        /// The message's version.
        version: u32,
        /// The newest version the target type knows.
        supported: u32,
        /// The Rust type it was decoded as.
        target: &'static str,
    },
    /// The payload is missing, is not JSON, does not deserialise as the target type, or is
    /// another event type than the message says.
    Payload {
        /// The message's event type.
        event_type: String,
        /// The Rust type it was decoded as.
        target: &'static str,
        /// What serde (or the check) reported.
        reason: String,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::MissingHeader { name } => write!(
                f,
                "missing header `{name}`: every message an outbox relay publishes carries it"
            ),
            DecodeError::InvalidHeader {
                name,
                value,
                reason,
            } => write!(f, "invalid header `{name}` = `{value}`: {reason}"),
            DecodeError::UnknownEventType {
                aggregate_type,
                event_type,
                target,
                known,
            } => write!(
                f,
                "unknown event type `{event_type}` of aggregate `{aggregate_type}`: `{target}` \
                 carries {}",
                known.join(", ")
            ),
            DecodeError::VersionTooNew {
                event_type,
                version,
                supported,
                target,
            } => write!(
                f,
                "event `{event_type}` has version {version}, newer than version {supported} \
                 that `{target}` knows: deploy a consumer that knows version {version}, then \
                 replay the message"
            ),
            DecodeError::Payload {
                event_type,
                target,
                reason,
            } => write!(
                f,
                "the payload of event `{event_type}` does not decode as `{target}`: {reason}"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}
