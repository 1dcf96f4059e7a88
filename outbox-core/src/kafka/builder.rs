//! [`KafkaPublisherBuilder`]: librdkafka settings, defaults and the settings we refuse.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::FutureProducer;

use super::log::LogLimiter;
use super::watch::{BrokerWatch, WatchContext};

use super::KafkaConfigError;
use super::publisher::KafkaPublisher;
use super::record::Router;
use crate::relay::OutboxMessage;

/// `message.timeout.ms` unless configured: well below a 30 s relay lease.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(outbox_core::kafka::DEFAULT_MESSAGE_TIMEOUT, Duration::from_secs(10));
/// ```
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings applied before the user's, in this order.
const DEFAULTS: [(&str, &str); 8] = [
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("enable.gapless.guarantee", "true"),
    ("message.timeout.ms", "10000"),
    // The Java client's partitioner: equal keys land on equal partitions whichever client wrote
    // them (librdkafka's own default hashes with CRC32).
    ("partitioner", "murmur2_random"),
    ("client.id", "outbox-relay"),
    // librdkafka's reconnect backoff grows to 10 s by default, so after a long broker outage
    // delivery could resume up to 10 s after the broker returned; capped at 1 s, it resumes
    // within about a second (a refused reconnect a second costs nothing).
    ("reconnect.backoff.max.ms", "1000"),
    // librdkafka waits `linger.ms` (5 ms by default) for more messages before it sends a
    // partition's batch, and the relay awaits every delivery report of its batch: 5 ms was the
    // largest fixed part of COMMIT → broker ack (the relay's own wait for a claim is at most
    // its 2 ms wake re-check; then a claim of about 1 ms, the linger, the broker's round trip
    // with `acks=all`). The relay hands librdkafka a whole batch at once, so lingering gathers
    // little more. Measured side by side, same build otherwise (quick benchmark, 1 relay,
    // noida-db, a shared machine at load 8–15, two latency runs and one drain run each): median
    // latency at 1,000 events/s 12–15 ms with 1 ms against 15–19 ms with 5 ms; the Kafka drain
    // at batch 1,000 at 0.83–1.19 of the same run's null-publisher drain with 1 ms against
    // 0.55–0.84 with 5 ms. On that machine the rest of the median was the machine itself
    // (the benchmark's writers ran up to 100–1,000 ms behind their schedule).
    ("linger.ms", "1"),
];

/// librdkafka's aliases, mapped to the names we check, so that an alias cannot be overridden
/// by a default of the other name.
const ALIASES: [(&str, &str); 3] = [
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("request.required.acks", "acks"),
    ("metadata.broker.list", "bootstrap.servers"),
];

/// Builds a [`KafkaPublisher`]. Get one from [`KafkaPublisher::builder`].
///
/// The producer is librdkafka's idempotent producer with `acks=all`; every other librdkafka
/// producer setting passes through [`set`](Self::set). Defaults the publisher applies (each may
/// be overridden): `enable.gapless.guarantee=true`, `message.timeout.ms=10000`,
/// `partitioner=murmur2_random` (the Java client's), `client.id=outbox-relay`,
/// `reconnect.backoff.max.ms=1000` (so delivery resumes within about a second of a broker's
/// return), `linger.ms=1` (librdkafka's 5 ms was the largest fixed part of the latency from
/// commit to acknowledgement; the relay hands over whole batches anyway).
///
/// ```
/// use std::time::Duration;
/// use outbox_core::kafka::KafkaPublisher;
///
/// let publisher = KafkaPublisher::builder()
///     .brokers("127.0.0.1:9092")
///     .set("linger.ms", "5")
///     .set("compression.type", "lz4")
///     .topic_prefix("prod.")
///     .message_timeout(Duration::from_secs(5))
///     .build()?;
/// assert_eq!(publisher.message_timeout(), Duration::from_secs(5));
/// # Ok::<(), outbox_core::kafka::KafkaConfigError>(())
/// ```
///
/// Its `Debug` output shows every setting, with the values of secret ones (see
/// [`is_secret_key`](crate::redact::is_secret_key)) replaced by `***`.
#[derive(Clone, Default)]
#[must_use = "a builder does nothing until `.build()`"]
pub struct KafkaPublisherBuilder {
    settings: Vec<(String, String)>,
    router: Router,
}

impl std::fmt::Debug for KafkaPublisherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisherBuilder")
            .field("settings", &super::secrets::Redacted(&self.settings))
            .field("router", &self.router)
            .finish()
    }
}

