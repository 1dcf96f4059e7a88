//! What librdkafka tells the publisher about its brokers between deliveries: whether every
//! broker is down right now. The relay asks it while a publish is in flight
//! ([`Publisher::unavailable`](crate::relay::Publisher::unavailable)), so that `outbox status`
//! shows the relay waiting for the broker as soon as librdkafka knows, not only once the
//! publish has run into `message.timeout.ms`.

use std::sync::{Arc, Mutex, PoisonError};

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Whether all brokers are down, as last reported; shared by the publisher and the context
/// of each producer it creates.
#[derive(Debug, Default)]
pub(crate) struct BrokerWatch {
    down: Mutex<Option<String>>,
}

impl BrokerWatch {
    /// librdkafka's reason, while every broker is down.
    pub(crate) fn down(&self) -> Option<String> {
        self.down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A broker acknowledged a message: it is reachable again. (librdkafka reports when the
    /// last broker goes down, never when one comes back.)
    pub(crate) fn reached(&self) {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        if down.is_some() {
            *down = None;
        }
    }

    fn all_down(&self, reason: String) {
        *self.down.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
    }
}

/// The producers' librdkafka context: records "all brokers down" in the [`BrokerWatch`] and
/// logs librdkafka's global errors as the default context does.
pub(crate) struct WatchContext(pub(crate) Arc<BrokerWatch>);

impl ClientContext for WatchContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.0
                .all_down(format!("no Kafka broker reachable: {reason}"));
        }
        // The default context's target, so that existing log filters keep working.
        tracing::error!(target: "rdkafka::client", "librdkafka: {error}: {reason}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_brokers_down_until_a_broker_is_reached() {
        let watch = Arc::new(BrokerWatch::default());
        let context = WatchContext(watch.clone());
        context.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "one broker",
        );
        assert_eq!(watch.down(), None, "one broker down is not an outage");
        context.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "2/2 brokers are down",
        );
        assert_eq!(
            watch.down().as_deref(),
            Some("no Kafka broker reachable: 2/2 brokers are down")
        );
        watch.reached();
        assert_eq!(watch.down(), None);
    }
}
