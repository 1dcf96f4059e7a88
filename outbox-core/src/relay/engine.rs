//! The relay loop.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod liveness;
mod settle;
mod window;

use super::stats::RelayStats;
use super::{Claim, ConfigError, Mode, Publisher, RelayConfig, RelayState, RelayStore};
use settle::{Beside, Settle};
use window::{InFlight, Overlap, Window};

use crate::backoff::SplitMix;

/// How often an empty outbox is claimed from again inside the wake window
/// ([`RelayConfig::wake_window`]): an event that committed without a notification waits at
/// most this long (half on average) for its claim. The re-checks follow activity only (a
/// claim that found rows, a notification), so an idle relay still claims once per poll
/// interval; after each burst it claims up to `wake_window / WAKE_RECHECK` (75) more times.
const WAKE_RECHECK: Duration = Duration::from_millis(2);

/// A relay: claims batches from a [`RelayStore`], publishes them with a [`Publisher`]
/// outside any transaction, and settles each message (published, retry later, dead letter,
/// or released) only where it still holds the lease.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use outbox_core::relay::{MemoryBroker, MemoryStore, Relay, RelayConfig};
/// let store = MemoryStore::default();
/// store.insert(outbox_core::relay::test_message("order", "1", "OrderCreated"));
/// let broker = std::sync::Arc::new(MemoryBroker::new());
/// let relay = Relay::new(store.clone(), broker.clone(), RelayConfig::default()).unwrap();
/// let stats = relay.stats();
/// // Run until the outbox is drained, then shut down gracefully.
/// relay.run(async move { while !store.is_drained() { tokio::task::yield_now().await } }).await;
/// assert_eq!(broker.records("order").len(), 1);
/// assert_eq!(stats.published.load(std::sync::atomic::Ordering::Relaxed), 1);
/// # }
/// ```
pub struct Relay<S, P> {
    store: S,
    /// Shared with the tasks that publish the batches in flight.
    publisher: Arc<P>,
    config: RelayConfig,
    stats: Arc<RelayStats>,
    rng: SplitMix,
    /// The state last written by a heartbeat, and the last outage error.
    reported: Option<RelayState>,
    last_error: Option<String>,
    /// The other session using this relay's id, as last logged (see `RelayIdInUse`).
    id_conflict: Option<String>,
    /// The store's settler, once the relay runs (see [`RelayStore::settler`]).
    beside: Option<Beside<S>>,
    /// Ordered modes: whether the relay works alone (the leader, or the only live sharded
    /// relay), and so settles beside its claims (see `run`).
    alone: bool,
    /// The largest event of the last batches, decaying by a quarter a batch: what a claim
    /// expects an event to weigh under [`max_in_flight_bytes`](RelayConfig::max_in_flight_bytes).
    event_bytes: usize,
}

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// A relay over `store` and `publisher`; fails if `config` does not
    /// [`validate`](RelayConfig::validate).
    pub fn new(store: S, publisher: P, config: RelayConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Relay {
            store,
            publisher: Arc::new(publisher),
            config,
            stats: Arc::default(),
            rng: SplitMix::seeded(),
            reported: None,
            last_error: None,
            id_conflict: None,
            beside: None,
            alone: false,
            event_bytes: 0,
        })
    }

    /// The relay's counters.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Rows to claim: the batch size, or fewer where the events are large, so that the events
    /// in flight stay under [`max_in_flight_bytes`](RelayConfig::max_in_flight_bytes) (at
    /// least one: an event larger than the bound goes alone).
    fn claim_limit(&self, window: &Window) -> usize {
        match self.event_bytes {
            0 => self.config.batch_size,
            each => {
                let left = self
                    .config
                    .max_in_flight_bytes
                    .saturating_sub(window.bytes());
                (left / each).clamp(1, self.config.batch_size)
            }
        }
    }

    /// Runs until `shutdown` completes, then finishes every batch in flight (its publish and
    /// settle), gives up its leases (shards, leadership, rows) and returns. Database and
    /// broker outages are retried with backoff forever: the relay recovers on its own.
    ///
    /// Up to [`max_in_flight`](RelayConfig::max_in_flight) batches are in flight: their
    /// publishes run as tasks of their own while this loop does the database's work on the
    /// store connection, one statement at a time (claim, heartbeat, ownership), and settles
    /// the batches in claim order as their publishes finish: on the store's
    /// [`settler`](RelayStore::settler) where it has one (one batch at a time, beside the
    /// next claim), else between its claims.
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) {
        let mut shutdown = pin!(shutdown);
        let mut stopping = false;
        let mut outage = 0u32;
        let mut next_ownership = Instant::now();
        let mut active = self.config.mode == Mode::Unordered;
        let mut next_cleanup = Instant::now();
        let mut next_liveness = Instant::now();
        // Consecutive outage waits for the broker (0: the broker is fine).
        let mut broker_outage = 0u32;
        let mut window = Window::default();
        let mut overlap = Overlap::default();
        // Until then, an empty claim is retried every `WAKE_RECHECK` (see `wake_window`).
        let mut wake_until = Instant::now();
        self.stats.active.store(active, Ordering::Relaxed);
        // Every mode but stream settles beside its claims (a stream batch's settle moves the
        // position its next claim starts from); an ordered relay only while it works alone
        // (see `Beside`). Measured: `docs/design/relay-loop.md`.
        if self.config.mode != Mode::Stream {
            self.beside = self
                .store
                .settler()
                .map(|store| Beside::new(store, &self.config, self.stats.clone()));
        }
        tracing::info!(relay = %self.config.relay_id, mode = ?self.config.mode, "relay started");

        while !stopping {
            if asked(&mut shutdown).await {
                stopping = true;
                continue;
            }

            // Settle the batches whose publish has finished, oldest first, and make room in a
            // full window. After a broker outage the relay probes with one batch at a time.
            // Stream mode: one batch in flight. A batch's position is the start of the next
            // one's, so the next claim waits for this one's settle (see `ClaimOrder::Stream`).
            let limit = if broker_outage > 0 || self.config.mode == Mode::Stream {
                1
            } else {
                self.config.max_in_flight
            };
            // And as many as keep the events in flight under their bound in bytes.
            let limit = limit.min(window.room_under(self.config.max_in_flight_bytes));
            if let Some(wait) = self
                .settle_ready(&mut window, Until::Room(limit), &mut broker_outage)
                .await
            {
                sleep_or_stop(&mut shutdown, &mut stopping, wait).await;
                continue;
            }

            let state = if !active {
                RelayState::Standby
            } else if broker_outage > 0 {
                RelayState::WaitingForBroker
            } else if let Some(error) = self.publisher.unavailable().filter(|_| !window.is_empty())
            {
                self.last_error = Some(error);
                RelayState::WaitingForBroker
            } else {
                RelayState::Running
            };
            if Instant::now() >= next_liveness || self.reported != Some(state) {
                next_liveness = Instant::now() + self.liveness_every();
                if self.liveness(state).await {
                    next_ownership = Instant::now(); // a dead peer's work is free: take it now
                }
            }

            if self.config.mode != Mode::Unordered && Instant::now() >= next_ownership {
                match self.renew_ownership().await {
                    Ok(now_active) => {
                        self.stats.database_reached();
                        if self.config.mode == Mode::Leader {
                            metrics::gauge!("outbox_relay_leader")
                                .set(f64::from(u8::from(now_active)));
                        }
                        if now_active != active {
                            tracing::info!(relay = %self.config.relay_id, active = now_active, "relay ownership changed");
                        }
                        active = now_active;
                        self.stats.active.store(active, Ordering::Relaxed);
                        next_ownership = Instant::now() + self.ownership_every(active);
                    }
                    Err(e) => {
                        let wait = self.outage_delay(&mut outage, &e);
                        sleep_or_stop(&mut shutdown, &mut stopping, wait).await;
                        continue;
                    }
                }
            }
            if !active {
                // Nothing more to claim: the batches in flight (claimed while active, still
                // leased by this relay) are settled first.
                let wait = match self
                    .settle_ready(&mut window, Until::Settled, &mut broker_outage)
                    .await
                {
                    Some(wait) => wait,
                    None => self.config.poll_interval.min(self.config.lease / 10),
                };
                sleep_or_stop(&mut shutdown, &mut stopping, wait).await;
                continue;
            }

            if let Some(retention) = self.config.retention
                && Instant::now() >= next_cleanup
            {
                next_cleanup = Instant::now() + retention.every;
                match self.store.cleanup(retention.keep, retention.batch).await {
                    Ok(n) if n > 0 => {
                        tracing::debug!(deleted = n, "retention cleanup");
                        // A whole batch: there may be more. Delete the next one at the next
                        // turn of the loop (one short statement a turn, between claims), not
                        // after `every`: one batch a minute (the CLI's 1,000 rows) would let
                        // any outbox past 17 events a second grow without end.
                        if n >= retention.batch as u64 {
                            next_cleanup = Instant::now();
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "retention cleanup failed"),
                }
            }

            // Ordered modes: claim beside the batches in flight only while that finds rows
            // (see `Overlap`); else settle them first. The last one's settle may still run on
            // the settler: the claim treats the rows it marks published as published.
            let ordered = self.config.mode != Mode::Unordered;
            if ordered
                && !overlap.allowed()
                && !window.is_empty()
                && let Some(wait) = self
                    .settle_ready(&mut window, Until::Published, &mut broker_outage)
                    .await
            {
                sleep_or_stop(&mut shutdown, &mut stopping, wait).await;
                continue;
            }
            let overlapped = ordered && !window.is_empty();
            // Settling may have waited for a publish: look at shutdown again, so that nothing
            // is claimed once it was asked for.
            if asked(&mut shutdown).await {
                stopping = true;
                continue;
            }
            let claim = Claim {
                relay: &self.config.relay_id,
                limit: self.claim_limit(&window),
                lease: self.config.lease,
                order: self.claim_order(),
                // Beside batches in flight: the rows in flight (at most one batch each) and
                // two batches past them (see `Claim::look_ahead`).
                look_ahead: overlapped
                    .then(|| self.config.batch_size.saturating_mul(window.len() + 2)),
                settling: self.beside.as_ref().map_or(&[], Beside::marking),
            };
            let claimed = Instant::now();
            let batch = match self.store.claim(&claim).await {
                Ok(batch) => {
                    metrics::histogram!("outbox_relay_claim_duration_seconds")
                        .record(claimed.elapsed());
                    self.stats.database_reached();
                    batch
                }
                Err(e) => {
                    // The publishes in flight go on; their batches are settled once the
                    // database answers again (within their lease, see `settle`).
                    let wait = self.outage_delay(&mut outage, &e);
                    sleep_or_stop(&mut shutdown, &mut stopping, wait).await;
                    continue;
                }
            };
            outage = 0;
            let (bytes, largest) = window::weigh(&batch);
            if !batch.is_empty() {
                self.event_bytes = largest.max(self.event_bytes - self.event_bytes / 4);
            }
            if ordered {
                overlap.claimed(overlapped, batch.len(), claim.limit);
            }
            if batch.is_empty() {
                if !window.is_empty() || self.settling() {
                    // Nothing claimable beside the batches in flight: settle the oldest (its
                    // aggregates may hold back what is pending), or wait for the settle that
                    // runs (`0`: with none in flight), then claim again.
                    let until = match window.len() {
                        0 => Until::Settled,
                        n => Until::Room(n),
                    };
                    if let Some(wait) = self
                        .settle_ready(&mut window, until, &mut broker_outage)
                        .await
                    {
                        sleep_or_stop(&mut shutdown, &mut stopping, wait).await;
                    }
                    continue;
                }
                let now = Instant::now();
                // Inside the wake window claim again shortly, else wait for a notification
                // or the poll interval.
                let wait = if now < wake_until {
                    WAKE_RECHECK.min(wake_until - now)
                } else {
                    self.config.poll_interval
                };
                tokio::select! {
                    _ = &mut shutdown => stopping = true,
                    _ = self.store.wait_for_work(wait) => {
                        // Woken before the poll interval (a notification): writers notify
                        // at most once per throttle interval, so the commits that follow
                        // this one within it wake nobody; look for them every few ms.
                        if wait == self.config.poll_interval && now.elapsed() < wait {
                            wake_until = Instant::now() + self.config.wake_window;
                        }
                    }
                }
                continue;
            }
            wake_until = Instant::now() + self.config.wake_window;
            RelayStats::add(
                &self.stats.claimed,
                "outbox_relay_claimed_total",
                batch.len(),
            );
            RelayStats::add(&self.stats.batches, "outbox_relay_batches_total", 1);
            // The batch's span: publish and settle run in it; `settle` records the outcomes.
            let span = tracing::info_span!(
                "outbox.relay.batch",
                relay = %self.config.relay_id,
                mode = ?self.config.mode,
                size = batch.len(),
                first_seq = batch.first().map(|m| m.seq),
                last_seq = batch.last().map(|m| m.seq),
                published = tracing::field::Empty,
                retried = tracing::field::Empty,
                dead_lettered = tracing::field::Empty,
                released = tracing::field::Empty,
                fenced = tracing::field::Empty,
                unavailable = tracing::field::Empty,
            );
            self.start_publish(&mut window, batch, bytes, span, claimed);
            // The store's work while the batch is published (stream mode: the last batch's
            // positions, the next rows); the batch is settled once both are done.
            self.store.overlap(&claim).await;
        }

        // Graceful shutdown: every batch in flight is published and settled; then give up
        // every lease.
        self.settle_ready(&mut window, Until::Settled, &mut broker_outage)
            .await;
        for attempt in 1..=3u32 {
            match self.store.release_all(&self.config.relay_id).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "relay could not release its leases");
                    tokio::time::sleep(self.config.outage_backoff.delay(attempt, 0.5)).await;
                }
            }
        }
        self.stats.active.store(false, Ordering::Relaxed);
        tracing::info!(relay = %self.config.relay_id, "relay stopped");
    }

    /// Settles the batches in flight whose publish has finished, oldest first, and then,
    /// waiting for their publishes, the oldest ones until `until` holds. If a batch met a
    /// broker outage, every other batch in flight is settled too (each gives back what was
    /// not published, without costing an attempt) and the outage backoff to wait is returned.
    async fn settle_ready(
        &mut self,
        window: &mut Window,
        until: Until,
        broker_outage: &mut u32,
    ) -> Option<Duration> {
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
    async fn finish(&mut self, mut batch: InFlight, probes: bool) -> Option<String> {
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
    fn settling(&self) -> bool {
        self.beside.as_ref().is_some_and(Beside::busy)
    }

    /// Waits for the settle on the settler, if one runs; its broker error, as `finish`.
    async fn join_settle(&mut self) -> Option<String> {
        match self.beside.as_mut() {
            Some(beside) => beside.join().await,
            None => None,
        }
    }
}

/// How far [`Relay::settle_ready`] settles the batches in flight.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// Until fewer than this many are in flight (at least one is settled when the window holds
    /// this many; `0` counts as `1`).
    Room(usize),
    /// Until none is in flight; the last one's settle may still run on the settler.
    Published,
    /// Until none is in flight and no settle runs.
    Settled,
}

/// Whether `shutdown` has completed, without waiting for it.
async fn asked(shutdown: &mut std::pin::Pin<&mut (impl Future<Output = ()> + Send)>) -> bool {
    tokio::select! {
        biased;
        _ = shutdown => true,
        _ = std::future::ready(()) => false,
    }
}

async fn sleep_or_stop(
    shutdown: &mut std::pin::Pin<&mut (impl Future<Output = ()> + Send)>,
    stopping: &mut bool,
    wait: Duration,
) {
    tokio::select! {
        _ = shutdown => *stopping = true,
        _ = tokio::time::sleep(wait) => {}
    }
}
