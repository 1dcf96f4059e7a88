//! Publishing outbox messages to NATS JetStream, and consuming them, with the official client
//! (`async-nats`): [`NatsPublisher`] for the relay (it needs the `relay` feature too),
//! [`NatsConsumer`] for the consumers.
//!
//! ```no_run
//! use outbox_core::nats::NatsPublisher;
//! use outbox_core::relay::{OutboxMessage, Publisher};
//!
//! # async fn run(claimed: Vec<OutboxMessage>) -> Result<(), Box<dyn std::error::Error>> {
//! let publisher = NatsPublisher::builder()
//!     .servers("nats://127.0.0.1:4222")
//!     .subject_prefix("prod.")              // `order` events go to `prod.order.<id>`
//!     .build()
//!     .await?;
//! let outcomes = publisher.publish(&claimed).await; // one Delivery per message, in order
//! # drop(outcomes); Ok(()) }
//! ```
//!
//! # The messages
//!
//! | JetStream | from the [`OutboxMessage`](crate::relay::OutboxMessage) |
//! |---|---|
//! | subject | `<topic>.<aggregate id>`: the topic is [`topic()`](crate::relay::OutboxMessage::topic) (the event's topic, else its aggregate type), prefixed by [`subject_prefix`](NatsPublisherBuilder::subject_prefix); the aggregate id is one subject token, escaped ([`subject_token`]) |
//! | stream | the stream that captures the subject; where none does, the publisher creates `<topic>` with the subjects `<topic>.>` ([`stream_name`]) |
//! | payload | the JSON payload, as is |
//! | header `Nats-Msg-Id` | the event id: JetStream drops a message whose id it saw within the stream's duplicate window (2 minutes by default), so the relay's retries are not stored twice |
//! | header `id`, `event_type`, `event_version`, `aggregate_type`, `created_at`, others | as for Kafka: the same rule for every broker |
//!
//! # Guarantees
//!
//! - **Published** means the stream stored the message: the publish acknowledgement came
//!   back. No acknowledgement within the [`ack_timeout`](NatsPublisherBuilder::ack_timeout),
//!   a lost connection, no server, or a stream that refuses everything (full, with
//!   `discard: new`) is an **outage** ([`Delivery::Unavailable`](crate::relay::Delivery)): the
//!   relay waits and publishes again, and `Nats-Msg-Id` turns a repeat inside the duplicate
//!   window into nothing. Only a message the stream refuses for itself (larger than the
//!   server's `max_payload` or the stream's `max_msg_size`) is **poison**
//!   ([`Delivery::Failed`](crate::relay::Delivery)).
//! - **Order per aggregate:** an aggregate's next message is sent only once the previous one
//!   was acknowledged ([`publish_in_key_order`](crate::relay::publish_in_key_order));
//!   aggregates go side by side. A client that reconnects between two messages of an
//!   aggregate cannot store the second without the first.
//! - **Beyond the duplicate window** (an outcome unknown for longer than it, then published
//!   again) a message can be stored twice: delivery is at least once, and the consumer's inbox
//!   (`#[idempotent]`) makes the effect once.
//!
//! # Consuming
//!
//! [`NatsConsumer`] reads each topic through a durable pull consumer named after the group,
//! filtered to `<topic>.>`, with explicit acks, and hands each message to the broker-free
//! runtime of [`crate::consumer`] (dispatch, outage and poison classes, key parking, dead
//! letters). A message is acknowledged only once its handler's transaction committed; while
//! one waits (an outage, a retry) the consumer keeps it and every message delivered after it
//! alive with `+WPI` (in progress) so JetStream does not deliver them again. Dead letters go to
//! the subject `<topic>-dlt.<aggregate id>`, kept by a stream `<topic>-dlt` that the consumer
//! creates where none captures it.
//!
//! **One consumer process per group and topic** keeps each aggregate's order: JetStream hands
//! a durable consumer's messages to all its clients in turn. A second process with the same
//! group is a standby only if it starts after the first stopped.

mod consumer;
mod error;
#[cfg(feature = "relay")]
mod publisher;
mod streams;
mod subject;

pub use consumer::{NatsConsumer, NatsConsumerBuilder};
pub use error::NatsConfigError;
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub use publisher::{NatsPublisher, NatsPublisherBuilder};
pub use subject::{stream_name, subject_token};

pub use crate::consumer::{
    AfterDeadLetter, ConsumerStats, DEFAULT_MAX_PARKED_KEYS, DEFAULT_OUTAGE_BACKOFF,
    DEFAULT_RETRY_BACKOFF, NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy,
};
