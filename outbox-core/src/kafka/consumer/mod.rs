//! [`KafkaConsumer`]: reads topics, decodes each message into the `Envelope<E>` of its event
//! type, runs that type's handler, and stores the message's offset for commit only once the
//! message is done.

mod builder;
mod dead_letter;
mod dispatch;

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};

pub use builder::{DEFAULT_RETRY_BACKOFF, KafkaConsumerBuilder, UndecodablePolicy};
pub use dead_letter::{
    DLT_HEADER_ATTEMPTS, DLT_HEADER_ERROR, DLT_HEADER_ERROR_KIND, DLT_HEADER_GROUP,
    DLT_HEADER_OFFSET, DLT_HEADER_PARTITION, DLT_HEADER_TOPIC,
};

use dead_letter::{DeadLetters, Kind};
use dispatch::{Dispatch, Handled, Undecodable};

use crate::relay::{Backoff, SplitMix};

/// Waits between attempts to reach a broker that refuses the dead letter or the commit.
const OUTAGE_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(10),
    multiplier: 2.0,
    jitter: 0.2,
};

/// Counters of a running consumer, shared with whoever holds [`KafkaConsumer::stats`].
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Messages read.
    pub received: AtomicU64,
    /// Messages a handler applied (its transaction committed).
    pub applied: AtomicU64,
    /// Messages a handler recognised as already applied.
    pub duplicates: AtomicU64,
    /// Handler attempts that failed (each followed by a retry or a dead letter).
    pub handler_errors: AtomicU64,
    /// Messages written to the dead-letter topic (handler failures and undecodable messages).
    pub dead_lettered: AtomicU64,
    /// Undecodable messages skipped (by [`UndecodablePolicy::Skip`]).
    pub skipped: AtomicU64,
    /// Offsets stored for commit: messages done.
    pub done: AtomicU64,
}

impl ConsumerStats {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The value of a counter, e.g. `stats.get(&stats.applied)`.
    pub fn get(&self, counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// What the builder hands the consumer.
struct Settings {
    group: String,
    topics: Vec<String>,
    assignment: Vec<(String, i32)>,
    dispatch: Dispatch,
    undecodable: UndecodablePolicy,
    max_attempts: u32,
    backoff: Backoff,
    shutdown_grace: Duration,
}

/// A Kafka consumer for outbox events, with a handler per event type.
///
/// For each message, in the order of its partition:
///
/// 1. Find the handler of its event type (its `aggregate_type` and `event_type` headers) and
///    decode it into that handler's [`Envelope<E>`](crate::Envelope). A message that cannot be
///    handled at all (bad headers or payload, a version newer than `E` knows, no handler for
///    its type) goes to the dead-letter topic or is skipped with a logged error, by
///    [`UndecodablePolicy`].
/// 2. Run the handler. `Ok(Applied)` means its transaction committed; `Ok(Duplicate)` that the
///    inbox recognised the message. An `Err` is retried with backoff; after `max_attempts` the
///    message goes to the dead-letter topic with the error in a header.
/// 3. Only then store the message's offset for commit. Offsets are committed in the background
///    (`auto.commit.interval.ms`), when partitions are revoked, and on shutdown.
///
/// So a message whose offset is committed is done, and one that is done may still be
/// delivered again (the process can die between the handler's commit and the offset commit):
/// the handler's inbox (`#[idempotent]`) makes that a `Duplicate`. Delivery is at least once,
/// the effect exactly once.
///
/// Messages are handled one at a time, which keeps every partition's order, also across
/// retries (a failing message holds back the ones behind it until it is dead-lettered). To
/// handle partitions in parallel, run several consumers in the group, up to the number of
/// partitions.
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
    consumer: Arc<StreamConsumer>,
    settings: Settings,
    dead_letters: DeadLetters,
    stats: Arc<ConsumerStats>,
    rng: SplitMix,
}

/// The shutdown signal, fused: once it fired, [`Stop::wait`] returns at once.
struct Stop<'a> {
    signal: Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
}

impl<'a> Stop<'a> {
    fn new(signal: impl Future<Output = ()> + Send + 'a) -> Self {
        Stop {
            signal: Some(Box::pin(signal)),
        }
    }

    /// Completes when shutdown was asked for (at once if it already was).
    async fn wait(&mut self) {
        if let Some(signal) = self.signal.as_mut() {
            signal.await;
            self.signal = None;
        }
    }

    fn stopping(&self) -> bool {
        self.signal.is_none()
    }
}

