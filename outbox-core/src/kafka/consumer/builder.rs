//! [`KafkaConsumerBuilder`]: the group, the topics, the handlers, and what to do when a message
//! fails.

use std::error::Error;
use std::time::Duration;

use rdkafka::message::OwnedMessage;
use serde::de::DeserializeOwned;

use super::KafkaConsumer;
use super::config::clients;
use super::dead_letter::{DeadLetterTopic, DeadLetters};
use super::transport::KafkaTransport;
use crate::backoff::Backoff;
use crate::consumer::{
    AfterDeadLetter, NewerVersionPolicy, Options, Runtime, UndecodablePolicy, UnhandledPolicy,
};
use crate::fault::{ClassifyError, ErrorClass, classifier_of};
use crate::kafka::KafkaConfigError;
use crate::{BoxError, Envelope, OutboxEvent, Outcome};

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
///     .outage_backoff(outbox_core::kafka::DEFAULT_OUTAGE_BACKOFF)
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
    dead_letter_topic: DeadLetterTopic,
    /// Handlers and policies: the broker-free runtime's.
    options: Options<OwnedMessage>,
}

/// Shows the settings with secret values (see [`is_secret_key`](crate::redact::is_secret_key))
/// as `***`, the group and the topics.
impl std::fmt::Debug for KafkaConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::kafka::secrets::Redacted;
        f.debug_struct("KafkaConsumerBuilder")
            .field("settings", &Redacted(&self.settings))
            .field(
                "dead_letter_settings",
                &Redacted(&self.dead_letter_settings),
            )
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("assignment", &self.assignment)
            .finish_non_exhaustive()
    }
}

impl Default for KafkaConsumerBuilder {
    fn default() -> Self {
        KafkaConsumerBuilder {
            settings: Vec::new(),
            dead_letter_settings: Vec::new(),
            group: None,
            topics: Vec::new(),
            assignment: Vec::new(),
            dead_letter_topic: DeadLetterTopic::Suffix(".dlt".to_owned()),
            options: Options::default(),
        }
    }
}

impl KafkaConsumerBuilder {
    /// The bootstrap brokers, comma separated `host:port` (librdkafka's `bootstrap.servers`).
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().brokers("k1:9092,k2:9092");
    /// # drop(builder);
    /// ```
    pub fn brokers(self, brokers: impl Into<String>) -> Self {
        self.set("bootstrap.servers", brokers)
    }

