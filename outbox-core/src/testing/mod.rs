//! The broker half of the test kit (feature `testing`): the events the
//! [`MemoryBroker`](crate::relay::MemoryBroker) received, typed
//! ([`MemoryBroker::published`](crate::relay::MemoryBroker::published)), and [`Faulty`], a
//! publisher wrapper that injects outages into any [`Publisher`](crate::relay::Publisher), and
//! [`check_old_payloads`], which proves that every registered version of an event still
//! decodes into today's type.
//!
//! Use it through `outbox::testing`, which adds the database half.

mod faulty;
mod old_payloads;
mod published;

pub use faulty::{Fault, Faulty};
pub use old_payloads::{OldPayload, OldPayloadError, check_old_payloads, check_old_payloads_in};
