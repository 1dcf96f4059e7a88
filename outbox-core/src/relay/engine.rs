//! The relay loop.

use std::ops::ControlFlow;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod liveness;
mod settle;
mod window;

use super::stats::RelayStats;
use super::{Claim, ConfigError, Mode, Publisher, RelayConfig, RelayState, RelayStore};
use settle::{Beside, Until};
use window::{Overlap, Window};

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
        let mut cycle = self.start();
        loop {
            if asked(&mut shutdown).await {
                break;
            }
            let next = match self.before_claim(&mut cycle).await {
                ControlFlow::Break(next) => next,
                // Settling may have waited for a publish: nothing is claimed once shutdown
                // was asked for.
                ControlFlow::Continue(()) if asked(&mut shutdown).await => break,
                ControlFlow::Continue(()) => self.claim_and_publish(&mut cycle).await,
            };
            let stopped = match next {
                Next::Now => false,
                Next::Sleep(wait) => stop_or(&mut shutdown, tokio::time::sleep(wait)).await,
                Next::Work(wait) => {
                    let since = Instant::now();
                    let stopped = stop_or(&mut shutdown, self.store.wait_for_work(wait)).await;
                    // Woken before the poll interval (a notification): writers notify at most
                    // once per throttle interval, so the commits that follow this one within
                    // it wake nobody; look for them every few ms.
                    if !stopped && wait == self.config.poll_interval && since.elapsed() < wait {
                        cycle.wake_until = Instant::now() + self.config.wake_window;
                    }
                    stopped
                }
            };
            if stopped {
                break;
            }
        }
        self.shut_down(&mut cycle).await;
    }

    /// The loop's state at start, and the settler set up where the mode settles beside.
    fn start(&mut self) -> Cycle {
        let active = self.config.mode == Mode::Unordered;
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
        let now = Instant::now();
        Cycle {
            outage: 0,
            broker_outage: 0,
            active,
            next_ownership: now,
            next_cleanup: now,
            next_liveness: now,
            wake_until: now,
            window: Window::default(),
            overlap: Overlap::default(),
        }
    }

    /// The work of a turn before its claim: make room in the window, report liveness, renew
    /// ownership, delete past retention and, ordered, settle what must go before the claim.
    /// Breaks with what to do instead of claiming.
    async fn before_claim(&mut self, cycle: &mut Cycle) -> ControlFlow<Next> {
        self.make_room(cycle).await?;
        self.report_liveness(cycle).await;
        self.own(cycle).await?;
        self.clean_up(cycle).await;
        // Ordered modes: claim beside the batches in flight only while that finds rows (see
        // `Overlap`); else settle them first. The last one's settle may still run on the
        // settler: the claim treats the rows it marks published as published.
        if self.config.mode != Mode::Unordered
            && !cycle.overlap.allowed()
            && !cycle.window.is_empty()
            && let Some(wait) = self.settle_ready(cycle, Until::Published).await
        {
            return ControlFlow::Break(Next::Sleep(wait));
        }
        ControlFlow::Continue(())
    }

    /// Settles the batches whose publish has finished, oldest first, and makes room in a full
    /// window. After a broker outage the relay probes with one batch at a time. Stream mode:
    /// one batch in flight, as a batch's position is the start of the next one's (the next
    /// claim waits for this one's settle, see `ClaimOrder::Stream`).
    async fn make_room(&mut self, cycle: &mut Cycle) -> ControlFlow<Next> {
        let limit = if cycle.broker_outage > 0 || self.config.mode == Mode::Stream {
            1
        } else {
            self.config.max_in_flight
        };
        // And as many as keep the events in flight under their bound in bytes.
        let limit = limit.min(cycle.window.room_under(self.config.max_in_flight_bytes));
        match self.settle_ready(cycle, Until::Room(limit)).await {
            Some(wait) => ControlFlow::Break(Next::Sleep(wait)),
            None => ControlFlow::Continue(()),
        }
    }

    /// Heartbeats when due or when the state changed; a dead peer reaped makes ownership due.
    async fn report_liveness(&mut self, cycle: &mut Cycle) {
        let state = if !cycle.active {
            RelayState::Standby
        } else if cycle.broker_outage > 0 {
            RelayState::WaitingForBroker
        } else if let Some(error) = self
            .publisher
            .unavailable()
            .filter(|_| !cycle.window.is_empty())
        {
            self.last_error = Some(error);
            RelayState::WaitingForBroker
        } else {
            RelayState::Running
        };
        if Instant::now() >= cycle.next_liveness || self.reported != Some(state) {
            cycle.next_liveness = Instant::now() + self.liveness_every();
            if self.liveness(state).await {
                cycle.next_ownership = Instant::now(); // a dead peer's work is free: take it now
            }
        }
    }

    /// Ordered modes: renews the relay's shards or leadership when due. A standby settles what
    /// it still has in flight and waits.
    async fn own(&mut self, cycle: &mut Cycle) -> ControlFlow<Next> {
        if self.config.mode != Mode::Unordered && Instant::now() >= cycle.next_ownership {
            match self.renew_ownership().await {
                Ok(now_active) => {
                    self.stats.database_reached();
                    if self.config.mode == Mode::Leader {
                        metrics::gauge!("outbox_relay_leader").set(f64::from(u8::from(now_active)));
                    }
                    if now_active != cycle.active {
                        tracing::info!(relay = %self.config.relay_id, active = now_active, "relay ownership changed");
                    }
                    cycle.active = now_active;
                    self.stats.active.store(now_active, Ordering::Relaxed);
                    cycle.next_ownership = Instant::now() + self.ownership_every(now_active);
                }
                Err(e) => {
                    return ControlFlow::Break(Next::Sleep(
                        self.outage_delay(&mut cycle.outage, &e),
                    ));
                }
            }
        }
        if cycle.active {
            return ControlFlow::Continue(());
        }
        // Nothing more to claim: the batches in flight (claimed while active, still leased by
        // this relay) are settled first.
        let wait = match self.settle_ready(cycle, Until::Settled).await {
            Some(wait) => wait,
            None => self.config.poll_interval.min(self.config.lease / 10),
        };
        ControlFlow::Break(Next::Sleep(wait))
    }

    /// Deletes a batch of published events past retention when due.
    async fn clean_up(&mut self, cycle: &mut Cycle) {
        let Some(retention) = self.config.retention else {
            return;
        };
        if Instant::now() < cycle.next_cleanup {
            return;
        }
        cycle.next_cleanup = Instant::now() + retention.every;
        match self.store.cleanup(retention.keep, retention.batch).await {
            Ok(n) if n > 0 => {
                tracing::debug!(deleted = n, "retention cleanup");
                // A whole batch: there may be more. Delete the next one at the next turn of
                // the loop (one short statement a turn, between claims), not after `every`:
                // one batch a minute (the CLI's 1,000 rows) would let any outbox past 17
                // events a second grow without end.
                if n >= retention.batch as u64 {
                    cycle.next_cleanup = Instant::now();
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention cleanup failed"),
        }
    }

    /// Claims a batch and starts its publish; an empty claim settles or waits for work.
    async fn claim_and_publish(&mut self, cycle: &mut Cycle) -> Next {
        let ordered = self.config.mode != Mode::Unordered;
        let overlapped = ordered && !cycle.window.is_empty();
        let claim = Claim {
            relay: &self.config.relay_id,
            limit: self.claim_limit(&cycle.window),
            lease: self.config.lease,
            order: self.claim_order(),
            // Beside batches in flight: the rows in flight (at most one batch each) and two
            // batches past them (see `Claim::look_ahead`).
            look_ahead: overlapped.then(|| {
                self.config
                    .batch_size
                    .saturating_mul(cycle.window.len() + 2)
            }),
            settling: self.beside.as_ref().map_or(&[], Beside::marking),
        };
        let claimed = Instant::now();
        let batch = match self.store.claim(&claim).await {
            Ok(batch) => batch,
            // The publishes in flight go on; their batches are settled once the database
            // answers again (within their lease, see `settle`).
            Err(e) => return Next::Sleep(self.outage_delay(&mut cycle.outage, &e)),
        };
        metrics::histogram!("outbox_relay_claim_duration_seconds").record(claimed.elapsed());
        self.stats.database_reached();
        cycle.outage = 0;
        let (bytes, largest) = window::weigh(&batch);
        if !batch.is_empty() {
            self.event_bytes = largest.max(self.event_bytes - self.event_bytes / 4);
        }
        if ordered {
            cycle.overlap.claimed(overlapped, batch.len(), claim.limit);
        }
        if batch.is_empty() {
            return self.nothing_claimed(cycle).await;
        }
        cycle.wake_until = Instant::now() + self.config.wake_window;
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
        self.start_publish(&mut cycle.window, batch, bytes, span, claimed);
        // The store's work while the batch is published (stream mode: the last batch's
        // positions, the next rows); the batch is settled once both are done.
        self.store.overlap(&claim).await;
        Next::Now
    }

    /// An empty claim. Beside batches in flight: settle the oldest (its aggregates may hold
    /// back what is pending), or wait for the settle that runs, then claim again. Else inside
    /// the wake window claim again shortly, or wait for a notification or the poll interval.
    async fn nothing_claimed(&mut self, cycle: &mut Cycle) -> Next {
        if !cycle.window.is_empty() || self.settling() {
            let until = match cycle.window.len() {
                0 => Until::Settled,
                n => Until::Room(n),
            };
            return self
                .settle_ready(cycle, until)
                .await
                .map_or(Next::Now, Next::Sleep);
        }
        let now = Instant::now();
        if now < cycle.wake_until {
            Next::Work(WAKE_RECHECK.min(cycle.wake_until - now))
        } else {
            Next::Work(self.config.poll_interval)
        }
    }

    /// Graceful shutdown: every batch in flight is published and settled; then every lease is
    /// given up.
    async fn shut_down(&mut self, cycle: &mut Cycle) {
        self.settle_ready(cycle, Until::Settled).await;
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
}

/// The relay loop's state from turn to turn.
struct Cycle {
    /// Consecutive database outage waits (0: the database answers).
    outage: u32,
    /// Consecutive broker outage waits (0: the broker is fine).
    broker_outage: u32,
    /// Whether the relay may claim: always in unordered mode; the leader, or a relay with
    /// shards, in the ordered modes.
    active: bool,
    next_ownership: Instant,
    next_cleanup: Instant,
    next_liveness: Instant,
    /// Until then, an empty claim is retried every `WAKE_RECHECK` (see `wake_window`).
    wake_until: Instant,
    /// The batches in flight, in claim order.
    window: Window,
    overlap: Overlap,
}

/// What the loop does after a turn.
enum Next {
    /// The next turn at once.
    Now,
    /// Wait this long (an outage's backoff, a standby's poll) or until shutdown.
    Sleep(Duration),
    /// Nothing to claim: wait for a notification, this long at most, or until shutdown.
    Work(Duration),
}

/// Whether `shutdown` has completed, without waiting for it.
async fn asked(shutdown: &mut std::pin::Pin<&mut (impl Future<Output = ()> + Send)>) -> bool {
    tokio::select! {
        biased;
        _ = shutdown => true,
        _ = std::future::ready(()) => false,
    }
}

/// Waits for `wait` or `shutdown`, whichever completes first; whether it was `shutdown`.
async fn stop_or(
    shutdown: &mut std::pin::Pin<&mut (impl Future<Output = ()> + Send)>,
    wait: impl Future,
) -> bool {
    tokio::select! {
        _ = shutdown => true,
        _ = wait => false,
    }
}
