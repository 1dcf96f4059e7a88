//! Dead letters: the runtime's dead letters (see `crate::consumer`) published to the
//! dead-letter exchange with confirms, `mandatory`, persistent, with the original routing key,
//! payload and headers.

use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation};

use super::link::Setup;
use crate::HEADER_ID;
use crate::consumer::{DeadLetter, Unwritten};
use crate::rabbitmq::classify::{code_name, name_of};

/// Where dead letters go and how long their confirm may take.
pub(crate) struct DeadLetters {
    pub(crate) timeout: Duration,
}

impl DeadLetters {
    /// The dead-letter exchange of `topic` (declared with its queues), or `<topic>.dlt`.
    pub(crate) fn exchange_for(&self, topic: &str, setup: &Setup) -> String {
        setup
            .queues
            .iter()
            .find(|q| q.topic.as_str() == topic)
            .map_or_else(|| format!("{topic}.dlt"), |q| q.dead_letters.to_string())
    }

    /// Publishes `letter` to `exchange` on `channel`; `Ok(exchange)` once the broker confirmed
    /// it, else why not (the runtime retries).
    pub(crate) async fn send(
        &self,
        channel: &Channel,
        exchange: String,
        letter: &DeadLetter<'_>,
    ) -> Result<String, Unwritten> {
        let unwritten = |code: &str, error: String| Unwritten {
            topic: exchange.clone(),
            code: code.to_owned(),
            error,
        };
        let Ok(name) = ShortString::try_new(exchange.as_str()) else {
            return Err(unwritten("name", "longer than 255 bytes".into()));
        };
        // A key AMQP cannot carry as a routing key (over 255 bytes) stays in the headers'
        // company: the dead-letter exchange is a fanout, which ignores routing keys.
        let key = letter
            .key
            .and_then(|k| ShortString::try_new(String::from_utf8_lossy(k).into_owned()).ok())
            .unwrap_or_default();
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let payload = letter.payload.unwrap_or_default();
        let confirmed = tokio::time::timeout(self.timeout, async {
            channel
                .basic_publish(name, key, options, payload, properties(letter))
                .await?
                .await
        })
        .await;
        match confirmed {
            Ok(Ok(Confirmation::Ack(None))) => Ok(exchange),
            Ok(Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)))) => {
                Err(unwritten(
                    name_of(returned.reply_code),
                    "no queue is bound to the dead-letter exchange".into(),
                ))
            }
            Ok(Ok(Confirmation::Nack(None))) => Err(unwritten(
                "nack",
                "the broker refused it (basic.nack)".into(),
            )),
            Ok(Ok(Confirmation::NotRequested)) => Err(unwritten(
                "none",
                "the channel was not in confirm mode".into(),
            )),
            Ok(Err(e)) => Err(unwritten(&code_name(&e), e.to_string())),
            Err(_) => Err(unwritten(
                "timeout",
                format!("no publisher confirm within {:?}", self.timeout),
            )),
        }
    }
}

/// Persistent, JSON, the event id as `message_id`, the dead letter's headers in order (AMQP
/// tables are keyed by name: a repeated name keeps its last value).
fn properties(letter: &DeadLetter<'_>) -> BasicProperties {
    let mut headers = FieldTable::default();
    let mut id = None;
    for (key, value) in &letter.headers {
        let Ok(name) = ShortString::try_new(*key) else {
            continue;
        };
        let value = match value {
            Some(bytes) => {
                if *key == HEADER_ID {
                    id = ShortString::try_new(String::from_utf8_lossy(bytes).into_owned()).ok();
                }
                AMQPValue::LongString(LongString::from(bytes.clone()))
            }
            None => AMQPValue::Void,
        };
        headers.insert(name, value);
    }
    let mut properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(id) = id {
        properties = properties.with_message_id(id);
    }
    properties
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letters_keep_the_headers_and_the_event_id() {
        let letter = DeadLetter {
            source: "order",
            key: Some(b"7"),
            payload: Some(b"{}"),
            headers: vec![
                ("id", Some(b"abc".to_vec())),
                ("outbox.error", Some(b"boom".to_vec())),
                ("empty", None),
            ],
        };
        let p = properties(&letter);
        assert_eq!(
            p.message_id().as_ref().map(ShortString::as_str),
            Some("abc")
        );
        assert_eq!(*p.delivery_mode(), Some(2));
        let headers = p.headers().as_ref().unwrap().inner();
        assert_eq!(
            headers.get("outbox.error"),
            Some(&AMQPValue::LongString("boom".into()))
        );
        assert_eq!(headers.get("empty"), Some(&AMQPValue::Void));
    }
}
