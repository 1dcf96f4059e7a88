//! [`Envelope`]: an event as a consumer receives it, decoded from a broker message or an outbox
//! row, and [`DecodeError`], everything that can be wrong with one.

use std::fmt;
use std::ops::Deref;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::{EventType, Headers, NewMessage, OutboxEvent};

/// Header carrying the event id (a UUID, hyphenated): consumers deduplicate on it.
///
/// ```
/// assert_eq!(outbox_core::HEADER_ID, "id");
/// ```
pub const HEADER_ID: &str = "id";
/// Header carrying the event type, e.g. `OrderCreated`.
///
/// ```
/// assert_eq!(outbox_core::HEADER_EVENT_TYPE, "event_type");
/// ```
pub const HEADER_EVENT_TYPE: &str = "event_type";
/// Header carrying the event's schema version, in decimal.
///
/// ```
/// assert_eq!(outbox_core::HEADER_EVENT_VERSION, "event_version");
/// ```
pub const HEADER_EVENT_VERSION: &str = "event_version";
/// Header carrying the aggregate type, e.g. `order`.
///
/// ```
/// assert_eq!(outbox_core::HEADER_AGGREGATE_TYPE, "aggregate_type");
/// ```
pub const HEADER_AGGREGATE_TYPE: &str = "aggregate_type";
/// Header carrying when the event was written to the outbox: RFC 3339, UTC, microseconds,
/// e.g. `2025-01-31T09:30:00.123456Z`.
///
/// ```
/// assert_eq!(outbox_core::HEADER_CREATED_AT, "created_at");
/// ```
pub const HEADER_CREATED_AT: &str = "created_at";

/// The headers a publisher sets itself; an event header with one of these names is not sent
/// (the publisher's value is the one consumers read), and [`Envelope::headers`] leaves them out.
///
/// ```
/// assert!(outbox_core::RESERVED_HEADERS.contains(&"id"));
/// assert!(!outbox_core::RESERVED_HEADERS.contains(&"traceparent"));
/// ```
pub const RESERVED_HEADERS: [&str; 5] = [
    HEADER_ID,
    HEADER_EVENT_TYPE,
    HEADER_EVENT_VERSION,
    HEADER_AGGREGATE_TYPE,
    HEADER_CREATED_AT,
];

/// An event as a consumer receives it: the typed payload and its metadata.
///
/// Decode one from a broker message with [`Envelope::decode`] (the headers and payload a
/// publisher sends, see [`HEADER_ID`] and its siblings), or from an outbox row with
/// [`Envelope::from_new_message`] (and `from_outbox_message` with the `relay` feature).
/// Decoding checks that the event type is one `E` carries ([`OutboxEvent::EVENT_TYPES`]), that
/// its version is not newer than `E` knows, and that the payload deserialises as `E` and is of
/// that event type; each failure is its own [`DecodeError`]. An older version is decoded
/// through `E`'s upcast chain (`#[outbox(upcast_from = ...)]`): as the oldest type of the chain
/// whose version is at least the message's, then converted with `From` up to `E`, so that a
/// handler only ever sees the current type. [`Envelope::version`] keeps the version the event
/// was written with.
///
/// An envelope dereferences to its payload, so `envelope.order_id` reads the event's field.
///
/// ```
/// # use outbox_core as outbox;
/// use outbox_core::{Envelope, NewMessage, OutboxEvent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderCreated")]
/// struct OrderCreated {
///     #[outbox(aggregate_id)]
///     order_id: u64,
///     total_cents: i64,
/// }
///
/// let row = NewMessage::from_event(&OrderCreated { order_id: 7, total_cents: 1250 }, Default::default())?;
/// let envelope = Envelope::<OrderCreated>::from_new_message(&row)?;
/// assert_eq!(envelope.id, row.id);
/// assert_eq!((envelope.aggregate_type.as_str(), envelope.aggregate_id.as_str()), ("order", "7"));
/// assert_eq!((envelope.event_type.as_str(), envelope.version), ("OrderCreated", 1));
/// assert_eq!(envelope.total_cents, 1250); // through Deref
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Envelope<E> {
    /// The event id (a UUIDv7 when written by the outbox): the default deduplication key.
    pub id: Uuid,
    /// The aggregate type, e.g. `"order"`.
    pub aggregate_type: String,
    /// The aggregate id, as a key: [`OutboxEvent::aggregate_id`] of the payload.
    pub aggregate_id: String,
    /// The event type, e.g. `"OrderCreated"`.
    pub event_type: String,
    /// The schema version the event was written with (at least 1, at most what `E` knows).
    pub version: u32,
    /// When the event was written to the outbox (UTC).
    pub created_at: DateTime<Utc>,
    /// The event's own headers (e.g. `traceparent`): every header but the
    /// [`RESERVED_HEADERS`] the publisher sets.
    pub headers: Headers,
    /// The event itself.
    pub payload: E,
}

