//! Dead letters: where a message goes that failed every attempt, that (by policy) cannot be
//! decoded, or that is parked behind an earlier dead letter of its key. The record keeps the
//! original key, payload and headers, and adds headers that say why and where it came from:
//! enough to replay it to its source, in order, once the cause is fixed. The adapter decides
//! where it goes (Kafka: a dead-letter topic).

use super::parking::Head;
use super::received::Received;

/// Dead-letter header: the error, e.g. the handler's last error or why decoding failed.
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_ERROR, "outbox.error");
/// ```
pub const DLT_HEADER_ERROR: &str = "outbox.error";
/// Dead-letter header: `handler` (the handler failed every attempt with a permanent error),
/// `undecodable`, or `parked` (not handled: an earlier message of its key was dead-lettered).
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_ERROR_KIND, "outbox.error.kind");
/// ```
pub const DLT_HEADER_ERROR_KIND: &str = "outbox.error.kind";
/// Dead-letter header: how many times the handler ran (0 for an undecodable message).
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_ATTEMPTS, "outbox.attempts");
/// ```
pub const DLT_HEADER_ATTEMPTS: &str = "outbox.attempts";
/// Dead-letter header: the topic (stream, queue) the message was consumed from.
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_TOPIC, "outbox.original.topic");
/// ```
pub const DLT_HEADER_TOPIC: &str = "outbox.original.topic";
/// Dead-letter header: the partition the message was consumed from (brokers with
/// partitions only).
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_PARTITION, "outbox.original.partition");
/// ```
pub const DLT_HEADER_PARTITION: &str = "outbox.original.partition";
/// Dead-letter header: the offset (stream sequence, delivery tag) the message had there.
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_OFFSET, "outbox.original.offset");
/// ```
pub const DLT_HEADER_OFFSET: &str = "outbox.original.offset";
/// Dead-letter header: the consumer group (durable consumer) that gave up on the message.
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_GROUP, "outbox.consumer.group");
/// ```
pub const DLT_HEADER_GROUP: &str = "outbox.consumer.group";

/// Dead-letter header of a parked message: the dead letter its key is parked behind, as
/// `topic/partition/offset` of that message in the source topic (`source/position` where the
/// broker has no partitions; names cannot contain `/`).
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_PARKED_BEHIND, "outbox.parked.behind");
/// ```
pub const DLT_HEADER_PARKED_BEHIND: &str = "outbox.parked.behind";
/// Dead-letter header of a parked message: the event id (`id` header) of the dead letter its
/// key is parked behind, when that message had one.
///
/// ```
/// assert_eq!(outbox_core::consumer::DLT_HEADER_PARKED_BEHIND_ID, "outbox.parked.behind.id");
/// ```
pub const DLT_HEADER_PARKED_BEHIND_ID: &str = "outbox.parked.behind.id";

/// Header values are bounded: an error message can be long (a serde error quotes input).
const MAX_ERROR_BYTES: usize = 16 * 1024;

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

/// A dead letter to write: the original message with the dead-letter headers added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadLetter<'a> {
    /// Where the original was read from (a Kafka adapter derives the dead-letter topic).
    pub(crate) source: &'a str,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) payload: Option<&'a [u8]>,
    /// The original headers, then the dead-letter headers.
    pub(crate) headers: Vec<(&'a str, Option<Vec<u8>>)>,
}

