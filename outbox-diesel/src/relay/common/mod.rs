//! What the relay stores share: guarding a relay's id, store errors and relay modes as stored
//! (here), the rows a claim returns (`rows`), sorting out malformed rows (`malformed`), and
//! statement helpers (`sql`).

mod malformed;
mod rows;
pub(crate) mod sql;

use outbox_core::relay::StoreError;

pub(crate) use super::created_at::CreatedAt;
pub(crate) use malformed::*;
pub(crate) use rows::*;
#[cfg(feature = "postgres_backend")]
pub use sql::Prepared;
pub(crate) use sql::*;

/// What a store that records relay sessions keeps to guard its relay's id: the last
/// heartbeat (repeated on every new connection, before anything else runs on it) and whether
/// another live relay holds the id.
#[derive(Default)]
pub(crate) struct IdGuard {
    /// The relay id, lease and health of the last heartbeat that tracks its session.
    pub beat: Option<(String, std::time::Duration, outbox_core::relay::RelayHealth)>,
    /// Set when a heartbeat found the id in use by another live session; cleared by one
    /// that recorded this store's session.
    pub in_use: Option<outbox_core::relay::RelayIdInUse>,
}

impl IdGuard {
    /// Remembers `health` (when it tracks the session) for the next connection.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub fn remember(
        &mut self,
        relay: &str,
        lease: std::time::Duration,
        health: &outbox_core::relay::RelayHealth,
    ) {
        if health.track_session {
            self.beat = Some((relay.to_owned(), lease, health.clone()));
        } else {
            // Nothing recorded, nothing to guard (and nothing detectable).
            self.beat = None;
            self.in_use = None;
        }
    }

    /// `Err` while another live relay holds the id: `op` must not run.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub fn refuse(&self, op: &'static str) -> Result<(), StoreError> {
        match &self.in_use {
            Some(c) => Err(StoreError::new(op, c.clone())),
            None => Ok(()),
        }
    }

    /// Whether a store connected at `connected_at` may reap peers by their sessions now:
    /// not while another live relay holds its id, and not before its own connection is
    /// [`REAP_GRACE`] old.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub fn may_reap(&self, connected_at: Option<std::time::Instant>) -> bool {
        self.in_use.is_none() && connected_at.is_some_and(|at| at.elapsed() >= REAP_GRACE)
    }
}

/// A store that cannot connect, with what to do about it.
pub type ConnectError = StoreError;

/// A connection failure, worded for the operator.
pub fn connect_error(backend: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::new(
        "connect",
        format!("cannot connect to {backend}: {e} (is the server up and the URL right?)"),
    )
}

/// A store error for `operation`; a missing outbox table (the migrations have not run) says
/// so in one line, naming the table and the command that creates it, instead of the
/// database's own wording.
pub(crate) fn store_error(operation: &'static str, e: diesel::result::Error) -> StoreError {
    match missing_table(&e) {
        Some(table) => StoreError::new(
            operation,
            format!(
                "the table `{table}` does not exist: the outbox's migrations have not run on                  this database; run `outbox migrate --database-url …` (or                  `outbox::migrations::run`) first"
            ),
        ),
        None => StoreError::new(operation, e),
    }
}

/// The outbox table a database error says is missing: PostgreSQL `relation "x" does not
/// exist`, MySQL/MariaDB `Table 'db.x' doesn't exist`, SQLite `no such table: x`.
pub(crate) fn missing_table(e: &diesel::result::Error) -> Option<String> {
    let diesel::result::Error::DatabaseError(_, info) = e else {
        return None;
    };
    let m = info.message();
    let name = if let Some(rest) = m.strip_prefix("relation \"") {
        rest.split('"').next()
    } else if let Some(rest) = m.strip_prefix("Table '") {
        rest.split('\'').next().and_then(|t| t.rsplit('.').next())
    } else {
        m.strip_prefix("no such table: ")
    }?;
    let missing = m.ends_with("does not exist")
        || m.ends_with("doesn't exist")
        || m.starts_with("no such table");
    (missing && name.starts_with("outbox_")).then(|| name.trim().to_owned())
}

/// How old a relay store's own connection must be before it reaps peers by their sessions.
/// After a database restart every recorded session is gone at once, including those of
/// relays that are alive and about to reconnect; waiting this long after connecting lets them
/// record their new sessions first (they do so on connecting, and with every heartbeat, about
/// every second).
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
pub(crate) const REAP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// A relay mode as stored in `outbox_relays.mode`.
pub(crate) fn mode_name(mode: outbox_core::relay::Mode) -> &'static str {
    match mode {
        outbox_core::relay::Mode::Unordered => "unordered",
        outbox_core::relay::Mode::Sharded => "sharded",
        outbox_core::relay::Mode::Leader => "leader",
        outbox_core::relay::Mode::Stream => "stream",
    }
}
