//! [`KafkaConsumerBuilder`]: the group, the topics, the handlers, and what to do when a message
//! fails.

use std::time::Duration;

use rdkafka::message::OwnedMessage;

use super::KafkaConsumer;
use super::config::clients;
use super::dead_letter::{DeadLetterTopic, DeadLetters};
use super::transport::KafkaTransport;
use crate::consumer::{Options, Runtime};
use crate::kafka::KafkaConfigError;

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

    crate::consumer::policy_methods!("outbox_core::kafka::KafkaConsumer::builder()");

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
