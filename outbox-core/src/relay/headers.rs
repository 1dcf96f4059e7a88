//! The headers a message carries on the wire, built in one place for every publisher (Kafka's
//! and the in-memory broker), so that consumers see the same headers from both.

use std::borrow::Cow;

use chrono::SecondsFormat;

use super::OutboxMessage;
use crate::{
    HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_TYPE, HEADER_EVENT_VERSION, HEADER_ID,
    RESERVED_HEADERS,
};

/// The headers of `m` in the order they are sent: the five publisher headers (`id`,
/// `event_type`, `event_version`, `aggregate_type`, `created_at` in RFC 3339, UTC,
/// microseconds), then every header the event carried (e.g. `traceparent`) except those
/// named like a publisher header ([`RESERVED_HEADERS`]): the publisher's values are the ones
/// consumers decode by, and an event header must not be able to spoof its id or type.
pub(crate) fn wire_headers(m: &OutboxMessage) -> impl Iterator<Item = (&str, Cow<'_, str>)> {
    let own = [
        (HEADER_ID, Cow::Owned(m.id.hyphenated().to_string())),
        (HEADER_EVENT_TYPE, Cow::Borrowed(m.event_type.as_str())),
        (
            HEADER_EVENT_VERSION,
            Cow::Owned(m.event_version.to_string()),
        ),
        (
            HEADER_AGGREGATE_TYPE,
            Cow::Borrowed(m.aggregate_type.as_str()),
        ),
        (
            HEADER_CREATED_AT,
            Cow::Owned(m.created_at.to_rfc3339_opts(SecondsFormat::Micros, true)),
        ),
    ];
    let carried = m
        .headers
        .iter()
        .filter(|(k, _)| !RESERVED_HEADERS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), Cow::Borrowed(v.as_str())));
    own.into_iter().chain(carried)
}

/// The headers every publisher sends with a message, owned: the five publisher headers (`id`,
/// `event_type`, `event_version`, `aggregate_type`, `created_at` in RFC 3339, UTC,
/// microseconds), then the event's own headers (e.g. `traceparent`) except those named like a
/// publisher header, which cannot override the publisher's.
///
/// ```
/// use outbox_core::relay::{OutboxMessage, message_headers};
/// let m = OutboxMessage {
///     seq: 1,
///     id: uuid::Uuid::now_v7(),
///     aggregate_type: "order".into(),
///     aggregate_id: "42".into(),
///     event_type: "OrderCreated".into(),
///     event_version: 1,
///     payload: "{}".into(),
///     headers: [("traceparent".into(), "00-abc-def-01".into()), ("id".into(), "spoofed".into())].into(),
///     topic: None,
///     shard: 0,
///     created_at: outbox_core::now_micros(),
///     attempts: 1,
/// };
/// let h = message_headers(&m);
/// let keys: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
/// assert_eq!(keys, ["id", "event_type", "event_version", "aggregate_type", "created_at", "traceparent"]);
/// assert_eq!(h[0].1, m.id.to_string()); // not "spoofed"
/// ```
pub fn message_headers(m: &OutboxMessage) -> Vec<(String, String)> {
    wire_headers(m)
        .map(|(k, v)| (k.to_owned(), v.into_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::{MemoryBroker, Publisher};

    #[tokio::test]
    async fn the_memory_broker_sends_the_wire_headers() {
        let message = OutboxMessage {
            seq: 1,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "OrderCreated".into(),
            event_version: 2,
            payload: "{}".into(),
            headers: [
                ("traceparent".to_owned(), "00-abc-def-01".to_owned()),
                (HEADER_EVENT_TYPE.to_owned(), "Spoofed".to_owned()),
            ]
            .into(),
            topic: None,
            shard: 0,
            created_at: crate::now_micros(),
            attempts: 1,
        };
        let broker = MemoryBroker::new();
        broker.publish(std::slice::from_ref(&message)).await;
        let record = broker.records("order").remove(0);
        assert_eq!(record.headers, message_headers(&message));
        assert_eq!(record.header(HEADER_EVENT_TYPE), Some("OrderCreated"));
        assert_eq!(
            record
                .headers
                .iter()
                .filter(|(k, _)| k == HEADER_EVENT_TYPE)
                .count(),
            1,
            "a reserved name is sent once, with the publisher's value"
        );
        assert_eq!(record.header("traceparent"), Some("00-abc-def-01"));
    }
}
