//! [`ConsumerStats`]: the counters of a running consumer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counters of a running consumer, shared with whoever holds its `stats()` (e.g.
/// `KafkaConsumer::stats`).
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Messages read.
    pub received: AtomicU64,
    /// Messages a handler applied (its transaction committed).
    pub applied: AtomicU64,
    /// Messages a handler recognised as already applied.
    pub duplicates: AtomicU64,
    /// Handler attempts that failed with a permanent error (poison): each counts toward
    /// `max_attempts` and is followed by a retry or a dead letter.
    pub handler_errors: AtomicU64,
    /// Handler attempts that failed with a transient error (an outage): each is followed by a
    /// retry with the outage backoff, never by a dead letter.
    pub transient_errors: AtomicU64,
    /// Messages written to the dead-letter topic: handler failures, undecodable messages and
    /// parked messages (those are also counted in [`parked`](Self::parked)).
    pub dead_lettered: AtomicU64,
    /// Messages parked behind an earlier dead letter of their key (written to the dead-letter
    /// topic, not handled).
    pub parked: AtomicU64,
    /// Messages of an event type without a handler, acknowledged by
    /// [`UnhandledPolicy::Acknowledge`](super::UnhandledPolicy::Acknowledge).
    pub unhandled: AtomicU64,
    /// Attempts to decode a message whose version is newer than its handler knows, held by
    /// [`NewerVersionPolicy::Hold`](super::NewerVersionPolicy::Hold).
    pub newer_version_attempts: AtomicU64,
    /// 1 while a message of a newer version than its handler knows holds the consumer
    /// ([`NewerVersionPolicy::Hold`](super::NewerVersionPolicy::Hold)), else 0: the
    /// consumer waits for an upgrade.
    pub waiting_for_upgrade: AtomicU64,
    /// Undecodable messages skipped (by [`UndecodablePolicy::Skip`](super::UndecodablePolicy::Skip)).
    pub skipped: AtomicU64,
    /// Offsets stored for commit: messages done.
    pub done: AtomicU64,
    /// True while a message waits for its dead letter to be written (the dead-letter topic
    /// refuses it, or the broker is away): its partition, and the consumer with it, make no
    /// progress. A readiness check should report it; `outbox_consumer_dead_letter_blocked` is
    /// the same as a gauge, and `outbox_consumer_dead_letter_failures_total` counts the
    /// failed writes by topic and code.
    pub dead_letter_blocked: AtomicBool,
}

impl ConsumerStats {
    /// Adds one to `counter` and to the `metrics` counter `metric`.
    pub(crate) fn add(counter: &AtomicU64, metric: &'static str) {
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(metric).increment(1);
    }

    /// The value of a counter, e.g. `stats.get(&stats.applied)`.
    ///
    /// ```
    /// let stats = outbox_core::consumer::ConsumerStats::default();
    /// assert_eq!(stats.get(&stats.applied), 0);
    /// ```
    pub fn get(&self, counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
