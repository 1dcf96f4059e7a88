//! [`KafkaPublisher`]: enqueue a batch, await its delivery reports, keep each key in order.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer, PurgeConfig};
use tokio::time::Instant;

use super::batch;
use super::builder::{KafkaPublisherBuilder, create_producer};
use super::classify;
use super::error::BrokerUnreachable;
use super::record::{self, Router};
use super::watch::{BrokerWatch, WatchContext};
use crate::relay::{Delivery, NotReady, OutboxMessage, Publisher};

/// Extra time, past `message.timeout.ms`, to wait for librdkafka's delivery reports: it scans
/// for timed-out messages and requests once a second.
const REPORT_GRACE: Duration = Duration::from_secs(2);
/// Pause between two attempts to enqueue into a full local queue (librdkafka's own thread keeps
/// sending meanwhile, freeing room).
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(2);
/// How often to look for a fatal producer error while awaiting delivery reports.
const FATAL_CHECK: Duration = Duration::from_millis(100);

/// Publishes outbox messages to Kafka with librdkafka's idempotent producer (`acks=all`).
///
/// Each message becomes one Kafka record: key = aggregate id, value = the JSON payload, topic =
/// [`OutboxMessage::topic`] (optionally mapped and prefixed, see [`KafkaPublisherBuilder`]), and
/// the headers listed in the [module docs](super). See there, too, for exactly what order it
/// keeps when something fails.
///
/// One publisher holds one producer (a few threads and one connection per broker); share it
/// (it is `Sync`, and `Arc<KafkaPublisher>` is a [`Publisher`] too) rather than building many.
///
/// ```no_run
/// use outbox_core::kafka::KafkaPublisher;
/// use outbox_core::relay::{Delivery, OutboxMessage, Publisher};
///
/// # async fn run(batch: Vec<OutboxMessage>) -> Result<(), Box<dyn std::error::Error>> {
/// let publisher = KafkaPublisher::builder().brokers("127.0.0.1:9092").build()?;
/// let outcomes = publisher.publish(&batch).await;
/// assert_eq!(outcomes.len(), batch.len());
/// for (msg, outcome) in batch.iter().zip(&outcomes) {
///     if let Some(why) = outcome.error() {
///         let class = if outcome.is_outage() { "broker unavailable" } else { "refused" };
///         eprintln!("event {} not published ({class}): {why}", msg.id);
///     }
/// }
/// # Ok(()) }
/// ```
pub struct KafkaPublisher {
    config: ClientConfig,
    current: RwLock<Current>,
    router: Router,
    message_timeout: Duration,
    /// Whether librdkafka reported every broker down since the last acknowledged message.
    watch: Arc<BrokerWatch>,
}

/// The producer, with the context that feeds the [`BrokerWatch`].
type WatchedProducer = FutureProducer<WatchContext>;

/// The producer in use, and how many were replaced before it.
struct Current {
    generation: u64,
    producer: WatchedProducer,
}

impl KafkaPublisher {
    /// Starts configuring a publisher.
    ///
    /// ```
    /// let publisher = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .build()?;
    /// # drop(publisher);
    /// # Ok::<(), outbox_core::kafka::KafkaConfigError>(())
    /// ```
    pub fn builder() -> KafkaPublisherBuilder {
        KafkaPublisherBuilder::default()
    }

    pub(crate) fn new(
        config: ClientConfig,
        producer: WatchedProducer,
        watch: Arc<BrokerWatch>,
        router: Router,
        message_timeout: Duration,
    ) -> Self {
        KafkaPublisher {
            config,
            current: RwLock::new(Current {
                generation: 0,
                producer,
            }),
            router,
            message_timeout,
            watch,
        }
    }

    /// librdkafka's `message.timeout.ms`: how long it may try to deliver one message.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let publisher = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .build()?;
    /// assert_eq!(publisher.message_timeout(), Duration::from_secs(10));
    /// # Ok::<(), outbox_core::kafka::KafkaConfigError>(())
    /// ```
    pub fn message_timeout(&self) -> Duration {
        self.message_timeout
    }

    /// The longest one [`publish`](Publisher::publish) takes: a tenth of the message timeout
    /// to wait for room in a full local queue, the message timeout itself, and two seconds of
    /// librdkafka's once-a-second timeout scans. 13 s with the default 10 s message timeout;
    /// configure the relay's lease well above it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let publisher = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .message_timeout(Duration::from_secs(5))
    ///     .build()?;
    /// assert_eq!(publisher.publish_timeout(), Duration::from_millis(7500));
    /// # Ok::<(), outbox_core::kafka::KafkaConfigError>(())
    /// ```
    pub fn publish_timeout(&self) -> Duration {
        self.enqueue_budget() + self.message_timeout + REPORT_GRACE
    }

