//! What a relay tells the database about itself: [`RelayHealth`], written by
//! [`RelayStore::heartbeat`](super::RelayStore::heartbeat) and shown by `outbox status`.

use super::Mode;

/// What a relay is doing, as its heartbeat row shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RelayState {
    /// Publishing (or idle with nothing to publish).
    Running,
    /// The broker is unreachable (or its outcomes unknown): the relay gives its batches back
    /// and retries with its outage backoff until the broker returns.
    WaitingForBroker,
    /// A hot standby: another relay holds the leadership (leader mode) or every shard
    /// (sharded mode).
    Standby,
}

impl RelayState {
    /// The name stored in the database: `running`, `waiting_for_broker` or `standby`.
    ///
    /// ```
    /// use outbox_core::relay::RelayState;
    /// assert_eq!(RelayState::WaitingForBroker.as_str(), "waiting_for_broker");
    /// assert_eq!("standby".parse::<RelayState>(), Ok(RelayState::Standby));
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            RelayState::Running => "running",
            RelayState::WaitingForBroker => "waiting_for_broker",
            RelayState::Standby => "standby",
        }
    }
}

impl std::fmt::Display for RelayState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RelayState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "running" => Ok(RelayState::Running),
            "waiting_for_broker" => Ok(RelayState::WaitingForBroker),
            "standby" => Ok(RelayState::Standby),
            other => Err(format!(
                "unknown relay state `{other}`: expected `running`, `waiting_for_broker` or \
                 `standby`"
            )),
        }
    }
}

/// A relay's health, written with every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayHealth {
    /// How the relay shares the work.
    pub mode: Mode,
    /// What it is doing now. The store keeps, next to it, since when (the database's time of
    /// the first heartbeat with this state).
    pub state: RelayState,
    /// The last outage the relay met (broker unreachable, publish timed out), if any; kept
    /// after the outage ends so that `outbox status` can show what happened.
    pub last_error: Option<String>,
    /// Whether the store should record this relay's database session, so that peers can tell
    /// from the database's own view that the relay died (see
    /// [`RelayConfig::session_check`](super::RelayConfig::session_check)). `false` behind a
    /// transaction pooler: the relay is then only ever replaced when its leases run out.
    pub track_session: bool,
}