impl<E: OutboxEvent> Envelope<E> {
    /// An envelope around `payload` as the outbox would deliver it now: a fresh UUIDv7 id, the
    /// event's own aggregate, type and version, no headers. For tests of consumer code, and for
    /// in-process delivery.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// use outbox_core::{Envelope, OutboxEvent};
    /// #[derive(serde::Serialize, OutboxEvent)]
    /// #[outbox(crate = outbox_core, aggregate = "cart", version = 3)]
    /// struct CartEmptied(#[outbox(aggregate_id)] u32);
    ///
    /// let envelope = Envelope::new(CartEmptied(9));
    /// assert_eq!(envelope.id.get_version_num(), 7);
    /// assert_eq!((envelope.aggregate_id.as_str(), envelope.version), ("9", 3));
    /// ```
    pub fn new(payload: E) -> Self {
        Envelope {
            id: Uuid::now_v7(),
            aggregate_type: payload.aggregate_type().to_owned(),
            aggregate_id: payload.aggregate_id(),
            event_type: payload.event_type().to_owned(),
            version: payload.event_version(),
            created_at: crate::now_micros(),
            headers: Headers::new(),
            payload,
        }
    }

    /// The same envelope with event id `id`, e.g. to deliver one event twice in a test.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// # #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    /// # #[outbox(crate = outbox_core, aggregate = "cart")]
    /// # struct CartEmptied(#[outbox(aggregate_id)] u32);
    /// let first = outbox_core::Envelope::new(CartEmptied(9));
    /// let again = outbox_core::Envelope::new(CartEmptied(9)).with_id(first.id);
    /// assert_eq!(first.inbox_key(), again.inbox_key());
    /// ```
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = id;
        self
    }

    /// The same envelope with header `name` set to `value`.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// # #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    /// # #[outbox(crate = outbox_core, aggregate = "cart")]
    /// # struct CartEmptied(#[outbox(aggregate_id)] u32);
    /// let envelope = outbox_core::Envelope::new(CartEmptied(9)).with_header("traceparent", "00-ab-cd-01");
    /// assert_eq!(envelope.headers["traceparent"], "00-ab-cd-01");
    /// ```
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
}

impl<E> Envelope<E> {
    /// The default inbox key: the event id, hyphenated. A redelivered event has the same id,
    /// so the inbox recognises it.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// # #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    /// # #[outbox(crate = outbox_core, aggregate = "cart")]
    /// # struct CartEmptied(#[outbox(aggregate_id)] u32);
    /// let envelope = outbox_core::Envelope::new(CartEmptied(9));
    /// assert_eq!(envelope.inbox_key(), envelope.id.hyphenated().to_string());
    /// ```
    pub fn inbox_key(&self) -> String {
        self.id.hyphenated().to_string()
    }

    /// The payload, without the metadata.
    pub fn into_payload(self) -> E {
        self.payload
    }
}

impl<E> Deref for Envelope<E> {
    type Target = E;

    fn deref(&self) -> &E {
        &self.payload
    }
}

