//! The relay's database bookkeeping between batches: heartbeats, reaping dead peers, renewing
//! its shards or leadership, and waiting out outages.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::super::stats::RelayStats;
use super::super::{
    ClaimOrder, DeadLetterPolicy, Mode, Publisher, RelayConfig, RelayHealth, RelayState,
    RelayStore, StoreError,
};
use super::Relay;

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// How often to heartbeat (and look for dead peers): `session_check`, but at least every
    /// third of the lease.
    pub(super) fn liveness_every(&self) -> Duration {
        let third = self.config.lease / 3;
        self.config
            .session_check
            .map_or(third, |every| every.min(third))
    }

    /// Heartbeats this relay's health and, with session detection on, reaps dead peers.
    /// Returns whether a peer was reaped (its shards or leadership are free now). Errors are
    /// logged only: a database outage shows up (and is waited out) at the next claim.
    pub(super) async fn liveness(&mut self, state: RelayState) -> bool {
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

    /// While a publish is in flight: if the publisher knows the broker is unreachable, say
    /// that the relay waits for the broker (in `outbox status`) before the publish times out.
    pub(super) async fn report_unreachable_broker(&mut self) {
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

    pub(super) fn claim_order(&self) -> ClaimOrder {
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
            Mode::Stream => ClaimOrder::Stream { dead_letters_block },
        }
    }

    /// Renews (or takes) this relay's work; whether it now owns some.
    pub(super) async fn renew_ownership(&mut self) -> Result<bool, StoreError> {
        let relay = &self.config.relay_id;
        match self.config.mode {
            Mode::Unordered => Ok(true),
            Mode::Leader => {
                self.alone = true;
                self.store
                    .acquire_leadership(relay, self.config.lease)
                    .await
            }
            Mode::Sharded | Mode::Stream => {
                let assignment = self
                    .store
                    .rebalance_shards(relay, self.config.lease)
                    .await?;
                self.stats
                    .shards
                    .store(assignment.owned.len() as u64, Ordering::Relaxed);
                metrics::gauge!("outbox_relay_shards").set(assignment.owned.len() as f64);
                self.alone = assignment.live_relays <= 1;
                Ok(!assignment.owned.is_empty())
            }
        }
    }

    /// How long until the next renewal of this relay's work.
    pub(super) fn ownership_every(&self, active: bool) -> Duration {
        // Sharded relays rebalance on the liveness cadence (a second by default): a peer that
        // dies or joins changes everyone's fair share, and shards a reap frees beyond the
        // reaper's own share would otherwise wait for the others' renewal, a third of a lease
        // (see `docs/design/relay-loop.md`, section "Rebalancing on the liveness cadence").
        // Leader mode: the leader renews every third of a lease, standbys look every tenth, so
        // a dead leader's work moves on soon after its lease ends (or at once, when its
        // session is reaped).
        match self.config.mode {
            Mode::Sharded | Mode::Stream => self.liveness_every(),
            _ if active => self.config.lease / 3,
            _ => self.config.lease / 10,
        }
    }

    /// Counts a store error and returns how long to wait before trying again.
    pub(super) fn outage_delay(&mut self, outage: &mut u32, error: &StoreError) -> Duration {
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
        wait
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
