//! Relay settings.

use std::time::Duration;

use super::Completion;

/// How relays share the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Any number of relays claim with `FOR UPDATE SKIP LOCKED`: maximum throughput, no
    /// ordering promise.
    #[default]
    Unordered,
    /// Per-aggregate order with parallelism: the 256 virtual shards are leased to relays,
    /// which rebalance as relays join, leave or die. No event of an aggregate is published
    /// before an earlier one of the same aggregate; a failing aggregate blocks only itself.
    Sharded,
    /// One active relay (a lease row elects it), the others wait as hot standbys; ordered as
    /// in `Sharded`.
    Leader,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "unordered" => Ok(Mode::Unordered),
            "sharded" => Ok(Mode::Sharded),
            "leader" => Ok(Mode::Leader),
            other => Err(format!(
                "unknown relay mode `{other}`: expected `unordered`, `sharded` or `leader`"
            )),
        }
    }
}

/// What happens to the later events of an aggregate whose event was dead-lettered (ordered
/// modes only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeadLetterPolicy {
    /// They wait until the dead letter is retried or purged (`outbox dead retry|purge`):
    /// order is never broken.
    #[default]
    Block,
    /// They flow: the dead letter is skipped.
    Skip,
}

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

/// Retention: published rows are deleted in bounded batches once they are older than `keep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep published rows this long.
    pub keep: Duration,
    /// Delete at most this many rows per statement.
    pub batch: usize,
    /// Run the cleanup this often.
    pub every: Duration,
}

/// Everything a relay can be told. Start from [`RelayConfig::default`] and change fields.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::relay::{Mode, RelayConfig};
/// let config = RelayConfig { mode: Mode::Sharded, batch_size: 1000, ..RelayConfig::default() };
/// assert!(config.validate().is_ok());
/// let bad = RelayConfig { publish_timeout: Duration::from_secs(60), ..config };
/// assert!(bad.validate().unwrap_err().contains("publish_timeout"));
/// ```
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// This relay's id (`locked_by`, lease owner). Unique per process; the default is the
    /// host name, process id and a random suffix.
    pub relay_id: String,
    /// How relays share the work.
    pub mode: Mode,
    /// Rows per claim.
    pub batch_size: usize,
    /// How long to wait for new rows when the outbox was empty (a notification ends the wait
    /// early). After a full batch the relay claims again at once.
    pub poll_interval: Duration,
    /// Lease on claimed rows, shards and leadership. A relay that dies loses them after this.
    pub lease: Duration,
    /// Upper bound of one publish; must be shorter than `lease` so a batch is settled while
    /// its lease holds.
    pub publish_timeout: Duration,
    /// Attempts before an event is dead-lettered.
    pub max_attempts: u32,
    /// Per-event retry backoff.
    pub backoff: Backoff,
    /// What happens to published rows.
    pub completion: Completion,
    /// Ordered modes: what a dead letter does to its aggregate.
    pub dead_letters: DeadLetterPolicy,
    /// Deleting old published rows, if wanted.
    pub retention: Option<Retention>,
    /// Backoff between attempts to reach a database or broker that went away. Its `max`
    /// bounds how long after the broker's return delivery resumes (default 2 s).
    pub outage_backoff: Backoff,
    /// How often the relay heartbeats its health and looks for dead peers by their database
    /// sessions (default every second; PostgreSQL and MySQL/MariaDB), so that a killed
    /// relay's shards, leadership and claimed rows are taken over within about this long
    /// instead of its lease. `None` turns session detection off: the relay records no
    /// session and reaps nobody, and the lease is the only rule (use it behind a transaction
    /// pooler such as PgBouncer in transaction mode, where a backend does not belong to one
    /// relay). The relay heartbeats at least every third of its lease either way (more often
    /// than `session_check` if the lease is that short).
    pub session_check: Option<Duration>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            relay_id: default_relay_id(),
            mode: Mode::Unordered,
            batch_size: 500,
            poll_interval: Duration::from_millis(500),
            lease: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(20),
            max_attempts: 10,
            backoff: Backoff::default(),
            completion: Completion::MarkPublished,
            dead_letters: DeadLetterPolicy::Block,
            retention: None,
            // Capped at 2 s: after an outage, delivery resumes within about that long of the
            // broker's (or database's) return, and a try every 2 s costs nothing.
            outage_backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(2),
                multiplier: 2.0,
                jitter: 0.2,
            },
            session_check: Some(Duration::from_secs(1)),
        }
    }
}

impl RelayConfig {
    /// Checks the settings against each other; the error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.relay_id.is_empty() || self.relay_id.len() > 200 {
            return Err("relay_id must be 1 to 200 characters".into());
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(format!(
                "batch_size must be 1 to 10000, not {}",
                self.batch_size
            ));
        }
        if self.lease < Duration::from_millis(100) {
            return Err("lease must be at least 100 ms".into());
        }
        if self.publish_timeout >= self.lease {
            return Err(format!(
                "publish_timeout ({:?}) must be shorter than lease ({:?})",
                self.publish_timeout, self.lease
            ));
        }
        if self.max_attempts == 0 {
            return Err("max_attempts must be at least 1".into());
        }
        if self.poll_interval.is_zero() {
            return Err("poll_interval must be above zero".into());
        }
        if let Some(every) = self.session_check
            && every < Duration::from_millis(10)
        {
            return Err(format!(
                "session_check ({every:?}) must be at least 10 ms (each check is a query)"
            ));
        }
        if self.outage_backoff.max.is_zero() {
            return Err(
                "outage_backoff.max must be above zero (else an outage is retried in a busy loop)"
                    .into(),
            );
        }
        if let Some(r) = &self.retention
            && r.batch == 0
        {
            return Err("retention batch must be at least 1".into());
        }
        Ok(())
    }
}

/// `host-pid-random`: unique per process, readable in `locked_by` and `outbox status`.
pub fn default_relay_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned());
    let mut rng = super::stats::SplitMix::seeded();
    format!(
        "{host}-{}-{:06x}",
        std::process::id(),
        rng.next() & 0xFF_FFFF
    )
}