impl<E: OutboxEvent + DeserializeOwned> Envelope<E> {
    /// Decodes a broker message: its headers (name, value; Kafka header values may be null)
    /// and its payload (`None` for a message without one).
    ///
    /// The headers [`HEADER_ID`], [`HEADER_EVENT_TYPE`], [`HEADER_EVENT_VERSION`],
    /// [`HEADER_AGGREGATE_TYPE`] and [`HEADER_CREATED_AT`] are required (the first of each
    /// name counts); every other header goes to [`Envelope::headers`], its value read as UTF-8
    /// (invalid sequences replaced). The message key is not needed: the aggregate id is read
    /// from the payload.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// use outbox_core::{DecodeError, Envelope, OutboxEvent};
    /// #[derive(Debug, serde::Serialize, serde::Deserialize, OutboxEvent)]
    /// #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderCreated", version = 2)]
    /// struct OrderCreated { #[outbox(aggregate_id)] order_id: u64 }
    ///
    /// let headers = [
    ///     ("id", Some(&b"0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a"[..])),
    ///     ("event_type", Some(b"OrderCreated")),
    ///     ("event_version", Some(b"2")),
    ///     ("aggregate_type", Some(b"order")),
    ///     ("created_at", Some(b"2025-01-31T09:30:00.123456Z")),
    ///     ("traceparent", Some(b"00-ab-cd-01")),
    /// ];
    /// let envelope = Envelope::<OrderCreated>::decode(headers, Some(br#"{"order_id":7}"#))?;
    /// assert_eq!((envelope.order_id, envelope.version), (7, 2));
    /// assert_eq!(envelope.headers["traceparent"], "00-ab-cd-01");
    ///
    /// let err = Envelope::<OrderCreated>::decode(headers[1..].iter().copied(), Some(b"{}")).unwrap_err();
    /// assert_eq!(err, DecodeError::MissingHeader { name: "id" });
    /// # Ok::<(), DecodeError>(())
    /// ```
    pub fn decode<'h, H>(headers: H, payload: Option<&[u8]>) -> Result<Self, DecodeError>
    where
        H: IntoIterator<Item = (&'h str, Option<&'h [u8]>)>,
    {
        let mut reserved: [Option<Option<&[u8]>>; 5] = [None; 5];
        let mut own = Headers::new();
        for (name, value) in headers {
            match RESERVED_HEADERS.iter().position(|r| *r == name) {
                Some(i) => {
                    reserved[i].get_or_insert(value);
                }
                None => {
                    let value = String::from_utf8_lossy(value.unwrap_or_default()).into_owned();
                    own.entry(name.to_owned()).or_insert(value);
                }
            }
        }
        let [id, event_type, version, aggregate_type, created_at] = reserved;
        let id = required(HEADER_ID, id)?;
        let id = Uuid::parse_str(id).map_err(|e| invalid(HEADER_ID, id, e.to_string()))?;
        let event_type = required(HEADER_EVENT_TYPE, event_type)?;
        let version = parse_version(required(HEADER_EVENT_VERSION, version)?)?;
        let aggregate_type = required(HEADER_AGGREGATE_TYPE, aggregate_type)?;
        let created_at = required(HEADER_CREATED_AT, created_at)?;
        let created_at = DateTime::parse_from_rfc3339(created_at)
            .map_err(|e| {
                invalid(
                    HEADER_CREATED_AT,
                    created_at,
                    format!("not an RFC 3339 timestamp ({e})"),
                )
            })?
            .with_timezone(&Utc);
        let payload = payload.ok_or_else(|| DecodeError::Payload {
            event_type: event_type.to_owned(),
            target: std::any::type_name::<E>(),
            reason: "the message has no payload".to_owned(),
        })?;
        Self::assemble(
            Meta {
                id,
                aggregate_type,
                event_type,
                version,
                created_at,
                headers: own,
            },
            payload,
        )
    }

    /// Decodes an outbox row as it was written ([`NewMessage`]). The row's headers become
    /// [`Envelope::headers`], except any named like a [reserved header](RESERVED_HEADERS).
    pub fn from_new_message(message: &NewMessage) -> Result<Self, DecodeError> {
        Self::from_row(
            message.id,
            &message.aggregate_type,
            &message.event_type,
            message.event_version,
            message.created_at,
            &message.headers,
            &message.payload,
        )
    }

