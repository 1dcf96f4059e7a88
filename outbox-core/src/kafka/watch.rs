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
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::log::LogLimiter;
use crate::relay::Delivery;

/// Whether all brokers are down, as last reported; shared by the publisher and the context
/// of each producer it creates.
#[derive(Debug, Default)]
pub(crate) struct BrokerWatch {
    /// The producer's `bootstrap.servers`, named in every outage reason.
    brokers: String,
    down: Mutex<Option<String>>,
    /// librdkafka's last error other than "all brokers down", until a broker acknowledges
    /// again: the cause an outage's reason names (a TLS handshake or SASL authentication that
    /// failed says so here; "all brokers down" alone does not).
    last_error: Mutex<Option<String>>,
    /// While publishes await reports: since when without an acknowledgement.
    silent_since: Mutex<Option<Instant>>,
    /// How many publishes await reports (the relay has several batches in flight).
    awaiting: Mutex<usize>,
}

impl BrokerWatch {
    /// A watch of the cluster at `brokers` (`bootstrap.servers`).
    pub(crate) fn new(brokers: impl Into<String>) -> Self {
        BrokerWatch {
            brokers: brokers.into(),
            ..BrokerWatch::default()
        }
    }

    /// ` at <bootstrap servers>`, or nothing if unknown.
    fn at(&self) -> String {
        if self.brokers.is_empty() {
            String::new()
        } else {
            format!(" at {}", self.brokers)
        }
    }

    /// Names the cluster in the reasons of outages (`Unavailable`), which the relay logs and
    /// `outbox status` shows, with librdkafka's [last error](Self::last_error) if any:
    /// "... (Kafka at 127.0.0.1:9092; last error: ... SSL handshake failed ...)".
    pub(crate) fn name_brokers(&self, outcomes: &mut [Delivery]) {
        let last = self.last_error();
        if self.brokers.is_empty() && last.is_none() {
            return;
        }
        let mut note = format!("Kafka{}", self.at());
        if let Some(last) = &last {
            note.push_str(&format!("; last error: {last}"));
        }
        for outcome in outcomes {
            if let Delivery::Unavailable(reason) = outcome
                && (self.brokers.is_empty() || !reason.contains(&self.brokers))
            {
                reason.push_str(&format!(" ({note})"));
            }
        }
    }

    /// librdkafka's last error other than "all brokers down" since a broker last
    /// acknowledged, e.g. `ssl://k1:9093/bootstrap: SSL handshake failed: ... certificate
    /// verify failed ...`; secret settings' values already hidden.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// librdkafka's reason, while every broker is down, with its [last error](Self::last_error)
    /// (which often comes after "all brokers down": a broker that went away is reconnected,
    /// and only then refuses the TLS handshake).
    pub(crate) fn down(&self) -> Option<String> {
        let down = self
            .down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .map(|mut reason| {
                if let Some(last) = self.last_error() {
                    reason.push_str(&format!("; last error: {last}"));
                }
                reason
            });
        down.or_else(|| {
            let since = (*self
                .silent_since
                .lock()
                .unwrap_or_else(PoisonError::into_inner))?;
            let silent = since.elapsed();
            (silent >= SILENCE).then(|| {
                format!(
                    "Kafka{} has acknowledged nothing for {} s",
                    self.at(),
                    silent.as_secs()
                )
            })
        })
    }

    /// A publish starts (`true`) or ends (`false`) awaiting delivery reports. The silence is
    /// timed from the first of several concurrent publishes, and ends with the last.
    pub(crate) fn awaiting(&self, awaiting: bool) {
        let mut count = self.awaiting.lock().unwrap_or_else(PoisonError::into_inner);
        let mut silent = self
            .silent_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if awaiting {
            *count += 1;
            if *count == 1 {
                *silent = Some(Instant::now());
            }
        } else {
            *count = count.saturating_sub(1);
            if *count == 0 {
                *silent = None;
            }
        }
    }

    /// A publish awaits delivery reports until the guard is dropped (also when the publish
    /// is cancelled, e.g. by the relay's publish timeout).
    pub(crate) fn awaiting_reports(&self) -> AwaitingReports<'_> {
        self.awaiting(true);
        AwaitingReports(self)
    }

    /// A broker acknowledged a message: it is reachable again. (librdkafka reports when the
    /// last broker goes down, never when one comes back.)
    pub(crate) fn reached(&self) {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        if down.is_some() {
            *down = None;
        }
        drop(down);
        let mut last = self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.is_some() {
            *last = None;
        }
        drop(last);
        let mut silent = self
            .silent_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if silent.is_some() {
            *silent = Some(Instant::now());
        }
    }

    fn all_down(&self, reason: &str) {
        let reason = format!("no Kafka broker reachable{}: {reason}", self.at());
        *self.down.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
    }

    fn error(&self, reason: &str) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(reason.to_owned());
    }
}

