//! Diesel storage of [`outbox`](https://docs.rs/outbox): `transaction_with_outbox` on sync and
//! async connections, the free `publish` functions, the consumers' [`inbox`], and the embedded
//! migrations.
//!
//! Depend on the `outbox` crate, which re-exports this one behind its backend features.
//!
//! ## Crate features
//! - `postgres`, `mysql`, `sqlite`: the backends (the first two link libpq and the MySQL
//!   client library; `postgres_backend` and `mysql_backend` give the backend types alone, for
//!   diesel-async).
//! - `async`: diesel-async 0.9 connections; the errors of its pools (deadpool, bb8) are
//!   classified as outages for the consumer runtime ([`fault`]).
//! - `r2d2`: Diesel's r2d2 pool support (pooled connections work unchanged; its errors are
//!   classified too).
//! - `deadpool`, `bb8`: kept for existing manifests; `async` alone does what they did.
//! - `tls`, `mysql_tls`: TLS (rustls) for the async PostgreSQL and MySQL connections the URL
//!   asks for ([`connect`]).
#![cfg_attr(docsrs, feature(doc_cfg))]

// `macro_use`: the backends' modules (`pg`, `mysql`, `sqlite`, declared after it) implement
// `OutboxBackend` with its macros.
#[macro_use]
mod backend;
mod error;
pub mod fault;
mod idempotent;
pub mod inbox;
pub mod migrations;
#[cfg(feature = "mysql_backend")]
mod mysql;
pub mod notify;
mod order;
#[cfg(feature = "postgres_backend")]
mod pg;
mod rollback;
#[cfg(feature = "sqlite")]
mod sqlite;
mod sync;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod tx;

#[cfg(feature = "async")]
mod async_;
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub mod connect;
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub mod relay;

pub use backend::OutboxBackend;
pub use error::Error;
pub use sync::{OutboxConnection, publish, publish_with_headers};
pub use tx::OutboxTx;
pub use tx::PendingEvents;

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use async_::{AsyncOutboxConnection, OutboxFunc, publish_async, publish_with_headers_async};

/// The name of the outbox table (fixed: no SQL is built from a configurable name).
pub const OUTBOX_TABLE: &str = backend::OUTBOX_TABLE;
/// The name of the inbox table.
pub const INBOX_TABLE: &str = "outbox_inbox";

/// Items the code `#[idempotent]` generates uses. Not public API: it may change in any release.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "async")]
    pub use crate::idempotent::{AsyncBegun, AsyncIdempotentConnection, begin_async, finish_async};
    pub use crate::idempotent::{
        Begun, IdempotentConnection, IdempotentError, begin, default_key, finish, key_of,
    };
    pub use outbox_core::{Envelope, Outcome};
}
