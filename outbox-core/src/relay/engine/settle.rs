//! Settling a published batch: each message's outcome recorded on its row, only where the
//! relay still holds the lease.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::Instrument;

use super::super::stats::RelayStats;
use super::super::{
    Delivery, Failure, Mode, OutboxMessage, Publisher, RelayConfig, RelayState, RelayStore,
};
use super::window::InFlight;
use super::{Cycle, Relay};
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
    /// the batch's lease runs out; after that the rows return to the pool by lease expiry (and
    /// published ones are published again: at-least-once). Returns the first outage error if
    /// the broker was unavailable for any message of the batch.
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
        }
        for (message, delivery) in batch.iter().zip(&deliveries) {
            if matches!(delivery, Delivery::Published) {
                let latency = (chrono::Utc::now() - message.created_at).to_std();
                metrics::histogram!("outbox_relay_commit_to_ack_seconds")
                    .record(latency.unwrap_or_default());
            }
        }
        let tally = Tally::of(batch, &mut deliveries, self.config, || self.rng.unit());
        tally.log(batch);
        self.write(tally, deadline).await
    }

    /// The store writes of a tally, each within `deadline`, and their counts; the tally's
    /// outage, if any.
    async fn write(&mut self, tally: Tally, deadline: Instant) -> Option<String> {
        let Tally {
            published,
            failures,
            released,
            outage,
            unavailable,
            dead,
        } = tally;
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

/// What a batch's outcomes come to, before anything is written: the rows to mark published,
/// to fail (retry later, or dead-letter past `max_attempts`) and to release.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) published: Vec<i64>,
    pub(super) failures: Vec<Failure>,
    pub(super) released: Vec<i64>,
    /// The first outage error: the broker was unavailable for a message.
    pub(super) outage: Option<String>,
    /// Messages the broker was unavailable for.
    pub(super) unavailable: usize,
    /// Failures dead-lettered (their `retry_after` is `None`).
    pub(super) dead: usize,
}

impl Tally {
    /// Sorts each message by its delivery; `unit` draws the jitter of each retry's backoff. A
    /// publisher that broke its contract (a wrong number of outcomes) had messages without
    /// one: not their fault, they go back without counting an attempt.
    pub(super) fn of(
        batch: &[OutboxMessage],
        deliveries: &mut Vec<Delivery>,
        config: &RelayConfig,
        mut unit: impl FnMut() -> f64,
    ) -> Tally {
        deliveries.resize(
            batch.len(),
            Delivery::Unavailable("publisher returned no outcome for this message".into()),
        );
        let mut tally = Tally::default();
        for (message, delivery) in batch.iter().zip(deliveries.drain(..)) {
            match delivery {
                Delivery::Published => tally.published.push(message.seq),
                Delivery::NotAttempted => tally.released.push(message.seq),
                // An outage: the row goes back as it was (`attempts - 1`, available now). In
                // the ordered modes the later events of its aggregate in this batch were not
                // attempted (or were unavailable too) and go back with it, so order is kept.
                Delivery::Unavailable(error) => {
                    tally.unavailable += 1;
                    tally.released.push(message.seq);
                    tally.outage.get_or_insert(error);
                }
                Delivery::Failed(error) => {
                    let attempt = u32::try_from(message.attempts).unwrap_or(1).max(1);
                    let retry_after = if attempt >= config.max_attempts {
                        tally.dead += 1;
                        None
                    } else {
                        Some(config.backoff.delay(attempt, unit()))
                    };
                    tally.failures.push(Failure {
                        seq: message.seq,
                        error,
                        retry_after,
                    });
                }
            }
        }
        tally
    }

