//! [`KafkaConsumer`]: reads topics, decodes each message into the `Envelope<E>` of its event
//! type, runs that type's handler, and stores the message's offset for commit only once the
//! message is done.
//!
//! Handler errors follow the fault classes of [`crate::fault`]: an outage is retried until it
//! passes, with the partitions paused; only poison is counted and dead-lettered, and a dead
//! letter parks the later messages of its key behind it. All of that is the broker-free
//! runtime of [`crate::consumer`]; this module is its Kafka transport.

mod builder;
mod config;
mod context;
mod dead_letter;
mod transport;

use std::sync::Arc;

pub use crate::consumer::{
    AfterDeadLetter, ConsumerStats, DEFAULT_MAX_PARKED_KEYS, DEFAULT_OUTAGE_BACKOFF,
    DEFAULT_RETRY_BACKOFF, DLT_HEADER_ATTEMPTS, DLT_HEADER_ERROR, DLT_HEADER_ERROR_KIND,
    DLT_HEADER_GROUP, DLT_HEADER_OFFSET, DLT_HEADER_PARKED_BEHIND, DLT_HEADER_PARKED_BEHIND_ID,
    DLT_HEADER_PARTITION, DLT_HEADER_TOPIC, NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy,
};
pub use builder::KafkaConsumerBuilder;

use crate::consumer::Runtime;
use transport::KafkaTransport;

/// A Kafka consumer for outbox events, with a handler per event type.
///
/// For each message, in the order of its partition:
///
/// 1. If an earlier message of its key (same topic, same Kafka key) was dead-lettered, the
///    message is **parked**: written to the dead-letter topic too, with the
///    [`DLT_HEADER_PARKED_BEHIND`] header naming that dead letter, and not handled (unless
///    [`AfterDeadLetter::SkipAhead`]).
/// 2. Find the handler of its event type (its `aggregate_type` and `event_type` headers) and
///    decode it into that handler's [`Envelope<E>`](crate::Envelope). A message of an event
///    type without a handler is acknowledged and counted ([`UnhandledPolicy`]); one of a
///    version newer than `E` knows holds the partition until a consumer that knows it is
///    deployed ([`NewerVersionPolicy`]). A message that cannot be handled at all (bad headers
///    or payload) goes to the dead-letter topic or is skipped with a logged error, by
///    [`UndecodablePolicy`].
/// 3. Run the handler. `Ok(Applied)` means its transaction committed; `Ok(Duplicate)` that the
///    inbox recognised the message. An `Err` is classified ([`crate::fault`]):
///    - **transient** (the infrastructure's fault: the database refusing or losing
///      connections, starting up or shutting down, a serialization failure, a deadlock, a
///      lock wait timeout, a read-only failover, a pool timeout, an io error of an unreachable
///      peer, or an error the user marked [`Transient`](crate::fault::Transient)): retried
///      with the outage backoff ([`DEFAULT_OUTAGE_BACKOFF`]: 100 ms growing to 2 s) for as long
///      as it takes, never counted, never dead-lettered;
///    - **permanent** (anything else: the user's own errors, a panic): retried with the retry
///      backoff; after `max_attempts` such failures the message goes to the dead-letter topic
///      with the error chain in a header, and its key is parked.
/// 4. Only then store the message's offset for commit. Offsets are committed in the background
///    (`auto.commit.interval.ms`), when partitions are revoked, and on shutdown.
///
/// So a message whose offset is committed is done, and one that is done may still be
/// delivered again (the process can die between the handler's commit and the offset commit):
/// the handler's inbox (`#[idempotent]`) makes that a `Duplicate`. Delivery is at least once,
/// the effect exactly once.
///
/// Messages are handled one at a time, which keeps every partition's order, also across
/// retries: a failing message holds back the ones behind it. While it waits between attempts
/// the consumer pauses its partitions (librdkafka's `pause`) and keeps polling, so an outage
/// of any length does not exceed `max.poll.interval.ms` and does not cost the group
/// membership; the partitions resume once the message is done. A single handler attempt must
/// still end within `max.poll.interval.ms` (5 minutes by default): give the database calls a
/// timeout (a pool's wait timeout, `statement_timeout`). To handle partitions in parallel,
/// run several consumers in the group, up to the number of partitions.
///
/// **Parked keys live in memory**, for the life of the process, at most
/// [`max_parked_keys`](KafkaConsumerBuilder::max_parked_keys) of them. A restarted consumer
/// has forgotten them and applies the later messages of such a key; the dead-letter topic is
/// the record: replaying it (in order) once the cause is fixed applies the parked messages
/// after their head.
///
/// ```no_run
/// use outbox_core::kafka::KafkaConsumer;
/// use outbox_core::{Envelope, Outcome, OutboxEvent};
/// # use outbox_core as outbox;
/// # #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// # #[outbox(crate = outbox_core, aggregate = "order")]
/// # struct OrderCreated { #[outbox(aggregate_id)] order_id: u64 }
///
/// # async fn run(stop: tokio::sync::oneshot::Receiver<()>) -> Result<(), Box<dyn std::error::Error>> {
/// let consumer = KafkaConsumer::builder()
///     .brokers("127.0.0.1:9092")
///     .group("billing")
///     .topic("order")
///     .handler(|event: Envelope<OrderCreated>| async move {
///         let _ = event; // e.g. `charge(&mut pool.get().await?, event).await`
///         Ok::<_, std::io::Error>(Outcome::Applied(()))
///     })
///     .build()?;
/// let stats = consumer.stats();
/// consumer.run(async { stop.await.ok(); }).await; // e.g. on SIGTERM
/// println!("applied {}", stats.get(&stats.applied));
/// # Ok(()) }
/// ```
pub struct KafkaConsumer {
    runtime: Runtime<KafkaTransport>,
}

impl KafkaConsumer {
    /// Starts configuring a consumer.
    pub fn builder() -> KafkaConsumerBuilder {
        KafkaConsumerBuilder::default()
    }

    /// The consumer's counters.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.runtime.stats()
    }

    /// Subscribes (or assigns) and handles messages until `shutdown` completes; then lets the
    /// message in flight finish (within the shutdown grace), commits the offsets of every
    /// message done, leaves the group and returns. Broker errors are logged and retried: the
    /// consumer never stops on its own.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        self.runtime.run(shutdown).await;
    }
}

impl std::fmt::Debug for KafkaConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let transport = &self.runtime.transport;
        f.debug_struct("KafkaConsumer")
            .field("group", &self.runtime.settings.group)
            .field("topics", &transport.topics)
            .field("assignment", &transport.assignment)
            .field("handles", &self.runtime.settings.dispatch.described())
            .finish_non_exhaustive()
    }
}
