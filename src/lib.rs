//! outbox: a Diesel-native transactional outbox (work in progress).

pub use outbox_core::*;