    /// Decodes an outbox row as a relay claimed it.
    #[cfg(feature = "relay")]
    #[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
    pub fn from_outbox_message(message: &crate::relay::OutboxMessage) -> Result<Self, DecodeError> {
        Self::from_row(
            message.id,
            &message.aggregate_type,
            &message.event_type,
            message.event_version,
            message.created_at,
            &message.headers,
            &message.payload,
        )
    }

    /// Decodes a message of the in-memory broker, as a Kafka consumer would decode the same
    /// message from Kafka.
    #[cfg(feature = "relay")]
    #[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
    pub fn from_record(record: &crate::relay::Record) -> Result<Self, DecodeError> {
        let headers = record
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), Some(v.as_bytes())));
        Self::decode(headers, Some(record.payload.as_bytes()))
    }

    fn from_row(
        id: Uuid,
        aggregate_type: &str,
        event_type: &str,
        version: i32,
        created_at: DateTime<Utc>,
        headers: &Headers,
        payload: &str,
    ) -> Result<Self, DecodeError> {
        let version = parse_version(&version.to_string())?;
        let headers = headers
            .iter()
            .filter(|(k, _)| !RESERVED_HEADERS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Self::assemble(
            Meta {
                id,
                aggregate_type,
                event_type,
                version,
                created_at,
                headers,
            },
            payload.as_bytes(),
        )
    }

    /// The checks shared by every source: the event type is one of `E`'s, the version is not
    /// newer than `E` knows, the payload deserialises as `E` and is of that event type.
    fn assemble(meta: Meta<'_>, payload: &[u8]) -> Result<Self, DecodeError> {
        let target = std::any::type_name::<E>();
        let known = E::EVENT_TYPES
            .iter()
            .find(|t| t.aggregate_type == meta.aggregate_type && t.event_type == meta.event_type);
        let Some(known) = known else {
            return Err(DecodeError::UnknownEventType {
                aggregate_type: meta.aggregate_type.to_owned(),
                event_type: meta.event_type.to_owned(),
                target,
                known: E::EVENT_TYPES.iter().map(describe).collect(),
            });
        };
        if meta.version > known.version {
            return Err(DecodeError::VersionTooNew {
                event_type: meta.event_type.to_owned(),
                version: meta.version,
                supported: known.version,
                target,
            });
        }
        let payload_error = |reason: String| DecodeError::Payload {
            event_type: meta.event_type.to_owned(),
            target,
            reason,
        };
        // An older version goes through the type's upcast chain when it has one for that
        // version (`#[outbox(upcast_from = ...)]`), so handlers only see the current type.
        let payload: E = match E::__outbox_upcast(meta.event_type, meta.version, payload) {
            None => serde_json::from_slice(payload).map_err(|e| payload_error(e.to_string()))?,
            Some(Ok(payload)) => payload,
            Some(Err(failure)) => {
                return Err(DecodeError::Payload {
                    event_type: meta.event_type.to_owned(),
                    target: failure.target,
                    reason: format!(
                        "version {} is upcast from `{}`: {}",
                        meta.version, failure.target, failure.reason
                    ),
                });
            }
        };
        if payload.event_type() != meta.event_type {
            return Err(payload_error(format!(
                "the payload is a `{}` event, but the message says `{}`",
                payload.event_type(),
                meta.event_type
            )));
        }
        Ok(Envelope {
            id: meta.id,
            aggregate_type: meta.aggregate_type.to_owned(),
            aggregate_id: payload.aggregate_id(),
            event_type: meta.event_type.to_owned(),
            version: meta.version,
            created_at: meta.created_at,
            headers: meta.headers,
            payload,
        })
    }
}

/// The metadata of a message, read but not yet checked against `E`.
struct Meta<'a> {
    id: Uuid,
    aggregate_type: &'a str,
    event_type: &'a str,
    version: u32,
    created_at: DateTime<Utc>,
    headers: Headers,
}

fn describe(t: &EventType) -> String {
    crate::catalog::version_name(t.aggregate_type, t.event_type, t.version)
}

fn required<'a>(
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

fn invalid(name: &'static str, value: &str, reason: String) -> DecodeError {
    DecodeError::InvalidHeader {
        name,
        value: value.to_owned(),
        reason,
    }
}

