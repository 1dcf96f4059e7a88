//! Waking relays from the write path (PostgreSQL): `NOTIFY outbox_events` in writing
//! transactions, at most once per interval per process.
//!
//! A notification is transactional (delivered at commit, dropped on rollback) and only wakes
//! relays; they still claim by state. It is not free: PostgreSQL serialises the commits of
//! notifying transactions on one global lock, so a `NOTIFY` in *every* transaction cuts
//! write throughput by more than half under many concurrent writers (measured:
//! `docs/design/write-path.md`, section "The notify throttle"). Hence the throttle: by default
//! at most one notifying transaction per 100 ms per process. A commit inside the window wakes
//! nobody, so the relay does not rely on a
//! notification per commit: after a notification or a claim that found rows it claims again
//! every few milliseconds for its `RelayConfig::wake_window` (150 ms by default, longer than
//! this throttle), and only then falls back to its poll interval; no committed event waits a
//! poll interval because its notification was throttled away (unless its transaction ran
//! longer than the wake window's margin between its notification decision and its commit).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `u64::MAX` means off.
static INTERVAL_MICROS: AtomicU64 = AtomicU64::new(100_000);
#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
/// Micros since `epoch()` of the last notifying transaction, plus one (0 = never).
static LAST: AtomicU64 = AtomicU64::new(0);

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// Sets how often writing transactions may notify relays: `Some(interval)` is at most once per
/// `interval` per process (`Some(Duration::ZERO)`: every transaction), `None` turns it off
/// (relays then poll). Default: `Some(100 ms)`.
///
/// ```
/// use std::time::Duration;
/// outbox_diesel::notify::set_interval(Some(Duration::from_millis(50)));
/// assert_eq!(outbox_diesel::notify::interval(), Some(Duration::from_millis(50)));
/// # outbox_diesel::notify::set_interval(Some(Duration::from_millis(100)));
/// ```
pub fn set_interval(interval: Option<Duration>) {
    let micros = interval.map_or(u64::MAX, |d| {
        u64::try_from(d.as_micros()).unwrap_or(u64::MAX - 1)
    });
    INTERVAL_MICROS.store(micros, Ordering::Relaxed);
}

/// The current setting (see [`set_interval`]).
pub fn interval() -> Option<Duration> {
    match INTERVAL_MICROS.load(Ordering::Relaxed) {
        u64::MAX => None,
        micros => Some(Duration::from_micros(micros)),
    }
}

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
/// Whether this transaction should notify; claims the slot if so.
pub(crate) fn due() -> bool {
    let interval = INTERVAL_MICROS.load(Ordering::Relaxed);
    if interval == u64::MAX {
        return false;
    }
    let now = epoch().elapsed().as_micros() as u64 + 1;
    let last = LAST.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < interval {
        return false;
    }
    LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}
