//! A message ready to be written to the outbox table.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{EventError, OutboxEvent, shard_of};

/// Headers of a message: string keys to string values, stored as a JSON object and sent as
/// Kafka headers. Kept sorted so that the stored JSON is deterministic.
pub type Headers = BTreeMap<String, String>;

/// The default limit on an event's serialised payload: 1,000,000 bytes, under Kafka's default
/// `message.max.bytes` (1,048,588) with room for the key and headers. A larger payload is
/// refused at `publish` with [`EventError::PayloadTooLarge`] instead of being committed and then
/// refused by the broker, where it would fail every attempt and be dead-lettered.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1_000_000;

static MAX_PAYLOAD_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_PAYLOAD_BYTES);

/// Sets the process-wide payload limit every `publish` checks (a transaction may override it
/// with `OutboxTx::set_max_payload_bytes`). Set it to your broker's limit minus headroom for
/// the headers; `usize::MAX` turns the check off.
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
    /// the version does not fit, and with [`EventError::PayloadTooLarge`] if the payload is
    /// over [`max_payload_bytes`].
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

    /// [`from_event`](NewMessage::from_event) with an explicit payload limit in bytes.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// # #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    /// # #[outbox(crate = outbox_core, aggregate = "doc")]
    /// # struct DocUploaded { #[outbox(aggregate_id)] id: u32, body: String }
    /// let event = DocUploaded { id: 1, body: "x".repeat(100) };
    /// let err = outbox_core::NewMessage::from_event_with_limit(&event, Default::default(), 64)
    ///     .unwrap_err();
    /// assert!(matches!(err, outbox_core::EventError::PayloadTooLarge { size: 118, limit: 64, .. }));
    /// assert!(err.to_string().contains("`DocUploaded` is 118 bytes, over the limit of 64"));
    /// ```
    pub fn from_event_with_limit<E: OutboxEvent + ?Sized>(
        event: &E,
        headers: Headers,
        limit: usize,
    ) -> Result<Self, EventError> {
        let event_type = event.event_type();
        let payload = crate::wire::encode(event)
            .map_err(|source| EventError::Serialize { event_type, source })?;
        if payload.len() > limit {
            return Err(EventError::PayloadTooLarge {
                event_type: event_type.to_owned(),
                size: payload.len(),
                limit,
            });
        }
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
        Ok(NewMessage {
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
        })
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
    fn payload_limit_is_inclusive_and_names_the_event() {
        let event = Doc {
            body: "x".repeat(90),
        }; // {"body":"xxx…"} is 101 bytes
        assert!(NewMessage::from_event_with_limit(&event, Headers::new(), 101).is_ok());
        match NewMessage::from_event_with_limit(&event, Headers::new(), 100) {
            Err(EventError::PayloadTooLarge {
                event_type,
                size,
                limit,
            }) => assert_eq!((event_type.as_str(), size, limit), ("DocStored", 101, 100)),
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        assert_eq!(DEFAULT_MAX_PAYLOAD_BYTES, 1_000_000);
    }
}
