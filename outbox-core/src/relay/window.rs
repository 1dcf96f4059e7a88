//! The batches in flight: publishes run as tasks of their own, so that the relay claims and
//! settles (on its one store connection) while the broker works; they are settled in claim
//! order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::Instrument;

use super::super::{Delivery, OutboxMessage, Publisher, RelayStore};
use super::Relay;

/// A claimed batch whose publish was started.
pub(super) struct InFlight {
    pub(super) batch: Arc<Vec<OutboxMessage>>,
    /// The batch's `outbox.relay.batch` span: its publish and settle run in it.
    pub(super) span: tracing::Span,
    /// When it was claimed: its lease runs out a lease later.
    pub(super) claimed: Instant,
    publish: JoinHandle<Vec<Delivery>>,
    /// The publish's result, once taken from `publish` by [`Window::wait_oldest`].
    joined: Option<Joined>,
}

type Joined = Result<Vec<Delivery>, tokio::task::JoinError>;

/// The batches in flight, oldest first. Dropping it (the relay's future dropped without a
/// graceful shutdown) aborts their publishes, as dropping a sequential publish would.
#[derive(Default)]
pub(super) struct Window {
    batches: VecDeque<InFlight>,
}

impl Drop for Window {
    fn drop(&mut self) {
        for b in &self.batches {
            b.publish.abort();
        }
    }
}

impl Window {
    pub(super) fn len(&self) -> usize {
        self.batches.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// The oldest batch, if its publish has finished.
    pub(super) fn pop_finished(&mut self) -> Option<InFlight> {
        let oldest = self.batches.front()?;
        if oldest.joined.is_some() || oldest.publish.is_finished() {
            self.batches.pop_front()
        } else {
            None
        }
    }

    /// Waits until the oldest batch's publish finishes, or `timeout`.
    pub(super) async fn wait_oldest(&mut self, timeout: Duration) {
        let Some(oldest) = self.batches.front_mut() else {
            return;
        };
        if oldest.joined.is_some() {
            return;
        }
        if let Ok(joined) = tokio::time::timeout(timeout, &mut oldest.publish).await {
            oldest.joined = Some(joined);
        }
    }

    pub(super) fn pop_oldest(&mut self) -> Option<InFlight> {
        self.batches.pop_front()
    }
}

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// Starts publishing `batch` (claimed at `claimed`) in a task of its own and adds it to
    /// the window.
    ///
    /// A publish that does not finish in time has an unknown outcome: an outage, not the
    /// events' fault. They go back and are published again (at least once).
    pub(super) fn start_publish(
        &self,
        window: &mut Window,
        batch: Vec<OutboxMessage>,
        span: tracing::Span,
        claimed: Instant,
    ) {
        let batch = Arc::new(batch);
        let publisher = self.publisher.clone();
        let timeout = self.config.publish_timeout;
        let messages = batch.clone();
        let publish = async move {
            let started = Instant::now();
            let published = tokio::time::timeout(timeout, publisher.publish(&messages)).await;
            metrics::histogram!("outbox_relay_publish_duration_seconds").record(started.elapsed());
            published.unwrap_or_else(|_| {
                vec![
                    Delivery::Unavailable(format!(
                        "publish timed out after {timeout:?}; the outcome is unknown"
                    ));
                    messages.len()
                ]
            })
        };
        let publish = tokio::spawn(publish.instrument(span.clone()));
        window.batches.push_back(InFlight {
            batch,
            span,
            claimed,
            publish,
            joined: None,
        });
    }

    /// Waits for the publish of `batch` to finish. Meanwhile, every liveness interval, says
    /// that the relay waits for the broker if the publisher knows it is unreachable (a
    /// publish to an unreachable broker lasts until librdkafka's message timeout).
    pub(super) async fn outcome(&mut self, batch: &mut InFlight) -> Vec<Delivery> {
        let every: Duration = self.liveness_every();
        let joined = if let Some(joined) = batch.joined.take() {
            joined
        } else {
            loop {
                tokio::select! {
                    joined = &mut batch.publish => break joined,
                    () = tokio::time::sleep(every) => self.report_unreachable_broker().await,
                }
            }
        };
        match joined {
            Ok(deliveries) => deliveries,
            // The publisher panicked: the relay panics too, as it did when it polled the
            // publish itself (its rows go back when their lease runs out).
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                vec![
                    Delivery::Unavailable(format!("publish task ended without an outcome: {e}"));
                    batch.batch.len()
                ]
            }
        }
    }
}