/// See [`BrokerWatch::awaiting_reports`].
pub(crate) struct AwaitingReports<'a>(&'a BrokerWatch);

impl Drop for AwaitingReports<'_> {
    fn drop(&mut self) {
        self.0.awaiting(false);
    }
}

/// The producers' librdkafka context: records "all brokers down" in the [`BrokerWatch`], and
/// passes librdkafka's log and global errors to `tracing`, rate-limited (see `kafka::log`).
pub(crate) struct WatchContext(pub(crate) Arc<BrokerWatch>, pub(crate) Arc<LogLimiter>);

impl ClientContext for WatchContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.1.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.0.all_down(reason);
        } else {
            self.0.error(&self.1.hide(reason));
        }
        self.1.error(&error, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_brokers_down_until_a_broker_is_reached() {
        let watch = Arc::new(BrokerWatch::default());
        let context = WatchContext(watch.clone(), Arc::new(LogLimiter::new("")));
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
            Some("no Kafka broker reachable: 2/2 brokers are down; last error: one broker")
        );
        watch.reached();
        assert_eq!(watch.down(), None);
    }

    #[test]
    fn all_brokers_down_names_the_last_error_without_secrets() {
        let watch = Arc::new(BrokerWatch::new("k1:9093"));
        let log = LogLimiter::new("k1:9093").hiding(vec!["hunter2".to_owned()]);
        let context = WatchContext(watch.clone(), Arc::new(log));
        context.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        context.error(
            KafkaError::Global(RDKafkaErrorCode::Authentication),
            "sasl_ssl://k1:9093/bootstrap: SASL authentication error: bad password hunter2",
        );
        assert_eq!(
            watch.down().as_deref(),
            Some(
                "no Kafka broker reachable at k1:9093: 1/1 brokers are down; last error: \
                 sasl_ssl://k1:9093/bootstrap: SASL authentication error: bad password ***"
            )
        );
        let mut outcomes = [Delivery::Unavailable("Message timed out".into())];
        watch.name_brokers(&mut outcomes);
        assert_eq!(
            outcomes,
            [Delivery::Unavailable(
                "Message timed out (Kafka at k1:9093; last error: sasl_ssl://k1:9093/bootstrap: \
                 SASL authentication error: bad password ***)"
                    .into()
            )]
        );
        watch.reached();
        assert_eq!(watch.last_error(), None, "an acknowledgement clears it");
    }

    #[test]
    fn outage_reasons_name_the_bootstrap_servers() {
        let watch = Arc::new(BrokerWatch::new("k1:9092,k2:9092"));
        let context = WatchContext(watch.clone(), Arc::new(LogLimiter::new("k1:9092,k2:9092")));
        context.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "2/2 brokers are down",
        );
        assert_eq!(
            watch.down().as_deref(),
            Some("no Kafka broker reachable at k1:9092,k2:9092: 2/2 brokers are down")
        );
        let mut outcomes = vec![
            Delivery::Published,
            Delivery::Unavailable("delivery to topic `order` failed: Message timed out".into()),
            Delivery::Failed("too large".into()),
        ];
        watch.name_brokers(&mut outcomes);
        assert_eq!(
            outcomes,
            [
                Delivery::Published,
                Delivery::Unavailable(
                    "delivery to topic `order` failed: Message timed out (Kafka at \
                     k1:9092,k2:9092)"
                        .into()
                ),
                Delivery::Failed("too large".into()),
            ]
        );
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

    #[test]
    fn silence_lasts_while_any_of_several_publishes_awaits_reports() {
        let watch = BrokerWatch::default();
        watch.awaiting(true);
        watch.awaiting(true);
        *watch.silent_since.lock().unwrap() = Some(Instant::now() - SILENCE);
        watch.awaiting(false);
        assert!(
            watch.down().is_some(),
            "one publish still awaits its reports: the silence goes on"
        );
        watch.awaiting(false);
        assert_eq!(watch.down(), None);
    }
}
