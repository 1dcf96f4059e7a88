//! RabbitMQ: the relay's publisher and the consumer runtime's transport.

#[cfg(feature = "relay")]
mod builder;
mod classify;
mod connection;
mod error;
#[cfg(feature = "relay")]
mod publisher;
#[cfg(feature = "relay")]
mod record;
mod topology;

#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub use builder::{DEFAULT_CONFIRM_TIMEOUT, RabbitMqPublisherBuilder};
pub use error::RabbitMqConfigError;
pub use lapin::ExchangeKind;
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub use publisher::RabbitMqPublisher;
