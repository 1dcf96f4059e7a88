//! The relay against real databases: the stores' contract (leases, fencing, head-of-line
//! order, leadership, shards, cleanup) and whole relays draining real outboxes.
//!
//! Run with `cargo test --all-features --test relay`.
#![allow(missing_docs)]

#[cfg(feature = "postgres")]
#[path = "../integration/pgbouncer.rs"]
mod pgbouncer;
#[path = "../integration/support.rs"]
mod support;

mod admin_suite;
mod backends;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod byo;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod foreign_rows;
mod memory;
mod store_suite;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
mod text_ids;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod pooler;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "postgres")]
mod stream;
#[cfg(feature = "postgres")]
mod stream_admin;
#[cfg(feature = "postgres")]
mod stream_partitions;
