//! [`KafkaConsumerBuilder`]: the group, the topics, the handlers, and what to do when a message
//! fails.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::StreamConsumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use serde::de::DeserializeOwned;

use super::dead_letter::{DeadLetterTopic, DeadLetters};
use super::dispatch::{Dispatch, Typed};
use super::{KafkaConsumer, Settings};
use crate::kafka::KafkaConfigError;
use crate::relay::Backoff;
use crate::{Envelope, OutboxEvent, Outcome};

/// What happens to a message that cannot be handled at all: its headers or payload do not
/// decode (a [`DecodeError`](crate::DecodeError): garbage bytes, a missing header, a version
/// newer than the handler knows, ...) or no handler is registered for its event type. Either
/// way the consumer goes on with the next message: never a crash loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UndecodablePolicy {
    /// Write it to the dead-letter topic with the reason in the
    /// [`DLT_HEADER_ERROR`](crate::kafka::DLT_HEADER_ERROR) header (and log it), then go on.
    /// Nothing is lost: the message can be replayed from there once a consumer understands it.
    #[default]
    DeadLetter,
    /// Log it at `error` level with the reason, and go on. The message stays in its topic (its
    /// offset says where) but this consumer group will not see it again.
    Skip,
}

/// Builds a [`KafkaConsumer`]. Get one from [`KafkaConsumer::builder`].
///
/// ```
/// use std::time::Duration;
/// use outbox_core::kafka::{KafkaConsumer, UndecodablePolicy};
/// use outbox_core::{Envelope, Outcome, OutboxEvent};
/// # use outbox_core as outbox;
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order")]
/// struct OrderCreated { #[outbox(aggregate_id)] order_id: u64 }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), outbox_core::kafka::KafkaConfigError> {
/// let consumer = KafkaConsumer::builder()
///     .brokers("127.0.0.1:9092")
///     .group("billing")
///     .topic("order")
///     .handler(|event: Envelope<OrderCreated>| async move {
///         // e.g. `charge(&mut pool.get().await?, event).await`, an `#[idempotent]` fn
///         let _ = event.order_id;
///         Ok::<_, std::io::Error>(Outcome::Applied(()))
///     })
///     .max_attempts(5)
///     .dead_letter_topic("billing.dlt")
///     .on_undecodable(UndecodablePolicy::DeadLetter)
///     .build()?;
/// # drop(consumer);
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `.build()`"]
pub struct KafkaConsumerBuilder {
    settings: Vec<(String, String)>,
    dead_letter_settings: Vec<(String, String)>,
    group: Option<String>,
    topics: Vec<String>,
    assignment: Vec<(String, i32)>,
    dispatch: Dispatch,
    duplicate_handler: Option<(String, String)>,
    dead_letter_topic: DeadLetterTopic,
    undecodable: UndecodablePolicy,
    max_attempts: u32,
    backoff: Backoff,
    shutdown_grace: Duration,
}

