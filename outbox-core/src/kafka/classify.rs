//! Whose fault a Kafka error is: one table from librdkafka's error codes to the relay's two
//! fault classes (DESIGN §6).
//!
//! - **Outage** ([`Delivery::Unavailable`]): the broker, the network or the producer is at
//!   fault, or the outcome is unknown. No attempt is counted, nothing is dead-lettered; the
//!   relay gives the message back and waits for the broker.
//! - **Poison** ([`Delivery::Failed`]): a reachable broker refused *this record* for itself
//!   (too large, a topic that is invalid, missing or forbidden, a corrupt record). It counts
//!   an attempt and is dead-lettered after `max_attempts`.
//!
//! The idempotent producer retries every retriable error itself until `message.timeout.ms`,
//! and then reports the message timed out; so a code other than a timeout reaches us only
//! when librdkafka gave up on it as permanent, or from a local check before sending.
//!
//! **Codes not in the table are outages.** Both mistakes block something: a transient error
//! taken for poison dead-letters a healthy event, which breaks its aggregate's order for good
//! (later events wait behind it, or skip it) and needs an operator; poison taken for an
//! outage keeps one aggregate waiting and the relay backing off (at most
//! `outage_backoff.max` per batch) while `outbox status` shows the relay
//! `waiting_for_broker` with the error, and delivers it as soon as the cause is fixed. The
//! second loses nothing and keeps order, so it is the safe side. It is bounded by the poison
//! list: every error a broker returns for one record (its size, its topic, its contents) is
//! listed as poison, so what falls through are cluster-, connection- or producer-wide
//! conditions, which are outages by nature.

use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};

use crate::relay::Delivery;

/// The two fault classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultClass {
    /// The broker, the network or the producer: wait, count nothing.
    Outage,
    /// The record itself: count an attempt.
    Poison,
}

/// The class of a librdkafka error code.
pub(crate) fn class_of(code: C) -> FaultClass {
    match code {
        // The record's own size or shape.
        C::MessageSizeTooLarge
        | C::InvalidMessageSize
        | C::MessageBatchTooLarge
        | C::InvalidMessage // CORRUPT_MESSAGE: the record failed its CRC or shape check
        | C::InvalidRecord
        | C::InvalidTimestamp
        | C::BadMessage
        | C::BadCompression
        | C::KeySerialization
        | C::ValueSerialization
        | C::InvalidArgument // refused by the local checks of `produce` for these arguments
        | C::UnsupportedForMessageFormat
        | C::PolicyViolation
        // The record's topic. An unknown topic is reported only after the broker answered a
        // metadata request without it for `topic.metadata.propagation.max.ms` (while no broker
        // answers, the message waits and then times out: an outage); so the broker, reachable,
        // says the topic does not exist and will not be auto-created. The event names a topic
        // that needs creating; once it is, `outbox dead retry` sends the dead letters.
        | C::InvalidTopic
        | C::TopicAuthorizationFailed
        | C::UnknownTopic
        | C::UnknownTopicOrPartition
        | C::UnknownPartition
        | C::UnsupportedCompressionType => FaultClass::Poison,

        // Listed for the tests and the reader; the `_` arm says the same.
        C::AllBrokersDown
        | C::BrokerTransportFailure
        | C::Resolve
        | C::MessageTimedOut
        | C::OperationTimedOut
        | C::RequestTimedOut
        | C::TimedOutQueue
        | C::QueueFull
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::BrokerNotAvailable
        | C::ReplicaNotAvailable
        | C::PreferredLeaderNotAvailable
        | C::EligibleLeadersNotAvailable
        | C::NetworkException
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::ISRInsufficient
        | C::KafkaStorageError
        | C::ThrottlingQuotaExceeded
        | C::CoordinatorLoadInProgress
        | C::CoordinatorNotAvailable
        | C::NotCoordinator
        | C::NotController
        | C::PurgeQueue
        | C::PurgeInflight
        | C::Fatal
        | C::OutOfOrderSequenceNumber
        | C::UnknownProducerId
        | C::InvalidProducerEpoch
        | C::ProducerFenced
        | C::Fenced
        | C::BrokerDestroy
        | C::DestroyBroker
        | C::Retry
        | C::Interrupted
        | C::Authentication
        | C::SaslAuthenticationFailed
        | C::ClusterAuthorizationFailed
        | C::SSL
        | C::RebootstrapRequired
        | C::Unknown => FaultClass::Outage,
        _ => FaultClass::Outage,
    }
}