    /// Asks the cluster for its metadata: `Ok` once a broker answered within `timeout`, else
    /// an error saying which brokers were tried and, when librdkafka reported one, the cause
    /// (a refused TLS certificate or SASL login, say: librdkafka's metadata error alone only
    /// says that the request timed out). For start-up checks; publishing does not need it.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let publisher = outbox_core::kafka::KafkaPublisher::builder().brokers("127.0.0.1:9092").build()?;
    /// publisher.check_reachable(Duration::from_secs(5)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_reachable(&self, timeout: Duration) -> Result<(), BrokerUnreachable> {
        let (_, producer) = self.current();
        let brokers = self
            .config
            .get("bootstrap.servers")
            .unwrap_or("?")
            .to_owned();
        let found = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, timeout)
                .map(|m| m.brokers().len())
        })
        .await;
        let mut reason = match found {
            Ok(Ok(n)) if n > 0 => return Ok(()),
            Ok(Ok(_)) => "the cluster answered with no brokers".to_owned(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("the metadata request failed: {e}"),
        };
        if let Some(last) = self.watch.last_error() {
            reason.push_str(&format!("; last error: {last}"));
        }
        Err(BrokerUnreachable { brokers, reason })
    }

    /// The topic `msg` is sent to.
    ///
    /// ```
    /// # use outbox_core::relay::OutboxMessage;
    /// # fn check(msg: OutboxMessage) -> Result<(), outbox_core::kafka::KafkaConfigError> {
    /// let publisher = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .topic_prefix("prod.")
    ///     .build()?;
    /// assert_eq!(publisher.topic_of(&msg), format!("prod.{}", msg.topic()));
    /// # Ok(()) }
    /// ```
    pub fn topic_of(&self, msg: &OutboxMessage) -> String {
        self.router.topic(msg)
    }

    /// What a delivery report (`None`: none came in time) means for the relay.
    fn outcome(&self, topic: &str, report: Option<<DeliveryFuture as Future>::Output>) -> Delivery {
        match report {
            Some(Ok(Ok(_))) => {
                self.watch.reached();
                Delivery::Published
            }
            Some(Ok(Err((e, _)))) => classify::failed(
                topic,
                &e,
                format!("delivery to topic `{topic}` failed: {e}"),
            ),
            Some(Err(_canceled)) => Delivery::Unavailable(format!(
                "delivery to topic `{topic}`: the producer closed before reporting; the outcome \
                 is unknown"
            )),
            None => Delivery::Unavailable(format!(
                "delivery to topic `{topic}`: no report from librdkafka within \
                 message.timeout.ms ({:?}) + {REPORT_GRACE:?}; the outcome is unknown",
                self.message_timeout
            )),
        }
    }

    fn enqueue_budget(&self) -> Duration {
        self.message_timeout / 10
    }

    fn current(&self) -> (u64, WatchedProducer) {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        (current.generation, current.producer.clone())
    }

    /// If the producer of `generation` hit a fatal error (it then refuses every message),
    /// replaces it with a new one. Returns the fatal error's description, if any.
    fn replace_if_fatal(&self, generation: u64, producer: &WatchedProducer) -> Option<String> {
        let (code, reason) = producer.client().fatal_error()?;
        let fatal = format!("{reason} ({code:?})");
        // If the new producer cannot be created, keep the old one: the next publish tries again.
        let fresh = create_producer(&self.config, &self.watch).ok()?;
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let old = if current.generation == generation {
            current.generation += 1;
            std::mem::replace(&mut current.producer, fresh)
        } else {
            fresh // another publish replaced it already
        };
        drop(current);
        drop_in_background(old);
        Some(fatal)
    }

    /// Enqueues one message, waiting (up to `deadline`) while the local queue is full.
    async fn enqueue(
        &self,
        producer: &WatchedProducer,
        topic: &str,
        msg: &OutboxMessage,
        deadline: Instant,
    ) -> Result<DeliveryFuture, Delivery> {
        let mut record = FutureRecord::to(topic)
            .key(msg.aggregate_id.as_str())
            .payload(msg.payload.as_str())
            .headers(record::headers(msg));
        loop {
            match producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    record = back;
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                }
                Err((e, _)) => {
                    let reason = enqueue_error(&e, topic, msg, self.enqueue_budget());
                    return Err(classify::failed(topic, &e, reason));
                }
            }
        }
    }

    /// Publishes the messages of `batch` at `indices` (in batch order) with `producer`:
    /// enqueues them grouped by key, then awaits their reports, everything by `end`. Once a
    /// message fails to enqueue, later messages of its key are not enqueued
    /// ([`Delivery::NotAttempted`]).
    async fn publish_round<'b>(
        &self,
        producer: &WatchedProducer,
        batch: &'b [OutboxMessage],
        indices: &[usize],
        end: Instant,
    ) -> Round<'b> {
        let enqueue_deadline = (Instant::now() + self.enqueue_budget()).min(end);
        let mut round = Round {
            outcomes: vec![Delivery::NotAttempted; batch.len()],
            unknown: HashSet::new(),
        };
        let mut blocked: HashSet<(&str, &str)> = HashSet::new();
        let mut pending: Vec<(usize, String, DeliveryFuture)> = Vec::with_capacity(indices.len());
        for i in batch::enqueue_order(batch, indices) {
            let msg = &batch[i];
            if blocked.contains(&msg.ordering_key()) {
                continue; // NotAttempted
            }
            let topic = self.router.topic(msg);
            match self.enqueue(producer, &topic, msg, enqueue_deadline).await {
                Ok(delivery) => pending.push((i, topic, delivery)),
                Err(failed) => {
                    round.outcomes[i] = failed;
                    blocked.insert(msg.ordering_key());
                }
            }
        }

        let report_deadline = (Instant::now() + self.message_timeout + REPORT_GRACE).min(end);
        let awaiting = self.watch.awaiting_reports();
        for (i, topic, delivery) in pending {
            let report = await_report(producer, delivery, report_deadline).await;
            if !matches!(report, Some(Ok(_))) {
                // No report (or the producer closed first): librdkafka may still hold the
                // message, so nothing of its key may be sent by another producer now.
                round.unknown.insert(batch[i].ordering_key());
            }
            round.outcomes[i] = self.outcome(&topic, report);
        }
        drop(awaiting);
        round
    }
}