impl KafkaPublisherBuilder {
    /// The bootstrap brokers, comma separated `host:port` (librdkafka's `bootstrap.servers`).
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaPublisher::builder().brokers("k1:9092,k2:9092");
    /// # drop(builder);
    /// ```
    pub fn brokers(self, brokers: impl Into<String>) -> Self {
        self.set("bootstrap.servers", brokers)
    }

    /// Sets any librdkafka producer property (see librdkafka's `CONFIGURATION.md`), e.g.
    /// `linger.ms`, `compression.type`, `security.protocol`. A later call for the same property
    /// wins. Unknown properties and bad values fail [`build`](Self::build) with an error naming
    /// the property; so do `enable.idempotence=false`, an `acks` other than `all`,
    /// `transactional.id` and `message.timeout.ms=0`, which would break the ordering and
    /// bounded-time promises of [`Publisher`](crate::relay::Publisher).
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .set("linger.ms", "20")
    ///     .set("batch.size", "1000000");
    /// # drop(builder);
    /// ```
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// How long librdkafka may try to deliver a message (`message.timeout.ms`), default
    /// [`DEFAULT_MESSAGE_TIMEOUT`]. It bounds a whole publish: see
    /// [`KafkaPublisher::publish_timeout`]. Keep it well below the relay's lease. Rounded down
    /// to whole milliseconds; [`build`](Self::build) refuses zero (librdkafka would read it as
    /// "no limit") and more than `i32::MAX` ms, naming `message.timeout.ms`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .message_timeout(Duration::from_secs(3));
    /// # drop(builder);
    /// let zero = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .message_timeout(Duration::ZERO)
    ///     .build()
    ///     .unwrap_err();
    /// assert!(zero.to_string().contains("message.timeout.ms"), "{zero}");
    /// ```
    pub fn message_timeout(self, timeout: Duration) -> Self {
        self.set("message.timeout.ms", timeout.as_millis().to_string())
    }

    /// Prefixes every topic, e.g. `"prod."` sends an `order` event to `prod.order`. Applied
    /// after [`topic_for`](Self::topic_for).
    ///
    /// ```
    /// let builder = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .topic_prefix("staging.");
    /// # drop(builder);
    /// ```
    pub fn topic_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.router.prefix = prefix.into();
        self
    }

    /// Chooses each message's topic, instead of [`OutboxMessage::topic`] (the topic the event
    /// names, else its aggregate type). Messages of one aggregate must get one topic, or their
    /// order is lost.
    ///
    /// ```
    /// use outbox_core::relay::OutboxMessage;
    /// let builder = outbox_core::kafka::KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .topic_for(|m: &OutboxMessage| format!("events.{}", m.aggregate_type));
    /// # drop(builder);
    /// ```
    pub fn topic_for(
        mut self,
        route: impl Fn(&OutboxMessage) -> String + Send + Sync + 'static,
    ) -> Self {
        self.router.map = Some(Arc::new(route));
        self
    }

    /// Checks the settings and creates the producer. It connects in the background: an
    /// unreachable broker is not an error here, its messages fail when published.
    ///
    /// ```
    /// use outbox_core::kafka::{KafkaConfigError, KafkaPublisher};
    ///
    /// let err = KafkaPublisher::builder()
    ///     .brokers("127.0.0.1:9092")
    ///     .set("acks", "1")
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(&err, KafkaConfigError::Forbidden { key, .. } if key == "acks"));
    /// ```
    pub fn build(self) -> Result<KafkaPublisher, KafkaConfigError> {
        let mut settings: BTreeMap<String, String> = DEFAULTS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (key, value) in self.settings {
            let key = ALIASES
                .iter()
                .find(|(alias, _)| *alias == key)
                .map_or(key, |(_, name)| name.to_string());
            settings.insert(key, value);
        }
        check_settings(&settings)?;
        let message_timeout = parse_ms(&settings, "message.timeout.ms")?;
        if message_timeout == 0 || message_timeout > i32::MAX as u64 {
            return Err(KafkaConfigError::Invalid {
                key: "message.timeout.ms".to_owned(),
                reason: "must be between 1 and 2147483647 ms (0 would mean no limit)".to_owned(),
            });
        }
        let message_timeout = Duration::from_millis(message_timeout);
        let mut config = ClientConfig::new();
        for (key, value) in &settings {
            config.set(key, value);
        }
        let watch = Arc::new(BrokerWatch::new(
            config.get("bootstrap.servers").unwrap_or_default(),
        ));
        let producer = create_producer(&config, &watch)?;
        Ok(KafkaPublisher::new(
            config,
            producer,
            watch,
            self.router,
            message_timeout,
        ))
    }
}

