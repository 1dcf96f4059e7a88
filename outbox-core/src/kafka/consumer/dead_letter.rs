//! The dead-letter topic: the runtime's dead letters (see `crate::consumer`) as Kafka records,
//! with the original key, payload and headers, on the source topic plus `.dlt` or a fixed one.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use crate::consumer::{DeadLetter, Unwritten};

/// Which topic dead letters go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeadLetterTopic {
    /// The source topic plus this suffix.
    Suffix(String),
    /// This topic, whatever the source.
    Fixed(String),
}

impl DeadLetterTopic {
    pub(crate) fn for_topic(&self, source: &str) -> String {
        match self {
            DeadLetterTopic::Suffix(suffix) => format!("{source}{suffix}"),
            DeadLetterTopic::Fixed(topic) => topic.clone(),
        }
    }
}

/// Produces dead letters.
pub(crate) struct DeadLetters {
    pub(crate) producer: super::context::DeadLetterProducer,
    pub(crate) topic: DeadLetterTopic,
    pub(crate) timeout: Duration,
}

impl DeadLetters {
    /// Sends `letter` to its dead-letter topic; `Ok(topic)` once the broker acknowledged it.
    pub(crate) async fn send(&self, letter: &DeadLetter<'_>) -> Result<String, Unwritten> {
        let topic = self.topic.for_topic(letter.source);
        let headers = kafka_headers(letter);
        let mut record = FutureRecord::<[u8], [u8]>::to(&topic).headers(headers);
        if let Some(key) = letter.key {
            record = record.key(key);
        }
        if let Some(payload) = letter.payload {
            record = record.payload(payload);
        }
        match self.producer.send(record, self.timeout).await {
            Ok(_) => Ok(topic),
            Err((error, _)) => Err(unwritten(topic, &error)),
        }
    }
}

/// The dead letter's headers, in order, as Kafka headers.
fn kafka_headers(letter: &DeadLetter<'_>) -> OwnedHeaders {
    letter
        .headers
        .iter()
        .fold(OwnedHeaders::new(), |headers, (key, value)| {
            headers.insert(Header {
                key,
                value: value.as_deref(),
            })
        })
}

/// A failed write: librdkafka's code (`TopicAuthorizationFailed`, `MessageTimedOut`, ...), or
/// `none`.
fn unwritten(topic: String, error: &KafkaError) -> Unwritten {
    Unwritten {
        topic,
        code: error
            .rdkafka_error_code()
            .map_or_else(|| "none".to_owned(), |c| format!("{c:?}")),
        error: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::test_recorder::CountingRecorder;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn an_unwritten_dead_letter_names_its_topic_and_code_and_is_counted() {
        let unwritten = unwritten(
            "order.dlt".into(),
            &KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed),
        );
        assert!(
            unwritten.to_string().starts_with(
                "could not write the dead letter to topic `order.dlt` (TopicAuthorizationFailed): "
            ),
            "{unwritten}"
        );
        let recorder = CountingRecorder::default();
        metrics::with_local_recorder(&recorder, || {
            unwritten.count();
            unwritten.count();
        });
        assert_eq!(
            recorder.counts(),
            [(
                "outbox_consumer_dead_letter_failures_total{code=TopicAuthorizationFailed,topic=order.dlt}"
                    .to_owned(),
                2
            )]
        );
    }

    #[test]
    fn records_keep_the_headers_in_order_and_topics_follow_the_source() {
        let letter = DeadLetter {
            source: "order",
            key: Some(b"7"),
            payload: None,
            headers: vec![
                ("id", Some(b"abc".to_vec())),
                ("outbox.error", Some(b"boom".to_vec())),
            ],
        };
        assert_eq!(
            crate::kafka::header_pairs(&kafka_headers(&letter)),
            [
                ("id".to_owned(), "abc".to_owned()),
                ("outbox.error".to_owned(), "boom".to_owned())
            ]
        );
        assert_eq!(
            DeadLetterTopic::Suffix(".dlt".into()).for_topic("order"),
            "order.dlt"
        );
        assert_eq!(
            DeadLetterTopic::Fixed("all.dlt".into()).for_topic("order"),
            "all.dlt"
        );
    }
}
