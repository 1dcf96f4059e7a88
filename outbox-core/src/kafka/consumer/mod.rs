//! [`KafkaConsumer`]: reads topics, decodes each message into the `Envelope<E>` of its event
//! type, runs that type's handler, and stores the message's offset for commit only once the
//! message is done.
//!
//! Handler errors follow the fault classes of [`crate::fault`]: an outage is retried until it
//! passes, with the partitions paused; only poison is counted and dead-lettered, and a dead
//! letter parks the later messages of its key behind it.

mod builder;
mod config;
mod context;
mod dead_letter;
mod dispatch;
mod hold;
mod parking;
mod policy;
mod stats;
mod trace;

use std::error::Error;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::Instrument;

pub use builder::KafkaConsumerBuilder;
pub use dead_letter::{
    DLT_HEADER_ATTEMPTS, DLT_HEADER_ERROR, DLT_HEADER_ERROR_KIND, DLT_HEADER_GROUP,
    DLT_HEADER_OFFSET, DLT_HEADER_PARKED_BEHIND, DLT_HEADER_PARKED_BEHIND_ID, DLT_HEADER_PARTITION,
    DLT_HEADER_TOPIC,
};
pub use policy::{
    AfterDeadLetter, DEFAULT_MAX_PARKED_KEYS, DEFAULT_OUTAGE_BACKOFF, DEFAULT_RETRY_BACKOFF,
    NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy,
};
pub use stats::ConsumerStats;

use dead_letter::{DeadLetters, Kind};
use dispatch::{Dispatch, Handled, Undecodable};
use hold::Held;
use parking::Parking;

use crate::DecodeError;
use crate::backoff::{Backoff, SplitMix};
use crate::fault::{ErrorClass, Permanent, chain_text, classify_with};

/// Waits between attempts to reach a broker that refuses the dead letter or the commit.
const OUTAGE_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(10),
    multiplier: 2.0,
    jitter: 0.2,
};

