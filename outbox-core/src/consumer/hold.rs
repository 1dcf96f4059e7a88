//! Holding a message: waiting between its attempts with the transport paused and still
//! polled; then writing its dead letter (and parking its key), or acknowledging it.
//!
//! Why keep receiving while paused: a Kafka consumer that has not polled for
//! `max.poll.interval.ms` leaves its group (its partitions go to another member, which would
//! apply the messages behind the held one), and other brokers' clients need their connection
//! served too. A message that still arrives is kept, in order, and handled next; its source is
//! paused too.

use std::time::Duration;

use super::dead_letter::{DeadLetter, Kind};
use super::policy::AfterDeadLetter;
use super::received::Received;
use super::runtime::{Done, OUTAGE_BACKOFF, Runtime, Stop};
use super::stats::ConsumerStats;
use super::transport::Transport;

impl<T: Transport> Runtime<T> {
    /// Waits `wait` with the transport paused, polling it. `false` if shutdown came first.
    pub(super) async fn hold(&mut self, wait: Duration, stop: &mut Stop<'_>) -> bool {
        self.transport.pause();
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(sleep);
        loop {
            let received = tokio::select! {
                biased;
                () = stop.wait() => return false,
                () = &mut sleep => return true,
                received = self.transport.receive() => received,
            };
            match received {
                Ok(message) => {
                    self.transport.pause_source_of(&message);
                    self.stashed.push_back(message);
                }
                Err(e) => {
                    // The broker may be away too; polling again at once would only spin.
                    tracing::debug!(error = %e, "polling while a message is held");
                    return tokio::select! {
                        () = stop.wait() => false,
                        () = &mut sleep => true,
                    };
                }
            }
        }
    }

    /// Writes the dead letter, retrying until the broker takes it: a message is never dropped
    /// because its dead letter could not be written. The wait is an outage and shows as one: an
    /// error log with the dead-letter topic and the code, `dead_letter_blocked` (stats and
    /// gauge) until it ends, every failed write counted. Then parks the message's key (by
    /// [`AfterDeadLetter`]).
    pub(super) async fn dead_letter(
        &mut self,
        message: &T::Message,
        kind: Kind,
        error: &str,
        attempts: u32,
        stop: &mut Stop<'_>,
    ) -> Done {
        let letter = DeadLetter::of(message, &kind, error, attempts, &self.settings.group);
        let mut failures = 0;
        loop {
            let sent = tokio::select! {
                biased;
                sent = self.transport.dead_letter(&letter) => sent,
                () = stop.wait() => return Done::Stopped,
            };
            match sent {
                Ok(topic) => {
                    if failures > 0 {
                        self.blocked_on_dead_letter(false);
                    }
                    tracing::info!(dead_letter_topic = %topic, topic = message.source(), offset = message.position(), "dead letter written");
                    ConsumerStats::add(
                        &self.stats.dead_lettered,
                        "outbox_consumer_dead_lettered_total",
                    );
                    if let Kind::Parked(_) = kind {
                        ConsumerStats::add(&self.stats.parked, "outbox_consumer_parked_total");
                    } else if self.settings.policy.after_dead_letter == AfterDeadLetter::ParkKey
                        && let Some((topic, key)) = self.parking.park(message)
                    {
                        tracing::error!(
                            topic, key = %String::from_utf8_lossy(&key),
                            max_parked_keys = self.settings.policy.max_parked_keys,
                            "too many parked keys: forgetting the oldest; its later messages \
                             will be applied although an earlier one is in the dead-letter topic"
                        );
                    }
                    return Done::Yes;
                }
                Err(unwritten) => {
                    failures += 1;
                    unwritten.count();
                    let wait = OUTAGE_BACKOFF.delay(failures, self.rng.unit());
                    if failures == 1 {
                        self.blocked_on_dead_letter(true);
                        tracing::error!(
                            error = %unwritten, code = %unwritten.code,
                            dead_letter_topic = %unwritten.topic, topic = message.source(),
                            partition = message.partition(), offset = message.position(),
                            "the dead-letter topic does not take the dead letter: the \
                             partition waits, retrying, until it does"
                        );
                    } else {
                        tracing::warn!(
                            error = %unwritten, code = %unwritten.code, failures,
                            retry_in = ?wait, "writing a dead letter failed; retrying"
                        );
                    }
                    if !self.hold(wait, stop).await {
                        self.blocked_on_dead_letter(false);
                        return Done::Stopped;
                    }
                }
            }
        }
    }

    /// Whether a message waits for its dead letter to be written: the gauge
    /// `outbox_consumer_dead_letter_blocked` and [`ConsumerStats::dead_letter_blocked`].
    fn blocked_on_dead_letter(&self, blocked: bool) {
        self.stats
            .dead_letter_blocked
            .store(blocked, std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!("outbox_consumer_dead_letter_blocked").set(if blocked { 1.0 } else { 0.0 });
    }

    /// Acknowledges a message that is done (Kafka: stores the offset after it for the next
    /// commit).
    pub(super) async fn acknowledge(&self, message: &T::Message) {
        match self.transport.acknowledge(message).await {
            Ok(()) => ConsumerStats::add(&self.stats.done, "outbox_consumer_done_total"),
            // The partition was revoked meanwhile: its new owner reads the message again and
            // the inbox recognises it.
            Err(e) => tracing::warn!(
                error = %e, topic = message.source(), partition = message.partition(),
                "could not store the offset of a handled message; it will be delivered again"
            ),
        }
    }
}