/// The outcomes of one round of a publish, by index in the batch.
struct Round<'b> {
    outcomes: Vec<Delivery>,
    /// The keys with a message whose outcome is unknown (no delivery report).
    unknown: HashSet<(&'b str, &'b str)>,
}

impl<'b> Round<'b> {
    /// After the producer died of a fatal error: the messages to publish again on its
    /// successor, in batch order. Those reported unavailable (purged, fenced) or not attempted,
    /// of keys with no poison message (a refused record holds its key back, and the relay
    /// decides about it) and no message whose outcome is unknown (the dead producer may still
    /// deliver it, and a message sent now could overtake it). Every other message of such a
    /// key has a report, so none of them is still in flight: sending them again cannot
    /// reorder the key, at most duplicate what was written without an acknowledgement.
    fn retriable_after_fatal(&self, batch: &'b [OutboxMessage]) -> Vec<usize> {
        let poisoned: HashSet<(&str, &str)> = batch
            .iter()
            .zip(&self.outcomes)
            .filter(|(_, o)| matches!(o, Delivery::Failed(_)))
            .map(|(m, _)| m.ordering_key())
            .collect();
        (0..batch.len())
            .filter(|&i| {
                let key = batch[i].ordering_key();
                matches!(
                    self.outcomes[i],
                    Delivery::Unavailable(_) | Delivery::NotAttempted
                ) && !poisoned.contains(&key)
                    && !self.unknown.contains(&key)
            })
            .collect()
    }

    /// Takes the outcomes of `retried` at `indices`.
    fn take(&mut self, mut retried: Round<'b>, indices: &[usize]) {
        for &i in indices {
            self.outcomes[i] = std::mem::replace(&mut retried.outcomes[i], Delivery::NotAttempted);
        }
        self.unknown.extend(retried.unknown);
    }

    /// Says in the error of every message not delivered that the producer stopped on the
    /// fatal error `fatal` and was replaced.
    fn note_fatal(&mut self, fatal: &str) {
        for outcome in &mut self.outcomes {
            if let Some(reason) = outcome.error_mut() {
                reason.push_str(&format!(
                    "; the producer stopped on a fatal error ({fatal}) and was replaced"
                ));
            }
        }
    }
}

fn enqueue_error(e: &KafkaError, topic: &str, msg: &OutboxMessage, budget: Duration) -> String {
    let detail = match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::MessageSizeTooLarge) => format!(
            ": the record (key {} bytes, payload {} bytes, plus headers) exceeds the producer's \
             `message.max.bytes`",
            msg.aggregate_id.len(),
            msg.payload.len()
        ),
        Some(RDKafkaErrorCode::QueueFull) => format!(
            ": librdkafka's local queue stayed full for {budget:?} \
             (`queue.buffering.max.messages`, `queue.buffering.max.kbytes`): the broker is not \
             keeping up"
        ),
        _ => String::new(),
    };
    format!("not sent to topic `{topic}`: {e}{detail}")
}

