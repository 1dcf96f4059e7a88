//! PostgreSQL: the write path ([`OutboxBackend`](crate::OutboxBackend) for `Pg`, in `write`,
//! with its `unnest` insert), the relay store (`relay`: the lease modes, stream mode, relay
//! sessions, the partition ring) and the admin API's SQL (`admin`).

mod unnest;
mod write;

#[cfg(feature = "relay")]
pub(crate) mod admin;
#[cfg(feature = "relay")]
pub(crate) mod relay;
