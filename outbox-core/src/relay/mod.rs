//! The relay: claims committed outbox rows, publishes them outside any transaction, and marks
//! them published only where it still holds their lease.
//!
//! The loop, per batch: **claim** up to `batch_size` pending rows in one short committed
//! statement (a lease: `locked_by`, `locked_until`, `attempts + 1`); **publish** them with no
//! transaction, row lock or connection checkout held; **settle** each message: mark it
//! published (or delete it), schedule a retry with exponential backoff and jitter, dead-letter
//! it after `max_attempts`, or release it. Settling only touches rows whose lease is still
//! this relay's (fencing), so a relay that stalled past its lease cannot overwrite another's
//! work. Delivery is at least once: a relay can publish and die before it marks.

mod config;
mod engine;
mod headers;
mod health;
mod key_order;
pub mod limits;
mod memory;
mod metrics;
mod publisher;
#[cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq"))]
mod router;
mod share;
mod stats;
mod store;

pub use crate::backoff::Backoff;
pub use config::{
    ConfigError, DEFAULT_MAX_IN_FLIGHT_BYTES, DeadLetterPolicy, MAX_IN_FLIGHT, MAX_LEASE,
    MAX_POLL_INTERVAL, MAX_RETENTION, Mode, RelayConfig, Retention, check_relay_id,
    default_relay_id,
};
pub use engine::Relay;
pub use headers::message_headers;
#[cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq"))]
pub(crate) use headers::wire_headers;
pub use health::{RelayHealth, RelayState};
pub use key_order::publish_in_key_order;
pub use memory::{MemoryBroker, MemoryRow, MemoryStore, Record, test_message};
pub use metrics::{METRICS, describe_metrics};
pub use publisher::{Delivery, NotReady, OutboxMessage, Publisher};
#[cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq"))]
pub(crate) use router::Router;
pub use share::{Share, fair_share, share};
pub use stats::RelayStats;
pub use store::{
    Claim, ClaimOrder, Completion, Failure, RelayIdInUse, RelayStore, ShardAssignment, StoreError,
    UnsupportedMode,
};
