//! The relay loop.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[path = "settle.rs"]
mod settle;

use super::stats::RelayStats;
use super::{
    Claim, ClaimOrder, ConfigError, DeadLetterPolicy, Delivery, Mode, Publisher, RelayConfig,
    RelayHealth, RelayState, RelayStore, StoreError,
};
use tracing::Instrument;

use crate::backoff::SplitMix;

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
    publisher: P,
    config: RelayConfig,
    stats: Arc<RelayStats>,
    rng: SplitMix,
    /// The state last written by a heartbeat, and the last outage error.
    reported: Option<RelayState>,
    last_error: Option<String>,
    /// The other session using this relay's id, as last logged (see `RelayIdInUse`).
    id_conflict: Option<String>,
}

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// A relay over `store` and `publisher`; fails if `config` does not
    /// [`validate`](RelayConfig::validate).
    pub fn new(store: S, publisher: P, config: RelayConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Relay {
            store,
            publisher,
            config,
            stats: Arc::default(),
            rng: SplitMix::seeded(),
            reported: None,
            last_error: None,
            id_conflict: None,
        })
    }

    /// The relay's counters.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Runs until `shutdown` completes, then finishes the batch in flight, gives up its
    /// leases (shards, leadership, rows) and returns. Database and broker outages are
    /// retried with backoff forever: the relay recovers on its own.
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) {
        let mut shutdown = pin!(shutdown);
        let mut stopping = false;
        let mut outage = 0u32;
        let mut next_ownership = Instant::now();
        let mut active = self.config.mode == Mode::Unordered;
        let mut next_cleanup = Instant::now();
        let mut next_liveness = Instant::now();
        // Consecutive batches that met a broker outage (0: the broker is fine).
        let mut broker_outage = 0u32;
        self.stats.active.store(active, Ordering::Relaxed);
        tracing::info!(relay = %self.config.relay_id, mode = ?self.config.mode, "relay started");

        while !stopping {
            // Poll shutdown without waiting.
            tokio::select! {
                biased;
                _ = &mut shutdown => { stopping = true; continue; }
                _ = std::future::ready(()) => {}
            }

            let state = if !active {
                RelayState::Standby
            } else if broker_outage > 0 {
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
                        // Sharded relays rebalance on the liveness cadence (a second by
                        // default): a peer that dies or joins changes everyone's fair share, and
                        // shards a reap frees beyond the reaper's own share would otherwise wait
                        // for the others' renewal, a third of a lease (measured in the SIGKILL
                        // storm: 20 shards without an owner for 9 s after kills, while a relay
                        // sat below its new share). Leader mode: the leader renews every third
                        // of a lease, standbys look every tenth, so a dead leader's work moves
                        // on soon after its lease ends (or at once, when its session is reaped).
                        let every = match self.config.mode {
                            Mode::Sharded => self.liveness_every(),
                            _ if active => self.config.lease / 3,
                            _ => self.config.lease / 10,
                        };
                        next_ownership = Instant::now() + every;
                    }
                    Err(e) => {
                        self.outage_wait(&mut shutdown, &mut stopping, &mut outage, e)
                            .await;
                        continue;
                    }
                }
            }
            if !active {
                let wait = self.config.poll_interval.min(self.config.lease / 10);
                sleep_or_stop(&mut shutdown, &mut stopping, wait).await;
                continue;
            }

            if let Some(retention) = self.config.retention
                && Instant::now() >= next_cleanup
            {
                next_cleanup = Instant::now() + retention.every;
                match self.store.cleanup(retention.keep, retention.batch).await {
                    Ok(n) if n > 0 => tracing::debug!(deleted = n, "retention cleanup"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "retention cleanup failed"),
                }
            }

            let claim = Claim {
                relay: &self.config.relay_id,
                limit: self.config.batch_size,
                lease: self.config.lease,
                order: self.claim_order(),
            };
            let started = Instant::now();
            let batch = match self.store.claim(&claim).await {
                Ok(batch) => {
                    metrics::histogram!("outbox_relay_claim_duration_seconds")
                        .record(started.elapsed());
                    self.stats.database_reached();
                    batch
                }
                Err(e) => {
                    self.outage_wait(&mut shutdown, &mut stopping, &mut outage, e)
                        .await;
                    continue;
                }
            };
            outage = 0;
            if batch.is_empty() {
                tokio::select! {
                    _ = &mut shutdown => stopping = true,
                    _ = self.store.wait_for_work(self.config.poll_interval) => {}
                }
                continue;
            }
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

            // A publish that does not finish in time has an unknown outcome: an outage, not
            // the events' fault. They go back and are published again (at least once).
            let started = Instant::now();
            let every = self.liveness_every();
            let published = {
                let publish = tokio::time::timeout(
                    self.config.publish_timeout,
                    self.publisher.publish(&batch).instrument(span.clone()),
                );
                let mut publish = pin!(publish);
                loop {
                    tokio::select! {
                        published = &mut publish => break published,
                        () = tokio::time::sleep(every) => {
                            // A publish to an unreachable broker lasts until librdkafka's message
                            // timeout: say meanwhile that the relay waits for the broker, if the
                            // publisher knows it is unreachable.
                            if let Some(error) = self.publisher.unavailable()
                                && self.reported != Some(RelayState::WaitingForBroker)
                                && heartbeat(
                                    &mut self.store,
                                    &self.config,
                                    RelayState::WaitingForBroker,
                                    Some(error.clone()),
                                )
                                .await
                                .is_ok()
                            {
                                self.reported = Some(RelayState::WaitingForBroker);
                                self.stats.database_reached();
                                self.stats.waiting_for_broker.store(true, Ordering::Relaxed);
                                self.last_error = Some(error);
                            }
                        }
                    }
                }
            };
            let deliveries = match published {
                Ok(d) => d,
                Err(_) => vec![
                    Delivery::Unavailable(format!(
                        "publish timed out after {:?}; the outcome is unknown",
                        self.config.publish_timeout
                    ));
                    batch.len()
                ],
            };
            metrics::histogram!("outbox_relay_publish_duration_seconds").record(started.elapsed());
            let started = Instant::now();
            let settled = self.settle(&batch, deliveries).instrument(span).await;
            metrics::histogram!("outbox_relay_mark_duration_seconds").record(started.elapsed());
            self.stats
                .waiting_for_broker
                .store(settled.is_some(), Ordering::Relaxed);
            match settled {
                Some(error) => {
                    // The broker is unavailable: the batch went back whole (order kept, no
                    // attempt counted); wait with the outage backoff, capped so delivery
                    // resumes soon after the broker returns.
                    broker_outage = broker_outage.saturating_add(1);
                    RelayStats::add(
                        &self.stats.broker_waits,
                        "outbox_relay_broker_waits_total",
                        1,
                    );
                    let wait = self
                        .config
                        .outage_backoff
                        .delay(broker_outage, self.rng.unit());
                    tracing::warn!(error = %error, retry_in = ?wait, "broker unavailable; waiting for it");
                    self.last_error = Some(error);
                    if self.reported != Some(RelayState::WaitingForBroker) {
                        self.liveness(RelayState::WaitingForBroker).await;
                    }
                    sleep_or_stop(&mut shutdown, &mut stopping, wait).await;
                }
                None => {
                    if broker_outage > 0 {
                        tracing::info!(batches = broker_outage, "broker available again");
                    }
                    broker_outage = 0;
                }
            }
        }

        // Graceful shutdown: the batch in flight is settled; give up every lease.
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

    /// How often to heartbeat (and look for dead peers): `session_check`, but at least every
    /// third of the lease.
    fn liveness_every(&self) -> Duration {
        let third = self.config.lease / 3;
        self.config
            .session_check
            .map_or(third, |every| every.min(third))
    }

    /// Heartbeats this relay's health and, with session detection on, reaps dead peers.
    /// Returns whether a peer was reaped (its shards or leadership are free now). Errors are
    /// logged only: a database outage shows up (and is waited out) at the next claim.
    async fn liveness(&mut self, state: RelayState) -> bool {
        let relay = self.config.relay_id.as_str();
        let last_error = self.last_error.clone();
        match heartbeat(&mut self.store, &self.config, state, last_error).await {
            Ok(()) => {
                self.reported = Some(state);
                self.stats.database_reached();
                if self.id_conflict.take().is_some() {
                    tracing::info!(relay = %relay, "relay id free again: the other relay with it is gone; working");
                }
            }
            Err(e) => {
                RelayStats::add(
                    &self.stats.store_errors,
                    "outbox_relay_store_errors_total",
                    1,
                );
                match e.relay_id_in_use() {
                    // A misconfiguration, not an outage: an error, once per change.
                    Some(conflict) => {
                        if self.id_conflict.as_deref() != Some(conflict.holder.as_str()) {
                            tracing::error!(relay = %relay, error = %e, "relay id in use by another live relay; not working until it is gone");
                            self.id_conflict = Some(conflict.holder.clone());
                        }
                    }
                    None => tracing::warn!(error = %e, "heartbeat failed"),
                }
                return false;
            }
        }
        if self.config.session_check.is_none() {
            return false;
        }
        match self.store.reap_dead_relays(relay).await {
            Ok(dead) if !dead.is_empty() => {
                tracing::warn!(relay = %relay, reaped = ?dead, "replaced relays whose database session ended");
                RelayStats::add(&self.stats.reaped, "outbox_relay_reaped_total", dead.len());
                true
            }
            Ok(_) => false,
            Err(e) => {
                RelayStats::add(
                    &self.stats.store_errors,
                    "outbox_relay_store_errors_total",
                    1,
                );
                tracing::warn!(error = %e, "looking for dead relays failed");
                false
            }
        }
    }

    fn claim_order(&self) -> ClaimOrder {
        let dead_letters_block = self.config.dead_letters == DeadLetterPolicy::Block;
        match self.config.mode {
            Mode::Unordered => ClaimOrder::Unordered,
            Mode::Sharded => ClaimOrder::Ordered {
                owned_shards_only: true,
                leader_only: false,
                dead_letters_block,
            },
            Mode::Leader => ClaimOrder::Ordered {
                owned_shards_only: false,
                leader_only: true,
                dead_letters_block,
            },
        }
    }

    /// Renews (or takes) this relay's work; whether it now owns some.
    async fn renew_ownership(&mut self) -> Result<bool, StoreError> {
        let relay = &self.config.relay_id;
        match self.config.mode {
            Mode::Unordered => Ok(true),
            Mode::Leader => {
                self.store
                    .acquire_leadership(relay, self.config.lease)
                    .await
            }
            Mode::Sharded => {
                let assignment = self
                    .store
                    .rebalance_shards(relay, self.config.lease)
                    .await?;
                self.stats
                    .shards
                    .store(assignment.owned.len() as u64, Ordering::Relaxed);
                metrics::gauge!("outbox_relay_shards").set(assignment.owned.len() as f64);
                Ok(!assignment.owned.is_empty())
            }
        }
    }

    async fn outage_wait(
        &mut self,
        shutdown: &mut std::pin::Pin<&mut (impl Future<Output = ()> + Send)>,
        stopping: &mut bool,
        outage: &mut u32,
        error: StoreError,
    ) {
        *outage = outage.saturating_add(1);
        RelayStats::add(
            &self.stats.store_errors,
            "outbox_relay_store_errors_total",
            1,
        );
        let wait = self.config.outage_backoff.delay(*outage, self.rng.unit());
        if error.relay_id_in_use().is_some() {
            // Logged as an error by the heartbeat when it began; a reminder while it lasts.
            tracing::warn!(error = %error, retry_in = ?wait, "relay id in use; waiting");
        } else {
            tracing::warn!(error = %error, retry_in = ?wait, "outbox store unavailable");
        }
        sleep_or_stop(shutdown, stopping, wait).await;
    }
}

/// Writes this relay's health row.
async fn heartbeat<S: RelayStore>(
    store: &mut S,
    config: &RelayConfig,
    state: RelayState,
    last_error: Option<String>,
) -> Result<(), StoreError> {
    let health = RelayHealth {
        mode: config.mode,
        state,
        last_error,
        track_session: config.session_check.is_some(),
    };
    store
        .heartbeat(&config.relay_id, config.lease, &health)
        .await
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