fn parse_version(value: &str) -> Result<u32, DecodeError> {
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

/// Why a message could not be decoded into an [`Envelope<E>`]. Each message names what was
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
    /// ([`OutboxEvent::EVENT_TYPES`]).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate as outbox_core;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize, crate::OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderCreated", version = 2)]
    struct OrderCreated {
        #[outbox(aggregate_id)]
        order_id: u64,
        total_cents: i64,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize, crate::OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "order")]
    enum OrderEvent {
        Paid {
            #[outbox(aggregate_id)]
            order_id: u64,
        },
        #[outbox(event_type = "OrderCancelled", version = 3)]
        Cancelled {
            #[outbox(aggregate_id)]
            order_id: u64,
        },
    }

    const ID: &str = "0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a";

    fn headers(event_type: &str, version: &str) -> Vec<(String, Option<Vec<u8>>)> {
        [
            ("id", ID),
            ("event_type", event_type),
            ("event_version", version),
            ("aggregate_type", "order"),
            ("created_at", "2025-01-31T09:30:00.123456Z"),
            ("traceparent", "00-ab-cd-01"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), Some(v.as_bytes().to_vec())))
        .collect()
    }

    fn decode<E: OutboxEvent + DeserializeOwned>(
        headers: &[(String, Option<Vec<u8>>)],
        payload: Option<&str>,
    ) -> Result<Envelope<E>, DecodeError> {
        Envelope::decode(
            headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())),
            payload.map(str::as_bytes),
        )
    }

    fn without(
        mut h: Vec<(String, Option<Vec<u8>>)>,
        name: &str,
    ) -> Vec<(String, Option<Vec<u8>>)> {
        h.retain(|(k, _)| k != name);
        h
    }

    fn with(
        mut h: Vec<(String, Option<Vec<u8>>)>,
        name: &str,
        value: Option<&[u8]>,
    ) -> Vec<(String, Option<Vec<u8>>)> {
        for (k, v) in &mut h {
            if k == name {
                *v = value.map(<[u8]>::to_vec);
            }
        }
        h
    }

    #[test]
    fn a_well_formed_message_decodes() {
        let payload = r#"{"order_id":7,"total_cents":1250}"#;
        let env: Envelope<OrderCreated> =
            decode(&headers("OrderCreated", "2"), Some(payload)).unwrap();
        assert_eq!(env.id, Uuid::parse_str(ID).unwrap());
        assert_eq!(env.aggregate_type, "order");
        assert_eq!(env.aggregate_id, "7");
        assert_eq!(env.event_type, "OrderCreated");
        assert_eq!(env.version, 2);
        assert_eq!(
            env.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "2025-01-31T09:30:00.123456Z"
        );
        assert_eq!(
            env.headers,
            Headers::from([("traceparent".to_owned(), "00-ab-cd-01".to_owned())])
        );
        assert_eq!(
            env.payload,
            OrderCreated {
                order_id: 7,
                total_cents: 1250
            }
        );
        assert_eq!(env.inbox_key(), ID);
    }

    #[test]
    fn an_older_version_decodes() {
        let env: Envelope<OrderCreated> = decode(
            &headers("OrderCreated", "1"),
            Some(r#"{"order_id":7,"total_cents":1}"#),
        )
        .unwrap();
        assert_eq!(env.version, 1);
    }

    #[test]
    fn each_missing_header_is_named() {
        for name in RESERVED_HEADERS {
            let h = without(headers("OrderCreated", "2"), name);
            let err = decode::<OrderCreated>(&h, Some("{}")).unwrap_err();
            assert_eq!(err, DecodeError::MissingHeader { name });
            assert!(
                err.to_string()
                    .starts_with(&format!("missing header `{name}`")),
                "{err}"
            );
            // A null value is as good as missing.
            let h = with(headers("OrderCreated", "2"), name, None);
            assert_eq!(
                decode::<OrderCreated>(&h, Some("{}")).unwrap_err(),
                DecodeError::MissingHeader { name }
            );
        }
    }

    #[test]
    fn invalid_headers_say_what_is_wrong() {
        let cases: [(&str, &[u8], &str); 7] = [
            ("id", b"42", "invalid header `id` = `42`: invalid"),
            (
                "event_version",
                b"0",
                "invalid header `event_version` = `0`: versions start at 1",
            ),
            ("event_version", b"-1", "not a version from 1 to 2147483647"),
            (
                "event_version",
                b"two",
                "not a version from 1 to 2147483647",
            ),
            (
                "event_version",
                b"2147483648",
                "not a version from 1 to 2147483647",
            ),
            (
                "created_at",
                b"yesterday",
                "invalid header `created_at` = `yesterday`: not an RFC 3339 timestamp",
            ),
            (
                "event_type",
                b"Order\xffCreated",
                "invalid header `event_type` = `Order\u{fffd}Created`: not UTF-8",
            ),
        ];
        for (name, value, message) in cases {
            let h = with(headers("OrderCreated", "2"), name, Some(value));
            let err = decode::<OrderCreated>(&h, Some("{}")).unwrap_err();
            assert!(
                matches!(&err, DecodeError::InvalidHeader { name: n, .. } if *n == name),
                "{err:?}"
            );
            assert!(err.to_string().contains(message), "{err} / {message}");
        }
    }

    #[test]
    fn an_unknown_event_type_lists_what_the_type_carries() {
        let err = decode::<OrderEvent>(&headers("OrderShipped", "1"), Some("{}")).unwrap_err();
        assert!(
            matches!(&err, DecodeError::UnknownEventType { event_type, .. } if event_type == "OrderShipped")
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with("unknown event type `OrderShipped` of aggregate `order`"),
            "{msg}"
        );
        assert!(
            msg.contains("OrderEvent` carries order/Paid v1, order/OrderCancelled v3"),
            "{msg}"
        );

        // The same event type under another aggregate is another event.
        let h = with(
            headers("OrderCreated", "1"),
            "aggregate_type",
            Some(b"invoice"),
        );
        let err = decode::<OrderCreated>(&h, Some("{}")).unwrap_err();
        assert!(
            matches!(err, DecodeError::UnknownEventType { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn a_version_newer_than_the_type_knows_is_refused() {
        let err = decode::<OrderEvent>(&headers("OrderCancelled", "4"), Some("{}")).unwrap_err();
        assert_eq!(
            err,
            DecodeError::VersionTooNew {
                event_type: "OrderCancelled".into(),
                version: 4,
                supported: 3,
                target: std::any::type_name::<OrderEvent>(),
            }
        );
        assert!(
            err.to_string()
                .contains("has version 4, newer than version 3"),
            "{err}"
        );
    }

    #[test]
    fn a_payload_that_does_not_match_is_refused() {
        let h = headers("OrderCreated", "2");
        let cases = [
            (Some("garbage \u{1}"), "expected value"),
            (Some(r#"{"order_id":7}"#), "missing field `total_cents`"),
            (
                Some(r#"{"order_id":"seven","total_cents":1}"#),
                "invalid type",
            ),
            (None, "the message has no payload"),
        ];
        for (payload, reason) in cases {
            let err = decode::<OrderCreated>(&h, payload).unwrap_err();
            assert!(matches!(err, DecodeError::Payload { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(
                msg.starts_with("the payload of event `OrderCreated` does not decode as `"),
                "{msg}"
            );
            assert!(msg.contains(reason), "{msg} / {reason}");
        }
        // Non-UTF-8 bytes are just another payload that is not JSON.
        let err = Envelope::<OrderCreated>::decode(
            h.iter().map(|(k, v)| (k.as_str(), v.as_deref())),
            Some(&[0xff, 0xfe, 0x00][..]),
        )
        .unwrap_err();
        assert!(matches!(err, DecodeError::Payload { .. }), "{err:?}");

        // An enum payload of another variant than the message says.
        let err = decode::<OrderEvent>(
            &headers("OrderCancelled", "3"),
            Some(r#"{"Paid":{"order_id":1}}"#),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("the payload is a `Paid` event, but the message says `OrderCancelled`"),
            "{err}"
        );
        let env: Envelope<OrderEvent> =
            decode(&headers("Paid", "1"), Some(r#"{"Paid":{"order_id":1}}"#)).unwrap();
        assert_eq!(env.payload, OrderEvent::Paid { order_id: 1 });
    }

    #[test]
    fn the_first_reserved_header_counts_and_others_are_kept() {
        let mut h = headers("OrderCreated", "2");
        h.push(("id".into(), Some(b"spoofed".to_vec())));
        h.push(("traceparent".into(), Some(b"second".to_vec())));
        h.push(("binary".into(), Some(vec![0xff])));
        h.push(("empty".into(), None));
        let env: Envelope<OrderCreated> =
            decode(&h, Some(r#"{"order_id":7,"total_cents":1}"#)).unwrap();
        assert_eq!(env.inbox_key(), ID);
        assert_eq!(env.headers["traceparent"], "00-ab-cd-01");
        assert_eq!(env.headers["binary"], "\u{fffd}");
        assert_eq!(env.headers["empty"], "");
    }

    #[test]
    fn an_outbox_row_decodes_with_the_same_checks() {
        let mut row = NewMessage::from_event(
            &OrderEvent::Cancelled { order_id: 3 },
            Headers::from([
                ("traceparent".to_owned(), "t".to_owned()),
                ("id".to_owned(), "spoofed".to_owned()),
            ]),
        )
        .unwrap();
        let env = Envelope::<OrderEvent>::from_new_message(&row).unwrap();
        assert_eq!(env.id, row.id);
        assert_eq!(
            (env.event_type.as_str(), env.version),
            ("OrderCancelled", 3)
        );
        assert_eq!(env.created_at, row.created_at);
        assert_eq!(
            env.headers,
            Headers::from([("traceparent".to_owned(), "t".to_owned())])
        );

        row.event_version = 4;
        assert!(matches!(
            Envelope::<OrderEvent>::from_new_message(&row),
            Err(DecodeError::VersionTooNew {
                version: 4,
                supported: 3,
                ..
            })
        ));
        row.event_version = 3;
        row.payload = "{}".into();
        assert!(matches!(
            Envelope::<OrderEvent>::from_new_message(&row),
            Err(DecodeError::Payload { .. })
        ));
        assert!(matches!(
            Envelope::<OrderCreated>::from_new_message(&row),
            Err(DecodeError::UnknownEventType { .. })
        ));
    }

    #[test]
    fn a_new_envelope_describes_its_payload() {
        let env = Envelope::new(OrderEvent::Cancelled { order_id: 5 }).with_header("k", "v");
        assert_eq!(env.aggregate_type, "order");
        assert_eq!(env.aggregate_id, "5");
        assert_eq!(env.event_type, "OrderCancelled");
        assert_eq!(env.version, 3);
        assert_eq!(env.headers["k"], "v");
        let id = Uuid::now_v7();
        assert_eq!(env.with_id(id).id, id);
    }

    #[cfg(feature = "relay")]
    #[tokio::test]
    async fn what_a_publisher_sends_decodes_as_what_was_written() {
        use crate::relay::{MemoryBroker, OutboxMessage, Publisher};
        let row = NewMessage::from_event(
            &OrderCreated {
                order_id: 4,
                total_cents: 99,
            },
            Headers::from([("traceparent".to_owned(), "t".to_owned())]),
        )
        .unwrap();
        let claimed = OutboxMessage {
            seq: 1,
            id: row.id,
            aggregate_type: row.aggregate_type.to_string(),
            aggregate_id: row.aggregate_id.clone(),
            event_type: row.event_type.to_string(),
            event_version: row.event_version,
            payload: row.payload.clone(),
            headers: row.headers.clone(),
            topic: None,
            shard: row.shard,
            created_at: row.created_at,
            attempts: 1,
        };
        let broker = MemoryBroker::new();
        broker.publish(std::slice::from_ref(&claimed)).await;
        let record = &broker.records("order")[0];
        let from_record = Envelope::<OrderCreated>::from_record(record).unwrap();
        let from_claim = Envelope::<OrderCreated>::from_outbox_message(&claimed).unwrap();
        let from_row = Envelope::<OrderCreated>::from_new_message(&row).unwrap();
        assert_eq!(from_record, from_row);
        assert_eq!(from_claim, from_row);
        assert_eq!(from_row.headers["traceparent"], "t");
    }
}
