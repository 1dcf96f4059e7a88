//! A message ready to be written to the outbox table.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{
    EventError, HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_TYPE, HEADER_EVENT_VERSION,
    HEADER_ID, OutboxEvent, RESERVED_HEADERS, shard_of,
};

/// Headers of a message: string keys to string values, stored as a JSON object and sent as
/// Kafka headers. Kept sorted so that the stored JSON is deterministic.
pub type Headers = BTreeMap<String, String>;

/// The default limit on an event's size as a Kafka producer counts it ([`NewMessage::record_size`]:
/// payload, key, headers, the relay's own headers included, and the record's framing):
/// 1,000,000 bytes, librdkafka's default producer `message.max.bytes` (which counts the same
/// things; the broker's default limit, 1,048,588, is larger). An event over it is refused at
/// `publish` with [`EventError::PayloadTooLarge`] instead of being committed and then refused
/// by the producer on every attempt until it is dead-lettered. Raise it together with
/// `message.max.bytes` (and the topic's `max.message.bytes`).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1_000_000;

/// What librdkafka adds to a record's key, value and headers when it checks
/// `message.max.bytes`: the most a record's length, attributes, timestamp and offset deltas,
/// key and value lengths and header count take (`RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`).
pub const RECORD_OVERHEAD_BYTES: usize = 36;

static MAX_PAYLOAD_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_PAYLOAD_BYTES);

/// Sets the process-wide limit every `publish` checks against an event's
/// [`record_size`](NewMessage::record_size) (a transaction may override it with
/// `OutboxTx::set_max_payload_bytes`). Set it to the producer's `message.max.bytes`;
/// `usize::MAX` turns the check off.
///
/// ```
/// outbox_core::set_max_payload_bytes(2_000_000);
/// assert_eq!(outbox_core::max_payload_bytes(), 2_000_000);
/// # outbox_core::set_max_payload_bytes(outbox_core::DEFAULT_MAX_PAYLOAD_BYTES);
/// ```
pub fn set_max_payload_bytes(limit: usize) {
    MAX_PAYLOAD_BYTES.store(limit, Ordering::Relaxed);
}

/// The process-wide payload limit ([`DEFAULT_MAX_PAYLOAD_BYTES`] unless set).
pub fn max_payload_bytes() -> usize {
    MAX_PAYLOAD_BYTES.load(Ordering::Relaxed)
}

/// One outbox row as it is inserted: an event, serialised, with its id, shard and headers.
///
/// Built by [`NewMessage::from_event`]; the Diesel store writes a batch of them with one
/// multi-row `INSERT`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// The event id, a UUIDv7 (time ordered); consumers deduplicate on it.
    pub id: Uuid,
    /// The aggregate type, e.g. `"order"`.
    pub aggregate_type: Cow<'static, str>,
    /// The aggregate id as a key.
    pub aggregate_id: String,
    /// The event type, e.g. `"OrderCreated"`.
    pub event_type: Cow<'static, str>,
    /// The event's schema version (at least 1).
    pub event_version: i32,
    /// The payload as JSON text.
    pub payload: String,
    /// The headers, stored as a JSON object.
    pub headers: Headers,
    /// The topic, when the event names one.
    pub topic: Option<Cow<'static, str>>,
    /// [`shard_of`] the aggregate.
    pub shard: i16,
    /// When the event was published into the outbox (UTC, microseconds).
    pub created_at: DateTime<Utc>,
}

impl NewMessage {
    /// Serialises `event` into a new message with a fresh UUIDv7 id.
    ///
    /// Fails with [`EventError::Serialize`] (naming the event type) if serde fails, with
    /// [`EventError::InvalidEvent`] if the event type, aggregate type or aggregate id is empty or
    /// the version does not fit, and with [`EventError::PayloadTooLarge`] if its
    /// [`record_size`](Self::record_size) is over [`max_payload_bytes`].
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// use outbox_core::{NewMessage, OutboxEvent};
    /// #[derive(serde::Serialize, OutboxEvent)]
    /// #[outbox(crate = outbox_core, aggregate = "order")]
    /// struct OrderCreated { #[outbox(aggregate_id)] id: u32 }
    ///
    /// let msg = NewMessage::from_event(&OrderCreated { id: 3 }, Default::default()).unwrap();
    /// assert_eq!(msg.aggregate_id, "3");
    /// assert_eq!(msg.event_type, "OrderCreated");
    /// assert_eq!(msg.payload, r#"{"id":3}"#);
    /// assert_eq!(msg.id.get_version_num(), 7);
    /// ```
    pub fn from_event<E: OutboxEvent + ?Sized>(
        event: &E,
        headers: Headers,
    ) -> Result<Self, EventError> {
        Self::from_event_with_limit(event, headers, max_payload_bytes())
    }

