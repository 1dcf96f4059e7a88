//! Keeping the values of Kafka settings out of errors, logs and `Debug` output (the rule for
//! which keys are secret is [`crate::redact::is_secret_key`]).

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

use super::KafkaConfigError;

/// Settings as `Debug` shows them: secret values as `***`.
pub(crate) struct Redacted<'a>(pub(crate) &'a [(String, String)]);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let v = if crate::redact::is_secret_key(k) {
                    crate::redact::REDACTED
                } else {
                    v.as_str()
                };
                (k, v)
            }))
            .finish()
    }
}

/// The values of `config`'s secret settings (see [`is_secret_key`](crate::redact::is_secret_key)).
pub(crate) fn secret_values(config: &ClientConfig) -> Vec<String> {
    // `config_map` hides a few values itself; `get` returns them all.
    config
        .config_map()
        .into_keys()
        .filter(|k| crate::redact::is_secret_key(k))
        .filter_map(|k| config.get(k))
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .collect()
}

/// librdkafka's refusal of `config`, with no setting's value in it: the value refused is
/// replaced in librdkafka's reason, and so is every secret setting's value in any message.
pub(crate) fn config_error(e: KafkaError, config: &ClientConfig) -> KafkaConfigError {
    let secrets = secret_values(config);
    let secrets = secrets.iter().map(String::as_str);
    match e {
        KafkaError::ClientConfig(_, reason, key, value) => {
            let quoted = format!("\"{value}\"");
            let reason = crate::redact::scrub(&reason, [quoted.as_str()]);
            let reason = if value.len() > 2 || crate::redact::is_secret_key(&key) {
                crate::redact::scrub(&reason, [value.as_str()])
            } else {
                reason
            };
            KafkaConfigError::Invalid {
                reason: crate::redact::scrub(&reason, secrets),
                key,
            }
        }
        KafkaError::ClientCreation(reason) => KafkaConfigError::Rejected {
            reason: crate::redact::scrub(&reason, secrets),
        },
        other => KafkaConfigError::Rejected {
            reason: crate::redact::scrub(&other.to_string(), secrets),
        },
    }
}
