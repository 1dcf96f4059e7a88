//! librdkafka's own log lines and global errors, through `tracing`, rate-limited.
//!
//! While a broker is unreachable librdkafka repeats the same few lines (connect failed, all
//! brokers down) at every reconnect attempt, for every client (the relay's producer, a
//! consumer and its dead-letter producer), and calls its global error callback each time.
//! Each client's [`LogLimiter`] lets through the first line of a kind, then at most one per
//! [`WINDOW`], saying how many it left out meanwhile. Measured with the relay's producer and
//! a broker cut for 40 s (tests/e2e/unreachable_broker.rs with `CUT` at 40 s): in the first
//! 30 s the limiter left out 57 "all brokers down" errors, 6 transport-failure errors and 2
//! connection-failure lines (librdkafka had already folded 35 to 43 identical connection
//! failures into each of those), and the relay wrote 20 lines in the 40 s, its own "broker
//! unavailable" warnings included.
//!
//! A line's kind is its level, its facility (`FAIL`, `CONFWARN`, ...) and its text up to the
//! first `(` (librdkafka's changing detail, e.g. `(after 0ms in state CONNECT)`), with runs of
//! digits counted as equal, so that "1/1 brokers are down" and "2/2 brokers are down" are one
//! kind. So are the same failure of two brokers: the line shown names one of them, and the
//! count covers both.
//!
//! Targets: log lines go to `librdkafka`, global errors to `rdkafka::client`, as rdkafka's
//! default context does, so existing log filters keep working.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// At most one line of a kind per window (after the first).
pub(crate) const WINDOW: Duration = Duration::from_secs(30);

/// Kinds remembered at once; beyond this the memory is cleared (a safety bound: librdkafka
/// has a few dozen kinds of line).
const MAX_KINDS: usize = 512;

/// How much of a line's text makes its kind.
const KIND_CHARS: usize = 96;

/// Rate-limits one librdkafka client's log and errors (see the module documentation).
#[derive(Debug)]
pub(crate) struct LogLimiter {
    /// The client's `bootstrap.servers`, named in the errors that mean no broker is reachable.
    brokers: String,
    /// Values of the client's secret settings, replaced by `***` in every line shown
    /// (librdkafka's configuration warnings quote values).
    secrets: Vec<String>,
    kinds: Mutex<HashMap<(u8, String), Seen>>,
}

#[derive(Debug)]
struct Seen {
    shown: Instant,
    suppressed: u64,
}

impl LogLimiter {
    pub(crate) fn new(brokers: impl Into<String>) -> Self {
        LogLimiter {
            brokers: brokers.into(),
            secrets: Vec::new(),
            kinds: Mutex::default(),
        }
    }

    /// Hides these values (the client's secret settings) in every line shown.
    pub(crate) fn hiding(mut self, secrets: Vec<String>) -> Self {
        self.secrets = secrets;
        self
    }

