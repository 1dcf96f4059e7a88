//! [`Envelope`]: an event as a consumer receives it, decoded from a broker message or an outbox
//! row, and [`DecodeError`], everything that can be wrong with one.

use std::ops::Deref;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::{Headers, NewMessage, OutboxEvent};

mod error;
mod headers;
#[cfg(test)]
mod tests;

use error::{Meta, describe, invalid, parse_version, required};

pub use error::DecodeError;
pub use headers::{
    HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_TYPE, HEADER_EVENT_VERSION, HEADER_ID,
    RESERVED_HEADERS,
};

/// Decodes an outbox row, as written ([`NewMessage`]) or as claimed (`OutboxMessage`): the
/// two share these fields. The row's headers become [`Envelope::headers`], except any named
/// like a reserved header.
macro_rules! from_row {
    ($message:expr) => {{
        let m = $message;
        Self::assemble(
            Meta {
                id: m.id,
                aggregate_type: &m.aggregate_type,
                event_type: &m.event_type,
                version: parse_version(&m.event_version.to_string())?,
                created_at: m.created_at,
                headers: m
                    .headers
                    .iter()
                    .filter(|(k, _)| !RESERVED_HEADERS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            },
            m.payload.as_bytes(),
        )
    }};
}

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
        from_row!(message)
    }

    /// Decodes an outbox row as a relay claimed it.
    #[cfg(feature = "relay")]
    #[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
    pub fn from_outbox_message(message: &crate::relay::OutboxMessage) -> Result<Self, DecodeError> {
        from_row!(message)
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
            None => crate::wire::decode(meta.event_type, payload)
                .map_err(|e| payload_error(e.to_string()))?,
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
