//! Relay stores: [`RelayStore`](outbox_core::relay::RelayStore) on PostgreSQL, MySQL/MariaDB
//! and SQLite, over diesel-async connections.
//!
//! Every method is one short, committed statement (MySQL: one short transaction, as it has
//! no `UPDATE … RETURNING`), and no method holds a connection, a transaction or a row lock
//! while the relay publishes. A store owns one connection and reconnects on the call after
//! an error, so the relay survives a database restart. (On PostgreSQL an unordered relay also
//! settles on a second store, its settler, beside its claims: `PgRelayStore::settle_beside`.)
//!
//! Times are the database's clock (PostgreSQL, MySQL) so relays on different hosts agree on
//! lease expiry; SQLite runs in-process, so its clock is the relay's, and it is meant for one
//! relay (see `SqliteRelayStore`).

#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub mod admin;
pub(crate) mod base;
pub(crate) mod common;
pub(crate) mod created_at;

#[cfg(feature = "mysql_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use crate::mysql::relay::MysqlRelayStore;
#[cfg(feature = "postgres_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use crate::pg::relay::PgRelayStore;
#[cfg(feature = "postgres_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use crate::pg::relay::handover::{Handover, LeaseDeadLetters, StreamLeftBehind};
/// How many rows a stream-mode claim reads at least by default
/// ([`PgRelayStore::stream_read_ahead`]).
#[cfg(feature = "postgres_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use crate::pg::relay::stream::READ_AHEAD as PG_STREAM_READ_AHEAD;
pub use common::{ConnectError, connect_error};
/// Stream mode's partition ring on PostgreSQL ([`admin::Admin::partition_events`]).
#[cfg(feature = "postgres_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod partitions {
    pub use crate::pg::relay::partition::{
        DEFAULT_SLOT_XIDS, DEFAULT_SLOTS, MAX_RING_XIDS, MAX_SLOTS, MIN_SLOTS, ROTATE_LOCK_WAIT,
        Rotated, max_slot_xids,
    };
}
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use crate::sqlite::relay::SqliteRelayStore;

/// The claim statements and the relay session's settings, for tests that inspect their plans.
/// Not public API.
#[doc(hidden)]
pub mod __sql {
    #[cfg(feature = "postgres_backend")]
    pub use super::common::Prepared as PgPrepared;
    #[cfg(feature = "postgres_backend")]
    pub use crate::pg::relay::sessions::REAP as PG_REAP;
    #[cfg(feature = "postgres_backend")]
    pub use crate::pg::relay::sql::{
        CLAIM_ORDERED as PG_CLAIM_ORDERED, CLAIM_UNORDERED as PG_CLAIM_UNORDERED,
        SESSION_SQL as PG_SESSION_SQL,
    };
    #[cfg(feature = "postgres_backend")]
    pub use crate::pg::relay::stream::CANDIDATES as PG_STREAM_CANDIDATES;
}
