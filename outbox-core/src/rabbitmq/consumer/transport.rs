//! [`RabbitMqTransport`]: the consumer runtime's [`Transport`] over lapin.
//!
//! Pausing stops taking deliveries from lapin's consumers: the broker sends at most `prefetch`
//! unacknowledged deliveries, which wait in lapin's buffer until `resume`. A lost connection
//! or channel is noticed by `receive` (or by a dead letter), which builds a new link: the
//! broker has requeued the deliveries not acknowledged, and they come again.

use std::future::Future;

use lapin::options::BasicAckOptions;

use super::dead_letter::DeadLetters;
use super::link::{LinkError, Setup, Slot};
use super::message::Incoming;
use crate::consumer::{DeadLetter, Transport, Unwritten};
use crate::redact;

/// The RabbitMQ side of a [`RabbitMqConsumer`](super::RabbitMqConsumer).
pub(crate) struct RabbitMqTransport {
    pub(super) setup: Setup,
    pub(super) dead_letters: DeadLetters,
    slot: tokio::sync::Mutex<Slot>,
    paused: bool,
}

impl RabbitMqTransport {
    pub(super) fn new(setup: Setup, dead_letters: DeadLetters) -> Self {
        RabbitMqTransport {
            setup,
            dead_letters,
            slot: tokio::sync::Mutex::default(),
            paused: false,
        }
    }
}

impl Transport for RabbitMqTransport {
    type Message = Incoming;
    type Error = LinkError;

    const BROKER: &'static str = "RabbitMQ";
    const SYSTEM: &'static str = "rabbitmq";

    /// Connects and declares the topology; if the broker is away, `receive` tries again.
    async fn start(&mut self) {
        let queues: Vec<&str> = self.setup.queues.iter().map(|q| q.queue.as_str()).collect();
        match self.slot.get_mut().ensure(&self.setup).await {
            Ok(_) => tracing::info!(
                group = %self.setup.group, ?queues, uri = %redact::url(&self.setup.uri),
                "consumer started"
            ),
            Err(e) => tracing::warn!(
                group = %self.setup.group, ?queues, error = %e,
                "consumer started; the broker is not reachable yet, retrying"
            ),
        }
    }

    fn receive(&self) -> impl Future<Output = Result<Incoming, LinkError>> + Send {
        let paused = self.paused;
        async move {
            if paused {
                // Deliveries wait in lapin's buffer (at most `prefetch` of them).
                return std::future::pending().await;
            }
            let mut slot = self.slot.lock().await;
            let link = slot.ensure(&self.setup).await?;
            let next = std::future::poll_fn(|cx| link.poll_next(cx)).await;
            if next.is_err() {
                // Closed: dropping it closes what is left; the next call builds a new one.
                slot.link = None;
            }
            next
        }
    }

    fn pause(&mut self) {
        self.paused = true;
    }

    /// Nothing more to pause: every queue of the consumer is paused together.
    fn pause_source_of(&mut self, _message: &Incoming) {}

    fn resume(&mut self) {
        self.paused = false;
    }

    /// `basic.ack` of the delivery on the channel it came on. An error if that channel was
    /// closed meanwhile: the broker has requeued the delivery and delivers it again.
    async fn acknowledge(&self, message: &Incoming) -> Result<(), LinkError> {
        let tag = message.delivery.delivery_tag;
        match message.delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(LinkError(format!(
                "delivery {tag} of topic `{}`: its channel was closed before the \
                 acknowledgement",
                message.topic
            ))),
            Err(e) => Err(LinkError(format!(
                "acknowledging delivery {tag} of topic `{}` failed: {e}",
                message.topic
            ))),
        }
    }

    async fn dead_letter(&self, letter: &DeadLetter<'_>) -> Result<String, Unwritten> {
        let exchange = self.dead_letters.exchange_for(letter.source, &self.setup);
        let channel = {
            let mut slot = self.slot.lock().await;
            match slot.ensure(&self.setup).await {
                Ok(link) => link.dead_letters.clone(),
                Err(e) => {
                    return Err(Unwritten {
                        topic: exchange,
                        code: "connection".to_owned(),
                        error: e.0,
                    });
                }
            }
        };
        self.dead_letters.send(&channel, exchange, letter).await
    }

    /// Cancels the consumers and closes the connection; deliveries not acknowledged are
    /// requeued by the broker.
    async fn close(self) {
        if let Some(link) = self.slot.into_inner().link {
            let closed = tokio::time::timeout(std::time::Duration::from_secs(5), link.close());
            if closed.await.is_err() {
                tracing::warn!("closing the RabbitMQ connection took longer than 5 s");
            }
        }
    }
}
