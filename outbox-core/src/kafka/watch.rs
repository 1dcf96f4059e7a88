//! What the publisher knows about its brokers while a publish is in flight: librdkafka
//! reported every broker down (refused connections), or no acknowledgement came for a while
//! (a network that drops packets: librdkafka's connections stay up and report nothing until
//! `socket.timeout.ms`). The relay asks it
//! ([`Publisher::unavailable`](crate::relay::Publisher::unavailable)), so that `outbox status`
//! shows the relay waiting for the broker within seconds, not only once the publish has run
//! into `message.timeout.ms`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a publish may go without any acknowledgement before the broker counts as not
/// answering. Acknowledgements of a healthy broker come within milliseconds (`linger.ms` plus
/// a round trip), so a few seconds of silence is an outage or a broker in trouble; a hint for
/// `outbox status` only, never a reason to fail a message.
const SILENCE: Duration = Duration::from_secs(3);

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Whether all brokers are down, as last reported; shared by the publisher and the context
/// of each producer it creates.
#[derive(Debug, Default)]
pub(crate) struct BrokerWatch {
    down: Mutex<Option<String>>,
    /// While a publish awaits reports: since when without an acknowledgement.
    silent_since: Mutex<Option<Instant>>,
}

impl BrokerWatch {
    /// librdkafka's reason, while every broker is down.
    pub(crate) fn down(&self) -> Option<String> {
        let down = self
            .down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        down.or_else(|| {
            let since = (*self
                .silent_since
                .lock()
                .unwrap_or_else(PoisonError::into_inner))?;
            let silent = since.elapsed();
            (silent >= SILENCE)
                .then(|| format!("Kafka has acknowledged nothing for {} s", silent.as_secs()))
        })
    }

    /// A publish starts (`true`) or ends (`false`) awaiting delivery reports.
    pub(crate) fn awaiting(&self, awaiting: bool) {
        *self
            .silent_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = awaiting.then(Instant::now);
    }

    /// A broker acknowledged a message: it is reachable again. (librdkafka reports when the
    /// last broker goes down, never when one comes back.)
    pub(crate) fn reached(&self) {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        if down.is_some() {
            *down = None;
        }
        drop(down);
        let mut silent = self
            .silent_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if silent.is_some() {
            *silent = Some(Instant::now());
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

    #[test]
    fn silence_while_awaiting_reports_counts_as_not_answering() {
        let watch = BrokerWatch::default();
        watch.awaiting(true);
        assert_eq!(watch.down(), None, "a publish just started");
        *watch.silent_since.lock().unwrap() = Some(Instant::now() - SILENCE);
        assert!(
            watch
                .down()
                .is_some_and(|d| d.starts_with("Kafka has acknowledged nothing for 3 s"))
        );
        watch.reached();
        assert_eq!(watch.down(), None, "an acknowledgement resets the silence");
        *watch.silent_since.lock().unwrap() = Some(Instant::now() - SILENCE);
        watch.awaiting(false);
        assert_eq!(watch.down(), None, "no publish in flight: nothing to say");
    }
}