impl Default for KafkaConsumerBuilder {
    fn default() -> Self {
        KafkaConsumerBuilder {
            settings: Vec::new(),
            dead_letter_settings: Vec::new(),
            group: None,
            topics: Vec::new(),
            assignment: Vec::new(),
            dispatch: Dispatch::default(),
            duplicate_handler: None,
            dead_letter_topic: DeadLetterTopic::Suffix(".dlt".to_owned()),
            undecodable: UndecodablePolicy::default(),
            max_attempts: 5,
            backoff: DEFAULT_RETRY_BACKOFF,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// The retry backoff unless configured: 200 ms, doubling, at most 5 s, ±20 %.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(outbox_core::kafka::DEFAULT_RETRY_BACKOFF.initial, Duration::from_millis(200));
/// ```
pub const DEFAULT_RETRY_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(200),
    max: Duration::from_secs(5),
    multiplier: 2.0,
    jitter: 0.2,
};

/// Consumer settings applied before the user's.
const DEFAULTS: [(&str, &str); 5] = [
    ("enable.auto.offset.store", "false"),
    ("enable.auto.commit", "true"),
    // A new group starts from the beginning: an outbox consumer must not skip events that
    // were published before it first ran.
    ("auto.offset.reset", "earliest"),
    ("enable.partition.eof", "false"),
    ("client.id", "outbox-consumer"),
];

/// Settings the dead-letter producer takes from the consumer's, so that it reaches the same
/// cluster the same way.
const SHARED_PREFIXES: [&str; 4] = ["bootstrap.servers", "security.", "ssl.", "sasl."];

impl KafkaConsumerBuilder {
    /// The bootstrap brokers, comma separated `host:port` (librdkafka's `bootstrap.servers`).
    pub fn brokers(self, brokers: impl Into<String>) -> Self {
        self.set("bootstrap.servers", brokers)
    }

    /// The consumer group (`group.id`): the offsets it commits are this group's, and the
    /// group's members share the topics' partitions. Required.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Subscribes to `topic` (as a member of the group). Call once per topic.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// Subscribes to every topic of `topics`.
    pub fn topics<I: IntoIterator<Item = S>, S: Into<String>>(mut self, topics: I) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// Reads the given partitions of `topic` without joining the group (librdkafka's
    /// `assign`), from the group's committed offsets (or `auto.offset.reset` where it has
    /// none), committing to the group as usual. For a fixed set of consumers that split the
    /// partitions themselves, and for brokers whose group coordination is slow. Not combined
    /// with [`topic`](Self::topic).
    pub fn assign(
        mut self,
        topic: impl Into<String>,
        partitions: impl IntoIterator<Item = i32>,
    ) -> Self {
        let topic = topic.into();
        self.assignment
            .extend(partitions.into_iter().map(|p| (topic.clone(), p)));
        self
    }

    /// Sets any librdkafka consumer property (librdkafka's `CONFIGURATION.md`), e.g.
    /// `session.timeout.ms`, `auto.offset.reset`, `security.protocol`. A later call for the same
    /// property wins. `enable.auto.offset.store` is refused: the consumer stores each offset
    /// itself, once the message is done.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// Sets a librdkafka producer property of the dead-letter producer (it already shares the
    /// consumer's `bootstrap.servers`, `security.*`, `ssl.*` and `sasl.*`).
    pub fn dead_letter_set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.dead_letter_settings.push((key.into(), value.into()));
        self
    }

    /// Handles every event type `E` carries ([`OutboxEvent::EVENT_TYPES`]) with `handler`.
    ///
    /// The handler gets the decoded [`Envelope<E>`] and returns what an `#[idempotent]`
    /// function returns: `Ok(Outcome::Applied(_))` or `Ok(Outcome::Duplicate)` when the message
    /// is done (its offset is then stored for commit), `Err(e)` to have it retried with
    /// backoff and, after [`max_attempts`](Self::max_attempts), dead-lettered with `e` in the
    /// [`DLT_HEADER_ERROR`](crate::kafka::DLT_HEADER_ERROR) header. Each attempt decodes the
    /// message again, so `E` need not be `Clone`. An event type may have one handler.
    pub fn handler<E, F, Fut, T, Err>(mut self, handler: F) -> Self
    where
        E: OutboxEvent + DeserializeOwned + Send + 'static,
        F: Fn(Envelope<E>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Err>> + Send + 'static,
        T: Send + 'static,
        Err: Display + Send + 'static,
    {
        let typed = Arc::new(Typed::<E, F>::new(handler));
        if let Err(key) = self.dispatch.register(E::EVENT_TYPES, typed)
            && self.duplicate_handler.is_none()
        {
            self.duplicate_handler = Some(key);
        }
        self
    }

    /// How many times a handler runs on one message before it is dead-lettered (default 5;
    /// at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The wait between attempts (default [`DEFAULT_RETRY_BACKOFF`]). The consumer does not
    /// read meanwhile, so the whole retry budget must stay below `max.poll.interval.ms`
    /// (default 5 minutes), which [`build`](Self::build) checks.
    pub fn retry_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Dead letters go to this topic, whatever their source topic. By default they go to the
    /// source topic plus `.dlt` (`order` to `order.dlt`).
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = DeadLetterTopic::Fixed(topic.into());
        self
    }

    /// What to do with a message that cannot be handled at all (default:
    /// [`UndecodablePolicy::DeadLetter`]).
    pub fn on_undecodable(mut self, policy: UndecodablePolicy) -> Self {
        self.undecodable = policy;
        self
    }

    /// On shutdown, how long the message in flight may take to finish (default 30 s). After
    /// that its handler is dropped unfinished and the message is read again on restart.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Checks everything and creates the consumer and the dead-letter producer. Connecting
    /// happens in the background, in [`KafkaConsumer::run`]. Call it inside a Tokio runtime,
    /// which the consumer's wake-ups use.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use outbox_core::kafka::{KafkaConfigError, KafkaConsumer};
    /// let err = KafkaConsumer::builder().brokers("127.0.0.1:9092").topic("order").build().unwrap_err();
    /// assert!(matches!(&err, KafkaConfigError::InvalidOption { option, .. } if option == "group"));
    /// assert!(err.to_string().starts_with("invalid `group`: a consumer needs a consumer group"));
    /// # }
    /// ```
    pub fn build(self) -> Result<KafkaConsumer, KafkaConfigError> {
        let invalid = |name: &str, reason: String| KafkaConfigError::InvalidOption {
            option: name.to_owned(),
            reason,
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(invalid(
                "build",
                "call it inside a Tokio runtime: the consumer's wake-ups use it".into(),
            ));
        }
        let group = self.group.filter(|g| !g.trim().is_empty()).ok_or_else(|| {
            invalid(
                "group",
                "a consumer needs a consumer group: call `.group(\"billing\")`".into(),
            )
        })?;
        if self.topics.is_empty() && self.assignment.is_empty() {
            return Err(invalid(
                "topic",
                "a consumer reads at least one topic: call `.topic(\"order\")` or `.assign(...)`"
                    .into(),
            ));
        }
        if !self.topics.is_empty() && !self.assignment.is_empty() {
            return Err(invalid(
                "assign",
                "`.assign(...)` reads chosen partitions instead of subscribing: do not combine it \
                 with `.topic(...)`"
                    .into(),
            ));
        }
        if self.dispatch.is_empty() {
            return Err(invalid(
                "handler",
                "a consumer needs at least one handler: call `.handler(...)`".into(),
            ));
        }
        if let Some((aggregate_type, event_type)) = self.duplicate_handler {
            return Err(invalid(
                "handler",
                format!(
                    "event type `{event_type}` of aggregate `{aggregate_type}` has two handlers"
                ),
            ));
        }
        if self.max_attempts == 0 {
            return Err(invalid("max_attempts", "at least 1 attempt".into()));
        }

        let mut settings: BTreeMap<String, String> = DEFAULTS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (key, value) in self.settings {
            let key = if key == "metadata.broker.list" {
                "bootstrap.servers".to_owned()
            } else {
                key
            };
            settings.insert(key, value);
        }
        settings.insert("group.id".into(), group.clone());
        check_settings(&settings)?;
        let poll_interval = settings
            .get("max.poll.interval.ms")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(Duration::from_secs(300), Duration::from_millis);
        let budget = retry_budget(&self.backoff, self.max_attempts);
        if budget >= poll_interval / 2 {
            return Err(invalid(
                "retry_backoff",
                format!(
                    "{} attempts with this backoff wait up to {budget:?}, more than half of \
                     `max.poll.interval.ms` ({poll_interval:?}): the consumer would be thrown \
                     out of its group while it waits; lower `max_attempts` or the backoff, or \
                     raise `max.poll.interval.ms`",
                    self.max_attempts
                ),
            ));
        }

        let mut config = ClientConfig::new();
        for (key, value) in &settings {
            config.set(key, value);
        }
        let consumer: StreamConsumer = config.create().map_err(config_error)?;

        let mut producer_config = ClientConfig::new();
        for (key, value) in settings
            .iter()
            .filter(|(k, _)| SHARED_PREFIXES.iter().any(|p| k.starts_with(p)))
        {
            producer_config.set(key, value);
        }
        producer_config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "10000")
            .set("client.id", "outbox-dead-letters");
        for (key, value) in &self.dead_letter_settings {
            producer_config.set(key, value);
        }
        let producer: FutureProducer = producer_config.create().map_err(config_error)?;

        Ok(KafkaConsumer::new(
            consumer,
            Settings {
                group: group.clone(),
                topics: self.topics,
                assignment: self.assignment,
                dispatch: self.dispatch,
                undecodable: self.undecodable,
                max_attempts: self.max_attempts,
                backoff: self.backoff,
                shutdown_grace: self.shutdown_grace,
            },
            DeadLetters {
                producer,
                topic: self.dead_letter_topic,
                group,
                timeout: Duration::from_secs(10),
            },
        ))
    }
}

