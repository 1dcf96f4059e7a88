//! Exponential backoff with jitter ([`Backoff`]), for the relay's retries and outages and the
//! Kafka consumer's: a module of its own, so that neither needs the other's feature.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Exponential backoff with jitter: attempt `n` waits `initial * multiplier^(n-1)`, at most
/// `max`, scaled by a random factor in `1 ± jitter`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// Growth per attempt.
    pub multiplier: f64,
    /// Relative jitter, `0.0..=1.0`.
    pub jitter: f64,
}

impl Backoff {
    /// The wait after `attempt` failures (1-based), with `unit` a random number in `0..1`.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let exp = self
            .multiplier
            .powi(attempt.saturating_sub(1).min(64) as i32);
        let base = (self.initial.as_secs_f64() * exp).min(self.max.as_secs_f64());
        let factor = 1.0 + self.jitter * (2.0 * unit - 1.0);
        Duration::from_secs_f64((base * factor).clamp(0.0, self.max.as_secs_f64()))
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

/// A small, fast, seedable generator for jitter (no dependency needed for that).
#[derive(Debug, Clone)]
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        SplitMix(
            nanos ^ (u64::from(std::process::id()) << 32) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..1`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
