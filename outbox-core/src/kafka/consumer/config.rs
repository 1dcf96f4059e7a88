//! librdkafka settings of the consumer and of its dead-letter producer: defaults and checks.

use std::collections::BTreeMap;

use std::sync::Arc;

use rdkafka::ClientConfig;

use super::context::{DeadLetterProducer, Inner, LogContext, RuntimeContext};
use crate::kafka::log::LogLimiter;

use crate::kafka::KafkaConfigError;
use crate::kafka::secrets::{config_error, secret_values};

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
            reason: "the consumer stores an offset only once its message is done (the \
                     handler's transaction committed, a duplicate was recognised, or the \
                     message was dead-lettered)",
        });
    }
    Ok(())
}

/// The consumer's librdkafka client and its dead-letter producer, from the defaults above, the
/// user's settings (`metadata.broker.list` read as `bootstrap.servers`) and the group; both log
/// through one rate limiter naming the brokers.
pub(super) fn clients(
    settings_given: Vec<(String, String)>,
    dead_letter_settings: &[(String, String)],
    group: &str,
) -> Result<(Inner, DeadLetterProducer), KafkaConfigError> {
    let mut settings: BTreeMap<String, String> = DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (key, value) in settings_given {
        let key = if key == "metadata.broker.list" {
            "bootstrap.servers".to_owned()
        } else {
            key
        };
        settings.insert(key, value);
    }
    settings.insert("group.id".into(), group.to_owned());
    check_settings(&settings)?;
    let mut config = ClientConfig::new();
    for (key, value) in &settings {
        config.set(key, value);
    }
    let brokers = settings["bootstrap.servers"].clone();
    let mut secrets = secret_values(&config);
    secrets.extend(
        dead_letter_settings
            .iter()
            .filter(|(k, v)| crate::redact::is_secret_key(k) && !v.is_empty())
            .map(|(_, v)| v.clone()),
    );
    let log = Arc::new(LogLimiter::new(brokers).hiding(secrets));
    let consumer: Inner = config
        .create_with_context(RuntimeContext(log.clone(), Default::default()))
        .map_err(|e| config_error(e, &config))?;

    let mut producer_config = ClientConfig::new();
    for (key, value) in settings
        .iter()
        .filter(|(k, _)| SHARED_PREFIXES.iter().any(|p| k.starts_with(p)))
    {
        producer_config.set(key, value);
    }
    producer_config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "10000")
        .set("client.id", "outbox-dead-letters");
    for (key, value) in dead_letter_settings {
        producer_config.set(key, value);
    }
    let producer: DeadLetterProducer = producer_config
        .create_with_context(LogContext(log))
        .map_err(|e| config_error(e, &producer_config))?;
    Ok((consumer, producer))
}
