//! The consumer's policies and defaults: what happens after a dead letter, to undecodable
//! messages, and the backoffs.

use std::time::Duration;

use crate::backoff::Backoff;

/// What happens to the later messages of a key (same topic, same key) once one of its
/// messages was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AfterDeadLetter {
    /// They are parked behind it: written to the dead-letter topic too, with the
    /// [`DLT_HEADER_PARKED_BEHIND`](super::DLT_HEADER_PARKED_BEHIND) header naming the
    /// dead letter they wait behind, and not handled, so that no later event of the key is
    /// applied before an earlier one. For as long as the consumer process runs (see
    /// `KafkaConsumer` on what a restart forgets).
    #[default]
    ParkKey,
    /// They are handled as usual: the key's later events are applied before the dead-lettered
    /// one is (if it ever is). For consumers whose effects do not depend on order.
    SkipAhead,
}

/// What happens to a message that cannot be handled at all: its headers or payload do not
/// decode (a [`DecodeError`](crate::DecodeError): garbage bytes, a missing header, a payload
/// that is not the event's shape, ...), or, by [`UnhandledPolicy::Undecodable`] and
/// [`NewerVersionPolicy::Undecodable`], its event type has no handler or its version is newer
/// than the handler knows. Either way the consumer goes on with the next message: never a
/// crash loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UndecodablePolicy {
    /// Write it to the dead-letter topic with the reason in the
    /// [`DLT_HEADER_ERROR`](super::DLT_HEADER_ERROR) header (and log it), then go on.
    /// Nothing is lost: the message can be replayed from there once a consumer understands it.
    #[default]
    DeadLetter,
    /// Log it at `error` level with the reason, and go on. The message stays in its topic (its
    /// offset says where) but this consumer group will not see it again.
    Skip,
}

/// What happens to a message of an event type that this consumer has no handler for.
///
/// A topic carries every event type of its aggregate, and a consumer handles those it needs:
/// a second service, or a producer deployed with a new event type before its consumers
/// (see `docs/evolving-events.md`, "Rolling deploys").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnhandledPolicy {
    /// Acknowledged (its offset stored) and counted, in
    /// [`ConsumerStats::unhandled`](super::ConsumerStats::unhandled) and the
    /// `outbox_consumer_unhandled_total` counter labelled by aggregate and event type. It is
    /// not dead-lettered and parks no key.
    #[default]
    Acknowledge,
    /// Treated as a message that cannot be handled, by the [`UndecodablePolicy`]: for a
    /// consumer that must handle every event type of its topics.
    Undecodable,
}

/// What happens to a message whose event version is newer than its handler's type knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NewerVersionPolicy {
    /// Held like an outage: the partitions are paused and the message is tried again with the
    /// outage backoff until a consumer that knows the version replaces this one (producers
    /// deployed before their consumers). Nothing is dead-lettered and no later message of
    /// the partition is applied before it. Visible in
    /// [`ConsumerStats::waiting_for_upgrade`](super::ConsumerStats::waiting_for_upgrade), the
    /// `outbox_consumer_waiting_for_upgrade` gauge and a warning naming the version.
    #[default]
    Hold,
    /// Treated as a message that cannot be handled, by the [`UndecodablePolicy`].
    Undecodable,
}

/// The retry backoff unless configured: 200 ms, doubling, at most 5 s, ±20 %.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(outbox_core::consumer::DEFAULT_RETRY_BACKOFF.initial, Duration::from_millis(200));
/// ```
pub const DEFAULT_RETRY_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(200),
    max: Duration::from_secs(5),
    multiplier: 2.0,
    jitter: 0.2,
};

/// The wait between attempts after a transient error (an outage) unless configured: 100 ms,
/// doubling, at most 2 s, ±20 %. Short at its longest, so that the consumer notices within
/// about 2 s that the outage is over; at most one attempt per 2 s is cheap for a database that
/// is away.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(outbox_core::consumer::DEFAULT_OUTAGE_BACKOFF.max, Duration::from_secs(2));
/// ```
pub const DEFAULT_OUTAGE_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(2),
    multiplier: 2.0,
    jitter: 0.2,
};

/// How many parked keys a consumer remembers unless configured (see
/// `KafkaConsumerBuilder::max_parked_keys`).
///
/// ```
/// assert_eq!(outbox_core::consumer::DEFAULT_MAX_PARKED_KEYS, 100_000);
/// ```
pub const DEFAULT_MAX_PARKED_KEYS: usize = 100_000;
