//! [`RabbitMqConsumer`]: reads each topic's queue, decodes each delivery into the
//! `Envelope<E>` of its event type, runs that type's handler, and acknowledges the delivery
//! only once the message is done. All of that but the reading is the broker-free runtime of
//! [`crate::consumer`]; this module is its RabbitMQ transport.

mod builder;
mod dead_letter;
mod link;
mod message;
mod transport;

use std::sync::Arc;

pub use builder::{DEFAULT_PREFETCH, RabbitMqConsumerBuilder};

use crate::consumer::{ConsumerStats, Runtime};
use transport::RabbitMqTransport;

/// A RabbitMQ consumer for outbox events, with a handler per event type.
///
/// It declares its topology at start and after every reconnect (see the
/// [module docs](crate::rabbitmq) for the table), consumes queue `<group>.<topic>` of each
/// topic with manual acknowledgements, and handles one delivery at a time, as the Kafka
/// consumer does ([`KafkaConsumer`](https://docs.rs/outbox-kernel/latest/outbox_core/kafka/struct.KafkaConsumer.html)
/// explains the steps): park behind an earlier dead letter of its key, decode, run the
/// handler (an outage retried until it passes, poison up to `max_attempts`, then the
/// dead-letter exchange), and only then `basic.ack`.
///
/// Delivery is at least once: a delivery not acknowledged when its channel closes (a crash,
/// a lost connection, the broker's `consumer_timeout`) is requeued and delivered again, to
/// this process after it reconnects or to another one of the group; the handler's inbox
/// (`#[idempotent]`) makes that a `Duplicate`.
///
/// ```no_run
/// use outbox_core::rabbitmq::RabbitMqConsumer;
/// use outbox_core::{Envelope, Outcome, OutboxEvent};
/// # use outbox_core as outbox;
/// # #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// # #[outbox(crate = outbox_core, aggregate = "order")]
/// # struct OrderCreated { #[outbox(aggregate_id)] order_id: u64 }
///
/// # async fn run(stop: tokio::sync::oneshot::Receiver<()>) -> Result<(), Box<dyn std::error::Error>> {
/// let consumer = RabbitMqConsumer::builder()
///     .uri("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .group("billing")
///     .topic("order")
///     .handler(|event: Envelope<OrderCreated>| async move {
///         let _ = event; // e.g. `charge(&mut pool.get().await?, event).await`
///         Ok::<_, std::io::Error>(Outcome::Applied(()))
///     })
///     .build()?;
/// let stats = consumer.stats();
/// consumer.run(async { stop.await.ok(); }).await; // e.g. on SIGTERM
/// println!("applied {}", stats.get(&stats.applied));
/// # Ok(()) }
/// ```
pub struct RabbitMqConsumer {
    runtime: Runtime<RabbitMqTransport>,
}

impl RabbitMqConsumer {
    /// Starts configuring a consumer.
    ///
    /// ```
    /// let builder = outbox_core::rabbitmq::RabbitMqConsumer::builder().group("billing");
    /// # drop(builder);
    /// ```
    pub fn builder() -> RabbitMqConsumerBuilder {
        RabbitMqConsumerBuilder::default()
    }

    /// The consumer's counters.
    ///
    /// ```
    /// # use outbox_core::{Envelope, Outcome, OutboxEvent};
    /// # use outbox_core as outbox;
    /// # #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
    /// # #[outbox(crate = outbox_core, aggregate = "order")]
    /// # struct OrderCreated { #[outbox(aggregate_id)] order_id: u64 }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), outbox_core::rabbitmq::RabbitMqConfigError> {
    /// let consumer = outbox_core::rabbitmq::RabbitMqConsumer::builder()
    ///     .uri("amqp://127.0.0.1:5672/%2f")
    ///     .group("billing")
    ///     .topic("order")
    ///     .handler(|_: Envelope<OrderCreated>| async { Ok::<_, String>(Outcome::Applied(())) })
    ///     .build()?;
    /// let stats = consumer.stats();
    /// assert_eq!(stats.get(&stats.applied), 0);
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.runtime.stats()
    }

    /// Connects, declares the topology and handles deliveries until `shutdown` completes;
    /// then lets the message in flight finish (within the shutdown grace), cancels the
    /// consumers and closes the connection (deliveries not acknowledged are requeued).
    /// Broker errors are logged and retried, reconnecting: the consumer never stops on its
    /// own.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        self.runtime.run(shutdown).await;
    }
}

impl std::fmt::Debug for RabbitMqConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let setup = &self.runtime.transport.setup;
        f.debug_struct("RabbitMqConsumer")
            .field("uri", &crate::redact::url(&setup.uri))
            .field("group", &self.runtime.settings.group)
            .field("queues", &setup.queues)
            .field("prefetch", &setup.prefetch)
            .field("handles", &self.runtime.settings.dispatch.described())
            .finish_non_exhaustive()
    }
}
