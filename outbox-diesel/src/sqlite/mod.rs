//! SQLite: the write path ([`OutboxBackend`](crate::OutboxBackend) for `Sqlite`, in `write`),
//! the relay store (`relay`) and the admin API's SQL (`admin`).

mod write;

#[cfg(feature = "relay")]
pub(crate) mod admin;
#[cfg(feature = "relay")]
pub(crate) mod relay;

#[cfg(feature = "relay")]
pub(crate) use write::sqlite_timestamp;