    /// [`from_event`](NewMessage::from_event) with an explicit limit in bytes on the
    /// [`record_size`](Self::record_size).
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// # #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    /// # #[outbox(crate = outbox_core, aggregate = "doc")]
    /// # struct DocUploaded { #[outbox(aggregate_id)] id: u32, body: String }
    /// use outbox_core::{EventError, NewMessage};
    /// let event = DocUploaded { id: 1, body: "x".repeat(100) };
    /// let size = NewMessage::from_event_with_limit(&event, Default::default(), usize::MAX)?
    ///     .record_size();
    /// assert!(NewMessage::from_event_with_limit(&event, Default::default(), size).is_ok());
    /// let err = NewMessage::from_event_with_limit(&event, Default::default(), size - 1)
    ///     .unwrap_err();
    /// assert!(matches!(err, EventError::PayloadTooLarge { size: s, .. } if s == size));
    /// assert!(err.to_string().contains(&format!("`DocUploaded` is {size} bytes")));
    /// # Ok::<(), EventError>(())
    /// ```
    pub fn from_event_with_limit<E: OutboxEvent + ?Sized>(
        event: &E,
        headers: Headers,
        limit: usize,
    ) -> Result<Self, EventError> {
        let event_type = event.event_type();
        let payload = crate::wire::encode(event)
            .map_err(|source| EventError::Serialize { event_type, source })?;
        let aggregate_type = event.aggregate_type();
        let aggregate_id = event.aggregate_id();
        // The same rules as the table's CHECK constraints (migration `row_checks`): refused
        // here first, with the event's name, rather than by the database at commit.
        let empty = if event_type.is_empty() {
            Some("the event type is empty")
        } else if aggregate_type.is_empty() {
            Some("the aggregate type is empty")
        } else if aggregate_id.is_empty() {
            Some("the aggregate id is empty")
        } else {
            None
        };
        if let Some(reason) = empty {
            return Err(EventError::InvalidEvent {
                event_type: event_type.to_owned(),
                reason: reason.to_owned(),
            });
        }
        let event_version = match i32::try_from(event.event_version()) {
            Ok(v) if v >= 1 => v,
            _ => {
                return Err(EventError::InvalidEvent {
                    event_type: event_type.to_owned(),
                    reason: format!(
                        "version {} is outside 1..=2147483647",
                        event.event_version()
                    ),
                });
            }
        };
        let message = NewMessage {
            id: Uuid::now_v7(),
            shard: shard_of(aggregate_type, &aggregate_id),
            aggregate_type: Cow::Borrowed(aggregate_type),
            aggregate_id,
            event_type: Cow::Borrowed(event_type),
            event_version,
            payload,
            headers,
            topic: event.topic().map(Cow::Borrowed),
            created_at: now_micros(),
        };
        let size = message.record_size();
        if size > limit {
            return Err(EventError::PayloadTooLarge {
                event_type: event_type.to_owned(),
                size,
                limit,
            });
        }
        Ok(message)
    }

    /// The message's size as librdkafka's producer checks it against `message.max.bytes`:
    /// the record framing (`RECORD_OVERHEAD_BYTES`, 36 bytes), the key (the aggregate id), the payload, and every header the
    /// relay sends (its own `id`, `event_type`, `event_version`, `aggregate_type` and
    /// `created_at`, then the event's headers but those named like its own), each as a
    /// varint-prefixed name and value. What the writer accepts under the default limit, the
    /// default producer sends.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// # #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    /// # #[outbox(crate = outbox_core, aggregate = "order")]
    /// # struct OrderCreated { #[outbox(aggregate_id)] id: u32 }
    /// let msg = outbox_core::NewMessage::from_event(&OrderCreated { id: 7 }, Default::default()).unwrap();
    /// // 36 of framing, the key `7`, the payload {"id":7}, and the relay's five headers.
    /// assert_eq!(msg.record_size(), 36 + 1 + 8 + 140);
    /// ```
    pub fn record_size(&self) -> usize {
        let created_at = self
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            .len();
        let own = [
            (HEADER_ID, 36),
            (HEADER_EVENT_TYPE, self.event_type.len()),
            (HEADER_EVENT_VERSION, self.event_version.to_string().len()),
            (HEADER_AGGREGATE_TYPE, self.aggregate_type.len()),
            (HEADER_CREATED_AT, created_at),
        ];
        let carried = self
            .headers
            .iter()
            .filter(|(k, _)| !RESERVED_HEADERS.contains(&k.as_str()))
            .map(|(k, v)| header_size(k.len(), v.len()));
        own.iter()
            .map(|(k, v)| header_size(k.len(), *v))
            .chain(carried)
            .fold(
                RECORD_OVERHEAD_BYTES
                    .saturating_add(self.aggregate_id.len())
                    .saturating_add(self.payload.len()),
                usize::saturating_add,
            )
    }

