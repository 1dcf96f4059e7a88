//! [`NatsMessage`]: a JetStream message as the consumer runtime reads it.

use async_nats::jetstream;

use crate::consumer::Received;
use crate::nats::subject::aggregate_id;

/// A message of one of the consumer's topics, with what the runtime asks of it worked out
/// once: its topic (the source), its aggregate id (from the subject's last token) and its
/// stream sequence.
pub(crate) struct NatsMessage {
    pub(super) inner: jetstream::Message,
    pub(super) topic: String,
    key: Option<String>,
    pub(super) sequence: u64,
    /// The headers as (name, value) pairs, in name order (a header map has no order of its
    /// own; sorted, a dead letter's headers do not change from one write to the next).
    headers: Vec<(String, Vec<u8>)>,
}

impl NatsMessage {
    /// `message` of `topic`: the key is the subject's token after `<topic>.`, unescaped
    /// (`None` if the subject is not one the publisher makes).
    pub(super) fn new(inner: jetstream::Message, topic: &str) -> Self {
        let key = inner
            .subject
            .strip_prefix(topic)
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(aggregate_id);
        let sequence = inner.info().map_or(0, |info| info.stream_sequence);
        let mut headers: Vec<(String, Vec<u8>)> = inner
            .headers
            .iter()
            .flat_map(|map| map.iter())
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |v| (name.to_string(), v.as_str().as_bytes().to_vec()))
            })
            .collect();
        headers.sort_by(|a, b| a.0.cmp(&b.0));
        NatsMessage {
            inner,
            topic: topic.to_owned(),
            key,
            sequence,
            headers,
        }
    }
}

impl Received for NatsMessage {
    fn source(&self) -> &str {
        &self.topic
    }

    fn position(&self) -> i64 {
        i64::try_from(self.sequence).unwrap_or(i64::MAX)
    }

    fn key(&self) -> Option<&[u8]> {
        self.key.as_deref().map(str::as_bytes)
    }

    fn payload(&self) -> Option<&[u8]> {
        Some(&self.inner.payload)
    }

    fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.headers
            .iter()
            .map(|(name, value)| (name.as_str(), Some(value.as_slice())))
    }
}