    /// The consumer group (`group.id`): the offsets it commits are this group's, and the
    /// group's members share the topics' partitions. Required.
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().group("billing");
    /// # drop(builder);
    /// ```
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Subscribes to `topic` (as a member of the group). Call once per topic.
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().topic("order").topic("payment");
    /// # drop(builder);
    /// ```
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// Subscribes to every topic of `topics`.
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().topics(["order", "payment"]);
    /// # drop(builder);
    /// ```
    pub fn topics<I: IntoIterator<Item = S>, S: Into<String>>(mut self, topics: I) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// Reads the given partitions of `topic` without joining the group (librdkafka's
    /// `assign`), from the group's committed offsets (or `auto.offset.reset` where it has
    /// none), committing to the group as usual. For a fixed set of consumers that split the
    /// partitions themselves, and for brokers whose group coordination is slow. Not combined
    /// with [`topic`](Self::topic).
    ///
    /// ```
    /// // This instance reads partitions 0 and 1 of `order`; another one reads the rest.
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().assign("order", [0, 1]);
    /// # drop(builder);
    /// ```
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
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder()
    ///     .set("session.timeout.ms", "10000")
    ///     .set("auto.commit.interval.ms", "1000");
    /// # drop(builder);
    /// ```
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// Sets a librdkafka producer property of the dead-letter producer (it already shares the
    /// consumer's `bootstrap.servers`, `security.*`, `ssl.*` and `sasl.*`).
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().dead_letter_set("linger.ms", "5");
    /// # drop(builder);
    /// ```
    pub fn dead_letter_set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.dead_letter_settings.push((key.into(), value.into()));
        self
    }

    /// Handles every event type `E` carries ([`OutboxEvent::EVENT_TYPES`]) with `handler`.
    ///
    /// The handler gets the decoded [`Envelope<E>`] and returns what an `#[idempotent]`
    /// function returns: `Ok(Outcome::Applied(_))` or `Ok(Outcome::Duplicate)` when the message
    /// is done (its offset is then stored for commit), or `Err(e)`, any error that converts
    /// into a boxed error (`std::io::Error`, `diesel::result::Error`, your own error type,
    /// `anyhow::Error`, `String`, ...). The error and its `source()` chain are classified
    /// ([`crate::fault`]): a transient one (an outage) is retried with the
    /// [`outage_backoff`](Self::outage_backoff) until it passes; any other is retried with the
    /// [`retry_backoff`](Self::retry_backoff) and, after [`max_attempts`](Self::max_attempts),
    /// dead-lettered with the error chain in the
    /// [`DLT_HEADER_ERROR`](crate::kafka::DLT_HEADER_ERROR) header. A handler that panics fails
    /// its attempt as a permanent error (each attempt runs as its own task), so a bad message
    /// cannot crash the consumer in a loop. Each attempt decodes the message again, so `E` need
    /// not be `Clone`. An event type may have one handler.
    ///
    /// For the database's errors to be recognised, the error you return must keep them in its
    /// chain: return the `diesel::result::Error` (or pool error) itself, or an error type of
    /// yours that has it as its `source()` (thiserror's `#[from]` or `#[source]`), not a string
    /// made of it.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// use outbox_core::{Envelope, Outcome, OutboxEvent};
    /// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
    /// #[outbox(crate = outbox_core, aggregate = "order")]
    /// enum OrderEvent {
    ///     Created(#[outbox(aggregate_id)] u64),
    ///     Cancelled(#[outbox(aggregate_id)] u64),
    /// }
    ///
    /// // One handler for both event types of the enum.
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().handler(|event: Envelope<OrderEvent>| async move {
    ///     match event.payload {
    ///         OrderEvent::Created(id) | OrderEvent::Cancelled(id) => println!("order {id}"),
    ///     }
    ///     Ok::<_, String>(Outcome::Applied(()))
    /// });
    /// # drop(builder);
    /// ```
    pub fn handler<E, F, Fut, T, Err>(mut self, handler: F) -> Self
    where
        E: OutboxEvent + DeserializeOwned + Send + 'static,
        F: Fn(Envelope<E>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Err>> + Send + 'static,
        T: Send + 'static,
        Err: Into<BoxError> + Send + 'static,
    {
        self.options.handler(handler);
        self
    }

    /// How many permanent failures of a handler on one message lead to its dead letter
    /// (default 5; at least 1). Transient failures (outages) do not count.
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().max_attempts(10);
    /// # drop(builder);
    /// ```
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.options.policy.max_attempts = attempts;
        self
    }

    /// The wait between attempts after a permanent failure (default
    /// [`DEFAULT_RETRY_BACKOFF`](crate::consumer::DEFAULT_RETRY_BACKOFF)). The partitions are paused and the consumer polled meanwhile,
    /// so the waits may add up to any length. [`build`](Self::build) refuses a backoff that
    /// [`Backoff::validate`] refuses, naming `retry_backoff.<field>`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_core::relay::Backoff;
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().retry_backoff(Backoff {
    ///     initial: Duration::from_millis(500),
    ///     max: Duration::from_secs(10),
    ///     multiplier: 2.0,
    ///     jitter: 0.2,
    /// });
    /// # drop(builder);
    /// ```
    pub fn retry_backoff(mut self, backoff: Backoff) -> Self {
        self.options.policy.backoff = backoff;
        self
    }

    /// The wait between attempts after a transient failure, an outage (default
    /// [`DEFAULT_OUTAGE_BACKOFF`](crate::consumer::DEFAULT_OUTAGE_BACKOFF): 100 ms doubling to 2 s). The message is retried for as long
    /// as the outage lasts, its partitions paused and the consumer polled; `max` bounds how
    /// long after the outage's end the consumer goes on. [`build`](Self::build) refuses a
    /// backoff that [`Backoff::validate`] refuses, naming `outage_backoff.<field>`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_core::relay::Backoff;
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().outage_backoff(Backoff {
    ///     initial: Duration::from_millis(50),
    ///     max: Duration::from_secs(1),
    ///     multiplier: 2.0,
    ///     jitter: 0.2,
    /// });
    /// # drop(builder);
    /// ```
    pub fn outage_backoff(mut self, backoff: Backoff) -> Self {
        self.options.policy.outage_backoff = backoff;
        self
    }

    /// Adds a classifier of handler errors, asked for each link of an error's `source()`
    /// chain after the [`Transient`](crate::fault::Transient) and
    /// [`Permanent`](crate::fault::Permanent) markers and before the registered and built-in
    /// classifiers (see [`crate::fault`]). `None` lets the others decide.
    ///
    /// ```
    /// use outbox_core::fault::ErrorClass;
    /// // An HTTP client's 503, recognised by a type of its own in your code.
    /// #[derive(Debug)]
    /// struct Unavailable;
    /// # impl std::fmt::Display for Unavailable {
    /// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("503") }
    /// # }
    /// # impl std::error::Error for Unavailable {}
    /// let builder = outbox_core::kafka::KafkaConsumer::builder()
    ///     .classifier(|e| e.is::<Unavailable>().then_some(ErrorClass::Transient));
    /// # drop(builder);
    /// ```
    pub fn classifier(
        mut self,
        classifier: impl Fn(&(dyn Error + 'static)) -> Option<ErrorClass> + Send + Sync + 'static,
    ) -> Self {
        self.options.classifier(classifier);
        self
    }

    /// Lets the errors of type `T` in a handler's error chain say their class
    /// ([`ClassifyError`]).
    ///
    /// ```
    /// use outbox_core::fault::{ClassifyError, ErrorClass};
    /// #[derive(Debug)]
    /// enum BillingError { ProviderDown, CardDeclined }
    /// # impl std::fmt::Display for BillingError {
    /// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
    /// # }
    /// # impl std::error::Error for BillingError {}
    /// impl ClassifyError for BillingError {
    ///     fn error_class(&self) -> Option<ErrorClass> {
    ///         matches!(self, BillingError::ProviderDown).then_some(ErrorClass::Transient)
    ///     }
    /// }
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().classify_errors_of::<BillingError>();
    /// # drop(builder);
    /// ```
    pub fn classify_errors_of<T: ClassifyError>(self) -> Self {
        self.classifier(classifier_of::<T>)
    }

    /// What happens to the later messages of a key once one was dead-lettered (default
    /// [`AfterDeadLetter::ParkKey`]: they follow it to the dead-letter topic, marked as parked).
    ///
    /// ```
    /// use outbox_core::kafka::AfterDeadLetter;
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().after_dead_letter(AfterDeadLetter::SkipAhead);
    /// # drop(builder);
    /// ```
    pub fn after_dead_letter(mut self, policy: AfterDeadLetter) -> Self {
        self.options.policy.after_dead_letter = policy;
        self
    }

    /// How many parked keys the consumer remembers (default [`DEFAULT_MAX_PARKED_KEYS`](crate::consumer::DEFAULT_MAX_PARKED_KEYS), about
    /// 100 bytes each plus the key). Beyond it the oldest is forgotten, logged at `error`: its
    /// later messages are applied again. Parked keys live in memory only; a restart forgets
    /// them all.
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().max_parked_keys(1_000_000);
    /// # drop(builder);
    /// ```
    pub fn max_parked_keys(mut self, keys: usize) -> Self {
        self.options.policy.max_parked_keys = keys;
        self
    }

    /// Dead letters go to this topic, whatever their source topic. By default they go to the
    /// source topic plus `.dlt` (`order` to `order.dlt`).
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().dead_letter_topic("billing.dlt");
    /// # drop(builder);
    /// ```
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = DeadLetterTopic::Fixed(topic.into());
        self
    }

    /// What to do with a message that cannot be handled at all (default:
    /// [`UndecodablePolicy::DeadLetter`]).
    ///
    /// ```
    /// use outbox_core::kafka::UndecodablePolicy;
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().on_undecodable(UndecodablePolicy::Skip);
    /// # drop(builder);
    /// ```
    pub fn on_undecodable(mut self, policy: UndecodablePolicy) -> Self {
        self.options.policy.undecodable = policy;
        self
    }

    /// What to do with a message of an event type that has no handler (default:
    /// [`UnhandledPolicy::Acknowledge`]).
    ///
    /// ```
    /// use outbox_core::kafka::UnhandledPolicy;
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().on_unhandled(UnhandledPolicy::Undecodable);
    /// # drop(builder);
    /// ```
    pub fn on_unhandled(mut self, policy: UnhandledPolicy) -> Self {
        self.options.policy.unhandled = policy;
        self
    }

    /// What to do with a message whose version is newer than its handler knows (default:
    /// [`NewerVersionPolicy::Hold`]).
    ///
    /// ```
    /// use outbox_core::kafka::NewerVersionPolicy;
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().on_newer_version(NewerVersionPolicy::Undecodable);
    /// # drop(builder);
    /// ```
    pub fn on_newer_version(mut self, policy: NewerVersionPolicy) -> Self {
        self.options.policy.newer_version = policy;
        self
    }

    /// On shutdown, how long the message in flight may take to finish (default 30 s). After
    /// that its handler is dropped unfinished and the message is read again on restart.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = outbox_core::kafka::KafkaConsumer::builder().shutdown_grace(Duration::from_secs(5));
    /// # drop(builder);
    /// ```
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.options.policy.shutdown_grace = grace;
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
        let options = self.options;
        let settings = options
            .settings(group.clone())
            .map_err(|(option, reason)| invalid(&option, reason))?;

        let (consumer, producer) = clients(self.settings, &self.dead_letter_settings, &group)?;

        let dead_letters = DeadLetters {
            producer,
            topic: self.dead_letter_topic,
            timeout: Duration::from_secs(10),
        };
        let transport =
            KafkaTransport::new(consumer, dead_letters, group, self.topics, self.assignment);
        Ok(KafkaConsumer {
            runtime: Runtime::new(transport, settings),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_secret_settings() {
        let builder = KafkaConsumerBuilder::default()
            .brokers("k1:9092")
            .group("billing")
            .set("sasl.password", "hunter2-secret")
            .dead_letter_set("sasl.jaas.config", "password=\"jaas-secret\";");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        assert!(!shown.contains("jaas-secret"), "{shown}");
        assert!(
            shown.contains("billing") && shown.contains("k1:9092"),
            "{shown}"
        );
    }
}
