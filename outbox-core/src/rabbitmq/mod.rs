//! Publishing outbox messages to RabbitMQ, and consuming them, with lapin (AMQP 0-9-1):
//! [`RabbitMqPublisher`] for the relay (it needs the `relay` feature too), [`RabbitMqConsumer`]
//! for the consumers.
//!
//! ```no_run
//! use std::time::Duration;
//! use outbox_core::rabbitmq::RabbitMqPublisher;
//! use outbox_core::relay::{OutboxMessage, Publisher};
//!
//! # async fn run(claimed: Vec<OutboxMessage>) -> Result<(), Box<dyn std::error::Error>> {
//! let publisher = RabbitMqPublisher::builder()
//!     .uri("amqp://relay:s3cret@127.0.0.1:5672/%2f")
//!     .exchange_prefix("prod.")              // `order` events go to exchange `prod.order`
//!     .confirm_timeout(Duration::from_secs(10))
//!     .build()?;
//! let outcomes = publisher.publish(&claimed).await; // one Delivery per message, in order
//! # drop(outcomes); Ok(()) }
//! ```
//!
//! # The messages
//!
//! | AMQP | from the [`OutboxMessage`](crate::relay::OutboxMessage) |
//! |---|---|
//! | exchange | [`topic()`](crate::relay::OutboxMessage::topic): the event's topic, else its aggregate type; mapped by [`exchange_for`](RabbitMqPublisherBuilder::exchange_for), then prefixed by [`exchange_prefix`](RabbitMqPublisherBuilder::exchange_prefix) |
//! | routing key | the aggregate id |
//! | body | the JSON payload, as is |
//! | `message_id` | the event id, a hyphenated UUID |
//! | `content_type`, `delivery_mode` | `application/json`, 2 (persistent) |
//! | `timestamp` | `created_at`, in whole seconds |
//! | headers (long strings) | `id`, `event_type`, `event_version`, `aggregate_type`, `created_at` (RFC 3339, UTC, microseconds), then every header the event carried (e.g. `traceparent`), as every publisher sends them |
//! | flags | `mandatory`: a message no queue takes comes back, and is an outage, never dropped |
//!
//! # Delivery and duplicates
//!
//! The publisher puts its channel in confirm mode: a message is
//! [`Published`](crate::relay::Delivery::Published) only once the broker acknowledged it
//! (for a durable queue: written to disk). A confirm that does not come within
//! [`confirm_timeout`](RabbitMqPublisherBuilder::confirm_timeout), a `basic.nack`, a lost
//! channel or connection: the outcome is unknown, the message is
//! [`Unavailable`](crate::relay::Delivery::Unavailable), and the relay publishes it again
//! later, so it may arrive twice. Consumers deduplicate on `message_id` (the `id` header):
//! the [`RabbitMqConsumer`]'s handlers through their inbox. See [`RabbitMqPublisher`] for how
//! each failure is classified (by AMQP reply code).
//!
//! # Ordering: what is promised
//!
//! A key's (aggregate's) next message is sent only once the broker confirmed the previous one
//! ([`publish_in_key_order`](crate::relay::publish_in_key_order)), so no message is stored
//! before an earlier one of its aggregate, whatever fails; keys travel side by side, a batch of
//! many aggregates as a pipeline. A queue keeps the order messages arrived in; the consumer
//! keeps it by reading each queue with a single active consumer and handling one delivery at
//! a time (below). Not promised: order across aggregates; order when
//! [`exchange_for`](RabbitMqPublisherBuilder::exchange_for) sends one aggregate to several
//! exchanges. For parallelism per aggregate, declare an `x-consistent-hash` exchange
//! yourself (the publisher keeps an existing exchange as it is) with a queue per consumer.
//!
//! # The consumer's topology
//!
//! [`RabbitMqConsumer`] declares, at start and after every reconnect, for each
//! [`topic`](RabbitMqConsumerBuilder::topic) of consumer [`group`](RabbitMqConsumerBuilder::group):
//!
//! | what | name | kind, arguments | why |
//! |---|---|---|---|
//! | exchange | `<topic>` | [`exchange_kind`](RabbitMqConsumerBuilder::exchange_kind) (default `topic`), durable; kept as it is if it exists | where the relay publishes the topic |
//! | queue | `<group>.<topic>` | durable, `x-single-active-consumer: true` | every process of the group reads it, one at a time: the others wait as standbys and take over on failure, so each aggregate stays in order |
//! | binding | `<group>.<topic>` to `<topic>` | routing key `#` | every message of the topic (a `topic` exchange; a `direct` or hashing exchange needs your own bindings) |
//! | dead-letter exchange | `<topic>.dlt` (or [`dead_letter_exchange`](RabbitMqConsumerBuilder::dead_letter_exchange)) | `fanout`, durable | where dead letters go, with their `outbox.*` headers |
//! | dead-letter queue | same name as the exchange, bound to it | durable | so that dead letters are kept |
//!
//! A delivery is the runtime's message ([`crate::consumer`]): its source is the topic (the
//! exchange its queue is bound to; also in the dead letters' `outbox.original.topic`), its
//! position the delivery tag (per channel: it starts again after a reconnect), its key the
//! routing key, its headers the AMQP table (long strings and byte arrays as they are, other
//! values as text). Acknowledgements are manual: `basic.ack` once the handler's transaction
//! committed (or the message was dead-lettered or skipped), never before. Dead letters are
//! published with confirms and `mandatory`; one the broker does not confirm is retried until
//! it is, the queue waiting. While a message waits between attempts, the consumer takes no
//! more deliveries (at most [`prefetch`](RabbitMqConsumerBuilder::prefetch) of them wait in
//! memory).
//!
//! RabbitMQ closes a channel whose delivery stays unacknowledged longer than its
//! `consumer_timeout` (30 minutes by default), e.g. a message held through a long database
//! outage: the broker requeues it, the consumer's acknowledgement then fails ("will be
//! delivered again"), it reconnects, and the message comes again, recognised by the inbox if
//! it had been applied. Nothing is lost; raise `consumer_timeout` if outages last longer.
//!
//! # Connections
//!
//! Each publisher holds one connection and one channel, opened on first use and again after
//! it is lost (at most one attempt per 100 ms); [`Publisher::ready`](crate::relay::Publisher::ready)
//! connects within its timeout. The consumer reconnects with the runtime's backoff (100 ms
//! doubling to 10 s). URIs are shown only without their password
//! ([`redact::url`](crate::redact::url)). TLS (`amqps://`) needs the feature `rabbitmq-tls`
//! (rustls on `ring`, the system's roots);
//! [`tls_ca_file`](RabbitMqPublisherBuilder::tls_ca_file) adds a private CA and
//! [`tls_client_cert`](RabbitMqPublisherBuilder::tls_client_cert) a client certificate.

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
/// The kind of exchange a publisher or consumer declares where none exists (lapin's).
pub use lapin::ExchangeKind;
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub use publisher::RabbitMqPublisher;
