//! [`RabbitMqConsumerBuilder`]: the broker, the group, the topics, the handlers, and what to
//! do when a message fails.

use std::time::Duration;

use lapin::ExchangeKind;

use super::RabbitMqConsumer;
use super::dead_letter::DeadLetters;
use super::link::Setup;
use super::message::Incoming;
use super::transport::RabbitMqTransport;
use crate::broker_tls::{TlsFiles, tls_methods};
use crate::consumer::{Options, Runtime};
use crate::rabbitmq::RabbitMqConfigError;
use crate::rabbitmq::error::check_endpoint;
use crate::rabbitmq::topology::TopicQueues;
use crate::redact;

/// How many unacknowledged deliveries the broker sends ahead unless configured.
///
/// ```
/// assert_eq!(outbox_core::rabbitmq::DEFAULT_PREFETCH, 100);
/// ```
pub const DEFAULT_PREFETCH: u16 = 100;

/// Builds a [`RabbitMqConsumer`]. Get one from [`RabbitMqConsumer::builder`].
///
/// ```
/// use outbox_core::rabbitmq::{RabbitMqConsumer, UndecodablePolicy};
/// use outbox_core::{Envelope, Outcome, OutboxEvent};
/// # use outbox_core as outbox;
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order")]
/// struct OrderCreated { #[outbox(aggregate_id)] order_id: u64 }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), outbox_core::rabbitmq::RabbitMqConfigError> {
/// let consumer = RabbitMqConsumer::builder()
///     .uri("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .group("billing")
///     .topic("order")
///     .prefetch(50)
///     .handler(|event: Envelope<OrderCreated>| async move {
///         // e.g. `charge(&mut pool.get().await?, event).await`, an `#[idempotent]` fn
///         let _ = event.order_id;
///         Ok::<_, std::io::Error>(Outcome::Applied(()))
///     })
///     .max_attempts(5)
///     .on_undecodable(UndecodablePolicy::DeadLetter)
///     .build()?;
/// # drop(consumer);
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `.build()`"]
pub struct RabbitMqConsumerBuilder {
    uri: Option<String>,
    group: Option<String>,
    topics: Vec<String>,
    prefetch: u16,
    dead_letter_exchange: Option<String>,
    exchange_kind: ExchangeKind,
    tls: TlsFiles,
    /// Handlers and policies: the broker-free runtime's.
    options: Options<Incoming>,
}

impl Default for RabbitMqConsumerBuilder {
    fn default() -> Self {
        RabbitMqConsumerBuilder {
            uri: None,
            group: None,
            topics: Vec::new(),
            prefetch: DEFAULT_PREFETCH,
            dead_letter_exchange: None,
            exchange_kind: ExchangeKind::Topic,
            tls: TlsFiles::default(),
            options: Options::default(),
        }
    }
}

