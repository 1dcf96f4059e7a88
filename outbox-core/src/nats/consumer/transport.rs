//! [`NatsTransport`]: the consumer runtime's [`Transport`] over JetStream durable pull
//! consumers, one per topic, read as one stream.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, AckKind};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use futures_util::stream::{BoxStream, SelectAll};
use futures_util::{StreamExt, TryStreamExt};

use super::message::NatsMessage;
use crate::consumer::{DeadLetter, Transport, Unwritten};
use crate::nats::streams;
use crate::nats::subject::{subject_token, wildcard};

/// Where dead letters go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeadLetterSubject {
    /// `<topic><suffix>.<aggregate id>`.
    Suffix(String),
    /// `<prefix>.<aggregate id>`, whatever the topic.
    Fixed(String),
}

impl DeadLetterSubject {
    /// The subjects' common part for `topic` (the part before the aggregate id).
    fn prefix(&self, topic: &str) -> String {
        match self {
            DeadLetterSubject::Suffix(suffix) => format!("{topic}{suffix}"),
            DeadLetterSubject::Fixed(prefix) => prefix.clone(),
        }
    }
}

/// The pull consumers' settings.
#[derive(Debug, Clone)]
pub(crate) struct PullSettings {
    pub(crate) ack_wait: Duration,
    pub(crate) max_ack_pending: i64,
}

/// Every topic's pull consumer, read as one stream.
type Merged = SelectAll<BoxStream<'static, Result<NatsMessage, String>>>;

/// Messages delivered and not yet acknowledged: their reply subjects, to tell JetStream they
/// are still in progress.
type Outstanding = Arc<Mutex<HashMap<String, Instant>>>;

/// The JetStream side of a [`NatsConsumer`](super::NatsConsumer).
pub(crate) struct NatsTransport {
    pub(super) client: async_nats::Client,
    pub(super) jetstream: jetstream::Context,
    pub(super) group: String,
    pub(crate) topics: Vec<String>,
    pub(super) dead_letters: DeadLetterSubject,
    pub(super) pull: PullSettings,
    /// The topics' messages, once their consumers exist; rebuilt after an error.
    messages: tokio::sync::Mutex<Option<Merged>>,
    outstanding: Outstanding,
    /// Dead-letter subject prefixes whose stream was found or created.
    dead_letter_streams: tokio::sync::Mutex<HashSet<String>>,
    progress: Option<tokio::task::JoinHandle<()>>,
}

impl NatsTransport {
    pub(super) fn new(
        client: async_nats::Client,
        jetstream: jetstream::Context,
        group: String,
        topics: Vec<String>,
        dead_letters: DeadLetterSubject,
        pull: PullSettings,
    ) -> Self {
        NatsTransport {
            client,
            jetstream,
            group,
            topics,
            dead_letters,
            pull,
            messages: tokio::sync::Mutex::new(None),
            outstanding: Arc::default(),
            dead_letter_streams: tokio::sync::Mutex::new(HashSet::new()),
            progress: None,
        }
    }

    /// Finds or creates each topic's stream and the group's durable consumer on it, and reads
    /// them as one stream.
    async fn subscribe(&self) -> Result<Merged, String> {
        let mut all = SelectAll::new();
        for topic in &self.topics {
            let stream_name = streams::ensure(&self.jetstream, topic).await?;
            let stream = self
                .jetstream
                .get_stream(&stream_name)
                .await
                .map_err(|e| format!("reading stream `{stream_name}` failed: {e}"))?;
            let config = pull::Config {
                durable_name: Some(self.group.clone()),
                filter_subject: wildcard(topic),
                deliver_policy: DeliverPolicy::All,
                ack_policy: AckPolicy::Explicit,
                ack_wait: self.pull.ack_wait,
                max_deliver: -1,
                max_ack_pending: self.pull.max_ack_pending,
                ..Default::default()
            };
            let consumer: jetstream::consumer::PullConsumer = stream
                .get_or_create_consumer(&self.group, config)
                .await
                .map_err(|e| {
                    format!(
                        "creating the durable consumer `{}` on `{stream_name}` failed: {e}",
                        self.group
                    )
                })?;
            let messages = consumer
                .messages()
                .await
                .map_err(|e| format!("pulling from `{stream_name}` failed: {e}"))?;
            let topic = topic.clone();
            let outstanding = self.outstanding.clone();
            all.push(
                messages
                    .map_err(|e| e.to_string())
                    .map_ok(move |message| {
                        if let Some(reply) = &message.reply {
                            outstanding
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .insert(reply.to_string(), Instant::now());
                        }
                        NatsMessage::new(message, &topic)
                    })
                    .boxed(),
            );
        }
        Ok(all)
    }

    /// The stream of a dead-letter subject prefix, found or created once.
    async fn dead_letter_stream(&self, prefix: &str) -> Result<(), String> {
        let mut known = self.dead_letter_streams.lock().await;
        if !known.contains(prefix) {
            streams::ensure(&self.jetstream, prefix).await?;
            known.insert(prefix.to_owned());
        }
        Ok(())
    }
}

