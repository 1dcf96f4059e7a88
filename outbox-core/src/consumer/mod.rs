//! The broker-free consumer runtime: what every consumer does whatever its broker.
//!
//! Dispatch by event type, the fault classes of [`crate::fault`] (an outage is retried until
//! it passes, poison is counted and dead-lettered), key parking behind a dead letter, the
//! dead-letter record, the per-message span and the counters live here; a broker adapter
//! (`kafka::KafkaConsumer`, `nats::NatsConsumer`, `rabbitmq::RabbitMqConsumer`, each behind
//! its feature) supplies only the transport: it receives messages, acknowledges them once
//! their handler's transaction committed, holds back delivery while a message waits between
//! attempts, and writes dead letters. As rdkafka's `Consumer` trait sits over its two
//! consumers, one runtime sits over every adapter, so that each broker behaves the same way
//! (see `CONTRIBUTING.md`, "Adding a broker").
//!
//! The public part is what a consumer is configured and observed with: the policies
//! ([`AfterDeadLetter`], [`UndecodablePolicy`], [`UnhandledPolicy`], [`NewerVersionPolicy`]),
//! the default backoffs, the dead-letter headers and [`ConsumerStats`]. `outbox_core::kafka`
//! re-exports all of them under their old paths.

// The runtime runs only under an adapter: with none enabled it is built but unused.
#![cfg_attr(
    not(any(feature = "kafka", feature = "nats", feature = "rabbitmq")),
    allow(dead_code, unused_imports)
)]

mod builder_methods;
mod dead_letter;
mod dispatch;
mod hold;
mod options;
mod parking;
mod policy;
mod received;
mod runtime;
mod stats;
mod trace;
mod transport;

pub use dead_letter::{
    DLT_HEADER_ATTEMPTS, DLT_HEADER_ERROR, DLT_HEADER_ERROR_KIND, DLT_HEADER_GROUP,
    DLT_HEADER_OFFSET, DLT_HEADER_PARKED_BEHIND, DLT_HEADER_PARKED_BEHIND_ID, DLT_HEADER_PARTITION,
    DLT_HEADER_TOPIC,
};
pub use policy::{
    AfterDeadLetter, DEFAULT_MAX_PARKED_KEYS, DEFAULT_OUTAGE_BACKOFF, DEFAULT_RETRY_BACKOFF,
    NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy,
};
pub use stats::ConsumerStats;

// The seam: crate-private until a second adapter has proved its shape.
pub(crate) use builder_methods::policy_methods;
pub(crate) use dead_letter::{DeadLetter, Unwritten};
pub(crate) use options::Options;
pub(crate) use received::Received;
pub(crate) use runtime::Runtime;
pub(crate) use transport::Transport;
