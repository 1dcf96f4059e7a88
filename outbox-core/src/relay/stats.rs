//! A relay's counters ([`RelayStats`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counters of a running relay, shared with whoever holds [`Relay::stats`](super::Relay::stats).
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Rows claimed.
    pub claimed: AtomicU64,
    /// Rows published and marked (or deleted).
    pub published: AtomicU64,
    /// Failed publishes recorded for retry.
    pub retried: AtomicU64,
    /// Rows dead-lettered.
    pub dead_lettered: AtomicU64,
    /// Rows given back unpublished (not attempted, the broker unavailable, or on shutdown).
    pub released: AtomicU64,
    /// Rows the broker could not take because it was unavailable (an outage: given back
    /// without counting an attempt).
    pub unavailable: AtomicU64,
    /// Batches after which the relay waited for the broker (outage backoff).
    pub broker_waits: AtomicU64,
    /// Dead peers this relay reaped (their database session was gone).
    pub reaped: AtomicU64,
    /// Rows published whose lease had passed to another relay before they could be marked
    /// (they will be published again: at-least-once).
    pub fenced: AtomicU64,
    /// Non-empty batches.
    pub batches: AtomicU64,
    /// Store errors (a failed claim or settlement is followed by a backoff).
    pub store_errors: AtomicU64,
    /// Whether this relay currently owns work (leader mode: is the leader; sharded mode:
    /// holds at least one shard; unordered: always).
    pub active: AtomicBool,
    /// Shards held (sharded mode).
    pub shards: AtomicU64,
    /// When the relay last reached its database (a claim, heartbeat or lease renewal that
    /// succeeded), in milliseconds since the Unix epoch; 0 before the first.
    pub database_reached_ms: AtomicU64,
    /// Whether the relay is waiting for the broker (its last batch met an outage).
    pub waiting_for_broker: AtomicBool,
}

impl RelayStats {
    /// Adds `n` to `counter` and to the `metrics` counter `metric`.
    pub(crate) fn add(counter: &AtomicU64, metric: &'static str, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
        if n > 0 {
            metrics::counter!(metric).increment(n as u64);
        }
    }

    /// Records that the database answered just now.
    pub(crate) fn database_reached(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.database_reached_ms.store(now, Ordering::Relaxed);
    }

    /// Ready: the database answered within `within` and the broker is not known to be down.
    ///
    /// ```
    /// let stats = outbox_core::relay::RelayStats::default();
    /// assert!(!stats.ready(std::time::Duration::from_secs(30)), "never reached the database");
    /// ```
    pub fn ready(&self, within: std::time::Duration) -> bool {
        let last = self.database_reached_ms.load(Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        last > 0
            && now.saturating_sub(last) <= u64::try_from(within.as_millis()).unwrap_or(u64::MAX)
            && !self.waiting_for_broker.load(Ordering::Relaxed)
    }
}