/// Every third of `ack_wait`, tells JetStream that each message delivered more than a third
/// of `ack_wait` ago and not yet acknowledged is still in progress (`+WPI`).
async fn keep_alive(client: async_nats::Client, outstanding: Outstanding, ack_wait: Duration) {
    let every = ack_wait / 3;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let due: Vec<String> = outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, since)| since.elapsed() >= every)
            .map(|(reply, _)| reply.clone())
            .collect();
        for reply in due {
            if let Err(e) = client.publish(reply, "+WPI".into()).await {
                tracing::debug!(error = %e, "telling JetStream a message is in progress failed");
            }
        }
    }
}

impl Transport for NatsTransport {
    type Message = NatsMessage;
    type Error = String;

    const BROKER: &'static str = "NATS";
    const SYSTEM: &'static str = "nats";

    /// Starts the in-progress task; the consumers are made at the first `receive`, so that a
    /// server down at start is retried like any outage.
    async fn start(&mut self) {
        self.progress = Some(tokio::spawn(keep_alive(
            self.client.clone(),
            self.outstanding.clone(),
            self.pull.ack_wait,
        )));
        tracing::info!(group = %self.group, topics = ?self.topics, "consumer started");
    }

    async fn receive(&self) -> Result<NatsMessage, String> {
        let mut messages = self.messages.lock().await;
        if messages.is_none() {
            *messages = Some(self.subscribe().await?);
        }
        let next = match messages.as_mut() {
            Some(stream) => stream.next().await,
            None => None,
        };
        match next {
            Some(Ok(message)) => Ok(message),
            // The next `receive` subscribes again: with one message unacknowledged at a time
            // nothing later was delivered, and JetStream delivers the unacknowledged one again.
            Some(Err(e)) => {
                *messages = None;
                Err(e)
            }
            None => {
                *messages = None;
                Err("the pull consumer's stream ended".into())
            }
        }
    }

    /// Nothing to do: with `max_ack_pending` messages unacknowledged JetStream sends no more,
    /// and the in-progress task keeps those alive.
    fn pause(&mut self) {}

    fn pause_source_of(&mut self, _message: &NatsMessage) {}

    fn resume(&mut self) {}

    async fn acknowledge(&self, message: &NatsMessage) -> Result<(), String> {
        if let Some(reply) = &message.inner.reply {
            self.outstanding
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(reply.as_str());
        }
        message
            .inner
            .ack_with(AckKind::Ack)
            .await
            .map_err(|e| e.to_string())
    }

    async fn dead_letter(&self, letter: &DeadLetter<'_>) -> Result<String, Unwritten> {
        let prefix = self.dead_letters.prefix(letter.source);
        let key = letter.key.map(String::from_utf8_lossy).unwrap_or_default();
        let subject = format!("{prefix}.{}", subject_token(&key));
        let unwritten = |code: &str, error: String| Unwritten {
            topic: subject.clone(),
            code: code.to_owned(),
            error,
        };
        self.dead_letter_stream(&prefix)
            .await
            .map_err(|e| unwritten("NoStream", e))?;
        let publish = PublishMessage::build()
            .payload(
                letter
                    .payload
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default()
                    .into(),
            )
            .headers(dead_letter_headers(letter));
        let acked = match self.jetstream.send_publish(subject.clone(), publish).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(_) => Ok(subject.clone()),
            Err(e) => Err(unwritten(&format!("{:?}", e.kind()), e.to_string())),
        }
    }

    async fn close(mut self) {
        if let Some(progress) = self.progress.take() {
            progress.abort();
        }
        *self.messages.lock().await = None;
        if let Err(e) = self.client.flush().await {
            tracing::debug!(error = %e, "flushing the acknowledgements on shutdown failed");
        }
    }
}

impl Drop for NatsTransport {
    fn drop(&mut self) {
        if let Some(progress) = self.progress.take() {
            progress.abort();
        }
    }
}

/// The dead letter's headers for NATS: in a name, each character NATS cannot carry becomes
/// `_`; a value's line breaks become spaces (an error's text can hold
/// them); the original message's headers came from NATS and pass as they are.
fn dead_letter_headers(letter: &DeadLetter<'_>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (key, value) in &letter.headers {
        let name: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() && c != ':' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let Ok(name) = (if name.is_empty() { "_" } else { &name }).parse::<HeaderName>() else {
            continue; // unreachable: the name is printable ASCII without `:` now
        };
        let text = value
            .as_deref()
            .map(String::from_utf8_lossy)
            .unwrap_or_default()
            .replace(['\r', '\n'], " ");
        let Ok(value) = text.parse::<HeaderValue>() else {
            continue; // unreachable: the value has no line break now
        };
        headers.append(name, value);
    }
    headers
}
