//! What one [`OutboxMessage`] becomes on the wire: its topic and its headers.

use rdkafka::message::{Header, OwnedHeaders};

use crate::relay::{OutboxMessage, wire_headers};

use crate::RESERVED_HEADERS;

/// The Kafka headers of `msg`: those of [`wire_headers`], the one rule for every publisher.
pub(crate) fn headers(msg: &OutboxMessage) -> OwnedHeaders {
    wire_headers(msg).fold(
        OwnedHeaders::new_with_capacity(RESERVED_HEADERS.len() + msg.headers.len()),
        |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(value.as_ref()),
            })
        },
    )
}

pub(crate) use crate::relay::Router;

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use std::sync::Arc;

    pub(crate) fn message() -> OutboxMessage {
        OutboxMessage {
            seq: 7,
            id: uuid::Uuid::parse_str("0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a").unwrap(),
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "OrderCreated".into(),
            event_version: 3,
            payload: r#"{"total":5}"#.into(),
            headers: [
                ("traceparent".to_owned(), "00-abc-def-01".to_owned()),
                ("id".to_owned(), "spoofed".to_owned()),
            ]
            .into(),
            topic: None,
            shard: 1,
            created_at: chrono::Utc
                .timestamp_opt(1_700_000_000, 123_456_000)
                .unwrap(),
            attempts: 1,
        }
    }

    #[test]
    fn headers_are_the_publisher_ones_then_the_carried_ones() {
        let h = headers(&message());
        let got = crate::kafka::header_pairs(&h);
        let want = [
            ("id", "0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a"),
            ("event_type", "OrderCreated"),
            ("event_version", "3"),
            ("aggregate_type", "order"),
            ("created_at", "2023-11-14T22:13:20.123456Z"),
            ("traceparent", "00-abc-def-01"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
        // The in-memory broker sends the same headers, by the same rule.
        let memory: Vec<(String, String)> = crate::relay::message_headers(&message());
        assert_eq!(got, memory);
    }

    #[test]
    fn topics_are_routed_then_prefixed() {
        let mut msg = message();
        let plain = Router::default();
        assert_eq!(plain.topic(&msg), "order");
        let prefixed = Router {
            prefix: "prod.".into(),
            map: None,
        };
        assert_eq!(prefixed.topic(&msg), "prod.order");
        msg.topic = Some("orders-v2".into());
        assert_eq!(prefixed.topic(&msg), "prod.orders-v2");
        let mapped = Router {
            prefix: "prod.".into(),
            map: Some(Arc::new(|m: &OutboxMessage| {
                format!("{}.{}", m.aggregate_type, m.event_type)
            })),
        };
        assert_eq!(mapped.topic(&msg), "prod.order.OrderCreated");
    }
}