fn check_settings(settings: &BTreeMap<String, String>) -> Result<(), KafkaConfigError> {
    let forbidden = |key: &str, reason| {
        Err(KafkaConfigError::Forbidden {
            key: key.to_owned(),
            reason,
        })
    };
    if settings
        .get("bootstrap.servers")
        .is_none_or(|b| b.trim().is_empty())
    {
        return Err(KafkaConfigError::MissingBrokers);
    }
    if !matches!(
        settings["enable.idempotence"].to_ascii_lowercase().as_str(),
        "true" | "t" | "1"
    ) {
        return forbidden(
            "enable.idempotence",
            "the publisher needs the idempotent producer to keep each aggregate's events in order \
             across retries",
        );
    }
    if !matches!(settings["acks"].to_ascii_lowercase().as_str(), "all" | "-1") {
        return forbidden(
            "acks",
            "a message counts as published only once all in-sync replicas have it (`acks=all`)",
        );
    }
    if settings.contains_key("transactional.id") {
        return forbidden(
            "transactional.id",
            "the publisher does not run Kafka transactions; the outbox gives at-least-once \
             delivery with idempotent consumers instead",
        );
    }
    if parse_ms(settings, "message.timeout.ms")? == 0 {
        return forbidden(
            "message.timeout.ms",
            "0 means no timeout, but a publish must end before the relay's lease does",
        );
    }
    Ok(())
}

fn parse_ms(settings: &BTreeMap<String, String>, key: &str) -> Result<u64, KafkaConfigError> {
    let value = &settings[key];
    value.trim().parse().map_err(|_| KafkaConfigError::Invalid {
        key: key.to_owned(),
        reason: "expected a whole number of milliseconds".to_owned(),
    })
}

/// Creates a producer from checked settings; also used to replace one after a fatal error.
pub(crate) fn create_producer(
    config: &ClientConfig,
    watch: &Arc<BrokerWatch>,
) -> Result<FutureProducer<WatchContext>, KafkaConfigError> {
    let log = LogLimiter::new(config.get("bootstrap.servers").unwrap_or_default())
        .hiding(super::secrets::secret_values(config));
    config
        .create_with_context(WatchContext(watch.clone(), Arc::new(log)))
        .map_err(|e| super::secrets::config_error(e, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_secret_settings() {
        let builder = KafkaPublisherBuilder::default()
            .brokers("k1:9092")
            .set("sasl.username", "svc-relay")
            .set("sasl.password", "hunter2-secret")
            .set("ssl.key.password", "pem-pass")
            .set("linger.ms", "7");
        let shown = format!("{builder:?}");
        for secret in ["hunter2-secret", "pem-pass", "svc-relay"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("\"sasl.password\": \"***\""), "{shown}");
        assert!(shown.contains("\"linger.ms\": \"7\""), "{shown}");
        assert!(shown.contains("k1:9092"), "{shown}");
    }

    #[test]
    fn rejected_secret_values_are_not_echoed() {
        // librdkafka refuses the bad `sasl.mechanisms`, quoting it; the error may carry no
        // value.
        let err = KafkaPublisherBuilder::default()
            .brokers("k1:9092")
            .set("security.protocol", "SASL_SSL")
            .set("ssl.key.password", "hunter2-secret")
            .set("sasl.password", "other-secret")
            .set("sasl.mechanisms", "NOT-A-MECHANISM")
            .build()
            .unwrap_err();
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains("hunter2-secret"), "{shown}");
            assert!(!shown.contains("other-secret"), "{shown}");
            assert!(!shown.contains("NOT-A-MECHANISM"), "{shown}");
        }
    }

    #[test]
    fn invalid_values_are_named_by_key_only() {
        let err = KafkaPublisherBuilder::default()
            .brokers("k1:9092")
            .set("linger.ms", "soonish")
            .build()
            .unwrap_err();
        assert!(matches!(&err, KafkaConfigError::Invalid { key, .. } if key == "linger.ms"));
        assert!(!format!("{err} {err:?}").contains("soonish"), "{err:?}");
    }
}