    /// Logs each failure: an error for a dead letter, a warning for a retry. The failures are
    /// in batch order, so one walk of the batch pairs them with their messages.
    fn log(&self, batch: &[OutboxMessage]) {
        let mut failures = self.failures.iter().peekable();
        for message in batch {
            let Some(failure) = failures.next_if(|f| f.seq == message.seq) else {
                continue;
            };
            let attempts = message.attempts.max(1);
            let error = &failure.error;
            match failure.retry_after {
                None => tracing::error!(
                    seq = message.seq, id = %message.id, event_type = %message.event_type,
                    attempts, error = %error, "event dead-lettered"
                ),
                Some(_) => tracing::warn!(
                    seq = message.seq, id = %message.id, attempts, error = %error,
                    "publish failed, will retry"
                ),
            }
        }
    }
}

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// Settles the batches in flight whose publish has finished, oldest first, and then,
    /// waiting for their publishes, the oldest ones until `until` holds. If a batch met a
    /// broker outage, every other batch in flight is settled too (each gives back what was
    /// not published, without costing an attempt) and the outage backoff to wait is returned.
    pub(super) async fn settle_ready(
        &mut self,
        cycle: &mut Cycle,
        until: Until,
    ) -> Option<Duration> {
        let Cycle {
            window,
            broker_outage,
            ..
        } = cycle;
        let limit = match until {
            Until::Room(limit) => limit.max(1),
            Until::Published | Until::Settled => 1,
        };
        loop {
            let settled = match window.pop_finished() {
                Some(batch) => self.finish(batch, *broker_outage > 0).await,
                None if window.len() >= limit => match window.pop_oldest() {
                    Some(batch) => self.finish(batch, *broker_outage > 0).await,
                    None => return None,
                },
                // All of them: the batch being settled beside too.
                None if until == Until::Settled && self.settling() => self.join_settle().await,
                None => return None,
            };
            let Some(mut error) = settled else {
                if *broker_outage > 0 {
                    tracing::info!(waits = *broker_outage, "broker available again");
                }
                *broker_outage = 0;
                continue;
            };
            // The broker is unavailable: what the batches in flight did not publish goes
            // back whole (order kept, no attempt counted); wait with the outage backoff,
            // capped so delivery resumes soon after the broker returns.
            while let Some(batch) = window.pop_oldest() {
                if let Some(later) = self.finish(batch, *broker_outage > 0).await {
                    error = later;
                }
            }
            if let Some(later) = self.join_settle().await {
                error = later;
            }
            *broker_outage = broker_outage.saturating_add(1);
            RelayStats::add(
                &self.stats.broker_waits,
                "outbox_relay_broker_waits_total",
                1,
            );
            let wait = self
                .config
                .outage_backoff
                .delay(*broker_outage, self.rng.unit());
            tracing::warn!(error = %error, retry_in = ?wait, "broker unavailable; waiting for it");
            self.stats.waiting_for_broker.store(true, Ordering::Relaxed);
            self.last_error = Some(error);
            if self.reported != Some(RelayState::WaitingForBroker) {
                self.liveness(RelayState::WaitingForBroker).await;
            }
            return Some(wait);
        }
    }

    /// Waits for the publish of `batch`, then settles it (within its lease). Returns the
    /// broker's error if it was unavailable for any of its messages.
    ///
    /// With a settler, the settle of `batch` starts there once the previous one is done, and
    /// this returns the previous one's error: the relay then learns of an outage one batch
    /// later (the batches published meanwhile give their rows back without an attempt). But
    /// while it `probes` the broker after an outage (one batch at a time), it waits for this
    /// batch's settle too: that is what tells whether the broker is back.
    pub(super) async fn finish(&mut self, mut batch: InFlight, probes: bool) -> Option<String> {
        let deliveries = self.outcome(&mut batch).await;
        let beside_now = self.config.mode == Mode::Unordered || self.alone;
        let (batch, deliveries) = match self.beside.as_mut() {
            Some(beside) if beside_now => {
                let previous = beside.join().await;
                match beside.start(batch, deliveries) {
                    Ok(()) if probes => {
                        let this = beside.join().await;
                        return previous.or(this);
                    }
                    Ok(()) => return previous,
                    Err(back) => back,
                }
            }
            _ => (batch, deliveries),
        };
        // Settled here: a settle still running beside (the relay no longer works alone) ends
        // first, so that the batches are settled in claim order.
        let previous = self.join_settle().await;
        let this = Settle {
            store: &mut self.store,
            config: &self.config,
            stats: &self.stats,
            rng: &mut self.rng,
        }
        .batch(batch, deliveries)
        .await;
        previous.or(this)
    }

    /// Whether a batch is being settled on the settler.
    pub(super) fn settling(&self) -> bool {
        self.beside.as_ref().is_some_and(Beside::busy)
    }

    /// Waits for the settle on the settler, if one runs; its broker error, as `finish`.
    pub(super) async fn join_settle(&mut self) -> Option<String> {
        match self.beside.as_mut() {
            Some(beside) => beside.join().await,
            None => None,
        }
    }
}

/// How far [`Relay::settle_ready`] settles the batches in flight.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Until {
    /// Until fewer than this many are in flight (at least one is settled when the window holds
    /// this many; `0` counts as `1`).
    Room(usize),
    /// Until none is in flight; the last one's settle may still run on the settler.
    Published,
    /// Until none is in flight and no settle runs.
    Settled,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: i64, attempts: i32) -> OutboxMessage {
        OutboxMessage {
            seq,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: "1".into(),
            event_type: "OrderCreated".into(),
            event_version: 1,
            payload: "{}".into(),
            headers: crate::Headers::new(),
            topic: None,
            shard: 0,
            created_at: chrono::Utc::now(),
            attempts,
        }
    }

    #[test]
    fn each_outcome_goes_where_it_belongs() {
        let config = RelayConfig {
            max_attempts: 3,
            ..RelayConfig::default()
        };
        let batch: Vec<_> = [(1, 1), (2, 1), (3, 2), (4, 3), (5, 1)]
            .map(|(seq, attempts)| message(seq, attempts))
            .into();
        let mut deliveries = vec![
            Delivery::Published,
            Delivery::Unavailable("broker down".into()),
            Delivery::Failed("too large".into()),
            Delivery::Failed("too large".into()),
            Delivery::NotAttempted,
        ];
        let tally = Tally::of(&batch, &mut deliveries, &config, || 0.5);
        assert_eq!(tally.published, [1]);
        assert_eq!(tally.released, [2, 5]);
        assert_eq!(tally.outage.as_deref(), Some("broker down"));
        assert_eq!(tally.unavailable, 1);
        let failed: Vec<_> = tally
            .failures
            .iter()
            .map(|f| (f.seq, f.retry_after.is_some()))
            .collect();
        // Attempt 2 of 3 retries; attempt 3 of 3 is dead-lettered.
        assert_eq!(failed, [(3, true), (4, false)]);
        assert_eq!(tally.dead, 1);
    }

    #[test]
    fn messages_without_an_outcome_go_back_as_an_outage() {
        let batch = vec![message(1, 1), message(2, 1), message(3, 1)];
        let mut deliveries = vec![Delivery::Published];
        let tally = Tally::of(&batch, &mut deliveries, &RelayConfig::default(), || 0.5);
        assert_eq!(tally.published, [1]);
        assert_eq!(tally.released, [2, 3]);
        assert_eq!(tally.unavailable, 2);
        assert!(tally.failures.is_empty());
        // Extra outcomes are ignored, not applied to other rows.
        let mut deliveries = vec![Delivery::Published; 5];
        let tally = Tally::of(&batch, &mut deliveries, &RelayConfig::default(), || 0.5);
        assert_eq!(tally.published, [1, 2, 3]);
    }
}