/// Shows the URI without its password, the group and the topics.
impl std::fmt::Debug for RabbitMqConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMqConsumerBuilder")
            .field("uri", &self.uri.as_deref().map(redact::url))
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("prefetch", &self.prefetch)
            .field("dead_letter_exchange", &self.dead_letter_exchange)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl RabbitMqConsumerBuilder {
    /// The broker, as an AMQP URI: `amqp://user:password@host:5672/vhost` (`%2f` is the
    /// default vhost `/`). Required. Its password is never shown in errors, logs or `Debug`.
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqConsumer::builder()
    ///     .uri("amqp://guest:guest@127.0.0.1:5672/%2f");
    /// # drop(builder);
    /// ```
    pub fn uri(mut self, uri: impl Into<String>) -> Self {
        self.uri = Some(uri.into());
        self
    }

    /// The consumer's name: it reads queue `<group>.<topic>` of each topic, so that every
    /// process of one group shares the queues (one of them active at a time) and each group
    /// gets every message. Required.
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqConsumer::builder().group("billing");
    /// # drop(builder);
    /// ```
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Reads `topic`: the exchange the relay publishes the topic's events to. Call once per
    /// topic.
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqConsumer::builder().topic("order").topic("payment");
    /// # drop(builder);
    /// ```
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// How many unacknowledged deliveries the broker sends ahead (`basic.qos`; default
    /// [`DEFAULT_PREFETCH`], at least 1). They wait in memory while a message is handled or
    /// held, in order.
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqConsumer::builder().prefetch(10);
    /// # drop(builder);
    /// ```
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Dead letters go to this exchange (fanout, with a queue of the same name bound to it),
    /// whatever their topic. By default each topic has its own: `<topic>.dlt`.
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqConsumer::builder().dead_letter_exchange("billing.dlt");
    /// # drop(builder);
    /// ```
    pub fn dead_letter_exchange(mut self, exchange: impl Into<String>) -> Self {
        self.dead_letter_exchange = Some(exchange.into());
        self
    }

    /// The kind of a topic exchange the consumer declares because it does not exist yet
    /// (default [`ExchangeKind::Topic`]); an existing exchange is kept as it is.
    ///
    /// ```
    /// use outbox_core::rabbitmq::{ExchangeKind, RabbitMqConsumer};
    /// let builder = RabbitMqConsumer::builder().exchange_kind(ExchangeKind::Topic);
    /// # drop(builder);
    /// ```
    pub fn exchange_kind(mut self, kind: ExchangeKind) -> Self {
        self.exchange_kind = kind;
        self
    }

    tls_methods!(
        "outbox_core::rabbitmq::RabbitMqConsumer::builder()",
        "They are trusted besides the system's roots (the operating system's store, or `SSL_CERT_FILE` / `SSL_CERT_DIR`).",
        "Either needs an `amqps://` [`uri`](Self::uri) and the feature `rabbitmq-tls`."
    );

    crate::consumer::policy_methods!("outbox_core::rabbitmq::RabbitMqConsumer::builder()");

    /// Checks everything. Connecting and declaring the topology happen in
    /// [`RabbitMqConsumer::run`]. Call it inside a Tokio runtime, which the consumer uses.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use outbox_core::rabbitmq::{RabbitMqConfigError, RabbitMqConsumer};
    /// let err = RabbitMqConsumer::builder()
    ///     .uri("amqp://127.0.0.1:5672/%2f")
    ///     .group("billing")
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(&err, RabbitMqConfigError::InvalidOption { option, .. } if option == "topic"));
    /// # }
    /// ```
    pub fn build(self) -> Result<RabbitMqConsumer, RabbitMqConfigError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RabbitMqConfigError::option(
                "build",
                "call it inside a Tokio runtime: the consumer runs on it",
            ));
        }
        let group = self.group.filter(|g| !g.trim().is_empty()).ok_or_else(|| {
            RabbitMqConfigError::option(
                "group",
                "a consumer needs a group: call `.group(\"billing\")`",
            )
        })?;
        if self.topics.is_empty() {
            return Err(RabbitMqConfigError::option(
                "topic",
                "a consumer reads at least one topic: call `.topic(\"order\")`",
            ));
        }
        let uri = self.uri.ok_or_else(|| {
            RabbitMqConfigError::option(
                "uri",
                "a consumer needs a broker: call `.uri(\"amqp://user:password@host:5672/%2f\")`",
            )
        })?;
        let tls = check_endpoint(&uri, &self.tls)?;
        if self.prefetch == 0 {
            return Err(RabbitMqConfigError::option(
                "prefetch",
                "at least 1 (0 would mean no limit)",
            ));
        }
        let mut queues = Vec::with_capacity(self.topics.len());
        for topic in &self.topics {
            let named = TopicQueues::new(&group, topic, self.dead_letter_exchange.as_deref());
            queues.push(named.map_err(|why| {
                RabbitMqConfigError::option("topic", format!("`{topic}`: {why}"))
            })?);
        }
        let settings = self
            .options
            .settings(group.clone())
            .map_err(|(option, reason)| RabbitMqConfigError::option(&option, reason))?;
        let setup = Setup {
            uri,
            tls,
            group,
            queues,
            exchange_kind: self.exchange_kind,
            prefetch: self.prefetch,
        };
        let dead_letters = DeadLetters {
            timeout: Duration::from_secs(10),
        };
        let transport = RabbitMqTransport::new(setup, dead_letters);
        Ok(RabbitMqConsumer {
            runtime: Runtime::new(transport, settings),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password() {
        let builder = RabbitMqConsumerBuilder::default()
            .uri("amqp://billing:hunter2-secret@rabbit:5672/%2f")
            .group("billing")
            .topic("order");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        assert!(shown.contains("billing:***@rabbit"), "{shown}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn names_longer_than_amqp_allows_are_refused_naming_the_topic() {
        let err = RabbitMqConsumerBuilder::default()
            .uri("amqp://127.0.0.1:5672/%2f")
            .group("billing")
            .topic("t".repeat(250))
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, RabbitMqConfigError::InvalidOption { option, reason }
                if option == "topic" && reason.contains("queue")),
            "{err}"
        );
    }
}
