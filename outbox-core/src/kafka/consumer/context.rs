//! The librdkafka contexts of the consumer and of its dead-letter producer: librdkafka's log
//! through `tracing`, rate-limited (see `kafka::log`), and the consumer's lag per partition
//! from librdkafka's statistics.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use rdkafka::ClientContext;
use rdkafka::Statistics;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;

use crate::kafka::log::LogLimiter;

/// The consumer as the runtime holds it.
pub(crate) type Inner = StreamConsumer<RuntimeContext>;

/// The dead-letter producer.
pub(crate) type DeadLetterProducer = FutureProducer<LogContext>;

/// The dead-letter producer's context: its log, rate-limited.
pub(crate) struct LogContext(pub(crate) Arc<LogLimiter>);

impl ClientContext for LogContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.0.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.error(&error, reason);
    }
}

/// The consumer's context: its log, rate-limited, and the lag gauge.
pub(crate) struct RuntimeContext(pub(crate) Arc<LogLimiter>, pub(crate) Lagging);

/// The partitions whose lag the last statistics reported.
pub(crate) type Lagging = Mutex<BTreeSet<(String, i32)>>;

impl ClientContext for RuntimeContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.0.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.error(&error, reason);
    }

    /// librdkafka's statistics, every `statistics.interval.ms` (5 s by default here): sets
    /// `outbox_consumer_lag_messages{topic, partition}` for every partition whose lag is known,
    /// and 0 for those whose lag was known before and no longer is (a partition revoked in a
    /// rebalance: its new owner reports it), so that a sum over consumers stays true.
    fn stats(&self, statistics: Statistics) {
        let gauge = |topic: &str, partition: i32| {
            metrics::gauge!(
                "outbox_consumer_lag_messages",
                "topic" => topic.to_owned(),
                "partition" => partition.to_string()
            )
        };
        let mut now = BTreeSet::new();
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                if let Some(lag) = lag(*partition, p.consumer_lag_stored, p.consumer_lag) {
                    gauge(topic, *partition).set(lag as f64);
                    now.insert((topic.clone(), *partition));
                }
            }
        }
        let mut before = self.1.lock().unwrap_or_else(PoisonError::into_inner);
        for (topic, partition) in before.difference(&now) {
            gauge(topic, *partition).set(0.0);
        }
        *before = now;
    }
}

impl ConsumerContext for RuntimeContext {}

/// A partition's lag in messages: the high watermark minus the offset stored for commit
/// (`consumer_lag_stored`: the consumer stores an offset once its message is done, so this
/// counts the messages not done yet), else minus the committed offset (`consumer_lag`, before
/// this consumer finished a message of the partition). `None` for librdkafka's internal
/// partition (-1) and while both are unknown (-1: a partition not assigned, or no offset yet).
fn lag(partition: i32, stored: i64, committed: i64) -> Option<i64> {
    if partition < 0 {
        return None;
    }
    [stored, committed].into_iter().find(|lag| *lag >= 0)
}

#[cfg(test)]
mod tests {
    use super::lag;

    #[test]
    fn lag_is_the_stored_one_else_the_committed_one() {
        assert_eq!(lag(0, 3, 10), Some(3));
        assert_eq!(lag(0, -1, 10), Some(10));
        assert_eq!(lag(0, 0, 10), Some(0));
        assert_eq!(lag(0, -1, -1), None);
        assert_eq!(lag(-1, 5, 5), None, "librdkafka's internal partition");
    }
}
