//! [`RabbitMqPublisherBuilder`]: the URI, where messages go, and how long a confirm may take.

use std::sync::Arc;
use std::time::Duration;

use lapin::ExchangeKind;

use super::error::{RabbitMqConfigError, check_endpoint};
use super::publisher::RabbitMqPublisher;
use super::record::Router;
use crate::broker_tls::{TlsFiles, tls_methods};
use crate::redact;
use crate::relay::OutboxMessage;

/// How long a publish waits for the broker's confirm (and a connection attempt) unless
/// configured: well below a 30 s relay lease.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(outbox_core::rabbitmq::DEFAULT_CONFIRM_TIMEOUT, Duration::from_secs(10));
/// ```
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`RabbitMqPublisher`]. Get one from [`RabbitMqPublisher::builder`].
///
/// ```
/// use std::time::Duration;
/// use outbox_core::rabbitmq::{ExchangeKind, RabbitMqPublisher};
///
/// let publisher = RabbitMqPublisher::builder()
///     .uri("amqp://relay:s3cret@rabbit.internal:5672/%2f")
///     .exchange_prefix("prod.")
///     .exchange_kind(ExchangeKind::Topic)
///     .confirm_timeout(Duration::from_secs(5))
///     .build()?;
/// assert!(!format!("{publisher:?}").contains("s3cret"));
/// # Ok::<(), outbox_core::rabbitmq::RabbitMqConfigError>(())
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build()`"]
pub struct RabbitMqPublisherBuilder {
    uri: Option<String>,
    router: Router,
    exchange_kind: ExchangeKind,
    confirm_timeout: Duration,
    connection_name: String,
    tls: TlsFiles,
}

impl Default for RabbitMqPublisherBuilder {
    fn default() -> Self {
        RabbitMqPublisherBuilder {
            uri: None,
            router: Router::default(),
            exchange_kind: ExchangeKind::Topic,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            connection_name: "outbox-relay".to_owned(),
            tls: TlsFiles::default(),
        }
    }
}

/// Shows the URI without its password.
impl std::fmt::Debug for RabbitMqPublisherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMqPublisherBuilder")
            .field("uri", &self.uri.as_deref().map(redact::url))
            .field("router", &self.router)
            .field("exchange_kind", &self.exchange_kind)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("connection_name", &self.connection_name)
            .field("tls", &self.tls)
            .finish()
    }
}

impl RabbitMqPublisherBuilder {
    /// The broker, as an AMQP URI: `amqp://user:password@host:5672/vhost` (`%2f` is the
    /// default vhost `/`). Required. Its password is never shown in errors, logs or `Debug`.
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqPublisher::builder()
    ///     .uri("amqp://guest:guest@127.0.0.1:5672/%2f");
    /// # drop(builder);
    /// ```
    pub fn uri(mut self, uri: impl Into<String>) -> Self {
        self.uri = Some(uri.into());
        self
    }

    /// Prefixes every exchange, e.g. `"prod."` sends an `order` event to `prod.order`.
    /// Applied after [`exchange_for`](Self::exchange_for).
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqPublisher::builder().exchange_prefix("staging.");
    /// # drop(builder);
    /// ```
    pub fn exchange_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.router.prefix = prefix.into();
        self
    }

    /// Chooses each message's exchange, instead of [`OutboxMessage::topic`] (the topic the
    /// event names, else its aggregate type). Messages of one aggregate must get one exchange,
    /// or their order is lost.
    ///
    /// ```
    /// use outbox_core::relay::OutboxMessage;
    /// let builder = outbox_core::rabbitmq::RabbitMqPublisher::builder()
    ///     .exchange_for(|m: &OutboxMessage| format!("events.{}", m.aggregate_type));
    /// # drop(builder);
    /// ```
    pub fn exchange_for(
        mut self,
        route: impl Fn(&OutboxMessage) -> String + Send + Sync + 'static,
    ) -> Self {
        self.router.map = Some(Arc::new(route));
        self
    }

    /// The kind of the exchanges the publisher declares because they do not exist (default
    /// [`ExchangeKind::Topic`]); durable. An exchange that exists is used as it is, whatever
    /// its kind (e.g. an `x-consistent-hash` exchange you declared).
    ///
    /// ```
    /// use outbox_core::rabbitmq::{ExchangeKind, RabbitMqPublisher};
    /// let builder = RabbitMqPublisher::builder().exchange_kind(ExchangeKind::Direct);
    /// # drop(builder);
    /// ```
    pub fn exchange_kind(mut self, kind: ExchangeKind) -> Self {
        self.exchange_kind = kind;
        self
    }

    /// How long a message may wait for the broker's publisher confirm (default
    /// [`DEFAULT_CONFIRM_TIMEOUT`]); also bounds a connection attempt. A message without a
    /// confirm in time is [`Unavailable`](crate::relay::Delivery::Unavailable): its outcome is
    /// unknown, and the relay publishes it again later. Keep it well below the relay's lease.
    /// [`build`](Self::build) refuses zero.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = outbox_core::rabbitmq::RabbitMqPublisher::builder()
    ///     .confirm_timeout(Duration::from_secs(3));
    /// # drop(builder);
    /// ```
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The connection's name, as the management UI and `rabbitmqctl list_connections` show it
    /// (default `outbox-relay`): name each relay to tell them apart.
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqPublisher::builder().connection_name("relay-eu-1");
    /// # drop(builder);
    /// ```
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    tls_methods!(
        "outbox_core::rabbitmq::RabbitMqPublisher::builder()",
        "They are trusted besides the system's roots (the operating system's store, or `SSL_CERT_FILE` / `SSL_CERT_DIR`).",
        "Either needs an `amqps://` [`uri`](Self::uri) and the feature `rabbitmq-tls`."
    );

    /// Checks the options and reads the TLS files. It does not connect: the publisher
    /// connects on its first publish (or [`ready`](crate::relay::Publisher::ready)), and again
    /// after a connection is lost.
    ///
    /// ```
    /// use outbox_core::rabbitmq::{RabbitMqConfigError, RabbitMqPublisher};
    /// let err = RabbitMqPublisher::builder().build().unwrap_err();
    /// assert!(matches!(&err, RabbitMqConfigError::InvalidOption { option, .. } if option == "uri"));
    /// ```
    pub fn build(self) -> Result<RabbitMqPublisher, RabbitMqConfigError> {
        let uri = self.uri.ok_or_else(|| {
            RabbitMqConfigError::option(
                "uri",
                "a publisher needs a broker: call `.uri(\"amqp://user:password@host:5672/%2f\")`",
            )
        })?;
        let tls = check_endpoint(&uri, &self.tls)?;
        if self.confirm_timeout.is_zero() {
            return Err(RabbitMqConfigError::option(
                "confirm_timeout",
                "must be more than zero",
            ));
        }
        Ok(RabbitMqPublisher::new(
            uri,
            tls,
            self.router,
            self.exchange_kind,
            self.confirm_timeout,
            self.connection_name,
        ))
    }
}
