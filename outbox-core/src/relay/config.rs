//! Relay settings.

use std::time::Duration;

use super::Completion;
use crate::backoff::Backoff;

/// How relays share the work.
///
/// The default is [`Mode::Sharded`]: events of one aggregate are published in the order they
/// were written, which is what consumers rely on. [`Mode::Unordered`] is the explicit opt-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Any number of relays claim with `FOR UPDATE SKIP LOCKED`: maximum throughput, no
    /// ordering promise. Choose it only when consumers do not care about order.
    Unordered,
    /// Per-aggregate order with parallelism: the 256 virtual shards are leased to relays,
    /// which rebalance as relays join, leave or die. No event of an aggregate is published
    /// before an earlier one of the same aggregate; a failing aggregate blocks only itself.
    /// The default. On SQLite (one relay) the single relay holds every shard.
    #[default]
    Sharded,
    /// One active relay (a lease row elects it), the others wait as hot standbys; ordered as
    /// in `Sharded`.
    Leader,
    /// PostgreSQL only. Relays never update event rows: each row records its writer's
    /// transaction (`xid`), and a relay publishes, per shard it owns (shards are leased as
    /// in `Sharded`), the rows that committed between the shard's last consumed snapshot and
    /// the current one (`pg_current_snapshot()`), in `seq` order, then advances the shard's
    /// position (`outbox_stream_positions`). A transaction that commits late is never
    /// skipped and nothing uncommitted is read: an event is published after its transaction
    /// commits, with the next claim of its shard. A long open transaction does not hold
    /// back the others, but while it is open every claim scans its shards' rows from that
    /// transaction's id on (the snapshot's `xmin`), so the claim's cost, and so latency
    /// under load, grows with the age of the oldest open transaction. Order within an
    /// aggregate is commit order, which is `seq` order when the writes to an aggregate are
    /// serialized (as they must be for every mode). One batch in flight at a time. An event
    /// refused past `max_attempts` is copied into `outbox_stream_dead_letters` (its
    /// aggregate's later events parked behind it unless [`DeadLetterPolicy::Skip`]); the
    /// rows keep `published_at` NULL, and retention deletes those the positions passed, by
    /// their commit time (see `PgRelayStore`). MySQL and SQLite stores refuse it
    /// ([`UnsupportedMode`](super::UnsupportedMode)).
    Stream,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "unordered" => Ok(Mode::Unordered),
            "sharded" => Ok(Mode::Sharded),
            "leader" => Ok(Mode::Leader),
            "stream" => Ok(Mode::Stream),
            other => Err(format!(
                "unknown relay mode `{other}`: expected `unordered`, `sharded`, `leader` or `stream`"
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
/// assert_eq!(bad.validate().unwrap_err().setting(), "publish_timeout");
/// ```
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// This relay's id (`locked_by`, lease owner, the shard and leadership leases). **Every
    /// relay needs its own**: the default ([`default_relay_id`]) is the host name, process id
    /// and a random suffix, drawn once when the config is made, so a config cloned (or built
    /// with `..base`) for a second relay shares it; give each relay
    /// `relay_id: default_relay_id()` (or its own name).
    ///
    /// Two relays with one id are one owner to the database: both hold every shard it owns
    /// and claim from them at once, and an aggregate's later event can then be published
    /// before an earlier one. With [`session_check`](Self::session_check) on (the default;
    /// PostgreSQL and MySQL/MariaDB) the store detects a second live relay with an id in use
    /// and refuses to work for it ([`RelayIdInUse`](super::RelayIdInUse), logged as an error)
    /// until the first one is gone. With `session_check: None` (behind a transaction pooler)
    /// nothing can detect it: then the ids must be unique by construction.
    ///
    /// ```
    /// use outbox_core::relay::{RelayConfig, default_relay_id};
    /// let base = RelayConfig::default();
    /// let first = RelayConfig { relay_id: default_relay_id(), ..base.clone() };
    /// let second = RelayConfig { relay_id: default_relay_id(), ..base };
    /// assert_ne!(first.relay_id, second.relay_id);
    /// ```
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
    /// How many claimed batches may be in flight at once (default 4). While batch N is being
    /// published, the relay settles the batches before it and claims the next ones, so a
    /// publish overlaps the database's work instead of waiting for it: with Kafka this is the
    /// difference between the sum of claim, publish and mark per batch and the larger of the
    /// two sides. `1` is the sequential loop (claim, publish, settle, claim, …).
    ///
    /// Order is kept whatever the value: in the ordered modes a claimed, unsettled event holds
    /// back the later events of its aggregate in every store's claim, so two batches in
    /// flight never share an aggregate. So a claim beside the batches in flight finds only
    /// aggregates that are not in them, which pays where aggregates are many; where a batch
    /// holds every aggregate with pending events it finds nothing, at the cost of a scan of
    /// the backlog. An ordered relay therefore starts with one batch at a time for its first
    /// 32 claims, then claims beside the batches in flight until such a claim finds nothing
    /// behind a full one (then one batch at a time for 32 claims again). Batches are settled
    /// in claim order, on the store's [`settler`](super::RelayStore::settler) where it has one
    /// (one batch at a time, beside the next claim; every mode but stream on PostgreSQL): the
    /// rows held in memory are at most `max_in_flight × batch_size`, plus the batch being
    /// settled. After a broker outage the relay probes with one batch at a time until a batch
    /// goes through.
    pub max_in_flight: usize,
    /// Upper bound on the size of the events in flight (payloads, headers and keys of the
    /// batches being published), so that large events cannot grow the relay's memory to
    /// `max_in_flight × batch_size` of them: a claim asks for fewer rows when the last events
    /// were large, and the oldest batches are settled before another is claimed while those
    /// in flight hold this much. An event larger than the bound is claimed alone. Stream mode
    /// also holds the rows it read ahead (see `PgRelayStore::stream_read_ahead`). Default
    /// 64 MiB.
    pub max_in_flight_bytes: usize,
    /// How long the relay keeps looking for new rows every few milliseconds after a claim
    /// that found rows or a wake-up (a notification), before it falls back to waiting
    /// [`poll_interval`](Self::poll_interval) (default 150 ms; zero turns it off).
    ///
    /// Writers notify at most once per throttle interval per process (PostgreSQL, 100 ms by
    /// default: `outbox_diesel::notify`), so a commit shortly after a notifying one wakes
    /// nobody; without this window a relay that had just found the outbox empty would leave
    /// that event waiting a whole poll interval. Keep it at least the writers' notify
    /// interval (plus their longest transaction, whose notification decision is taken before
    /// its commit).
    pub wake_window: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            relay_id: default_relay_id(),
            mode: Mode::default(),
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
            max_in_flight: 4,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            // The notify throttle's default (100 ms) and 50 ms for the writer's transaction
            // between its notification decision and its commit.
            wake_window: Duration::from_millis(150),
        }
    }
}