/// Awaits one delivery report until `deadline` (`None` after it). Meanwhile, if the producer
/// hit a fatal error, purges its queue: it will never send again, and messages that were in
/// flight when it stopped come back to the queue (librdkafka retries them after an
/// out-of-order-sequence answer) where they would otherwise wait out `message.timeout.ms`.
async fn await_report(
    producer: &WatchedProducer,
    mut delivery: DeliveryFuture,
    deadline: Instant,
) -> Option<<DeliveryFuture as Future>::Output> {
    loop {
        let wake = deadline.min(Instant::now() + FATAL_CHECK);
        match tokio::time::timeout_at(wake, &mut delivery).await {
            Ok(report) => return Some(report),
            Err(_) if Instant::now() >= deadline => return None,
            Err(_) => {
                if producer.client().fatal_error().is_some() {
                    producer.purge(PurgeConfig::default().queue());
                }
            }
        }
    }
}

fn drop_in_background(producer: WatchedProducer) {
    // Dropping a producer purges it and waits for its threads: never on an async worker.
    let spawned = std::thread::Builder::new()
        .name("outbox-kafka-close".into())
        .spawn(move || drop(producer));
    // If no thread can be spawned the closure, and with it the producer, is dropped right here.
    drop(spawned);
}

impl Publisher for KafkaPublisher {
    /// Enqueues the whole batch (grouped by ordering key), then awaits every delivery report,
    /// within [`publish_timeout`](KafkaPublisher::publish_timeout). Once a message fails to
    /// enqueue, later messages of its key are not enqueued ([`Delivery::NotAttempted`]). If the
    /// producer stops on a fatal error, it is replaced and what it did not deliver is sent again
    /// on the new one within the same time (keys with a refused record or a message without a
    /// report excepted).
    ///
    /// ```no_run
    /// # use outbox_core::relay::{Delivery, OutboxMessage, Publisher};
    /// # async fn run(batch: &[OutboxMessage]) -> Result<(), outbox_core::kafka::KafkaConfigError> {
    /// let publisher = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .build()?;
    /// let outcomes = publisher.publish(batch).await;
    /// let published = outcomes.iter().filter(|d| **d == Delivery::Published).count();
    /// println!("{published} of {} published", batch.len());
    /// # Ok(()) }
    /// ```
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let end = Instant::now() + self.publish_timeout();
        let (mut generation, mut producer) = self.current();
        if self.replace_if_fatal(generation, &producer).is_some() {
            (generation, producer) = self.current();
        }
        let all: Vec<usize> = (0..batch.len()).collect();
        let mut round = self.publish_round(&producer, batch, &all, end).await;
        if let Some(fatal) = self.replace_if_fatal(generation, &producer) {
            // A fatal error stops the producer, not the broker (which answered it): what the
            // dead producer did not deliver goes again at once on the new one, within this
            // publish's time, instead of coming back to the relay as an outage and waiting out
            // its backoff (2 s of a broker outage test's 2.3 s resume were that wait).
            let again = round.retriable_after_fatal(batch);
            let mut fatal_again = None;
            if !again.is_empty() {
                let (generation, producer) = self.current();
                let retried = self.publish_round(&producer, batch, &again, end).await;
                round.take(retried, &again);
                fatal_again = self.replace_if_fatal(generation, &producer);
            }
            // What is still not delivered: the messages a fatal error's purge sent back are
            // outages (the next publish tries again); a record refused for itself (e.g. too
            // large) stays poison.
            round.note_fatal(&fatal);
            if let Some(fatal) = fatal_again {
                round.note_fatal(&fatal);
            }
        }
        let mut outcomes = round.outcomes;
        batch::flag_order_breaks(batch, &mut outcomes);
        self.watch.name_brokers(&mut outcomes);
        outcomes
    }

    /// While librdkafka reports every broker down (its `AllBrokersDown` error), until a broker
    /// acknowledges a message again; or while a publish has had no acknowledgement for a few
    /// seconds (a network that drops packets leaves librdkafka's connections up and silent).
    fn unavailable(&self) -> Option<String> {
        self.watch.down()
    }

    /// [`check_reachable`](KafkaPublisher::check_reachable): asks the cluster for its metadata.
    async fn ready(&self, timeout: Duration) -> Result<(), NotReady> {
        self.check_reachable(timeout).await.map_err(NotReady::from)
    }
}

impl fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("bootstrap.servers", &self.config.get("bootstrap.servers"))
            .field("router", &self.router)
            .field("message_timeout", &self.message_timeout)
            .finish_non_exhaustive()
    }
}
