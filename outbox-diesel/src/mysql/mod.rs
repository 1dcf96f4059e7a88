//! MySQL and MariaDB: the write path ([`OutboxBackend`](crate::OutboxBackend) for `Mysql`, in
//! `write`), the relay store (`relay`: its units of work and relay sessions) and the admin API's
//! SQL (`admin`).

mod write;

#[cfg(feature = "relay")]
pub(crate) mod admin;
#[cfg(feature = "relay")]
pub(crate) mod relay;
