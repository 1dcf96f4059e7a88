//! [`NatsConsumerBuilder`]: the servers, the group, the topics, the handlers, and what to do
//! when a message fails.

use std::time::Duration;

use async_nats::jetstream;

use super::NatsConsumer;
use super::message::NatsMessage;
use super::transport::{DeadLetterSubject, NatsTransport, PullSettings};
use crate::broker_tls::{TlsFiles, tls_methods};
use crate::consumer::{Options, Runtime};
use crate::nats::NatsConfigError;
use crate::nats::streams;

/// Builds a [`NatsConsumer`]. Get one from [`NatsConsumer::builder`].
///
/// ```no_run
/// use outbox_core::nats::{NatsConsumer, UndecodablePolicy};
/// use outbox_core::{Envelope, Outcome, OutboxEvent};
/// # use outbox_core as outbox;
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order")]
/// struct OrderCreated { #[outbox(aggregate_id)] order_id: u64 }
///
/// # async fn run() -> Result<(), outbox_core::nats::NatsConfigError> {
/// let consumer = NatsConsumer::builder()
///     .servers("nats://127.0.0.1:4222")
///     .group("billing")
///     .topic("order")
///     .handler(|event: Envelope<OrderCreated>| async move {
///         let _ = event.order_id; // e.g. `charge(&mut pool.get().await?, event).await`
///         Ok::<_, std::io::Error>(Outcome::Applied(()))
///     })
///     .max_attempts(5)
///     .on_undecodable(UndecodablePolicy::DeadLetter)
///     .build()
///     .await?;
/// # drop(consumer); Ok(()) }
/// ```
#[must_use = "a builder does nothing until `.build()`"]
pub struct NatsConsumerBuilder {
    servers: String,
    group: Option<String>,
    topics: Vec<String>,
    dead_letters: DeadLetterSubject,
    ack_wait: Duration,
    max_ack_pending: i64,
    tls: TlsFiles,
    credentials: Option<std::path::PathBuf>,
    /// Handlers and policies: the broker-free runtime's.
    options: Options<NatsMessage>,
}

impl Default for NatsConsumerBuilder {
    fn default() -> Self {
        NatsConsumerBuilder {
            servers: String::new(),
            group: None,
            topics: Vec::new(),
            dead_letters: DeadLetterSubject::Suffix("-dlt".to_owned()),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1,
            tls: TlsFiles::default(),
            credentials: None,
            options: Options::default(),
        }
    }
}

