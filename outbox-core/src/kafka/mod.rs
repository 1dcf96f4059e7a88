//! Publishing outbox messages to Kafka, and consuming them, with librdkafka (through
//! `rdkafka`): [`KafkaPublisher`] for the relay (it needs the `relay` feature too),
//! [`KafkaConsumer`] for the consumers (see its documentation; the rest of this page is about
//! publishing).
//!
//! ```no_run
//! use std::time::Duration;
//! use outbox_core::kafka::KafkaPublisher;
//! use outbox_core::relay::{OutboxMessage, Publisher};
//!
//! # async fn run(claimed: Vec<OutboxMessage>) -> Result<(), Box<dyn std::error::Error>> {
//! let publisher = KafkaPublisher::builder()
//!     .brokers("127.0.0.1:9092")
//!     .set("linger.ms", "5")                 // any librdkafka producer setting
//!     .topic_prefix("prod.")                 // `order` events go to `prod.order`
//!     .message_timeout(Duration::from_secs(10))
//!     .build()?;
//! let outcomes = publisher.publish(&claimed).await; // one Delivery per message, in order
//! # drop(outcomes); Ok(()) }
//! ```
//!
//! # The records
//!
//! | Kafka | from the [`OutboxMessage`](crate::relay::OutboxMessage) |
//! |---|---|
//! | topic | [`topic()`](crate::relay::OutboxMessage::topic): the event's topic, else its aggregate type; mapped by [`topic_for`](KafkaPublisherBuilder::topic_for), then prefixed by [`topic_prefix`](KafkaPublisherBuilder::topic_prefix) |
//! | key | the aggregate id (so the partition follows the aggregate) |
//! | value | the JSON payload, as is |
//! | header `id` | the event id, a hyphenated UUID: consumers deduplicate on it |
//! | header `event_type`, `event_version` | e.g. `OrderCreated`, `1` |
//! | header `aggregate_type` | e.g. `order` |
//! | header `created_at` | when the event was written to the outbox, RFC 3339 in UTC with microseconds, e.g. `2025-01-31T09:30:00.123456Z` |
//! | other headers | every header the event carried, e.g. `traceparent`; one named like a header above is left out |
//! | timestamp | the send time, set by the producer. Not `created_at`: an event relayed late would then fall under the topic's time-based retention at once |
//!
//! # The producer
//!
//! librdkafka's idempotent producer with `acks=all`: a message counts as
//! [`Published`](crate::relay::Delivery::Published) once every in-sync replica has it. The
//! builder refuses settings that break the guarantees below (`enable.idempotence=false`, other
//! `acks`, `transactional.id`, `message.timeout.ms=0`) and defaults
//! `enable.gapless.guarantee=true`, `message.timeout.ms=10000` and
//! `partitioner=murmur2_random` (the Java client's, so keys land where Java producers put them).
//! Everything else passes through [`set`](KafkaPublisherBuilder::set). librdkafka's
//! `message.timeout.ms` bounds every publish: see [`KafkaPublisher::publish_timeout`].
//! librdkafka warns at every start that `enable.gapless.guarantee` is experimental; the
//! publisher logs that warning at `debug` (the setting is deliberate, see "Ordering"), and
//! passes the rest of librdkafka's log to `tracing` rate-limited: a line of a kind at most once
//! per 30 s, with the count of those left out.
//!
//! librdkafka is built from the bundled sources with TLS and SASL (linked against the system's
//! OpenSSL: `libssl-dev` and `pkg-config` on Debian) and without zlib or zstd. Compression
//! `lz4` and `snappy` are built in; for `gzip` or `zstd` add e.g.
//! `rdkafka = { version = "0.39", features = ["libz"] }` to your own `Cargo.toml` (Cargo unifies
//! the features). Until then the builder reports such a setting, e.g. "invalid Kafka setting
//! `compression.type` = `gzip`: ... zlib not available at build time". Kerberos (`GSSAPI`) is
//! not built in (rdkafka's `gssapi` feature, with libsasl2, adds it).
//!
//! # TLS and SASL
//!
//! Both builders pass librdkafka's security settings through `set` as they are:
//! `security.protocol` (`SSL`, `SASL_SSL`, `SASL_PLAINTEXT`), `ssl.ca.location`,
//! `ssl.certificate.location` / `ssl.key.location` / `ssl.key.password` (mutual TLS),
//! `sasl.mechanisms` (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, `OAUTHBEARER`),
//! `sasl.username`, `sasl.password`. The consumer's dead-letter producer takes the consumer's
//! `security.*`, `ssl.*` and `sasl.*` settings. Values of secret settings (see
//! [`is_secret_key`](crate::redact::is_secret_key)) never appear in errors, logs or `Debug`
//! output. A refused certificate or login is an outage for the relay and the consumer (they
//! wait, count no attempt), and the publisher's outage reason and
//! [`check_reachable`](KafkaPublisher::check_reachable) quote librdkafka's cause, e.g. "SSL
//! handshake failed: ... certificate verify failed".
//!
//! ```
//! use outbox_core::kafka::{KafkaConsumer, KafkaPublisher};
//!
//! // SASL_SSL with SCRAM (Amazon MSK, Redpanda, Aiven); the server is checked against the
//! // system's CA bundle unless `ssl.ca.location` names one.
//! let security = [
//!     ("security.protocol", "SASL_SSL"),
//!     ("sasl.mechanisms", "SCRAM-SHA-512"),
//!     ("sasl.username", "outbox-relay"),
//!     ("sasl.password", "s3cret"), // from your secret store, not the source
//! ];
//! let mut publisher = KafkaPublisher::builder().brokers("kafka-1.internal:9096");
//! let mut consumer = KafkaConsumer::builder().brokers("kafka-1.internal:9096");
//! for (key, value) in security {
//!     publisher = publisher.set(key, value);
//!     consumer = consumer.set(key, value);
//! }
//! assert!(!format!("{publisher:?}").contains("s3cret"));
//! let publisher = publisher.build()?; // connects in the background
//! # drop((publisher, consumer));
//! # Ok::<(), outbox_core::kafka::KafkaConfigError>(())
//! ```
//!
//! # Ordering: what is promised, and why
//!
//! A [`publish`](crate::relay::Publisher::publish) enqueues the whole batch, then awaits the
//! delivery reports, so a batch costs about one round trip, not one per message. The messages of
//! one ordering key (aggregate type and id) are enqueued back to back in batch order; keys are
//! not ordered among themselves. Equal keys go to the same topic and so to the same partition,
//! the unit in which Kafka keeps order (unless the topic's partition count changes meanwhile).
//!
//! **Failures at enqueue time** (record larger than `message.max.bytes`, a topic the cluster
//! reported unknown, the local queue still full after a tenth of the message timeout, a fatal
//! producer error): the message is `Failed` and no later message of its key in the batch is
//! enqueued; they are `NotAttempted`. The key's earlier messages are already ahead of it.
//!
//! **In flight**, librdkafka keeps each partition's messages in enqueue order: the idempotent
//! producer numbers them, sends at most 5 requests at once per broker, and on a transport error,
//! a leader change or a retriable broker error it waits for the partition's requests to drain,
//! then resends in the original order; the broker drops duplicates by sequence number. So
//! retries neither reorder nor duplicate.
//!
//! **Failures after enqueue** are where a later message could overtake a failed one:
//! - *A permanent broker error* (record too large for the topic's `max.message.bytes`, not
//!   authorized, policy violation). Without the gap-less guarantee librdkafka would skip the
//!   failed request and send the rest; with `enable.gapless.guarantee=true` it raises a fatal
//!   error instead and sends nothing more: it purges the queued messages, and the broker answers
//!   requests already in flight after the failed one with an out-of-order-sequence error, so
//!   every later message fails too (so do other keys' messages still queued; the relay retries
//!   them). Messages that librdkafka puts back in the dead producer's queue after such an answer
//!   are purged by the publisher at once instead of waiting out `message.timeout.ms`, the
//!   producer is replaced, and the same publish sends the other keys' undelivered messages again
//!   on the new one (not those of the refused record's key, nor of a key with a message that
//!   has no report yet: the dead producer might still deliver it). Seen with noida-db, which
//!   refuses records over 1 MB: a 3 MB record fails with "Message size too large", the key's
//!   later messages with "Purged in queue", and the other keys are published on a new producer.
//!   Seen with tansu after a 30 s outage: the producer's epoch bump after its timed-out
//!   messages is answered `ProducerFenced`, a fatal error; the retry on the new producer is what
//!   lets delivery resume within a second of the broker's return instead of after the relay's
//!   outage backoff.
//!   Disabling the gap-less guarantee (or a Kafka-protocol broker that does not check producer
//!   sequence numbers) gives up this case.
//! - *`message.timeout.ms` running out* (broker down, no leader, throttled), which librdkafka
//!   documents the gap-less guarantee does not cover. It times out a partition's queue from the
//!   front, in a scan about once a second, each message `message.timeout.ms` after it was
//!   enqueued; a request in flight times out with its first message. Because a key's messages
//!   are enqueued within microseconds of each other and travel in the same requests, they time
//!   out together. A later one can survive an earlier one only if a scan falls in those
//!   microseconds *and* the broker then accepts it within the next second: vanishingly rare, but
//!   not impossible.
//!
//! **Detection.** If a publish ever reports a message `Failed` and a later message of its key
//! `Published`, the failed message's error says that it "may reach consumers out of order", so
//! the row's `last_error` shows it. Outcomes stay truthful: the published message is not
//! reported failed, since sending it again could only add a duplicate.
//!
//! **Unknown outcomes.** A request that timed out in flight may have been written anyway
//! (librdkafka's "possibly persisted"), and a message without a report within
//! [`publish_timeout`](KafkaPublisher::publish_timeout) is reported failed while librdkafka may
//! still deliver it. Both are retried by the relay and may then arrive twice: delivery is at
//! least once, and consumers deduplicate on the `id` header. Neither reorders a key: a message
//! the same producer still holds goes out before any message enqueued after it.
//!
//! So: per key, the broker receives the batch's messages in order, and never a later message
//! after an earlier one failed at enqueue time or through a permanent broker error. Not promised:
//! order across keys, order when [`topic_for`](KafkaPublisherBuilder::topic_for) sends one
//! aggregate to several topics, exactly-once delivery, and the timeout corner above (reported
//! when it happens).

