//! Whose fault a Kafka error is: one table from librdkafka's error codes to the relay's two
//! fault classes (DESIGN §6).
//!
//! - **Outage** ([`Delivery::Unavailable`]): the broker, the network, the producer or the
//!   record's *topic* is at fault, or the outcome is unknown. No attempt is counted, nothing is
//!   dead-lettered; the relay gives the message back and waits (`waiting_for_broker` in
//!   `outbox status`, with the error).
//! - **Poison** ([`Delivery::Failed`]): a reachable broker refused *this record* for itself
//!   (too large, corrupt, refused by the local checks of `produce`). It counts an attempt and
//!   is dead-lettered after `max_attempts`.
//!
//! **A code that concerns the topic or the cluster, not the record, is an outage**: every
//! record sent there gets the same answer until an operator acts, so counting attempts would
//! dead-letter the whole topic within minutes (an ACL slip, a topic not created yet) while
//! nothing is wrong with the events. These topic-wide codes ([`is_topic_wide`]):
//!
//! | code | why it is not the record's fault |
//! |---|---|
//! | `TOPIC_AUTHORIZATION_FAILED` | the producer's ACL on the topic |
//! | `UNKNOWN_TOPIC_OR_PART`, local `UnknownTopic`, `UnknownPartition` | the topic does not exist (auto-creation off) or its metadata is not there yet: reported only after a reachable broker answered without it for `topic.metadata.propagation.max.ms` |
//! | `INVALID_TOPIC_EXCEPTION` | the topic's name (the router's or the event type's configuration), the same for all its events; fixed by configuration, after which they are delivered in order |
//! | `INVALID_TIMESTAMP` | the relay does not set timestamps, so librdkafka stamps the relay's clock: the clock is skewed beyond the topic's `message.timestamp.*` limits, for every record |
//! | `UNSUPPORTED_FOR_MESSAGE_FORMAT` | the topic's message format cannot hold headers, which every outbox record has |
//! | `UNSUPPORTED_COMPRESSION_TYPE` | the producer's `compression.type` against the topic's configuration |
//!
//! Their reason names the topic and the code, and every failed delivery is counted in
//! `outbox_relay_publish_errors_total{topic, code, class}` ([`failed`]). The relay has no
//! per-topic pause: while one topic is refused it waits with the outage backoff after each
//! batch that met the refusal (at most `outage_backoff.max`). Other topics' events claimed in
//! the same batches are delivered, but a refused topic with a batch's worth of pending events
//! fills every claim and holds the rest back until it is fixed, as a broker outage would.
//!
//! The idempotent producer retries every retriable error itself until `message.timeout.ms`,
//! and then reports the message timed out; so a code other than a timeout reaches us only
//! when librdkafka gave up on it as permanent, or from a local check before sending.
//!
//! **Codes not in the table are outages.** Both mistakes block something: a transient error
//! taken for poison dead-letters a healthy event, which breaks its aggregate's order for good
//! (later events wait behind it, or skip it) and needs an operator; poison taken for an
//! outage keeps one aggregate waiting and the relay backing off while `outbox status` shows
//! the relay `waiting_for_broker` with the error, and delivers it as soon as the cause is
//! fixed. The second loses nothing and keeps order, so it is the safe side. It is bounded by
//! the poison list: every error a broker returns for one record (its size, its shape, its
//! contents) is listed as poison, so what falls through are topic-, cluster-, connection- or
//! producer-wide conditions, which are outages by nature.

use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};

use crate::relay::Delivery;

/// The two fault classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultClass {
    /// The broker, the network, the producer or the topic: wait, count nothing.
    Outage,
    /// The record itself: count an attempt.
    Poison,
}

impl FaultClass {
    /// `outage` or `poison`, the metrics' label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FaultClass::Outage => "outage",
            FaultClass::Poison => "poison",
        }
    }
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
        | C::BadMessage
        | C::BadCompression
        | C::KeySerialization
        | C::ValueSerialization
        | C::InvalidArgument // refused by the local checks of `produce` for these arguments
        | C::PolicyViolation => FaultClass::Poison,

        // The topic, not the record: see the module documentation.
        code if is_topic_wide(code) => FaultClass::Outage,

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

