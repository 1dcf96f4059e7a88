//! The dead-letter topic: where a message goes that failed every attempt, that (by policy)
//! cannot be decoded, or that is parked behind an earlier dead letter of its key. It keeps the
//! original key, payload and headers, and adds headers that say why and where it came from:
//! enough to replay it to its topic, in order, once the cause is fixed.

use std::time::Duration;

use rdkafka::Message;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureRecord;

use super::parking::Head;

/// Dead-letter header: the error, e.g. the handler's last error or why decoding failed.
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_ERROR, "outbox.error");
/// ```
pub const DLT_HEADER_ERROR: &str = "outbox.error";
/// Dead-letter header: `handler` (the handler failed every attempt with a permanent error),
/// `undecodable`, or `parked` (not handled: an earlier message of its key was dead-lettered).
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_ERROR_KIND, "outbox.error.kind");
/// ```
pub const DLT_HEADER_ERROR_KIND: &str = "outbox.error.kind";
/// Dead-letter header: how many times the handler ran (0 for an undecodable message).
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_ATTEMPTS, "outbox.attempts");
/// ```
pub const DLT_HEADER_ATTEMPTS: &str = "outbox.attempts";
/// Dead-letter header: the topic the message was consumed from.
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_TOPIC, "outbox.original.topic");
/// ```
pub const DLT_HEADER_TOPIC: &str = "outbox.original.topic";
/// Dead-letter header: the partition the message was consumed from.
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_PARTITION, "outbox.original.partition");
/// ```
pub const DLT_HEADER_PARTITION: &str = "outbox.original.partition";
/// Dead-letter header: the offset the message had there.
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_OFFSET, "outbox.original.offset");
/// ```
pub const DLT_HEADER_OFFSET: &str = "outbox.original.offset";
/// Dead-letter header: the consumer group that gave up on the message.
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_GROUP, "outbox.consumer.group");
/// ```
pub const DLT_HEADER_GROUP: &str = "outbox.consumer.group";

/// Dead-letter header of a parked message: the dead letter its key is parked behind, as
/// `topic/partition/offset` of that message in the source topic (topic names cannot contain
/// `/`).
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_PARKED_BEHIND, "outbox.parked.behind");
/// ```
pub const DLT_HEADER_PARKED_BEHIND: &str = "outbox.parked.behind";
/// Dead-letter header of a parked message: the event id (`id` header) of the dead letter its
/// key is parked behind, when that message had one.
///
/// ```
/// assert_eq!(outbox_core::kafka::DLT_HEADER_PARKED_BEHIND_ID, "outbox.parked.behind.id");
/// ```
pub const DLT_HEADER_PARKED_BEHIND_ID: &str = "outbox.parked.behind.id";

/// Header values are bounded: an error message can be long (a serde error quotes input).
const MAX_ERROR_BYTES: usize = 16 * 1024;

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

/// Why a message is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Handler,
    Undecodable,
    /// Parked behind this earlier dead letter of its key.
    Parked(Head),
}

impl Kind {
    fn as_str(&self) -> &'static str {
        match self {
            Kind::Handler => "handler",
            Kind::Undecodable => "undecodable",
            Kind::Parked(_) => "parked",
        }
    }
}

/// Produces dead letters.
pub(crate) struct DeadLetters {
    pub(crate) producer: super::context::DeadLetterProducer,
    pub(crate) topic: DeadLetterTopic,
    pub(crate) group: String,
    pub(crate) timeout: Duration,
}

/// A dead letter the broker did not take: the message's partition waits until one is written.
#[derive(Debug)]
pub(crate) struct Unwritten {
    /// The dead-letter topic.
    pub(crate) topic: String,
    pub(crate) error: KafkaError,
}

impl Unwritten {
    /// librdkafka's code (`TopicAuthorizationFailed`, `MessageTimedOut`, ...), or `none`.
    pub(crate) fn code(&self) -> String {
        self.error
            .rdkafka_error_code()
            .map_or_else(|| "none".to_owned(), |c| format!("{c:?}"))
    }

    /// Counts it in `outbox_consumer_dead_letter_failures_total{topic, code}`.
    pub(crate) fn count(&self) {
        metrics::counter!(
            "outbox_consumer_dead_letter_failures_total",
            "topic" => self.topic.clone(),
            "code" => self.code(),
        )
        .increment(1);
    }
}