/// The class of a `KafkaError`: by its code, an outage when it has none (the client itself
/// failed).
pub(crate) fn class_of_error(e: &KafkaError) -> FaultClass {
    e.rdkafka_error_code().map_or(FaultClass::Outage, class_of)
}

/// A failed delivery of the given class with `reason`.
pub(crate) fn delivery(class: FaultClass, reason: String) -> Delivery {
    match class {
        FaultClass::Outage => Delivery::Unavailable(reason),
        FaultClass::Poison => Delivery::Failed(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_are_outages() {
        for code in [
            C::AllBrokersDown,
            C::BrokerTransportFailure,
            C::Resolve,
            C::MessageTimedOut,
            C::OperationTimedOut,
            C::RequestTimedOut,
            C::TimedOutQueue,
            C::QueueFull,
            C::LeaderNotAvailable,
            C::NotLeaderForPartition,
            C::FencedLeaderEpoch,
            C::UnknownLeaderEpoch,
            C::BrokerNotAvailable,
            C::ReplicaNotAvailable,
            C::PreferredLeaderNotAvailable,
            C::EligibleLeadersNotAvailable,
            C::NetworkException,
            C::NotEnoughReplicas,
            C::NotEnoughReplicasAfterAppend,
            C::ISRInsufficient,
            C::KafkaStorageError,
            C::ThrottlingQuotaExceeded,
            C::CoordinatorLoadInProgress,
            C::CoordinatorNotAvailable,
            C::NotCoordinator,
            C::NotController,
            C::PurgeQueue,
            C::PurgeInflight,
            C::Fatal,
            C::OutOfOrderSequenceNumber,
            C::UnknownProducerId,
            C::InvalidProducerEpoch,
            C::ProducerFenced,
            C::Fenced,
            C::BrokerDestroy,
            C::DestroyBroker,
            C::Retry,
            C::Interrupted,
            C::Authentication,
            C::SaslAuthenticationFailed,
            C::ClusterAuthorizationFailed,
            C::SSL,
            C::RebootstrapRequired,
            C::Unknown,
        ] {
            assert_eq!(class_of(code), FaultClass::Outage, "{code:?}");
        }
    }

    #[test]
    fn the_records_own_faults_are_poison() {
        for code in [
            C::MessageSizeTooLarge,
            C::InvalidMessageSize,
            C::MessageBatchTooLarge,
            C::InvalidMessage,
            C::InvalidRecord,
            C::InvalidTimestamp,
            C::BadMessage,
            C::BadCompression,
            C::KeySerialization,
            C::ValueSerialization,
            C::InvalidArgument,
            C::UnsupportedForMessageFormat,
            C::PolicyViolation,
            C::InvalidTopic,
            C::TopicAuthorizationFailed,
            C::UnknownTopic,
            C::UnknownTopicOrPartition,
            C::UnknownPartition,
            C::UnsupportedCompressionType,
        ] {
            assert_eq!(class_of(code), FaultClass::Poison, "{code:?}");
        }
    }

    #[test]
    fn codes_not_in_the_table_are_outages() {
        // Consumer- and admin-side codes a producer should never see: the safe side.
        for code in [
            C::RebalanceInProgress,
            C::GroupIdNotFound,
            C::State,
            C::Fail,
        ] {
            assert_eq!(class_of(code), FaultClass::Outage, "{code:?}");
        }
        assert_eq!(
            class_of_error(&KafkaError::Canceled),
            FaultClass::Outage,
            "no code: the client failed"
        );
        assert_eq!(
            class_of_error(&KafkaError::MessageProduction(C::MessageSizeTooLarge)),
            FaultClass::Poison
        );
        assert!(delivery(FaultClass::Outage, "x".into()).is_outage());
    }
}
