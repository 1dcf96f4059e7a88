//! What a relay publishes ([`OutboxMessage`]) and to what ([`Publisher`]).

use std::fmt;
use std::time::Duration;

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
///
/// A failure says whose fault it is, because the relay treats the two very differently:
/// [`Failed`](Delivery::Failed) is the message's own fault (poison: it counts an attempt and
/// is dead-lettered after `max_attempts`), [`Unavailable`](Delivery::Unavailable) is the
/// broker's or the network's (an outage: it never counts an attempt and never dead-letters;
/// the relay gives the message back and backs off until the broker returns).
///
/// Two variants rather than one `Failed { error, class }`: a publisher must decide the class
/// at the place it creates the failure, and matching on the variant keeps that decision
/// visible in every `match`.
///
/// ```
/// use outbox_core::relay::Delivery;
/// let outage = Delivery::Unavailable("all brokers down".into());
/// assert!(outage.is_outage());
/// assert!(!Delivery::Failed("message too large".into()).is_outage());
/// assert_eq!(outage.error(), Some("all brokers down"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivery {
    /// The broker acknowledged the message (for Kafka: written to all in-sync replicas).
    Published,
    /// The broker refused the message for itself (too large, invalid or forbidden topic, a
    /// corrupt record): poison. The relay retries it with backoff, counting attempts, and
    /// dead-letters it after the configured number of attempts.
    Failed(String),
    /// The message could not be published because the broker or the network is unavailable
    /// (no broker reachable, a timeout, a leader election, a full local queue, throttling), or
    /// its outcome is unknown (no delivery report in time): an outage, never the message's
    /// fault. The relay gives it back without counting an attempt and publishes it again once
    /// the broker returns; a message whose outcome was unknown may so be published twice
    /// (at least once), never lost.
    Unavailable(String),
    /// The message was not sent because an earlier message with the same ordering key in the
    /// same batch failed. The relay releases it without counting an attempt.
    NotAttempted,
}

impl Delivery {
    /// Whether this is an outage ([`Delivery::Unavailable`]).
    pub fn is_outage(&self) -> bool {
        matches!(self, Delivery::Unavailable(_))
    }

    /// Whether the message was not published, for either reason.
    pub fn is_failure(&self) -> bool {
        matches!(self, Delivery::Failed(_) | Delivery::Unavailable(_))
    }

    /// The error of a failed or unavailable delivery.
    pub fn error(&self) -> Option<&str> {
        match self {
            Delivery::Failed(e) | Delivery::Unavailable(e) => Some(e),
            _ => None,
        }
    }

    /// The error of a failed or unavailable delivery, to append to.
    pub fn error_mut(&mut self) -> Option<&mut String> {
        match self {
            Delivery::Failed(e) | Delivery::Unavailable(e) => Some(e),
            _ => None,
        }
    }
}

/// A broker the relay publishes to: Kafka, the in-memory broker, or your own.
///
/// # Contract
/// - `publish` returns exactly one [`Delivery`] per message, in the batch's order.
/// - Messages with the same [`ordering_key`](OutboxMessage::ordering_key) are delivered in batch
///   order, and once one of them fails, no later one of the same key in the batch may be
///   delivered: report it [`Delivery::NotAttempted`] (or `Failed`/`Unavailable`). This is what
///   lets the ordered relay modes promise that no event of an aggregate is published before an
///   earlier one.
/// - A failure is classified: [`Delivery::Failed`] only when the broker refused that message
///   for itself (it costs an attempt and leads to a dead letter), [`Delivery::Unavailable`]
///   whenever the broker or the network is at fault or the outcome is unknown (it costs
///   nothing, and the relay waits for the broker). When unsure, say `Unavailable`: a healthy
///   event dead-lettered breaks its aggregate's order, an outage only waits.
/// - It returns once every message has an outcome; the relay bounds it with a timeout shorter
///   than its lease.
/// - It never runs inside a database transaction: the relay calls it between two short,
///   committed statements.
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `batch` and reports each message's outcome.
    fn publish(&self, batch: &[OutboxMessage]) -> impl Future<Output = Vec<Delivery>> + Send;

    /// Whether the broker is known to be unreachable right now, and why: asked while a
    /// publish is in flight, so that the relay reports itself waiting for the broker (in
    /// `outbox status`) during an outage, not only once the publish has timed out. The
    /// default knows nothing (`None`). A hint only: the outcomes of `publish` decide.
    ///
    /// ```
    /// use outbox_core::relay::{MemoryBroker, Publisher};
    /// let broker = MemoryBroker::new();
    /// assert_eq!(broker.unavailable(), None);
    /// broker.set_available(false);
    /// assert!(broker.unavailable().is_some());
    /// ```
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// Asks the broker, within `timeout`, whether it can take messages now: the start-up
    /// check of `outbox relay` and its `/readyz` probe. Kafka asks the cluster for its
    /// metadata. The default asks nothing and answers from
    /// [`unavailable`](Self::unavailable).
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_core::relay::{MemoryBroker, Publisher};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let broker = MemoryBroker::new();
    /// assert!(broker.ready(Duration::from_secs(1)).await.is_ok());
    /// broker.set_available(false);
    /// assert!(broker.ready(Duration::from_secs(1)).await.is_err());
    /// # }
    /// ```
    fn ready(&self, timeout: Duration) -> impl Future<Output = Result<(), NotReady>> + Send {
        let _ = timeout;
        std::future::ready(
            self.unavailable()
                .map_or(Ok(()), |why| Err(NotReady::new(why))),
        )
    }
}

impl<P: Publisher> Publisher for std::sync::Arc<P> {
    fn publish(&self, batch: &[OutboxMessage]) -> impl Future<Output = Vec<Delivery>> + Send {
        (**self).publish(batch)
    }

    fn unavailable(&self) -> Option<String> {
        (**self).unavailable()
    }

    fn ready(&self, timeout: Duration) -> impl Future<Output = Result<(), NotReady>> + Send {
        (**self).ready(timeout)
    }
}

/// Why [`Publisher::ready`] found the broker not ready: unreachable, refusing the login, or
/// without brokers, in the publisher's words.
///
/// ```
/// use outbox_core::relay::NotReady;
/// assert_eq!(NotReady::new("all brokers down").to_string(), "all brokers down");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    reason: String,
}

impl NotReady {
    /// A broker not ready, and why.
    pub fn new(reason: impl Into<String>) -> Self {
        NotReady {
            reason: reason.into(),
        }
    }

    /// Why, as [`Display`](fmt::Display) shows it.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for NotReady {}