fn check_settings(settings: &BTreeMap<String, String>) -> Result<(), KafkaConfigError> {
    if settings
        .get("bootstrap.servers")
        .is_none_or(|b| b.trim().is_empty())
    {
        return Err(KafkaConfigError::MissingBrokers);
    }
    if !matches!(
        settings["enable.auto.offset.store"]
            .to_ascii_lowercase()
            .as_str(),
        "false" | "f" | "0"
    ) {
        return Err(KafkaConfigError::Forbidden {
            key: "enable.auto.offset.store".into(),
            value: settings["enable.auto.offset.store"].clone(),
            reason: "the consumer stores an offset only once its message is done (the \
                     handler's transaction committed, a duplicate was recognised, or the \
                     message was dead-lettered)",
        });
    }
    Ok(())
}

fn config_error(e: KafkaError) -> KafkaConfigError {
    match e {
        KafkaError::ClientConfig(_, reason, key, value) => {
            KafkaConfigError::Invalid { key, value, reason }
        }
        KafkaError::ClientCreation(reason) => KafkaConfigError::Rejected { reason },
        other => KafkaConfigError::Rejected {
            reason: other.to_string(),
        },
    }
}

/// The longest the retries of one message wait in total: every backoff at its jittered
/// maximum.
fn retry_budget(backoff: &Backoff, max_attempts: u32) -> Duration {
    (1..max_attempts).map(|n| backoff.delay(n, 1.0)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_budget_sums_the_longest_waits() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(4),
            multiplier: 2.0,
            jitter: 0.0,
        };
        assert_eq!(retry_budget(&b, 1), Duration::ZERO);
        assert_eq!(retry_budget(&b, 4), Duration::from_secs(1 + 2 + 4));
        assert_eq!(retry_budget(&b, 5), Duration::from_secs(1 + 2 + 4 + 4));
    }
}