// The publisher's parts need the relay (its `Publisher` trait and `OutboxMessage`); the
// consumer needs only the Kafka client.
#[cfg(feature = "relay")]
mod batch;
#[cfg(feature = "relay")]
mod builder;
#[cfg(feature = "relay")]
mod classify;
mod consumer;
mod error;
mod log;
#[cfg(feature = "relay")]
mod publisher;
#[cfg(feature = "relay")]
mod record;
mod secrets;
#[cfg(test)]
mod test_recorder;
#[cfg(feature = "relay")]
mod watch;

pub use crate::backoff::Backoff;
pub use crate::envelope::{
    HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_TYPE, HEADER_EVENT_VERSION, HEADER_ID,
    RESERVED_HEADERS,
};
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub use builder::{DEFAULT_MESSAGE_TIMEOUT, KafkaPublisherBuilder};
pub use consumer::{
    AfterDeadLetter, ConsumerStats, DEFAULT_MAX_PARKED_KEYS, DEFAULT_OUTAGE_BACKOFF,
    DEFAULT_RETRY_BACKOFF, DLT_HEADER_ATTEMPTS, DLT_HEADER_ERROR, DLT_HEADER_ERROR_KIND,
    DLT_HEADER_GROUP, DLT_HEADER_OFFSET, DLT_HEADER_PARKED_BEHIND, DLT_HEADER_PARKED_BEHIND_ID,
    DLT_HEADER_PARTITION, DLT_HEADER_TOPIC, KafkaConsumer, KafkaConsumerBuilder,
    NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy,
};
pub use error::{BrokerUnreachable, KafkaConfigError};
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub use publisher::KafkaPublisher;

/// Kafka headers as text pairs, for tests' assertions.
#[cfg(test)]
pub(crate) fn header_pairs(headers: &rdkafka::message::OwnedHeaders) -> Vec<(String, String)> {
    use rdkafka::message::Headers as _;
    headers
        .iter()
        .map(|h| {
            (
                h.key.to_owned(),
                String::from_utf8(h.value.unwrap().to_vec()).unwrap(),
            )
        })
        .collect()
}
