//! librdkafka settings of the consumer and of its dead-letter producer: defaults and checks.

use std::collections::BTreeMap;

use rdkafka::error::KafkaError;

use crate::kafka::KafkaConfigError;

/// Consumer settings applied before the user's.
pub(super) const DEFAULTS: [(&str, &str); 7] = [
    ("enable.auto.offset.store", "false"),
    ("enable.auto.commit", "true"),
    // A new group starts from the beginning: an outbox consumer must not skip events that
    // were published before it first ran.
    ("auto.offset.reset", "earliest"),
    ("enable.partition.eof", "false"),
    ("client.id", "outbox-consumer"),
    // How often librdkafka refreshes topic metadata; it is also how soon a group member
    // notices a subscribed topic that was created after it started (librdkafka's default,
    // 300,000 ms, left such a consumer idle for five minutes). One small metadata request
    // every 5 s per consumer.
    ("topic.metadata.refresh.interval.ms", "5000"),
    // librdkafka's statistics, from which the consumer sets `outbox_consumer_lag_messages`
    // per partition: one JSON document every 5 s, parsed off the message path (in the poll
    // between two messages). "0" turns them, and the lag gauge, off.
    ("statistics.interval.ms", "5000"),
];

/// Settings the dead-letter producer takes from the consumer's, so that it reaches the same
/// cluster the same way.
pub(super) const SHARED_PREFIXES: [&str; 4] = ["bootstrap.servers", "security.", "ssl.", "sasl."];

pub(super) fn check_settings(settings: &BTreeMap<String, String>) -> Result<(), KafkaConfigError> {
    if settings
        .get("bootstrap.servers")
        .is_none_or(|b| b.trim().is_empty())
    {
        return Err(KafkaConfigError::MissingBrokers);
    }
    if !matches!(
        settings["enable.auto.offset.store"]
            .to_ascii_lowercase()
            .as_str(),
        "false" | "f" | "0"
    ) {
        return Err(KafkaConfigError::Forbidden {
            key: "enable.auto.offset.store".into(),
            value: settings["enable.auto.offset.store"].clone(),
            reason: "the consumer stores an offset only once its message is done (the \
                     handler's transaction committed, a duplicate was recognised, or the \
                     message was dead-lettered)",
        });
    }
    Ok(())
}

pub(super) fn config_error(e: KafkaError) -> KafkaConfigError {
    match e {
        KafkaError::ClientConfig(_, reason, key, value) => {
            KafkaConfigError::Invalid { key, value, reason }
        }
        KafkaError::ClientCreation(reason) => KafkaConfigError::Rejected { reason },
        other => KafkaConfigError::Rejected {
            reason: other.to_string(),
        },
    }
}