impl<'a> DeadLetter<'a> {
    /// The dead letter of `message`: `error` (bounded), `kind`, `attempts` and where it came
    /// from, for consumer `group`.
    pub(crate) fn of<M: Received>(
        message: &'a M,
        kind: &Kind,
        error: &str,
        attempts: u32,
        group: &str,
    ) -> Self {
        let mut headers: Vec<(&'a str, Option<Vec<u8>>)> = message
            .headers()
            .map(|(key, value)| (key, value.map(<[u8]>::to_vec)))
            .collect();
        let mut add = |key: &'static str, value: &str| headers.push((key, Some(value.into())));
        add(DLT_HEADER_ERROR, truncate(error, MAX_ERROR_BYTES));
        add(DLT_HEADER_ERROR_KIND, kind.as_str());
        add(DLT_HEADER_ATTEMPTS, &attempts.to_string());
        add(DLT_HEADER_TOPIC, message.source());
        if let Some(partition) = message.partition() {
            add(DLT_HEADER_PARTITION, &partition.to_string());
        }
        add(DLT_HEADER_OFFSET, &message.position().to_string());
        add(DLT_HEADER_GROUP, group);
        if let Kind::Parked(head) = kind {
            add(DLT_HEADER_PARKED_BEHIND, &head.coordinates());
            if let Some(id) = &head.id {
                add(DLT_HEADER_PARKED_BEHIND_ID, id);
            }
        }
        DeadLetter {
            source: message.source(),
            key: message.key(),
            payload: message.payload(),
            headers,
        }
    }
}

/// A dead letter the broker did not take: the message's source waits until one is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unwritten {
    /// Where it was to go: the dead-letter topic (subject, exchange).
    pub(crate) topic: String,
    /// The broker's error code (`TopicAuthorizationFailed`, `MessageTimedOut`, ...), or `none`.
    pub(crate) code: String,
    /// The broker's error.
    pub(crate) error: String,
}

impl Unwritten {
    /// Counts it in `outbox_consumer_dead_letter_failures_total{topic, code}`.
    pub(crate) fn count(&self) {
        metrics::counter!(
            "outbox_consumer_dead_letter_failures_total",
            "topic" => self.topic.clone(),
            "code" => self.code.clone(),
        )
        .increment(1);
    }
}

impl std::fmt::Display for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "could not write the dead letter to topic `{}` ({}): {}",
            self.topic, self.code, self.error
        )
    }
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
    use crate::consumer::received::TestMessage;

    fn text(headers: &[(&str, Option<Vec<u8>>)]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(k, v)| {
                let v = String::from_utf8(v.clone().unwrap()).unwrap();
                ((*k).to_owned(), v)
            })
            .collect()
    }

    #[test]
    fn dead_letters_keep_the_original_headers_and_say_why() {
        let message = TestMessage {
            source: "order".into(),
            partition: Some(2),
            position: 41,
            key: Some(b"7".to_vec()),
            payload: Some(b"{}".to_vec()),
            headers: vec![("id".into(), Some(b"abc".to_vec()))],
        };
        let long = "é".repeat(MAX_ERROR_BYTES);
        let letter = DeadLetter::of(&message, &Kind::Handler, &long, 5, "billing");
        assert_eq!((letter.source, letter.key), ("order", Some(&b"7"[..])));
        assert_eq!(letter.payload, Some(&b"{}"[..]));
        let got = text(&letter.headers);
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
            source: "order".into(),
            partition: Some(2),
            position: 40,
            id: Some("e-40".into()),
        };
        let parked = DeadLetter::of(&message, &Kind::Parked(head), "parked", 0, "billing");
        let tail = text(&parked.headers[got.len()..]);
        assert_eq!(
            tail,
            [
                ("outbox.parked.behind".into(), "order/2/40".into()),
                ("outbox.parked.behind.id".into(), "e-40".into())
            ]
        );
    }

    #[test]
    fn without_partitions_there_is_no_partition_header() {
        let message = TestMessage {
            source: "orders".into(),
            partition: None,
            position: 9,
            key: None,
            payload: None,
            headers: Vec::new(),
        };
        let letter = DeadLetter::of(&message, &Kind::Undecodable, "bad", 0, "billing");
        let keys: Vec<&str> = letter.headers.iter().map(|(k, _)| *k).collect();
        assert!(!keys.contains(&DLT_HEADER_PARTITION), "{keys:?}");
        assert!(keys.contains(&DLT_HEADER_OFFSET), "{keys:?}");
    }
}
