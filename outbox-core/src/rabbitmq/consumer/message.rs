//! [`Incoming`]: a RabbitMQ delivery as the consumer runtime reads it ([`Received`]).

use std::sync::Arc;

use lapin::message::Delivery;
use lapin::types::AMQPValue;

use crate::consumer::Received;

/// A delivery and the topic (exchange) whose queue it was read from.
pub(crate) struct Incoming {
    /// The topic: the source of the runtime's keys, parking and dead letters.
    pub(crate) topic: Arc<str>,
    pub(crate) delivery: Delivery,
    /// The AMQP headers as bytes, in the table's order (by name).
    headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Incoming {
    pub(crate) fn new(topic: Arc<str>, delivery: Delivery) -> Self {
        let headers = delivery
            .properties
            .headers()
            .as_ref()
            .map(|table| {
                table
                    .inner()
                    .iter()
                    .map(|(key, value)| (key.to_string(), header_bytes(value)))
                    .collect()
            })
            .unwrap_or_default();
        Incoming {
            topic,
            delivery,
            headers,
        }
    }
}

/// A header's value as bytes: strings and byte arrays as they are, no value as `None`,
/// anything else (numbers, booleans, tables) as text.
pub(crate) fn header_bytes(value: &AMQPValue) -> Option<Vec<u8>> {
    let text = |v: &dyn std::fmt::Display| Some(v.to_string().into_bytes());
    match value {
        AMQPValue::LongString(s) => Some(s.as_bytes().to_vec()),
        AMQPValue::ShortString(s) => Some(s.as_str().as_bytes().to_vec()),
        AMQPValue::ByteArray(b) => Some(b.as_slice().to_vec()),
        AMQPValue::Void => None,
        AMQPValue::Boolean(b) => text(b),
        AMQPValue::ShortShortInt(n) => text(n),
        AMQPValue::ShortShortUInt(n) => text(n),
        AMQPValue::ShortInt(n) => text(n),
        AMQPValue::ShortUInt(n) => text(n),
        AMQPValue::LongInt(n) => text(n),
        AMQPValue::LongUInt(n) => text(n),
        AMQPValue::LongLongInt(n) => text(n),
        AMQPValue::Timestamp(n) => text(n),
        AMQPValue::Float(n) => text(n),
        AMQPValue::Double(n) => text(n),
        other => Some(format!("{other:?}").into_bytes()),
    }
}

impl Received for Incoming {
    fn source(&self) -> &str {
        &self.topic
    }

    /// The delivery tag (per channel: it starts again at 1 after a reconnect).
    fn position(&self) -> i64 {
        i64::try_from(self.delivery.delivery_tag).unwrap_or(i64::MAX)
    }

    fn key(&self) -> Option<&[u8]> {
        Some(self.delivery.routing_key.as_str().as_bytes())
    }

    fn payload(&self) -> Option<&[u8]> {
        Some(&self.delivery.data)
    }

    fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.headers
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_deref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{ByteArray, LongString};

    #[test]
    fn header_values_become_bytes() {
        let long = AMQPValue::LongString(LongString::from("OrderCreated"));
        assert_eq!(header_bytes(&long), Some(b"OrderCreated".to_vec()));
        let bytes = AMQPValue::ByteArray(ByteArray::from(vec![0u8, 159]));
        assert_eq!(header_bytes(&bytes), Some(vec![0, 159]));
        assert_eq!(header_bytes(&AMQPValue::LongInt(-3)), Some(b"-3".to_vec()));
        assert_eq!(
            header_bytes(&AMQPValue::Boolean(true)),
            Some(b"true".to_vec())
        );
        assert_eq!(header_bytes(&AMQPValue::Void), None);
    }
}
