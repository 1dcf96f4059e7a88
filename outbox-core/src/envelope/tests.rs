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

fn without(mut h: Vec<(String, Option<Vec<u8>>)>, name: &str) -> Vec<(String, Option<Vec<u8>>)> {
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
    let env: Envelope<OrderCreated> = decode(&headers("OrderCreated", "2"), Some(payload)).unwrap();
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
