//! [`NatsConsumer`]: reads topics through JetStream durable pull consumers, runs each
//! message's handler through the broker-free runtime of [`crate::consumer`], and acknowledges
//! a message only once it is done.

mod builder;
mod message;
mod transport;

use std::sync::Arc;

pub use builder::NatsConsumerBuilder;

use crate::consumer::{ConsumerStats, Runtime};
use transport::NatsTransport;

/// A NATS JetStream consumer for outbox events, with a handler per event type.
///
/// It behaves as `kafka::KafkaConsumer` does (the same runtime):
/// dispatch by event type, an outage retried until it passes, poison retried then
/// dead-lettered, the later messages of a dead-lettered key parked behind it, and a message
/// acknowledged only once its handler's transaction committed (or the inbox recognised it,
/// or it was dead-lettered or skipped). What is JetStream's:
///
/// - **Topology.** Per topic (see [`topic`](NatsConsumerBuilder::topic)), the stream that
///   captures `<topic>.>` (created where none does), and on it a durable pull consumer named
///   after the [`group`](NatsConsumerBuilder::group), filtered to `<topic>.>`, with explicit
///   acks, unlimited deliveries (the runtime decides when a message is dead) and
///   `max_ack_pending` 1 (see below).
/// - **Order.** With one message unacknowledged at a time, JetStream delivers the next only
///   once the previous was acknowledged, and delivers an unacknowledged one again (after
///   `ack_wait`) before any later one: each topic's order holds through crashes, restarts and
///   several processes sharing the group (they take turns; any one can fail). A larger
///   [`max_ack_pending`](NatsConsumerBuilder::max_ack_pending) lets JetStream deliver ahead,
///   faster, but a message delivered again after a crash then comes after later messages of
///   its aggregate.
/// - **Waiting.** While a message waits between attempts (an outage of any length) the
///   consumer tells JetStream every third of `ack_wait` that it is still in progress, so it is
///   not delivered again meanwhile.
/// - **Dead letters** go to `<topic>-dlt.<aggregate id>` (see
///   [`dead_letter_subject`](NatsConsumerBuilder::dead_letter_subject)), with the original
///   headers and payload and the `outbox.*` headers of [`crate::consumer`]; the stream that
///   keeps them is created where none captures them.
///
/// ```no_run
/// use outbox_core::nats::NatsConsumer;
/// use outbox_core::{Envelope, Outcome, OutboxEvent};
/// # use outbox_core as outbox;
/// # #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// # #[outbox(crate = outbox_core, aggregate = "order")]
/// # struct OrderCreated { #[outbox(aggregate_id)] order_id: u64 }
///
/// # async fn run(stop: tokio::sync::oneshot::Receiver<()>) -> Result<(), Box<dyn std::error::Error>> {
/// let consumer = NatsConsumer::builder()
///     .servers("nats://127.0.0.1:4222")
///     .group("billing")
///     .topic("order")
///     .handler(|event: Envelope<OrderCreated>| async move {
///         let _ = event; // e.g. `charge(&mut pool.get().await?, event).await`
///         Ok::<_, std::io::Error>(Outcome::Applied(()))
///     })
///     .build()
///     .await?;
/// let stats = consumer.stats();
/// consumer.run(async { stop.await.ok(); }).await; // e.g. on SIGTERM
/// println!("applied {}", stats.get(&stats.applied));
/// # Ok(()) }
/// ```
pub struct NatsConsumer {
    runtime: Runtime<NatsTransport>,
}

impl NatsConsumer {
    /// Starts configuring a consumer.
    pub fn builder() -> NatsConsumerBuilder {
        NatsConsumerBuilder::default()
    }

    /// The consumer's counters.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.runtime.stats()
    }

    /// Handles messages until `shutdown` completes; then lets the message in flight finish
    /// (within the shutdown grace) and returns. Server errors are logged and retried: the
    /// consumer never stops on its own.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        self.runtime.run(shutdown).await;
    }
}

impl std::fmt::Debug for NatsConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConsumer")
            .field("group", &self.runtime.settings.group)
            .field("topics", &self.runtime.transport.topics)
            .field("handles", &self.runtime.settings.dispatch.described())
            .finish_non_exhaustive()
    }
}
