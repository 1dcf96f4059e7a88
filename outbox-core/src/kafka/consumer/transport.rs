//! [`KafkaTransport`]: the consumer runtime's [`Transport`] over librdkafka's
//! `StreamConsumer`, and its records as [`Received`] messages.
//!
//! Holding pauses partitions: librdkafka then stops fetching them and drops what it had
//! prefetched (outdated by the pause), and after `resume` fetches again from the position
//! after the last message it delivered.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers as _, OwnedMessage};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::context::Inner;
use super::dead_letter::DeadLetters;
use crate::consumer::{DeadLetter, Received, Transport, Unwritten};

impl Received for OwnedMessage {
    fn source(&self) -> &str {
        self.topic()
    }

    fn partition(&self) -> Option<i32> {
        Some(Message::partition(self))
    }

    fn position(&self) -> i64 {
        self.offset()
    }

    fn key(&self) -> Option<&[u8]> {
        Message::key(self)
    }

    fn payload(&self) -> Option<&[u8]> {
        Message::payload(self)
    }

    fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        Message::headers(self)
            .into_iter()
            .flat_map(|h| h.iter())
            .map(|h| (h.key, h.value))
    }
}

/// The Kafka side of a [`KafkaConsumer`](super::KafkaConsumer).
pub(crate) struct KafkaTransport {
    consumer: Arc<Inner>,
    dead_letters: Arc<DeadLetters>,
    pub(super) group: String,
    pub(super) topics: Vec<String>,
    pub(super) assignment: Vec<(String, i32)>,
    /// The partitions paused while a message is held.
    paused: Option<TopicPartitionList>,
}

impl KafkaTransport {
    pub(super) fn new(
        consumer: Inner,
        dead_letters: DeadLetters,
        group: String,
        topics: Vec<String>,
        assignment: Vec<(String, i32)>,
    ) -> Self {
        KafkaTransport {
            consumer: Arc::new(consumer),
            dead_letters: Arc::new(dead_letters),
            group,
            topics,
            assignment,
            paused: None,
        }
    }
}

impl Transport for KafkaTransport {
    type Message = OwnedMessage;
    type Error = KafkaError;

    const BROKER: &'static str = "Kafka";
    const SYSTEM: &'static str = "kafka";

    /// Subscribes to the topics, or assigns the partitions.
    async fn start(&mut self) {
        let result = if self.assignment.is_empty() {
            let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
            self.consumer.subscribe(&topics)
        } else {
            let mut tpl = TopicPartitionList::new();
            for (topic, partition) in &self.assignment {
                // `Stored`: the group's committed offset, else `auto.offset.reset`.
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Stored);
            }
            self.consumer.assign(&tpl)
        };
        if let Err(e) = result {
            // Only invalid topic names fail here; librdkafka then reports nothing to read.
            tracing::error!(error = %e, "subscribing failed");
        }
        tracing::info!(
            group = %self.group, topics = ?self.topics, assignment = ?self.assignment,
            "consumer started"
        );
    }

    fn receive(&self) -> impl Future<Output = Result<OwnedMessage, KafkaError>> + Send {
        let consumer = self.consumer.clone();
        async move { consumer.recv().await.map(|m| m.detach()) }
    }

    fn pause(&mut self) {
        if self.paused.is_some() {
            return;
        }
        match self.consumer.assignment() {
            Ok(assignment) => {
                if let Err(e) = self.consumer.pause(&assignment) {
                    tracing::warn!(error = %e, "pausing the partitions failed");
                }
                tracing::debug!(partitions = assignment.count(), "partitions paused");
                self.paused = Some(assignment);
            }
            Err(e) => tracing::warn!(error = %e, "reading the assignment to pause it failed"),
        }
    }

    fn pause_source_of(&mut self, message: &OwnedMessage) {
        let (topic, partition) = (message.topic(), Message::partition(message));
        let mut one = TopicPartitionList::with_capacity(1);
        one.add_partition(topic, partition);
        if let Err(e) = self.consumer.pause(&one) {
            tracing::warn!(error = %e, topic, partition, "pausing a partition failed");
        }
        let paused = self.paused.get_or_insert_with(TopicPartitionList::new);
        if paused.find_partition(topic, partition).is_none() {
            paused.add_partition(topic, partition);
        }
    }

    fn resume(&mut self) {
        if let Some(paused) = self.paused.take()
            && let Err(e) = self.consumer.resume(&paused)
        {
            // A partition revoked meanwhile cannot be resumed; its new owner reads it.
            tracing::warn!(error = %e, "resuming the paused partitions failed");
        }
    }

    /// Stores the offset after `message` (the next one to read) for the next commit.
    ///
    /// Through `rd_kafka_offsets_store`, which stores exactly the offset it is given; the
    /// older `rd_kafka_offset_store` (rdkafka's `store_offset`) adds one itself.
    async fn acknowledge(&self, message: &OwnedMessage) -> Result<(), KafkaError> {
        let mut next = TopicPartitionList::with_capacity(1);
        next.add_partition_offset(
            message.topic(),
            Message::partition(message),
            Offset::Offset(message.offset() + 1),
        )
        .and_then(|()| self.consumer.store_offsets(&next))
    }

    fn dead_letter(
        &self,
        letter: &DeadLetter<'_>,
    ) -> impl Future<Output = Result<String, Unwritten>> + Send {
        let dead_letters = self.dead_letters.clone();
        async move { dead_letters.send(letter).await }
    }

    /// Commits the stored offsets and leaves the group, off the async workers (librdkafka
    /// blocks for both).
    async fn close(self) {
        let consumer = self.consumer;
        let closed = tokio::task::spawn_blocking(move || {
            let mut attempt = 0;
            loop {
                attempt += 1;
                match consumer.commit_consumer_state(CommitMode::Sync) {
                    Ok(()) => break,
                    Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => break,
                    Err(e) if attempt < 3 => {
                        tracing::warn!(error = %e, "committing offsets on shutdown failed; retrying");
                        std::thread::sleep(Duration::from_millis(200 * attempt));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "committing offsets on shutdown failed; the messages done since the last commit will be delivered again");
                        break;
                    }
                }
            }
            drop(consumer); // leaves the group
        })
        .await;
        if closed.is_err() {
            tracing::error!("closing the consumer panicked");
        }
    }
}
