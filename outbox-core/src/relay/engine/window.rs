//! The batches in flight: publishes run as tasks of their own, so that the relay claims and
//! settles (on its store connection, and settles on its settler's where the store has one)
//! while the broker works; they are settled in claim order.

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
    /// Its events' size ([`event_bytes`]).
    bytes: usize,
}

/// The size of `batch`'s events ([`event_bytes`]) and of its largest, in one pass.
pub(super) fn weigh(batch: &[OutboxMessage]) -> (usize, usize) {
    batch
        .iter()
        .map(event_bytes)
        .fold((0, 0), |(sum, largest), b| (sum + b, largest.max(b)))
}

/// What an event holds in memory, near enough to bound the relay's: its payload, headers,
/// and the text of its keys.
fn event_bytes(m: &OutboxMessage) -> usize {
    const FIXED: usize = 128; // the struct, its id, times and numbers
    let headers: usize = m.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    FIXED
        + m.payload.len()
        + headers
        + m.aggregate_type.len()
        + m.aggregate_id.len()
        + m.event_type.len()
        + m.topic.as_ref().map_or(0, String::len)
}

/// The batches in flight, oldest first. Dropping it (the relay's future dropped without a
/// graceful shutdown) aborts their publishes, as dropping a sequential publish would.
#[derive(Default)]
pub(super) struct Window {
    batches: VecDeque<InFlight>,
    /// The size of the batches' events ([`event_bytes`]).
    bytes: usize,
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

    /// The size of the events in flight ([`event_bytes`]).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The most batches that may stay in flight, plus one (a room limit, as
    /// `max_in_flight` is), for the events in flight to stay under `bound` bytes once the
    /// oldest are settled.
    pub(super) fn room_under(&self, bound: usize) -> usize {
        let mut bytes = self.bytes;
        let mut kept = self.batches.len();
        for b in &self.batches {
            if bytes < bound {
                break;
            }
            bytes -= b.bytes;
            kept -= 1;
        }
        kept + 1
    }

    /// The oldest batch, if its publish has finished.
    pub(super) fn pop_finished(&mut self) -> Option<InFlight> {
        if self.batches.front()?.publish.is_finished() {
            self.pop_oldest()
        } else {
            None
        }
    }

    pub(super) fn pop_oldest(&mut self) -> Option<InFlight> {
        let batch = self.batches.pop_front()?;
        self.bytes -= batch.bytes;
        Some(batch)
    }
}

/// Whether an ordered relay claims while batches are in flight.
///
/// A claimed, unsettled event holds back the later events of its aggregate (that is what
/// keeps the order), so a claim made beside the batches in flight finds only aggregates that
/// are not in them. Where a batch holds an event of every aggregate with pending events, it
/// finds nothing, after the head-of-line check of every pending row: on a backlog where every
/// batch holds every aggregate, claiming beside the batch in flight halves the drain, and
/// neither backing off by doubling nor a single such claim at the start wins that back.
/// Measured: `docs/design/relay-loop.md`, section "Claiming beside batches in flight". So an
/// ordered relay starts with one batch at a time for its first 32 claims;
/// then it claims beside the batches in flight, until such a claim finds nothing while the
/// claim before it was full (a backlog it cannot reach: the next 32 claims are made with
/// nothing in flight again). An empty claim beside batches in flight with no backlog (the
/// relay has caught up) costs little and changes nothing.
pub(super) struct Overlap {
    /// Claims still to make with nothing in flight.
    left: u32,
    /// Whether the last claim was full.
    backlog: bool,
}

/// How many claims are made with nothing in flight, at first and after a fruitless claim
/// beside batches in flight.
const SKIP: u32 = 32;

impl Default for Overlap {
    fn default() -> Self {
        Overlap {
            left: SKIP,
            backlog: false,
        }
    }
}

impl Overlap {
    /// Whether the next claim may be made beside batches in flight; counts the claim.
    pub(super) fn allowed(&mut self) -> bool {
        if self.left == 0 {
            true
        } else {
            self.left -= 1;
            false
        }
    }

    /// A claim (beside batches in flight: `overlapped`) returned `rows` of at most `limit`.
    pub(super) fn claimed(&mut self, overlapped: bool, rows: usize, limit: usize) {
        if overlapped && rows == 0 && self.backlog {
            self.left = SKIP;
        }
        self.backlog = rows >= limit;
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
        bytes: usize,
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
        window.bytes += bytes;
        window.batches.push_back(InFlight {
            batch,
            span,
            claimed,
            publish,
            bytes,
        });
    }

    /// Waits for the publish of `batch` to finish. Meanwhile, every liveness interval, says
    /// that the relay waits for the broker if the publisher knows it is unreachable (a
    /// publish to an unreachable broker lasts until librdkafka's message timeout).
    pub(super) async fn outcome(&mut self, batch: &mut InFlight) -> Vec<Delivery> {
        let every: Duration = self.liveness_every();
        let joined = loop {
            tokio::select! {
                joined = &mut batch.publish => break joined,
                () = tokio::time::sleep(every) => self.report_unreachable_broker().await,
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
