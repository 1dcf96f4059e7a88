//! The relay: claims committed outbox rows, publishes them outside any transaction, and marks
//! them published only where it still holds their lease.

mod publisher;

pub use publisher::{Delivery, OutboxMessage, Publisher};