    /// The headers as JSON text, as stored in the `headers` column.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// # #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    /// # #[outbox(crate = outbox_core, aggregate = "order")]
    /// # struct OrderCreated { #[outbox(aggregate_id)] id: u32 }
    /// let mut headers = outbox_core::Headers::new();
    /// headers.insert("traceparent".into(), "00-abc-def-01".into());
    /// let msg = outbox_core::NewMessage::from_event(&OrderCreated { id: 1 }, headers).unwrap();
    /// assert_eq!(msg.headers_json(), r#"{"traceparent":"00-abc-def-01"}"#);
    /// ```
    pub fn headers_json(&self) -> String {
        // A map of strings to strings always serialises.
        serde_json::to_string(&self.headers).unwrap_or_else(|_| String::from("{}"))
    }
}

/// A record header's size on the wire: its name and value, each after its length as a
/// zig-zag varint (as librdkafka counts it).
fn header_size(name: usize, value: usize) -> usize {
    varint_size(name)
        .saturating_add(name)
        .saturating_add(varint_size(value))
        .saturating_add(value)
}

/// The bytes of `n` as a zig-zag varint (`2n` in 7-bit groups).
fn varint_size(n: usize) -> usize {
    let mut v = (n as u128) << 1;
    let mut bytes = 1;
    while v >= 0x80 {
        v >>= 7;
        bytes += 1;
    }
    bytes
}

/// The current time truncated to microseconds, the precision every backend stores, so that
/// what is written reads back equal.
///
/// ```
/// let t = outbox_core::now_micros();
/// assert_eq!(t.timestamp_subsec_nanos() % 1_000, 0);
/// ```
pub fn now_micros() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Doc {
        body: String,
    }

    impl OutboxEvent for Doc {
        const AGGREGATE_TYPE: &'static str = "doc";
        const EVENT_TYPES: &'static [crate::EventType] = &[];
        fn aggregate_id(&self) -> String {
            "1".into()
        }
        fn event_type(&self) -> &'static str {
            "DocStored"
        }
        fn event_version(&self) -> u32 {
            1
        }
    }

    #[test]
    fn varints_are_zigzag_sized() {
        assert_eq!([0, 63, 64, 8191, 8192].map(varint_size), [1, 1, 2, 2, 3]);
    }

    /// The size the writer checks is that of the headers the relay sends: its own five, the
    /// event's, but not an event header named like one of its own.
    #[cfg(feature = "relay")]
    #[test]
    fn record_size_counts_what_the_relay_sends() {
        let mut headers = Headers::new();
        headers.insert(
            "traceparent".into(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        );
        headers.insert("id".into(), "spoofed".into());
        headers.insert("tenant".into(), "t".repeat(300));
        let event = Doc {
            body: "x".repeat(70_000),
        };
        let m = NewMessage::from_event_with_limit(&event, headers, usize::MAX).unwrap();
        let sent = crate::relay::OutboxMessage {
            seq: 1,
            id: m.id,
            aggregate_type: m.aggregate_type.to_string(),
            aggregate_id: m.aggregate_id.clone(),
            event_type: m.event_type.to_string(),
            event_version: m.event_version,
            payload: m.payload.clone(),
            headers: m.headers.clone(),
            topic: None,
            shard: m.shard,
            created_at: m.created_at,
            attempts: 0,
        };
        let wire: usize = crate::relay::wire_headers(&sent)
            .map(|(k, v)| header_size(k.len(), v.len()))
            .sum();
        assert_eq!(
            m.record_size(),
            RECORD_OVERHEAD_BYTES + m.aggregate_id.len() + m.payload.len() + wire
        );
    }

    #[test]
    fn payload_limit_is_inclusive_and_names_the_event() {
        let event = Doc {
            body: "x".repeat(90),
        }; // {"body":"xxx…"} is 101 bytes
        let size = NewMessage::from_event_with_limit(&event, Headers::new(), usize::MAX)
            .unwrap()
            .record_size();
        assert!(size > 101 + RECORD_OVERHEAD_BYTES, "{size}");
        assert!(NewMessage::from_event_with_limit(&event, Headers::new(), size).is_ok());
        match NewMessage::from_event_with_limit(&event, Headers::new(), size - 1) {
            Err(EventError::PayloadTooLarge {
                event_type,
                size: s,
                limit,
            }) => assert_eq!(
                (event_type.as_str(), s, limit),
                ("DocStored", size, size - 1)
            ),
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        assert_eq!(DEFAULT_MAX_PAYLOAD_BYTES, 1_000_000);
    }
}