/// How handling one message ended.
enum Done {
    /// Its offset may be stored.
    Yes,
    /// Shutdown came first: leave the offset, the message is read again after a restart.
    Stopped,
}

impl KafkaConsumer {
    /// Starts configuring a consumer.
    pub fn builder() -> KafkaConsumerBuilder {
        KafkaConsumerBuilder::default()
    }

    fn new(consumer: StreamConsumer, settings: Settings, dead_letters: DeadLetters) -> Self {
        KafkaConsumer {
            consumer: Arc::new(consumer),
            settings,
            dead_letters,
            stats: Arc::default(),
            rng: SplitMix::seeded(),
        }
    }

    /// The consumer's counters.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.stats.clone()
    }

    /// Subscribes (or assigns) and handles messages until `shutdown` completes; then lets the
    /// message in flight finish (within the shutdown grace), commits the offsets of every
    /// message done, leaves the group and returns. Broker errors are logged and retried: the
    /// consumer never stops on its own.
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) {
        let mut stop = Stop::new(shutdown);
        self.start().await;
        let mut outage = 0u32;
        while !stop.stopping() {
            let message = tokio::select! {
                biased;
                () = stop.wait() => break,
                received = self.consumer.recv() => received.map(|m| m.detach()),
            };
            let message = match message {
                Ok(message) => {
                    outage = 0;
                    message
                }
                Err(e) => {
                    outage += 1;
                    let wait = OUTAGE_BACKOFF.delay(outage, self.rng.unit());
                    tracing::warn!(error = %e, retry_in = ?wait, "reading from Kafka failed");
                    tokio::select! {
                        () = stop.wait() => break,
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            ConsumerStats::add(&self.stats.received);
            match self.handle(&message, &mut stop).await {
                Done::Yes => self.store(&message),
                Done::Stopped => break,
            }
        }
        self.stop().await;
    }

    /// Subscribes to the topics, or assigns the partitions.
    async fn start(&mut self) {
        let s = &self.settings;
        let result = if s.assignment.is_empty() {
            let topics: Vec<&str> = s.topics.iter().map(String::as_str).collect();
            self.consumer.subscribe(&topics)
        } else {
            let mut tpl = TopicPartitionList::new();
            for (topic, partition) in &s.assignment {
                // `Stored`: the group's committed offset, else `auto.offset.reset`.
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Stored);
            }
            self.consumer.assign(&tpl)
        };
        if let Err(e) = result {
            // Only invalid topic names fail here; librdkafka then reports nothing to read.
            tracing::error!(error = %e, "subscribing failed");
        }
        tracing::info!(group = %s.group, topics = ?s.topics, assignment = ?s.assignment, "consumer started");
    }

    /// Handles one message: decode, run the handler with retries, dead-letter or skip.
    async fn handle(&mut self, message: &OwnedMessage, stop: &mut Stop<'_>) -> Done {
        let handler = match self.settings.dispatch.handler_for(message) {
            Ok(handler) => handler,
            Err(why) => return self.undecodable(message, &why, stop).await,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let run = match handler.call(message) {
                Ok(run) => run,
                Err(e) => {
                    return self
                        .undecodable(message, &Undecodable::Decode(e), stop)
                        .await;
                }
            };
            let mut run = pin!(run);
            let outcome = tokio::select! {
                biased;
                outcome = &mut run => outcome,
                () = stop.wait() => {
                    // Let the transaction in flight finish, within the grace.
                    match tokio::time::timeout(self.settings.shutdown_grace, run).await {
                        Ok(outcome) => outcome,
                        Err(_) => {
                            tracing::warn!(
                                topic = message.topic(), partition = message.partition(),
                                offset = message.offset(),
                                "the handler did not finish within the shutdown grace; the \
                                 message will be read again"
                            );
                            return Done::Stopped;
                        }
                    }
                }
            };
            match outcome {
                Ok(Handled::Applied) => {
                    ConsumerStats::add(&self.stats.applied);
                    return Done::Yes;
                }
                Ok(Handled::Duplicate) => {
                    ConsumerStats::add(&self.stats.duplicates);
                    return Done::Yes;
                }
                Err(error) => {
                    ConsumerStats::add(&self.stats.handler_errors);
                    if attempt >= self.settings.max_attempts {
                        tracing::error!(
                            topic = message.topic(), partition = message.partition(),
                            offset = message.offset(), attempts = attempt, error = %error,
                            "the handler failed every attempt; dead-lettering the message"
                        );
                        return self
                            .dead_letter(message, Kind::Handler, &error, attempt, stop)
                            .await;
                    }
                    let wait = self.settings.backoff.delay(attempt, self.rng.unit());
                    tracing::warn!(
                        topic = message.topic(), partition = message.partition(),
                        offset = message.offset(), attempt, error = %error, retry_in = ?wait,
                        "the handler failed; retrying"
                    );
                    tokio::select! {
                        () = stop.wait() => return Done::Stopped,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    async fn undecodable(
        &mut self,
        message: &OwnedMessage,
        why: &Undecodable,
        stop: &mut Stop<'_>,
    ) -> Done {
        let error = why.to_string();
        match self.settings.undecodable {
            UndecodablePolicy::Skip => {
                tracing::error!(
                    topic = message.topic(), partition = message.partition(),
                    offset = message.offset(), error = %error,
                    "skipping a message that cannot be handled"
                );
                ConsumerStats::add(&self.stats.skipped);
                Done::Yes
            }
            UndecodablePolicy::DeadLetter => {
                tracing::error!(
                    topic = message.topic(), partition = message.partition(),
                    offset = message.offset(), error = %error,
                    "dead-lettering a message that cannot be handled"
                );
                self.dead_letter(message, Kind::Undecodable, &error, 0, stop)
                    .await
            }
        }
    }

    /// Writes the dead letter, retrying until the broker takes it: a message is never dropped
    /// because its dead letter could not be written.
    async fn dead_letter(
        &mut self,
        message: &OwnedMessage,
        kind: Kind,
        error: &str,
        attempts: u32,
        stop: &mut Stop<'_>,
    ) -> Done {
        let mut failures = 0;
        loop {
            let sent = tokio::select! {
                biased;
                sent = self.dead_letters.send(message, kind, error, attempts) => sent,
                () = stop.wait() => return Done::Stopped,
            };
            match sent {
                Ok(topic) => {
                    tracing::info!(dead_letter_topic = %topic, topic = message.topic(), offset = message.offset(), "dead letter written");
                    ConsumerStats::add(&self.stats.dead_lettered);
                    return Done::Yes;
                }
                Err(e) => {
                    failures += 1;
                    let wait = OUTAGE_BACKOFF.delay(failures, self.rng.unit());
                    tracing::warn!(error = %e, retry_in = ?wait, "writing a dead letter failed; retrying");
                    tokio::select! {
                        () = stop.wait() => return Done::Stopped,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// Stores the offset after `message` (the next one to read) for the next commit.
    ///
    /// Through `rd_kafka_offsets_store`, which stores exactly the offset it is given; the
    /// older `rd_kafka_offset_store` (rdkafka's `store_offset`) adds one itself.
    fn store(&self, message: &OwnedMessage) {
        let mut next = TopicPartitionList::with_capacity(1);
        let stored = next
            .add_partition_offset(
                message.topic(),
                message.partition(),
                Offset::Offset(message.offset() + 1),
            )
            .and_then(|()| self.consumer.store_offsets(&next));
        match stored {
            Ok(()) => ConsumerStats::add(&self.stats.done),
            // The partition was revoked meanwhile: its new owner reads the message again and
            // the inbox recognises it.
            Err(e) => tracing::warn!(
                error = %e, topic = message.topic(), partition = message.partition(),
                "could not store the offset of a handled message; it will be delivered again"
            ),
        }
    }

    /// Commits the stored offsets and leaves the group, off the async workers (librdkafka
    /// blocks for both).
    async fn stop(self) {
        let consumer = self.consumer;
        let group = self.settings.group;
        let closed = tokio::task::spawn_blocking(move || {
            let mut attempt = 0;
            loop {
                attempt += 1;
                match consumer.commit_consumer_state(CommitMode::Sync) {
                    Ok(()) => break,
                    Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => break,
                    Err(e) if attempt < 3 => {
                        tracing::warn!(error = %e, "committing offsets on shutdown failed; retrying");
                        std::thread::sleep(Duration::from_millis(200 * attempt));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "committing offsets on shutdown failed; the messages done since the last commit will be delivered again");
                        break;
                    }
                }
            }
            drop(consumer); // leaves the group
        })
        .await;
        if closed.is_err() {
            tracing::error!("closing the consumer panicked");
        }
        tracing::info!(group = %group, "consumer stopped");
    }
}

impl std::fmt::Debug for KafkaConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConsumer")
            .field("group", &self.settings.group)
            .field("topics", &self.settings.topics)
            .field("assignment", &self.settings.assignment)
            .field("handles", &self.settings.dispatch.described())
            .finish_non_exhaustive()
    }
}