/// A classifier given to the builder (a closure may capture).
type UserClassifier = Arc<dyn Fn(&(dyn Error + 'static)) -> Option<ErrorClass> + Send + Sync>;

/// What the builder hands the consumer.
struct Settings {
    group: String,
    topics: Vec<String>,
    assignment: Vec<(String, i32)>,
    dispatch: Dispatch,
    undecodable: UndecodablePolicy,
    unhandled: UnhandledPolicy,
    newer_version: NewerVersionPolicy,
    max_attempts: u32,
    backoff: Backoff,
    outage_backoff: Backoff,
    classifiers: Vec<UserClassifier>,
    after_dead_letter: AfterDeadLetter,
    max_parked_keys: usize,
    shutdown_grace: Duration,
}

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
    consumer: Arc<context::Inner>,
    settings: Settings,
    dead_letters: DeadLetters,
    stats: Arc<ConsumerStats>,
    rng: SplitMix,
    held: Held,
    parking: Parking,
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

    fn new(consumer: context::Inner, settings: Settings, dead_letters: DeadLetters) -> Self {
        let parking = Parking::new(settings.max_parked_keys);
        KafkaConsumer {
            consumer: Arc::new(consumer),
            settings,
            dead_letters,
            stats: Arc::default(),
            rng: SplitMix::seeded(),
            held: Held::default(),
            parking,
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
            let message = match self.held.stashed.pop_front() {
                // Read while a message was held (see `hold`): next in line.
                Some(message) => Ok(message),
                None => tokio::select! {
                    biased;
                    () = stop.wait() => break,
                    received = self.consumer.recv() => received.map(|m| m.detach()),
                },
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
            ConsumerStats::add(&self.stats.received, "outbox_consumer_received_total");
            let span = trace::message_span(&message);
            let handling = self.handle(&message, &mut stop);
            let done = handling.instrument(span.clone()).await;
            trace::ended(&span, &done);
            if self
                .stats
                .waiting_for_upgrade
                .swap(0, std::sync::atomic::Ordering::Relaxed)
                == 1
            {
                metrics::gauge!("outbox_consumer_waiting_for_upgrade").set(0.0);
            }
            if let Done::Yes = done {
                self.store(&message);
            }
            self.release();
            if let Done::Stopped = done {
                break;
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

    /// Handles one message: park, or decode and run the handler with retries (an outage's for
    /// as long as it takes, poison's up to `max_attempts`), then dead-letter or skip.
    async fn handle(&mut self, message: &OwnedMessage, stop: &mut Stop<'_>) -> Done {
        let handler = self.settings.dispatch.handler_for(message);
        if let Err(Undecodable::NoHandler {
            aggregate_type,
            event_type,
            ..
        }) = &handler
            && self.settings.unhandled == UnhandledPolicy::Acknowledge
        {
            // Before parking: an event this consumer does not handle is no part of its keys'
            // order, and writing it to the dead-letter topic would say it failed.
            tracing::debug!(
                topic = message.topic(), partition = message.partition(),
                offset = message.offset(), %aggregate_type, %event_type,
                "acknowledging a message of an event type without a handler"
            );
            trace::outcome("unhandled");
            self.stats
                .unhandled
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!(
                "outbox_consumer_unhandled_total",
                "aggregate_type" => aggregate_type.clone(),
                "event_type" => event_type.clone(),
            )
            .increment(1);
            return Done::Yes;
        }
        if self.settings.after_dead_letter == AfterDeadLetter::ParkKey
            && let Some(head) = self.parking.head_of(message)
        {
            let why = format!(
                "parked behind the dead letter of {} (an earlier message of the same key)",
                head.coordinates()
            );
            tracing::warn!(
                topic = message.topic(), partition = message.partition(),
                offset = message.offset(), behind = %head.coordinates(),
                "parking a message behind the dead letter of its key"
            );
            trace::outcome("parked");
            return self
                .dead_letter(message, Kind::Parked(head), &why, 0, stop)
                .await;
        }
        let handler = match handler {
            Ok(handler) => handler,
            Err(why) => return self.undecodable(message, &why, stop).await,
        };
        let (mut attempt, mut outage) = (0, 0);
        loop {
            let run = match handler.call(message) {
                Ok(run) => run,
                Err(e @ DecodeError::VersionTooNew { .. })
                    if self.settings.newer_version == NewerVersionPolicy::Hold =>
                {
                    outage += 1;
                    if !self.wait_for_upgrade(message, &e, outage, stop).await {
                        return Done::Stopped;
                    }
                    continue;
                }
                Err(e) => {
                    return self
                        .undecodable(message, &Undecodable::Decode(e), stop)
                        .await;
                }
            };
            // Its own task: a handler that panics fails this attempt instead of the consumer
            // (which, restarted, would read the same message and panic again).
            let started = std::time::Instant::now();
            let mut run = tokio::spawn(run.instrument(tracing::Span::current()));
            let joined = tokio::select! {
                biased;
                joined = &mut run => joined,
                () = stop.wait() => {
                    // Let the transaction in flight finish, within the grace.
                    match tokio::time::timeout(self.settings.shutdown_grace, &mut run).await {
                        Ok(joined) => joined,
                        Err(_) => {
                            run.abort();
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
            let outcome = joined.unwrap_or_else(|e| Err(Permanent::new(panic_message(e)).into()));
            metrics::histogram!("outbox_consumer_handler_duration_seconds")
                .record(started.elapsed());
            let error = match outcome {
                Ok(Handled::Applied) => {
                    trace::outcome("applied");
                    ConsumerStats::add(&self.stats.applied, "outbox_consumer_applied_total");
                    return Done::Yes;
                }
                Ok(Handled::Duplicate) => {
                    trace::outcome("duplicate");
                    ConsumerStats::add(&self.stats.duplicates, "outbox_consumer_duplicate_total");
                    return Done::Yes;
                }
                Err(error) => error,
            };
            let text = chain_text(&*error);
            let wait = if self.classify(&*error) == ErrorClass::Transient {
                ConsumerStats::add(
                    &self.stats.transient_errors,
                    "outbox_consumer_transient_errors_total",
                );
                outage += 1;
                let wait = self.settings.outage_backoff.delay(outage, self.rng.unit());
                // Every failure of a long outage at `warn` would flood the log: the first, then
                // one in ten.
                if outage == 1 || outage % 10 == 0 {
                    tracing::warn!(
                        topic = message.topic(), partition = message.partition(),
                        offset = message.offset(), failures = outage, error = %text,
                        retry_in = ?wait,
                        "the handler failed with a transient error (an outage); its partitions \
                         are paused and it is retried until it passes"
                    );
                }
                wait
            } else {
                ConsumerStats::add(
                    &self.stats.handler_errors,
                    "outbox_consumer_handler_errors_total",
                );
                outage = 0;
                attempt += 1;
                if attempt >= self.settings.max_attempts {
                    tracing::error!(
                        topic = message.topic(), partition = message.partition(),
                        offset = message.offset(), attempts = attempt, error = %text,
                        "the handler failed every attempt; dead-lettering the message"
                    );
                    trace::outcome("dead_lettered");
                    return self
                        .dead_letter(message, Kind::Handler, &text, attempt, stop)
                        .await;
                }
                let wait = self.settings.backoff.delay(attempt, self.rng.unit());
                tracing::warn!(
                    topic = message.topic(), partition = message.partition(),
                    offset = message.offset(), attempt, error = %text, retry_in = ?wait,
                    "the handler failed; retrying"
                );
                wait
            };
            if !self.hold(wait, stop).await {
                return Done::Stopped;
            }
        }
    }

    /// Holds a message whose version is newer than its handler knows for the `failures`-th
    /// time, as an outage: the outage backoff with the partitions paused. `false` if shutdown
    /// came first.
    async fn wait_for_upgrade(
        &mut self,
        message: &OwnedMessage,
        why: &DecodeError,
        failures: u32,
        stop: &mut Stop<'_>,
    ) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let wait = self
            .settings
            .outage_backoff
            .delay(failures, self.rng.unit());
        ConsumerStats::add(
            &self.stats.newer_version_attempts,
            "outbox_consumer_newer_version_attempts_total",
        );
        if failures == 1 || failures.is_multiple_of(10) {
            tracing::warn!(
                topic = message.topic(), partition = message.partition(),
                offset = message.offset(), failures, error = %why, retry_in = ?wait,
                "a message is newer than this consumer knows; its partitions are paused until \
                 a consumer that knows its version is deployed"
            );
        }
        if self.stats.waiting_for_upgrade.swap(1, Relaxed) == 0 {
            metrics::gauge!("outbox_consumer_waiting_for_upgrade").set(1.0);
        }
        self.hold(wait, stop).await
    }

    /// The fault class of a handler's error: link by link, the markers, the builder's
    /// classifiers, the registered ones and the built-in ones (see [`crate::fault`]).
    fn classify(&self, error: &(dyn Error + 'static)) -> ErrorClass {
        classify_with(error, |e| {
            self.settings.classifiers.iter().find_map(|c| c(e))
        })
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
                trace::outcome("skipped");
                ConsumerStats::add(&self.stats.skipped, "outbox_consumer_skipped_total");
                Done::Yes
            }
            UndecodablePolicy::DeadLetter => {
                tracing::error!(
                    topic = message.topic(), partition = message.partition(),
                    offset = message.offset(), error = %error,
                    "dead-lettering a message that cannot be handled"
                );
                trace::outcome("dead_lettered");
                self.dead_letter(message, Kind::Undecodable, &error, 0, stop)
                    .await
            }
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

/// A failed attempt's error for a handler task that panicked (or was cancelled).
fn panic_message(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return "the handler was cancelled".to_owned();
    }
    let payload = e.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".to_owned());
    format!("the handler panicked: {text}")
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