impl std::fmt::Display for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "could not write the dead letter to topic `{}` ({}): {}",
            self.topic,
            self.code(),
            self.error
        )
    }
}

impl DeadLetters {
    /// Sends `message` to its dead-letter topic; `Ok(topic)` once the broker acknowledged it.
    pub(crate) async fn send(
        &self,
        message: &OwnedMessage,
        kind: &Kind,
        error: &str,
        attempts: u32,
    ) -> Result<String, Unwritten> {
        let topic = self.topic.for_topic(message.topic());
        let headers = dead_letter_headers(message, kind, error, attempts, &self.group);
        let mut record = FutureRecord::<[u8], [u8]>::to(&topic).headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(payload) = message.payload() {
            record = record.payload(payload);
        }
        match self.producer.send(record, self.timeout).await {
            Ok(_) => Ok(topic),
            Err((error, _)) => Err(Unwritten { topic, error }),
        }
    }
}

/// The original headers, then the dead-letter headers.
pub(crate) fn dead_letter_headers(
    message: &OwnedMessage,
    kind: &Kind,
    error: &str,
    attempts: u32,
    group: &str,
) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new();
    if let Some(original) = message.headers() {
        for h in original.iter() {
            headers = headers.insert(Header {
                key: h.key,
                value: h.value,
            });
        }
    }
    let error = truncate(error, MAX_ERROR_BYTES);
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let attempts = attempts.to_string();
    let ours = [
        (DLT_HEADER_ERROR, error),
        (DLT_HEADER_ERROR_KIND, kind.as_str()),
        (DLT_HEADER_ATTEMPTS, attempts.as_str()),
        (DLT_HEADER_TOPIC, message.topic()),
        (DLT_HEADER_PARTITION, partition.as_str()),
        (DLT_HEADER_OFFSET, offset.as_str()),
        (DLT_HEADER_GROUP, group),
    ];
    for (key, value) in ours {
        headers = headers.insert(Header {
            key,
            value: Some(value),
        });
    }
    if let Kind::Parked(head) = kind {
        let behind = head.coordinates();
        headers = headers.insert(Header {
            key: DLT_HEADER_PARKED_BEHIND,
            value: Some(behind.as_str()),
        });
        if let Some(id) = &head.id {
            headers = headers.insert(Header {
                key: DLT_HEADER_PARKED_BEHIND_ID,
                value: Some(id.as_str()),
            });
        }
    }
    headers
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::test_recorder::CountingRecorder;
    use rdkafka::Timestamp;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn an_unwritten_dead_letter_names_its_topic_and_code_and_is_counted() {
        let unwritten = Unwritten {
            topic: "order.dlt".into(),
            error: KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed),
        };
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
    fn dead_letters_keep_the_original_headers_and_say_why() {
        let original = OwnedHeaders::new().insert(Header {
            key: "id",
            value: Some("abc"),
        });
        let message = OwnedMessage::new(
            Some(b"{}".to_vec()),
            Some(b"7".to_vec()),
            "order".into(),
            Timestamp::NotAvailable,
            2,
            41,
            Some(original),
        );
        let long = "é".repeat(MAX_ERROR_BYTES);
        let h = dead_letter_headers(&message, &Kind::Handler, &long, 5, "billing");
        let got = crate::kafka::header_pairs(&h);
        assert_eq!(got[0], ("id".into(), "abc".into()));
        assert_eq!(got[1].0, "outbox.error");
        assert_eq!(got[1].1.len(), MAX_ERROR_BYTES);
        let rest: Vec<(&str, &str)> = got[2..]
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            rest,
            [
                ("outbox.error.kind", "handler"),
                ("outbox.attempts", "5"),
                ("outbox.original.topic", "order"),
                ("outbox.original.partition", "2"),
                ("outbox.original.offset", "41"),
                ("outbox.consumer.group", "billing"),
            ]
        );
        let head = Head {
            topic: "order".into(),
            partition: 2,
            offset: 40,
            id: Some("e-40".into()),
        };
        let parked = dead_letter_headers(&message, &Kind::Parked(head), "parked", 0, "billing");
        let tail: Vec<(&str, &str)> = parked
            .iter()
            .skip(got.len())
            .map(|h| (h.key, std::str::from_utf8(h.value.unwrap()).unwrap()))
            .collect();
        assert_eq!(
            tail,
            [
                ("outbox.parked.behind", "order/2/40"),
                ("outbox.parked.behind.id", "e-40")
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
