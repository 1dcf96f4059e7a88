//! The error [`KafkaPublisherBuilder::build`](super::KafkaPublisherBuilder::build) returns.

use std::fmt;

/// Why a [`KafkaPublisher`](super::KafkaPublisher) or a [`KafkaConsumer`](super::KafkaConsumer)
/// could not be built. Every variant names the setting at fault, or quotes librdkafka's message,
/// which does. None holds a setting's value: a rejected `sasl.password` must not end up in a
/// log through this error, so the values librdkafka quotes are replaced by `***` too.
///
/// ```
/// use outbox_core::kafka::{KafkaConfigError, KafkaPublisher};
///
/// let err = KafkaPublisher::builder()
///     .brokers("127.0.0.1:9092")
///     .set("linger.ms", "soon")
///     .build()
///     .unwrap_err();
/// assert!(matches!(&err, KafkaConfigError::Invalid { key, .. } if key == "linger.ms"));
/// assert!(err.to_string().contains("`linger.ms`"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KafkaConfigError {
    /// Neither [`brokers`](super::KafkaPublisherBuilder::brokers) nor `bootstrap.servers` was
    /// given.
    MissingBrokers,
    /// librdkafka rejected one setting: an unknown property or a value it cannot parse.
    Invalid {
        /// The property, e.g. `"linger.ms"`.
        key: String,
        /// librdkafka's reason, with the value given replaced by `***`.
        reason: String,
    },
    /// The setting would break the [`Publisher`](crate::relay::Publisher) contract (e.g.
    /// `enable.idempotence=false` or `acks=1`), so the publisher refuses it.
    Forbidden {
        /// The property, e.g. `"acks"`.
        key: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// librdkafka refused to create the producer from the settings as a whole, e.g.
    /// `max.in.flight` above 5 with the idempotent producer. Its message names the settings.
    Rejected {
        /// librdkafka's message, with the values of secret settings replaced by `***`.
        reason: String,
    },
    /// A builder option is missing or invalid, e.g. a consumer without a group or a handler.
    InvalidOption {
        /// The builder method, e.g. `"group"`.
        option: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for KafkaConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaConfigError::MissingBrokers => f.write_str(
                "no Kafka brokers configured: call `.brokers(\"host:port\")` or set \
                 `bootstrap.servers`",
            ),
            KafkaConfigError::Invalid { key, reason } => {
                write!(f, "invalid value for Kafka setting `{key}`: {reason}")
            }
            KafkaConfigError::Forbidden { key, reason } => {
                write!(
                    f,
                    "the value of Kafka setting `{key}` is not allowed: {reason}"
                )
            }
            KafkaConfigError::Rejected { reason } => {
                write!(f, "invalid Kafka client configuration: {reason}")
            }
            KafkaConfigError::InvalidOption { option, reason } => {
                write!(f, "invalid `{option}`: {reason}")
            }
        }
    }
}

impl std::error::Error for KafkaConfigError {}

/// No Kafka broker answered [`KafkaPublisher::check_reachable`](super::KafkaPublisher::check_reachable)
/// in time, or the cluster answered without brokers.
///
/// ```
/// use outbox_core::kafka::BrokerUnreachable;
/// let err = BrokerUnreachable { brokers: "10.0.0.9:9092".into(), reason: "timed out".into() };
/// assert_eq!(err.to_string(), "cannot reach Kafka at 10.0.0.9:9092: timed out");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUnreachable {
    /// The bootstrap servers that were tried, as configured.
    pub brokers: String,
    /// What went wrong: librdkafka's message, or that the cluster named no brokers.
    pub reason: String,
}

impl fmt::Display for BrokerUnreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot reach Kafka at {}: {}", self.brokers, self.reason)
    }
}

impl std::error::Error for BrokerUnreachable {}

/// The readiness probe's answer ([`Publisher::ready`](crate::relay::Publisher::ready)), with
/// the same text.
#[cfg(feature = "relay")]
impl From<BrokerUnreachable> for crate::relay::NotReady {
    fn from(e: BrokerUnreachable) -> Self {
        crate::relay::NotReady::new(e.to_string())
    }
}
