//! [`Received`]: the runtime's view of a message a broker delivered.

/// A message as the runtime reads it, whatever broker delivered it.
///
/// - Kafka: a record (`rdkafka`'s `OwnedMessage`); source = topic, partition, position =
///   offset.
/// - NATS JetStream: a pull consumer's message; source = stream (or subject), no partition,
///   position = the stream sequence.
/// - RabbitMQ: a delivery; source = queue, no partition, position = the delivery tag.
///
/// Keys are ordered, and parked, per source: two messages with equal keys from one source are
/// one aggregate's events in order.
pub(crate) trait Received: Send + Sync + 'static {
    /// Where it was read from: the topic, stream or queue.
    fn source(&self) -> &str;

    /// Its partition, where the broker has partitions (Kafka).
    fn partition(&self) -> Option<i32> {
        None
    }

    /// Its position in its source (or partition): an offset, a stream sequence, a delivery
    /// tag. In dead-letter headers and logs, so that an operator can find it.
    fn position(&self) -> i64;

    /// The ordering key: the aggregate id, as the relay published it.
    fn key(&self) -> Option<&[u8]>;

    /// The payload, as published (JSON).
    fn payload(&self) -> Option<&[u8]>;

    /// Every header, in the order the broker gives them (a header without a value: `None`).
    fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)>;

    /// The value of the first header named `name`.
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers()
            .find(|(key, _)| *key == name)
            .and_then(|(_, value)| value)
    }
}

/// `source/partition/position`, or `source/position` without a partition (topic, stream and
/// queue names cannot contain `/`).
pub(crate) fn coordinates(source: &str, partition: Option<i32>, position: i64) -> String {
    match partition {
        Some(partition) => format!("{source}/{partition}/{position}"),
        None => format!("{source}/{position}"),
    }
}

/// A message for the runtime's unit tests.
#[cfg(test)]
pub(crate) struct TestMessage {
    pub(crate) source: String,
    pub(crate) partition: Option<i32>,
    pub(crate) position: i64,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) payload: Option<Vec<u8>>,
    pub(crate) headers: Vec<(String, Option<Vec<u8>>)>,
}

#[cfg(test)]
impl Received for TestMessage {
    fn source(&self) -> &str {
        &self.source
    }

    fn partition(&self) -> Option<i32> {
        self.partition
    }

    fn position(&self) -> i64 {
        self.position
    }

    fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref()))
    }
}
