//! What one [`OutboxMessage`] becomes on the wire: its exchange, its routing key and its
//! properties.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::topology::short;
use crate::relay::{OutboxMessage, wire_headers};

/// `delivery_mode` 2: the broker writes the message to disk (with a durable queue).
const PERSISTENT: u8 = 2;

/// The message as it is published: where, with which key, which properties.
pub(crate) struct Outgoing {
    pub(crate) exchange: ShortString,
    pub(crate) routing_key: ShortString,
    pub(crate) properties: BasicProperties,
}

/// `msg` as it is published to `exchange`, or why it cannot be: an exchange name, routing key
/// (aggregate id) or header name longer than AMQP's 255 bytes is the message's own fault, it
/// can never be published.
pub(crate) fn outgoing(exchange: &str, msg: &OutboxMessage) -> Result<Outgoing, String> {
    let mut headers = FieldTable::default();
    for (key, value) in wire_headers(msg) {
        let key = short("header name", key)?;
        let value = LongString::from(value.into_owned());
        headers.insert(key, AMQPValue::LongString(value));
    }
    let timestamp = u64::try_from(msg.created_at.timestamp()).unwrap_or(0);
    let properties = BasicProperties::default()
        .with_message_id(msg.id.hyphenated().to_string().into())
        .with_content_type("application/json".into())
        .with_delivery_mode(PERSISTENT)
        .with_timestamp(timestamp)
        .with_headers(headers);
    Ok(Outgoing {
        exchange: short("exchange name", exchange)?,
        routing_key: short("routing key (the aggregate id)", &msg.aggregate_id)?,
        properties,
    })
}

/// Chooses the exchange of a message: a user function or [`OutboxMessage::topic`], then a
/// prefix.
pub(crate) use crate::relay::Router;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn message(aggregate_id: &str) -> OutboxMessage {
        OutboxMessage {
            seq: 1,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: aggregate_id.into(),
            event_type: "OrderPlaced".into(),
            event_version: 1,
            payload: "{}".into(),
            headers: Default::default(),
            topic: None,
            shard: 0,
            created_at: chrono::Utc::now(),
            attempts: 1,
        }
    }

    fn text(headers: &FieldTable) -> Vec<(String, String)> {
        headers
            .inner()
            .iter()
            .map(|(k, v)| match v {
                AMQPValue::LongString(s) => (k.to_string(), s.to_string()),
                other => panic!("{k}: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn properties_carry_the_id_persistence_and_the_wire_headers() {
        let mut msg = message("42");
        msg.headers
            .insert("traceparent".into(), "00-abc-def-01".into());
        let out = outgoing("prod.order", &msg).unwrap();
        assert_eq!(out.exchange.as_str(), "prod.order");
        assert_eq!(out.routing_key.as_str(), "42");
        let p = &out.properties;
        let id = msg.id.hyphenated().to_string();
        assert_eq!(
            p.message_id().as_ref().map(ShortString::as_str),
            Some(id.as_str())
        );
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(
            p.content_type().as_ref().map(ShortString::as_str),
            Some("application/json")
        );
        let mut want = crate::relay::message_headers(&msg);
        want.sort();
        // An AMQP table is sorted by name.
        assert_eq!(text(p.headers().as_ref().unwrap()), want);
    }

    #[test]
    fn names_over_255_bytes_are_the_message_s_fault() {
        let msg = message(&"7".repeat(256));
        let why = outgoing("order", &msg).err().unwrap();
        assert!(why.contains("routing key"), "{why}");
    }

    #[test]
    fn exchanges_are_routed_then_prefixed() {
        let mut msg = message("42");
        assert_eq!(Router::default().topic(&msg), "order");
        msg.topic = Some("orders-v2".into());
        let mapped = Router {
            prefix: "prod.".into(),
            map: Some(Arc::new(|m: &OutboxMessage| {
                format!("{}.events", m.aggregate_type)
            })),
        };
        assert_eq!(mapped.topic(&msg), "prod.order.events");
    }
}
