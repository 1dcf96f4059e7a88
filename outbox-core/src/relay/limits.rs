//! The range of every relay setting, in one table: what
//! [`RelayConfig::validate`](super::RelayConfig::validate) enforces, and what the `outbox`
//! command line checks its flags against, so that the two never disagree.
//!
//! ```
//! use std::time::Duration;
//! use outbox_core::relay::limits;
//! assert!(limits::BATCH_SIZE.contains(&1_000));
//! assert!(!limits::LEASE.contains(&Duration::from_millis(10)));
//! ```

use std::time::Duration;

use super::config::{MAX_IN_FLIGHT as MOST_IN_FLIGHT, MAX_LEASE, MAX_POLL_INTERVAL, MAX_RETENTION};

/// The values a setting may take, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit<T> {
    /// The smallest value allowed.
    pub min: T,
    /// The largest value allowed.
    pub max: T,
}

impl<T: PartialOrd> Limit<T> {
    /// Whether `value` is within the range.
    pub fn contains(&self, value: &T) -> bool {
        *value >= self.min && *value <= self.max
    }
}

/// [`RelayConfig::batch_size`](super::RelayConfig::batch_size): rows per claim.
pub const BATCH_SIZE: Limit<usize> = Limit {
    min: 1,
    max: 10_000,
};

/// [`RelayConfig::lease`](super::RelayConfig::lease).
pub const LEASE: Limit<Duration> = Limit {
    min: Duration::from_millis(100),
    max: MAX_LEASE,
};

/// [`RelayConfig::publish_timeout`](super::RelayConfig::publish_timeout), which must also be
/// shorter than the lease.
pub const PUBLISH_TIMEOUT: Limit<Duration> = Limit {
    min: Duration::from_millis(1),
    max: MAX_LEASE,
};

/// [`RelayConfig::max_attempts`](super::RelayConfig::max_attempts).
pub const MAX_ATTEMPTS: Limit<u32> = Limit {
    min: 1,
    max: 1_000_000,
};

/// [`RelayConfig::poll_interval`](super::RelayConfig::poll_interval).
pub const POLL_INTERVAL: Limit<Duration> = Limit {
    min: Duration::from_millis(1),
    max: MAX_POLL_INTERVAL,
};

/// [`RelayConfig::max_in_flight`](super::RelayConfig::max_in_flight): batches in flight.
pub const MAX_IN_FLIGHT: Limit<usize> = Limit {
    min: 1,
    max: MOST_IN_FLIGHT,
};

/// A [`Backoff`](crate::backoff::Backoff)'s delays (`initial`, and `max`, which must also be at
/// least `initial`).
pub const BACKOFF_DELAY: Limit<Duration> = Limit {
    min: crate::backoff::MIN_DELAY,
    max: crate::backoff::MAX_DELAY,
};

/// [`Retention::keep`](super::Retention::keep): how long published rows are kept.
pub const RETENTION_KEEP: Limit<Duration> = Limit {
    min: Duration::from_secs(1),
    max: MAX_RETENTION,
};

/// [`Retention::batch`](super::Retention::batch): rows deleted per statement.
pub const RETENTION_BATCH: Limit<usize> = Limit {
    min: 1,
    max: 100_000,
};
