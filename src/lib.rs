//! # outbox
//!
//! A Diesel-native transactional outbox. Write business rows and the events that describe them
//! in **one** local transaction; a relay publishes the events to a broker at least once;
//! consumers apply each event exactly once in effect.
//!
//! ## Why
//!
//! `insert order; commit; publish OrderCreated` loses the event when the process dies between
//! the commit and the publish; publishing first announces orders that a failed commit never
//! stored; retrying either step duplicates. There is no atomic commit across a database and a
//! broker. The outbox turns the problem into one local ACID transaction: the event is a row,
//! committed with the order or not at all, and a relay publishes committed rows afterwards.
//!
//! ```
//! use diesel::prelude::*;
//! use outbox::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, OutboxEvent)]
//! #[outbox(aggregate = "order", event_type = "OrderCreated", version = 1)]
//! struct OrderCreated {
//!     #[outbox(aggregate_id)]
//!     order_id: i64,
//!     total_cents: i64,
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! outbox::migrations::run(&mut conn)?;
//! # diesel::sql_query("CREATE TABLE orders (id BIGINT PRIMARY KEY, total_cents BIGINT)").execute(&mut conn)?;
//!
//! conn.transaction_with_outbox(|tx| {
//!     diesel::sql_query("INSERT INTO orders (id, total_cents) VALUES (1, 1250)")
//!         .execute(tx.conn())?;
//!     tx.publish(&OrderCreated { order_id: 1, total_cents: 1250 })?;
//!     Ok::<_, outbox::Error>(())
//! })?; // the order and its event commit together, or neither does
//! # Ok(())
//! # }
//! ```
//!
//! ## Crate features
//! - `sqlite` (default): SQLite through Diesel, with a bundled libsqlite3.
//! - `postgres`: PostgreSQL (links libpq).
//! - `mysql`: MySQL and MariaDB (links the MySQL/MariaDB client library).
//! - `async`: diesel-async 0.9 connections (`AsyncPgConnection`, `AsyncMysqlConnection`,
//!   `SyncConnectionWrapper<SqliteConnection>`), with `transaction_with_outbox` taking an async
//!   closure.
//! - `r2d2`: Diesel's r2d2 pool; pooled connections work unchanged.
//! - `relay`: the relay engine and its stores (implies `async`).
//! - `kafka`: the Kafka publisher (librdkafka, built from bundled sources).
//! - `cli`: the `outbox` binary: `outbox migrate`, `outbox relay`, `outbox status`.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use outbox_core::{
    AggregateKey, BoxError, Error, EventType, Headers, NewMessage, OutboxEvent, SHARD_COUNT,
    shard_of,
};

pub use outbox_diesel::{
    INBOX_TABLE, OUTBOX_TABLE, OutboxBackend, OutboxConnection, OutboxTx, publish,
    publish_with_headers,
};

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use outbox_diesel::{
    AsyncOutboxConnection, OutboxFunc, publish_async, publish_with_headers_async,
};

/// The relay: publishes committed outbox rows to a broker, at least once.
///
/// [`Relay`](relay::Relay) runs the loop over a store (`PgRelayStore`, `MysqlRelayStore`,
/// `SqliteRelayStore`) and a [`Publisher`](relay::Publisher) (Kafka with the `kafka` feature,
/// or the [`MemoryBroker`](relay::MemoryBroker)).
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub mod relay {
    pub use outbox_core::relay::*;
    pub use outbox_diesel::relay::*;
}

pub use outbox_diesel::notify;

/// Publishing to Kafka (feature `kafka`): [`KafkaPublisher`](kafka::KafkaPublisher).
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub use outbox_core::kafka;

/// The outbox's schema migrations: [`migrations::run`] (sync) and `migrations::run_async`.
pub mod migrations {
    pub use outbox_diesel::migrations::*;
}

/// The traits and derive most code needs: `use outbox::prelude::*;`.
pub mod prelude {
    pub use outbox_core::OutboxEvent;
    #[cfg(feature = "async")]
    pub use outbox_diesel::AsyncOutboxConnection;
    pub use outbox_diesel::OutboxConnection;
}

#[doc(hidden)]
pub use outbox_core::__private;