/// The most batches a relay may have in flight.
pub const MAX_IN_FLIGHT: usize = 64;

/// [`RelayConfig::max_in_flight_bytes`] unless set: 64 MiB.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 64 << 20;

/// The longest lease, publish timeout and backoff delay: one day. Longer leases gain nothing
/// (a dead relay's work would wait that long) and would approach the limits of the stores:
/// PostgreSQL's `statement_timeout` (which the store keeps at a third of the lease) takes at most
/// `i32::MAX` ms (about 24.8 days), and `now() + lease` must stay a valid time everywhere.
pub const MAX_LEASE: Duration = crate::backoff::MAX_DELAY;

/// The longest poll interval: one hour.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(3600);

/// The longest retention: ten years, so that `now() - keep` is a valid time on every backend
/// (MySQL's `DATETIME` starts at the year 1000, SQLite's date functions at year 0).
pub const MAX_RETENTION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

impl RelayConfig {
    /// Checks every setting against its range and against the others; the error is one line
    /// naming the setting, its range and the value given.
    ///
    /// The ranges keep every value valid where it ends up: in SQL intervals (`now() + lease`,
    /// `now() - retention.keep`), in PostgreSQL's `statement_timeout`, and in timers.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_core::relay::RelayConfig;
    /// let mut config = RelayConfig::default();
    /// config.backoff.jitter = 1.5;
    /// let err = config.validate().unwrap_err();
    /// assert_eq!(err.setting(), "backoff.jitter");
    /// assert_eq!(err.to_string(), "backoff.jitter must be between 0 and 1, got 1.5");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Err(reason) = check_relay_id(&self.relay_id) {
            return Err(ConfigError::new("relay_id", format!("relay_id {reason}")));
        }
        use super::limits::{self, Limit};
        /// `setting must be between <min> and <max>, got <value>` unless within `limit`.
        fn check<T: PartialOrd + std::fmt::Debug>(
            setting: &str,
            value: T,
            limit: Limit<T>,
        ) -> Result<(), ConfigError> {
            if limit.contains(&value) {
                return Ok(());
            }
            Err(ConfigError::new(
                setting,
                format!(
                    "{setting} must be between {:?} and {:?}, got {value:?}",
                    limit.min, limit.max
                ),
            ))
        }
        check("batch_size", self.batch_size, limits::BATCH_SIZE)?;
        check("lease", self.lease, limits::LEASE)?;
        check(
            "publish_timeout",
            self.publish_timeout,
            limits::PUBLISH_TIMEOUT,
        )?;
        if self.publish_timeout >= self.lease {
            return Err(ConfigError::new(
                "publish_timeout",
                format!(
                    "publish_timeout ({:?}) must be shorter than lease ({:?})",
                    self.publish_timeout, self.lease
                ),
            ));
        }
        check("max_attempts", self.max_attempts, limits::MAX_ATTEMPTS)?;
        check("poll_interval", self.poll_interval, limits::POLL_INTERVAL)?;
        if self.max_in_flight_bytes == 0 {
            return Err(ConfigError::new(
                "max_in_flight_bytes",
                "max_in_flight_bytes must be at least 1".to_owned(),
            ));
        }
        check("max_in_flight", self.max_in_flight, limits::MAX_IN_FLIGHT)?;
        if self.wake_window > MAX_POLL_INTERVAL {
            return Err(ConfigError::new(
                "wake_window",
                format!(
                    "wake_window must be at most {MAX_POLL_INTERVAL:?}, got {:?}",
                    self.wake_window
                ),
            ));
        }
        if let Some(every) = self.session_check
            && every < Duration::from_millis(10)
        {
            return Err(ConfigError::new(
                "session_check",
                format!("session_check ({every:?}) must be at least 10 ms (each check is a query)"),
            ));
        }
        for (backoff, name) in [
            (&self.backoff, "backoff"),
            (&self.outage_backoff, "outage_backoff"),
        ] {
            backoff
                .validate(name)
                .map_err(|e| ConfigError::new(e.setting(), e.to_string()))?;
        }
        if let Some(r) = &self.retention {
            check("retention.keep", r.keep, limits::RETENTION_KEEP)?;
            check("retention.batch", r.batch, limits::RETENTION_BATCH)?;
            if r.every.is_zero() || r.every > MAX_LEASE {
                return Err(ConfigError::new(
                    "retention.every",
                    format!(
                        "retention.every must be between 1ns and {MAX_LEASE:?}, got {:?}",
                        r.every
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A [`RelayConfig`] setting out of its range or at odds with another one, from
/// [`RelayConfig::validate`] (and so [`Relay::new`](super::Relay::new)): which setting, and a
/// one-line message naming it, its range and the value given.
///
/// ```
/// use outbox_core::relay::RelayConfig;
/// let config = RelayConfig { batch_size: 0, ..RelayConfig::default() };
/// let err = config.validate().unwrap_err();
/// assert_eq!(err.setting(), "batch_size");
/// assert_eq!(err.to_string(), "batch_size must be between 1 and 10000, got 0");
/// // An error type like any other: `?` turns it into `anyhow::Error` or `Box<dyn Error>`.
/// let boxed: Box<dyn std::error::Error + Send + Sync> = err.into();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    setting: String,
    message: String,
}

impl ConfigError {
    fn new(setting: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            setting: setting.into(),
            message: message.into(),
        }
    }

    /// The setting at fault, as a field path: `"lease"`, `"backoff.jitter"`,
    /// `"retention.keep"`.
    pub fn setting(&self) -> &str {
        &self.setting
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Checks a relay id: 1 to 200 bytes, no leading or trailing whitespace and no control
/// characters; the error is what is wrong, for a message that names the setting as its caller
/// calls it (`relay_id`, `--relay-id`). Ids are compared by the stores, and MySQL's default
/// collations ignore trailing spaces (`'a' = 'a '`) while `GET_LOCK` does not: two ids
/// differing only by a trailing space would pass the duplicate-id guard and yet hold
/// different locks. The value itself is not quoted back.
///
/// ```
/// use outbox_core::relay::check_relay_id;
/// assert!(check_relay_id("relay-1").is_ok());
/// assert_eq!(
///     check_relay_id("relay-1 ").unwrap_err(),
///     "must not start or end with whitespace"
/// );
/// ```
pub fn check_relay_id(id: &str) -> Result<(), String> {
    if id.trim().is_empty() || id.len() > 200 {
        return Err(format!("must be 1 to 200 characters, got {}", id.len()));
    }
    if id.trim() != id {
        return Err("must not start or end with whitespace".to_owned());
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(format!(
            "must not contain control characters, found U+{:04X}",
            u32::from(c)
        ));
    }
    Ok(())
}

/// `host-pid-random`: a fresh id on every call, readable in `locked_by` and `outbox status`.
/// Use it for each relay of a process that runs several (see [`RelayConfig::relay_id`]).
pub fn default_relay_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned());
    let mut rng = crate::backoff::SplitMix::seeded();
    format!(
        "{host}-{}-{:06x}",
        std::process::id(),
        rng.next() & 0xFF_FFFF
    )
}

#[cfg(test)]
mod tests;