    /// `text` without any of the secrets.
    pub(crate) fn hide<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        if self
            .secrets
            .iter()
            .any(|s| !s.is_empty() && text.contains(s.as_str()))
        {
            crate::redact::scrub(text, self.secrets.iter().map(String::as_str)).into()
        } else {
            text.into()
        }
    }

    /// Whether to show a line of this kind now; `Some(n)`: yes, and `n` lines of its kind were
    /// left out since the last one shown.
    fn admit(&self, level: u8, facility: &str, text: &str) -> Option<u64> {
        self.admit_at(level, facility, text, Instant::now())
    }

    fn admit_at(&self, level: u8, facility: &str, text: &str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(PoisonError::into_inner);
        if kinds.len() >= MAX_KINDS {
            kinds.clear();
        }
        let key = (level, kind_of(facility, text));
        match kinds.get_mut(&key) {
            None => {
                kinds.insert(
                    key,
                    Seen {
                        shown: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
            Some(seen) if now.duration_since(seen.shown) >= WINDOW => {
                let suppressed = seen.suppressed;
                *seen = Seen {
                    shown: now,
                    suppressed: 0,
                };
                Some(suppressed)
            }
            Some(seen) => {
                seen.suppressed += 1;
                None
            }
        }
    }

    /// A librdkafka log line (its `log_cb`).
    pub(crate) fn log(&self, level: RDKafkaLogLevel, facility: &str, text: &str) {
        let text = &*self.hide(text);
        let Some(suppressed) = self.admit(level as u8, facility, text) else {
            return;
        };
        let more = more(suppressed);
        // librdkafka warns at every start that `enable.gapless.guarantee` (which the publisher
        // sets, see the `kafka` module's "Ordering") is experimental. It is the setting that
        // stops a producer instead of letting a later message of a key overtake a failed one;
        // the warning says nothing an operator can act on, so it goes to `debug`.
        if facility == "CONFWARN" && text.contains("enable.gapless.guarantee") {
            tracing::debug!(target: "librdkafka", "librdkafka: {facility} {text}{more}");
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {facility} {text}{more}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {facility} {text}{more}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {facility} {text}{more}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {facility} {text}{more}")
            }
        }
    }

    /// A librdkafka global error (its `error_cb`). "All brokers down" names the bootstrap
    /// servers, at `warn` (the client keeps trying; an outage, not a bug).
    pub(crate) fn error(&self, error: &KafkaError, reason: &str) {
        let reason = &*self.hide(reason);
        let code = error.rdkafka_error_code().map_or(-1, |c| c as i32);
        let Some(suppressed) = self.admit(u8::MAX, &code.to_string(), reason) else {
            return;
        };
        let more = more(suppressed);
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            tracing::warn!(
                target: "rdkafka::client",
                "no Kafka broker reachable at {}: {reason}{more}", self.brokers
            );
        } else {
            tracing::error!(target: "rdkafka::client", "librdkafka: {error}: {reason}{more}");
        }
    }
}

/// ` (n similar lines left out in the last 30 s)`, or nothing.
fn more(suppressed: u64) -> String {
    if suppressed == 0 {
        String::new()
    } else {
        format!(
            " ({suppressed} similar line(s) left out in the last {} s)",
            WINDOW.as_secs()
        )
    }
}

/// A line's kind: its facility and its text up to the first `(`, digit runs as `#`.
fn kind_of(facility: &str, text: &str) -> String {
    let mut kind = String::with_capacity(facility.len() + KIND_CHARS + 1);
    kind.push_str(facility);
    kind.push(' ');
    let mut in_digits = false;
    for c in text.chars().take_while(|&c| c != '(').take(KIND_CHARS) {
        if c.is_ascii_digit() {
            if !in_digits {
                kind.push('#');
            }
            in_digits = true;
        } else {
            kind.push(c);
            in_digits = false;
        }
    }
    kind
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_hidden_in_lines() {
        let limiter = LogLimiter::new("k:9092").hiding(vec!["hunter2".to_owned()]);
        let shown = limiter.hide("Configuration property `sasl.password` set to `hunter2`");
        assert_eq!(shown, "Configuration property `sasl.password` set to `***`");
        assert_eq!(limiter.hide("nothing secret"), "nothing secret");
    }

    #[test]
    fn a_kind_is_shown_once_per_window_with_the_count_left_out() {
        let limiter = LogLimiter::new("127.0.0.1:1");
        let start = Instant::now();
        let line = |n: u64| {
            format!(
                "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused \
                 (after {n}ms in state CONNECT)"
            )
        };
        assert_eq!(limiter.admit_at(3, "FAIL", &line(0), start), Some(0));
        for n in 1..=59 {
            let at = start + Duration::from_millis(500 * n);
            assert_eq!(limiter.admit_at(3, "FAIL", &line(n), at), None, "{n}");
        }
        assert_eq!(
            limiter.admit_at(3, "FAIL", &line(60), start + WINDOW),
            Some(59)
        );
        // Another kind is not held back by the first.
        assert_eq!(
            limiter.admit_at(3, "FAIL", "other broker gone", start + WINDOW),
            Some(0)
        );
    }

    #[test]
    fn kinds_ignore_numbers_and_the_detail_in_parentheses() {
        assert_eq!(
            kind_of("ERROR", "1/1 brokers are down"),
            kind_of("ERROR", "2/2 brokers are down")
        );
        assert_ne!(
            kind_of("FAIL", "Connect failed"),
            kind_of("CONFWARN", "Connect failed")
        );
        assert_eq!(
            kind_of("FAIL", "refused (after 1ms)"),
            kind_of(
                "FAIL",
                "refused (after 2000ms, 5 identical error(s) suppressed)"
            )
        );
    }
}
