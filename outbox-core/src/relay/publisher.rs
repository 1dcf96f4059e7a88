//! What a relay publishes ([`OutboxMessage`]) and to what ([`Publisher`]).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::Headers;

/// An outbox row claimed by a relay, ready to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// The row's position in the outbox: the order of events, per aggregate.
    pub seq: i64,
    /// The event id (UUIDv7): consumers deduplicate on it.
    pub id: Uuid,
    /// The aggregate type, e.g. `"order"`; the default topic.
    pub aggregate_type: String,
    /// The aggregate id: the message key.
    pub aggregate_id: String,
    /// The event type, e.g. `"OrderCreated"`.
    pub event_type: String,
    /// The event's schema version.
    pub event_version: i32,
    /// The payload, JSON text.
    pub payload: String,
    /// The headers the event was published with.
    pub headers: Headers,
    /// The topic the event names, if any.
    pub topic: Option<String>,
    /// The aggregate's shard.
    pub shard: i16,
    /// When the event was written to the outbox.
    pub created_at: DateTime<Utc>,
    /// How many times a relay has claimed it, this time included.
    pub attempts: i32,
}

impl OutboxMessage {
    /// The topic: the one the event names, else its aggregate type.
    pub fn topic(&self) -> &str {
        self.topic.as_deref().unwrap_or(&self.aggregate_type)
    }

    /// The ordering key: events with equal keys are published in `seq` order.
    pub fn ordering_key(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }
}

/// The outcome of publishing one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The broker acknowledged the message (for Kafka: written to all in-sync replicas).
    Published,
    /// The message was not published; the error says why. The relay retries it with backoff
    /// and dead-letters it after the configured number of attempts.
    Failed(String),
    /// The message was not sent because an earlier message with the same ordering key in the
    /// same batch failed. The relay releases it without counting an attempt.
    NotAttempted,
}

/// A broker the relay publishes to: Kafka, the in-memory broker, or your own.
///
/// # Contract
/// - `publish` returns exactly one [`Delivery`] per message, in the batch's order.
/// - Messages with the same [`ordering_key`](OutboxMessage::ordering_key) are delivered in batch
///   order, and once one of them fails, no later one of the same key in the batch may be
///   delivered: report it [`Delivery::NotAttempted`] (or `Failed`). This is what lets the
///   ordered relay modes promise that no event of an aggregate is published before an earlier
///   one.
/// - It returns once every message has an outcome; the relay bounds it with a timeout shorter
///   than its lease.
/// - It never runs inside a database transaction: the relay calls it between two short,
///   committed statements.
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `batch` and reports each message's outcome.
    fn publish(&self, batch: &[OutboxMessage]) -> impl Future<Output = Vec<Delivery>> + Send;
}

impl<P: Publisher> Publisher for std::sync::Arc<P> {
    fn publish(&self, batch: &[OutboxMessage]) -> impl Future<Output = Vec<Delivery>> + Send {
        (**self).publish(batch)
    }
}
