//! The broker half of the test kit (feature `testing`): the events the
//! [`MemoryBroker`](crate::relay::MemoryBroker) received, typed
//! ([`MemoryBroker::published`](crate::relay::MemoryBroker::published)), and [`Faulty`], a
//! publisher wrapper that injects outages into any [`Publisher`](crate::relay::Publisher).
//!
//! Use it through `outbox::testing`, which adds the database half.

mod faulty;
mod published;

pub use faulty::{Fault, Faulty};