/// Shows the servers with any password as `***`, the group and the topics.
impl std::fmt::Debug for NatsConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConsumerBuilder")
            .field("servers", &streams::redacted(&self.servers))
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("ack_wait", &self.ack_wait)
            .field("max_ack_pending", &self.max_ack_pending)
            .field("tls", &self.tls)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl NatsConsumerBuilder {
    /// The servers, comma-separated URLs (`nats://host:4222`, `tls://host:4222`,
    /// `nats://user:password@host:4222`). Required.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsConsumer::builder().servers("nats://127.0.0.1:4222");
    /// # drop(builder);
    /// ```
    pub fn servers(mut self, servers: impl Into<String>) -> Self {
        self.servers = servers.into();
        self
    }

    /// The group: the name of the durable consumer on each topic's stream, which keeps the
    /// group's position. Required; a durable name cannot hold `.`, `*`, `>` or whitespace.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsConsumer::builder().group("billing");
    /// # drop(builder);
    /// ```
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Reads `topic`: the subjects `<topic>.>`, as the publisher writes them (with its
    /// prefix, e.g. `prod.order`). Call once per topic.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsConsumer::builder().topic("order").topic("payment");
    /// # drop(builder);
    /// ```
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// Dead letters go to `<prefix>.<aggregate id>`, whatever their topic. By default they go
    /// to `<topic>-dlt.<aggregate id>` (`order.7` to `order-dlt.7`). Either way the stream
    /// that keeps them is created where none captures them.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsConsumer::builder().dead_letter_subject("billing-dlt");
    /// # drop(builder);
    /// ```
    pub fn dead_letter_subject(mut self, prefix: impl Into<String>) -> Self {
        self.dead_letters = DeadLetterSubject::Fixed(prefix.into());
        self
    }

    /// JetStream's `ack_wait` for the durable consumers it creates (default 30 s): a message
    /// unacknowledged this long after its delivery, with no word from the consumer, is
    /// delivered again. A live consumer says every third of it that its messages are in
    /// progress; a dead one's messages move on after it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = outbox_core::nats::NatsConsumer::builder().ack_wait(Duration::from_secs(10));
    /// # drop(builder);
    /// ```
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// JetStream's `max_ack_pending` for the durable consumers it creates (default 1: each
    /// topic's order holds through every failure). Higher is faster, but a message delivered
    /// again (after a crash) then comes after later messages of its aggregate: only for
    /// handlers that do not depend on order.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsConsumer::builder().max_ack_pending(1);
    /// # drop(builder);
    /// ```
    pub fn max_ack_pending(mut self, max: i64) -> Self {
        self.max_ack_pending = max;
        self
    }

    /// Authenticates with this `.creds` file: a user JWT and its nkey seed, as `nsc` and
    /// Synadia Cloud hand them out (operator-mode servers). [`build`](Self::build) reads it and
    /// refuses a file that is not one; its contents are never shown.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsConsumer::builder()
    ///     .credentials_file("/etc/outbox/relay.creds");
    /// # drop(builder);
    /// ```
    pub fn credentials_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.credentials = Some(path.into());
        self
    }

    tls_methods!(
        "outbox_core::nats::NatsConsumer::builder()",
        "They replace the system's roots (which are trusted without this file: the operating system's store, or `SSL_CERT_FILE` / `SSL_CERT_DIR`).",
        "With either, TLS is required of every server, whether its URL says `nats://` or `tls://`."
    );

    crate::consumer::policy_methods!("outbox_core::nats::NatsConsumer::builder()");

    /// Checks everything and starts connecting in the background (a server that is down is
    /// waited for in [`NatsConsumer::run`]). Call it inside a Tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use outbox_core::nats::{NatsConfigError, NatsConsumer};
    /// let err = NatsConsumer::builder()
    ///     .servers("nats://127.0.0.1:4222")
    ///     .topic("order")
    ///     .build()
    ///     .await
    ///     .unwrap_err();
    /// assert!(matches!(&err, NatsConfigError::InvalidOption { option, .. } if option == "group"));
    /// # }
    /// ```
    pub async fn build(self) -> Result<NatsConsumer, NatsConfigError> {
        let invalid = |option: &str, reason: String| NatsConfigError::InvalidOption {
            option: option.to_owned(),
            reason,
        };
        let group = self.group.filter(|g| !g.trim().is_empty()).ok_or_else(|| {
            invalid(
                "group",
                "a consumer needs a group, its durable consumer's name: call `.group(\"billing\")`"
                    .into(),
            )
        })?;
        if group.contains(['.', '*', '>']) || group.chars().any(char::is_whitespace) {
            return Err(invalid(
                "group",
                format!("`{group}` cannot name a durable consumer: no `.`, `*`, `>` or whitespace"),
            ));
        }
        if self.topics.is_empty() {
            return Err(invalid(
                "topic",
                "a consumer reads at least one topic: call `.topic(\"order\")`".into(),
            ));
        }
        if let Some(topic) = self
            .topics
            .iter()
            .find(|t| t.is_empty() || t.contains(['*', '>']) || t.chars().any(char::is_whitespace))
        {
            return Err(invalid(
                "topic",
                format!("`{topic}` is not a topic: no wildcard, no whitespace, not empty"),
            ));
        }
        if self.ack_wait < Duration::from_secs(1) {
            return Err(invalid("ack_wait", "at least 1 s".into()));
        }
        if self.max_ack_pending < 1 {
            return Err(invalid("max_ack_pending", "at least 1".into()));
        }
        let settings = self
            .options
            .settings(group.clone())
            .map_err(|(option, reason)| invalid(&option, reason))?;
        let credentials = self.credentials.as_deref();
        let timeout = Duration::from_secs(10);
        let client = streams::connect(&self.servers, &group, timeout, &self.tls, credentials)
            .await?
            .client;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(10))
            .build(client.clone());
        let transport = NatsTransport::new(
            client,
            jetstream,
            group,
            self.topics,
            self.dead_letters,
            PullSettings {
                ack_wait: self.ack_wait,
                max_ack_pending: self.max_ack_pending,
            },
        );
        Ok(NatsConsumer {
            runtime: Runtime::new(transport, settings),
        })
    }
}
