//! Holding a message: waiting between its attempts with the partitions paused and the consumer
//! polled; then writing its dead letter (and parking its key), or storing its offset.
//!
//! Why pause: librdkafka takes a consumer that has not polled for `max.poll.interval.ms` out
//! of its group (its partitions go to another member, which would apply the messages behind
//! the held one). So while a message waits, the consumer keeps calling `recv()`. To receive
//! nothing meanwhile it first pauses every assigned partition: librdkafka then stops fetching
//! them and drops what it had prefetched (outdated by the pause), and after `resume` fetches
//! again from the position after the last message it delivered. A message that still arrives
//! (from a partition assigned during the wait) is kept, in order, and handled next; its
//! partition is paused too.

use std::collections::VecDeque;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::dead_letter::Kind;
use super::{AfterDeadLetter, ConsumerStats, Done, KafkaConsumer, OUTAGE_BACKOFF, Stop};

/// The partitions paused while a message is held, and what arrived meanwhile.
#[derive(Default)]
pub(super) struct Held {
    paused: Option<TopicPartitionList>,
    pub(super) stashed: VecDeque<OwnedMessage>,
}

impl KafkaConsumer {
    /// Waits `wait` with the assigned partitions paused, polling the consumer. `false` if
    /// shutdown came first.
    pub(super) async fn hold(&mut self, wait: Duration, stop: &mut Stop<'_>) -> bool {
        self.pause_assignment();
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(sleep);
        let consumer = self.consumer.clone();
        loop {
            let received = tokio::select! {
                biased;
                () = stop.wait() => return false,
                () = &mut sleep => return true,
                received = consumer.recv() => received.map(|m| m.detach()),
            };
            match received {
                Ok(message) => {
                    self.pause_one(message.topic(), message.partition());
                    self.held.stashed.push_back(message);
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

    fn pause_assignment(&mut self) {
        if self.held.paused.is_some() {
            return;
        }
        match self.consumer.assignment() {
            Ok(assignment) => {
                if let Err(e) = self.consumer.pause(&assignment) {
                    tracing::warn!(error = %e, "pausing the partitions failed");
                }
                tracing::debug!(partitions = assignment.count(), "partitions paused");
                self.held.paused = Some(assignment);
            }
            Err(e) => tracing::warn!(error = %e, "reading the assignment to pause it failed"),
        }
    }

    fn pause_one(&mut self, topic: &str, partition: i32) {
        let mut one = TopicPartitionList::with_capacity(1);
        one.add_partition(topic, partition);
        if let Err(e) = self.consumer.pause(&one) {
            tracing::warn!(error = %e, topic, partition, "pausing a partition failed");
        }
        let paused = self.held.paused.get_or_insert_with(TopicPartitionList::new);
        if paused.find_partition(topic, partition).is_none() {
            paused.add_partition(topic, partition);
        }
    }

    /// Resumes what [`hold`](Self::hold) paused, once the held message is done.
    pub(super) fn release(&mut self) {
        if let Some(paused) = self.held.paused.take()
            && let Err(e) = self.consumer.resume(&paused)
        {
            // A partition revoked meanwhile cannot be resumed; its new owner reads it.
            tracing::warn!(error = %e, "resuming the paused partitions failed");
        }
    }

    /// Writes the dead letter, retrying until the broker takes it: a message is never dropped
    /// because its dead letter could not be written. The wait is an outage and shows as one: an
    /// error log with the dead-letter topic and the code, `dead_letter_blocked` (stats and
    /// gauge) until it ends, every failed write counted. Then parks the message's key (by
    /// [`AfterDeadLetter`]).
    pub(super) async fn dead_letter(
        &mut self,
        message: &OwnedMessage,
        kind: Kind,
        error: &str,
        attempts: u32,
        stop: &mut Stop<'_>,
    ) -> Done {
        let mut failures = 0;
        loop {
            let sent = tokio::select! {
                biased;
                sent = self.dead_letters.send(message, &kind, error, attempts) => sent,
                () = stop.wait() => return Done::Stopped,
            };
            match sent {
                Ok(topic) => {
                    if failures > 0 {
                        self.blocked_on_dead_letter(false);
                    }
                    tracing::info!(dead_letter_topic = %topic, topic = message.topic(), offset = message.offset(), "dead letter written");
                    ConsumerStats::add(
                        &self.stats.dead_lettered,
                        "outbox_consumer_dead_lettered_total",
                    );
                    if let Kind::Parked(_) = kind {
                        ConsumerStats::add(&self.stats.parked, "outbox_consumer_parked_total");
                    } else if self.settings.after_dead_letter == AfterDeadLetter::ParkKey
                        && let Some((topic, key)) = self.parking.park(message)
                    {
                        tracing::error!(
                            topic, key = %String::from_utf8_lossy(&key),
                            max_parked_keys = self.settings.max_parked_keys,
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
                            error = %unwritten, code = %unwritten.code(),
                            dead_letter_topic = %unwritten.topic, topic = message.topic(),
                            partition = message.partition(), offset = message.offset(),
                            "the dead-letter topic does not take the dead letter: the \
                             partition waits, retrying, until it does"
                        );
                    } else {
                        tracing::warn!(
                            error = %unwritten, code = %unwritten.code(), failures,
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

    /// Stores the offset after `message` (the next one to read) for the next commit.
    ///
    /// Through `rd_kafka_offsets_store`, which stores exactly the offset it is given; the
    /// older `rd_kafka_offset_store` (rdkafka's `store_offset`) adds one itself.
    pub(super) fn store(&self, message: &OwnedMessage) {
        let mut next = TopicPartitionList::with_capacity(1);
        let stored = next
            .add_partition_offset(
                message.topic(),
                message.partition(),
                Offset::Offset(message.offset() + 1),
            )
            .and_then(|()| self.consumer.store_offsets(&next));
        match stored {
            Ok(()) => ConsumerStats::add(&self.stats.done, "outbox_consumer_done_total"),
            // The partition was revoked meanwhile: its new owner reads the message again and
            // the inbox recognises it.
            Err(e) => tracing::warn!(
                error = %e, topic = message.topic(), partition = message.partition(),
                "could not store the offset of a handled message; it will be delivered again"
            ),
        }
    }
}
