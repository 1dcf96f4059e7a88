//! Settling a published batch: each message's outcome recorded on its row, only where the
//! relay still holds the lease.

use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;
use tracing::Instrument;

use super::super::stats::RelayStats;
use super::super::{Delivery, Failure, OutboxMessage, RelayConfig, RelayStore};
use super::window::InFlight;
use crate::backoff::SplitMix;

/// Runs a store call until it succeeds or `deadline` passes (then the rows go back to the
/// pool by lease expiry), backing off between tries.
macro_rules! retry_until {
    ($self:ident, $deadline:expr, $call:expr) => {{
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match $call.await {
                Ok(v) => break Some(v),
                Err(e) => {
                    RelayStats::add(&$self.stats.store_errors, "outbox_relay_store_errors_total", 1);
                    let wait = $self.config.outage_backoff.delay(attempt, $self.rng.unit());
                    if Instant::now() + wait >= $deadline {
                        tracing::error!(error = %e, "could not settle a batch before its lease ran out; its rows will be claimed again");
                        break None;
                    }
                    tracing::warn!(error = %e, retry_in = ?wait, "settling a batch failed, retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }};
}

/// What settling a batch works with: the store it settles on (the relay's own, or its
/// [`settler`](RelayStore::settler)), the relay's configuration, counters and jitter.
pub(super) struct Settle<'a, S> {
    pub(super) store: &'a mut S,
    pub(super) config: &'a RelayConfig,
    pub(super) stats: &'a RelayStats,
    pub(super) rng: &'a mut SplitMix,
}

impl<S: RelayStore> Settle<'_, S> {
    /// Records `deliveries`, the outcome of `batch`'s publish ([`settle`](Self::settle)), in
    /// the batch's span and within its lease, and times it.
    pub(super) async fn batch(
        &mut self,
        batch: InFlight,
        deliveries: Vec<Delivery>,
    ) -> Option<String> {
        let started = Instant::now();
        let deadline = batch.claimed + self.config.lease;
        let settled = self
            .settle(&batch.batch, deliveries, deadline)
            .instrument(batch.span)
            .await;
        metrics::histogram!("outbox_relay_mark_duration_seconds").record(started.elapsed());
        self.stats
            .waiting_for_broker
            .store(settled.is_some(), std::sync::atomic::Ordering::Relaxed);
        settled
    }

    /// Records each message's outcome. Store errors here are retried until `deadline`, when
    /// the batch's lease runs out; after that the rows return to the pool by lease expiry (and published
    /// ones are published again: at-least-once). Returns the first outage error if the broker
    /// was unavailable for any message of the batch.
    pub(super) async fn settle(
        &mut self,
        batch: &[OutboxMessage],
        mut deliveries: Vec<Delivery>,
        deadline: Instant,
    ) -> Option<String> {
        if deliveries.len() != batch.len() {
            tracing::error!(
                expected = batch.len(),
                got = deliveries.len(),
                "publisher broke its contract: wrong number of outcomes"
            );
            // Not the events' fault: give them back without counting an attempt.
            deliveries.resize(
                batch.len(),
                Delivery::Unavailable("publisher returned no outcome for this message".into()),
            );
        }
        let mut published = Vec::new();
        let mut failures = Vec::new();
        let mut released = Vec::new();
        let mut outage: Option<String> = None;
        let mut unavailable = 0usize;
        let mut dead = 0usize;
        for (message, delivery) in batch.iter().zip(deliveries) {
            match delivery {
                Delivery::Published => {
                    published.push(message.seq);
                    let latency = (chrono::Utc::now() - message.created_at).to_std();
                    metrics::histogram!("outbox_relay_commit_to_ack_seconds")
                        .record(latency.unwrap_or_default());
                }
                Delivery::NotAttempted => released.push(message.seq),
                // An outage: the row goes back as it was (`attempts - 1`, available now). In
                // the ordered modes the later events of its aggregate in this batch were not
                // attempted (or were unavailable too) and go back with it, so order is kept.
                Delivery::Unavailable(error) => {
                    unavailable += 1;
                    released.push(message.seq);
                    outage.get_or_insert(error);
                }
                Delivery::Failed(error) => {
                    let attempt = u32::try_from(message.attempts).unwrap_or(1).max(1);
                    let retry_after = if attempt >= self.config.max_attempts {
                        dead += 1;
                        tracing::error!(
                            seq = message.seq, id = %message.id, event_type = %message.event_type,
                            attempts = attempt, error = %error, "event dead-lettered"
                        );
                        None
                    } else {
                        tracing::warn!(
                            seq = message.seq, id = %message.id, attempts = attempt, error = %error,
                            "publish failed, will retry"
                        );
                        Some(self.config.backoff.delay(attempt, self.rng.unit()))
                    };
                    failures.push(Failure {
                        seq: message.seq,
                        error,
                        retry_after,
                    });
                }
            }
        }

        // The batch's span (see `run`): its outcome counts.
        let span = tracing::Span::current();
        span.record("unavailable", unavailable);
        let relay = self.config.relay_id.as_str();
        let completion = self.config.completion;
        if !published.is_empty()
            && let Some(n) = retry_until!(
                self,
                deadline,
                self.store.complete(relay, &published, completion)
            )
        {
            RelayStats::add(
                &self.stats.published,
                "outbox_relay_published_total",
                n as usize,
            );
            let fenced = published.len().saturating_sub(n as usize);
            span.record("published", n);
            span.record("fenced", fenced);
            if fenced > 0 {
                tracing::warn!(
                    fenced,
                    "published rows whose lease had passed to another relay"
                );
            }
            RelayStats::add(&self.stats.fenced, "outbox_relay_fenced_total", fenced);
        }
        if !failures.is_empty()
            && retry_until!(self, deadline, self.store.fail(relay, &failures)).is_some()
        {
            span.record("retried", failures.len() - dead);
            span.record("dead_lettered", dead);
            RelayStats::add(
                &self.stats.retried,
                "outbox_relay_retried_total",
                failures.len() - dead,
            );
            RelayStats::add(
                &self.stats.dead_lettered,
                "outbox_relay_dead_lettered_total",
                dead,
            );
        }
        if !released.is_empty()
            && let Some(n) = retry_until!(self, deadline, self.store.release(relay, &released))
        {
            span.record("released", n);
            RelayStats::add(
                &self.stats.released,
                "outbox_relay_released_total",
                n as usize,
            );
        }
        RelayStats::add(
            &self.stats.unavailable,
            "outbox_relay_unavailable_total",
            unavailable,
        );
        outage
    }
}

/// The settler's side (see [`RelayStore::settler`]): one batch at a time is settled there, as
/// a task of its own, while the relay claims on its own store. The batch settled there is
/// still leased by the relay until its settle commits, so no claim made meanwhile takes its
/// rows; an ordered claim made meanwhile treats the rows the broker acknowledged as published
/// ([`Claim::settling`](super::super::Claim::settling), from [`marking`](Self::marking)).
pub(super) struct Beside<S> {
    config: Arc<RelayConfig>,
    stats: Arc<RelayStats>,
    /// The settler while no settle runs on it.
    idle: Option<(S, SplitMix)>,
    running: Option<JoinHandle<(S, SplitMix, Option<String>)>>,
    /// The rows the running settle marks published (the broker acknowledged them), in batch
    /// order; empty while none runs.
    marking: Vec<i64>,
}

impl<S: RelayStore> Beside<S> {
    pub(super) fn new(store: S, config: &RelayConfig, stats: Arc<RelayStats>) -> Self {
        Beside {
            config: Arc::new(config.clone()),
            stats,
            idle: Some((store, SplitMix::seeded())),
            running: None,
            marking: Vec::new(),
        }
    }

    /// The rows the running settle marks published: those the broker acknowledged. Empty while
    /// no settle runs.
    pub(super) fn marking(&self) -> &[i64] {
        &self.marking
    }

    /// Whether a settle is running.
    pub(super) fn busy(&self) -> bool {
        self.running.is_some()
    }

    /// Waits for the settle that runs, if any; returns the broker's error if it was
    /// unavailable for any message of that batch.
    pub(super) async fn join(&mut self) -> Option<String> {
        let joined = self.running.take()?.await;
        self.marking.clear();
        match joined {
            Ok((store, rng, outage)) => {
                self.idle = Some((store, rng));
                outage
            }
            // The settle panicked: the relay panics too, as it would have settling itself.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: only `Drop` aborts it, so this is not reached; the settler is gone
            // and the relay settles on its own store from now on.
            Err(_) => None,
        }
    }

    /// Starts settling `batch` on the settler, which must be idle (after [`join`](Self::join));
    /// gives the batch back if the settler is gone.
    pub(super) fn start(
        &mut self,
        batch: InFlight,
        deliveries: Vec<Delivery>,
    ) -> Result<(), (InFlight, Vec<Delivery>)> {
        let Some((mut store, mut rng)) = self.idle.take() else {
            return Err((batch, deliveries));
        };
        self.marking.clear();
        // A batch with a wrong number of outcomes (a publisher that broke its contract) counts
        // nothing as published here: its aggregates stay held back until its settle commits.
        if deliveries.len() == batch.batch.len() {
            self.marking.extend(
                batch
                    .batch
                    .iter()
                    .zip(&deliveries)
                    .filter(|(_, d)| matches!(d, Delivery::Published))
                    .map(|(m, _)| m.seq),
            );
        }
        let (config, stats) = (self.config.clone(), self.stats.clone());
        self.running = Some(tokio::spawn(async move {
            let outage = Settle {
                store: &mut store,
                config: &config,
                stats: &stats,
                rng: &mut rng,
            }
            .batch(batch, deliveries)
            .await;
            (store, rng, outage)
        }));
        Ok(())
    }
}

impl<S> Drop for Beside<S> {
    /// The relay's future dropped without a graceful shutdown: the settle stops with it, as
    /// one on the relay's own store would (the rows go back when their lease runs out).
    fn drop(&mut self) {
        if let Some(task) = &self.running {
            task.abort();
        }
    }
}