/// Whether `code` is a refusal of the whole topic (or of every record, by the relay's clock)
/// rather than of one record: an outage of that topic (see the module documentation).
pub(crate) fn is_topic_wide(code: C) -> bool {
    matches!(
        code,
        C::TopicAuthorizationFailed
            | C::UnknownTopicOrPartition
            | C::UnknownTopic
            | C::UnknownPartition
            | C::InvalidTopic
            | C::InvalidTimestamp
            | C::UnsupportedForMessageFormat
            | C::UnsupportedCompressionType
    )
}

/// The outcome of a message that `e` kept from `topic`, `reason` saying what happened. A
/// topic-wide refusal says so, naming the topic and the code, for the relay's log and
/// `outbox status`. Counted in `outbox_relay_publish_errors_total` by topic, code and class.
pub(crate) fn failed(topic: &str, e: &KafkaError, reason: String) -> Delivery {
    let code = e.rdkafka_error_code();
    let class = class_of_error(e);
    let name = code.map_or_else(|| "none".to_owned(), |c| format!("{c:?}"));
    metrics::counter!(
        "outbox_relay_publish_errors_total",
        "topic" => topic.to_owned(),
        "code" => name.clone(),
        "class" => class.as_str(),
    )
    .increment(1);
    let reason = match code {
        Some(c) if is_topic_wide(c) => format!(
            "{reason}; topic `{topic}` refuses every record ({name}), not this one for itself: \
             no attempt is counted, its events wait until the topic is fixed"
        ),
        _ => reason,
    };
    delivery(class, reason)
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
    use crate::kafka::test_recorder::CountingRecorder;

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
            C::BadMessage,
            C::BadCompression,
            C::KeySerialization,
            C::ValueSerialization,
            C::InvalidArgument,
            C::PolicyViolation,
        ] {
            assert_eq!(class_of(code), FaultClass::Poison, "{code:?}");
            assert!(!is_topic_wide(code), "{code:?}");
        }
    }

    /// An ACL slip, a topic not created, the relay's clock: every event of the topic would be
    /// dead-lettered within minutes if these counted attempts.
    #[test]
    fn refusals_of_the_whole_topic_are_outages() {
        for code in [
            C::TopicAuthorizationFailed,
            C::UnknownTopicOrPartition,
            C::UnknownTopic,
            C::UnknownPartition,
            C::InvalidTopic,
            C::InvalidTimestamp,
            C::UnsupportedForMessageFormat,
            C::UnsupportedCompressionType,
        ] {
            assert_eq!(class_of(code), FaultClass::Outage, "{code:?}");
            assert!(is_topic_wide(code), "{code:?}");
            let e = KafkaError::MessageProduction(code);
            assert!(
                failed("orders", &e, "delivery to topic `orders` failed".into()).is_outage(),
                "{code:?}"
            );
        }
    }

    #[test]
    fn a_topic_wide_refusal_names_its_topic_and_code_and_is_counted() {
        let recorder = CountingRecorder::default();
        let (refused, too_large) = metrics::with_local_recorder(&recorder, || {
            let acl = KafkaError::MessageProduction(C::TopicAuthorizationFailed);
            let refused = failed("orders", &acl, format!("delivery failed: {acl}"));
            failed("orders", &acl, "again".into());
            let size = KafkaError::MessageProduction(C::MessageSizeTooLarge);
            (refused, failed("orders", &size, "too large".into()))
        });
        let Delivery::Unavailable(reason) = refused else {
            panic!("an outage: {refused:?}");
        };
        assert!(
            reason.contains("topic `orders` refuses every record (TopicAuthorizationFailed)"),
            "{reason}"
        );
        assert_eq!(too_large, Delivery::Failed("too large".into()));
        assert_eq!(
            recorder.counts(),
            [
                (
                    "outbox_relay_publish_errors_total{class=outage,code=TopicAuthorizationFailed,topic=orders}".to_owned(),
                    2
                ),
                (
                    "outbox_relay_publish_errors_total{class=poison,code=MessageSizeTooLarge,topic=orders}".to_owned(),
                    1
                ),
            ]
        );
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
