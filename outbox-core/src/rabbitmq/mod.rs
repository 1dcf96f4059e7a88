//! RabbitMQ: the relay's publisher and the consumer runtime's transport.

#[cfg(feature = "relay")]
mod builder;
mod classify;
mod connection;
mod consumer;
mod error;
#[cfg(feature = "relay")]
mod publisher;
#[cfg(feature = "relay")]
mod record;
mod topology;

pub use crate::consumer::{
    AfterDeadLetter, ConsumerStats, DEFAULT_MAX_PARKED_KEYS, DEFAULT_OUTAGE_BACKOFF,
    DEFAULT_RETRY_BACKOFF, DLT_HEADER_ATTEMPTS, DLT_HEADER_ERROR, DLT_HEADER_ERROR_KIND,
    DLT_HEADER_GROUP, DLT_HEADER_OFFSET, DLT_HEADER_PARKED_BEHIND, DLT_HEADER_PARKED_BEHIND_ID,
    DLT_HEADER_TOPIC, NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy,
};
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub use builder::{DEFAULT_CONFIRM_TIMEOUT, RabbitMqPublisherBuilder};
pub use consumer::{DEFAULT_PREFETCH, RabbitMqConsumer, RabbitMqConsumerBuilder};
pub use error::RabbitMqConfigError;
/// The AMQP client the adapter is built on (lapin), for its types and for reading and
/// declaring with the same client, without a dependency of your own that must match its
/// version.
#[doc(no_inline)]
pub use lapin;
pub use lapin::ExchangeKind;
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub use publisher::RabbitMqPublisher;
