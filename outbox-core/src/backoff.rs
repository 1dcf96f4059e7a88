//! Exponential backoff with jitter ([`Backoff`]), for the relay's retries and outages and the
//! Kafka consumer's: a module of its own, so that neither needs the other's feature.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Exponential backoff with jitter: attempt `n` waits `initial * multiplier^(n-1)`, at most
/// `max`, scaled by a random factor in `1 ± jitter`.
///
/// The relay's configuration and the Kafka consumer's builder refuse a backoff that
/// [`validate`](Self::validate) refuses (a NaN jitter would make every wait zero, a multiplier
/// below 1 would shrink them).
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

/// The shortest `initial` a [`Backoff`] may have.
pub const MIN_DELAY: Duration = Duration::from_millis(1);

/// The longest `initial` and `max` a [`Backoff`] may have: one day (longer waits gain nothing
/// and would approach the limits of timers and SQL intervals).
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// The largest `multiplier` a [`Backoff`] may have.
pub const MAX_MULTIPLIER: f64 = 1_000.0;

/// A [`Backoff`] setting out of its range, from [`Backoff::validate`]: which setting (as a
/// field path, e.g. `"retry_backoff.jitter"`), and why.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::backoff::Backoff;
/// let backoff = Backoff { jitter: f64::NAN, ..Backoff::default() };
/// let err = backoff.validate("retry_backoff").unwrap_err();
/// assert_eq!(err.setting(), "retry_backoff.jitter");
/// assert_eq!(err.to_string(), "retry_backoff.jitter must be between 0 and 1, got NaN");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackoffError {
    setting: String,
    reason: String,
}

impl BackoffError {
    fn new(name: &str, field: &str, reason: String) -> Self {
        BackoffError {
            setting: format!("{name}.{field}"),
            reason,
        }
    }

    /// The setting at fault: the name given to [`Backoff::validate`], a dot and the field.
    pub fn setting(&self) -> &str {
        &self.setting
    }

    /// What is wrong with it, e.g. `must be between 0 and 1, got NaN`.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl std::fmt::Display for BackoffError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.setting, self.reason)
    }
}

impl std::error::Error for BackoffError {}

impl Backoff {
    /// Checks every field: `initial` between 1 ms and [`MAX_DELAY`], `max` between `initial`
    /// and [`MAX_DELAY`], `multiplier` finite and between 1 and [`MAX_MULTIPLIER`], `jitter`
    /// finite and between 0 and 1. `name` names the backoff in the error (`"backoff"`,
    /// `"retry_backoff"`, ...).
    ///
    /// ```
    /// use outbox_core::backoff::Backoff;
    /// assert!(Backoff::default().validate("backoff").is_ok());
    /// let shrinking = Backoff { multiplier: -2.0, ..Backoff::default() };
    /// assert_eq!(shrinking.validate("backoff").unwrap_err().setting(), "backoff.multiplier");
    /// ```
    pub fn validate(&self, name: &str) -> Result<(), BackoffError> {
        if self.initial < MIN_DELAY || self.initial > MAX_DELAY {
            return Err(BackoffError::new(
                name,
                "initial",
                format!(
                    "must be between {MIN_DELAY:?} and {MAX_DELAY:?}, got {:?}",
                    self.initial
                ),
            ));
        }
        if self.max < self.initial || self.max > MAX_DELAY {
            return Err(BackoffError::new(
                name,
                "max",
                format!(
                    "must be between {name}.initial ({:?}) and {MAX_DELAY:?}, got {:?}",
                    self.initial, self.max
                ),
            ));
        }
        // `!(x >= 1.0)` also refuses NaN.
        if !(self.multiplier >= 1.0 && self.multiplier <= MAX_MULTIPLIER) {
            return Err(BackoffError::new(
                name,
                "multiplier",
                format!(
                    "must be between 1 and {MAX_MULTIPLIER}, got {}",
                    self.multiplier
                ),
            ));
        }
        if !(self.jitter >= 0.0 && self.jitter <= 1.0) {
            return Err(BackoffError::new(
                name,
                "jitter",
                format!("must be between 0 and 1, got {}", self.jitter),
            ));
        }
        Ok(())
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_validate_refuses_each_bad_field() {
        let ok = Backoff::default();
        assert_eq!(ok.validate("b"), Ok(()));
        let cases = [
            (
                Backoff {
                    jitter: f64::NAN,
                    ..ok
                },
                "b.jitter",
            ),
            (
                Backoff {
                    jitter: f64::INFINITY,
                    ..ok
                },
                "b.jitter",
            ),
            (Backoff { jitter: -0.1, ..ok }, "b.jitter"),
            (Backoff { jitter: 1.5, ..ok }, "b.jitter"),
            (
                Backoff {
                    multiplier: -2.0,
                    ..ok
                },
                "b.multiplier",
            ),
            (
                Backoff {
                    multiplier: 0.5,
                    ..ok
                },
                "b.multiplier",
            ),
            (
                Backoff {
                    multiplier: f64::NAN,
                    ..ok
                },
                "b.multiplier",
            ),
            (
                Backoff {
                    multiplier: f64::INFINITY,
                    ..ok
                },
                "b.multiplier",
            ),
            (
                Backoff {
                    initial: Duration::ZERO,
                    ..ok
                },
                "b.initial",
            ),
            (
                Backoff {
                    initial: ok.max * 2,
                    ..ok
                },
                "b.max",
            ),
            (
                Backoff {
                    initial: MAX_DELAY * 2,
                    max: MAX_DELAY * 2,
                    ..ok
                },
                "b.initial",
            ),
        ];
        for (backoff, setting) in cases {
            let err = backoff.validate("b").unwrap_err();
            assert_eq!(err.setting(), setting, "{backoff:?}");
            assert!(err.to_string().starts_with(setting), "{err}");
        }
    }
}

/// A small, fast, seedable generator for jitter (no dependency needed for that).
#[derive(Debug, Clone)]
#[cfg_attr(not(any(feature = "relay", feature = "kafka")), allow(dead_code))]
pub(crate) struct SplitMix(u64);

#[cfg_attr(not(any(feature = "relay", feature = "kafka")), allow(dead_code))]
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
