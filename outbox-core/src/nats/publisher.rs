//! [`NatsPublisher`]: each aggregate's messages one after another, aggregates side by side,
//! every one counted only once JetStream acknowledged it.

use std::collections::{HashMap, HashSet};
use std::error::Error as _;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{HeaderMap, HeaderName, HeaderValue};

use super::error::NatsConfigError;
use super::streams;
use super::subject::subject_token;
use crate::broker_tls::{TlsFiles, tls_methods};
use crate::relay::{
    Delivery, NotReady, OutboxMessage, Publisher, Router, publish_in_key_order, wire_headers,
};

/// Extra time, past the acknowledgement timeout, that a publish may take: the client's own
/// queue, and the stream lookups of a batch's new topics.
const GRACE: Duration = Duration::from_secs(2);

/// Publishes outbox messages to NATS JetStream, awaiting each publish acknowledgement.
///
/// See the [module docs](super) for the subjects, headers, streams and what it guarantees.
/// One publisher holds one connection (the client reconnects by itself); share it
/// (`Arc<NatsPublisher>` is a [`Publisher`] too) rather than building many.
///
/// ```no_run
/// use outbox_core::nats::NatsPublisher;
/// use outbox_core::relay::{OutboxMessage, Publisher};
///
/// # async fn run(batch: Vec<OutboxMessage>) -> Result<(), Box<dyn std::error::Error>> {
/// let publisher = NatsPublisher::builder().servers("nats://127.0.0.1:4222").build().await?;
/// for (msg, outcome) in batch.iter().zip(publisher.publish(&batch).await) {
///     if let Some(why) = outcome.error() {
///         eprintln!("event {} not published: {why}", msg.id);
///     }
/// }
/// # Ok(()) }
/// ```
pub struct NatsPublisher {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    /// The servers, passwords redacted.
    servers: String,
    router: Router,
    ack_timeout: Duration,
    create_streams: bool,
    /// Topics (prefixed) whose stream was found or created.
    streams: Mutex<HashSet<String>>,
    /// The client's connection events, and how it connects: why it cannot, for `ready`.
    events: Arc<streams::EventLog>,
    recipe: streams::Recipe,
}

impl NatsPublisher {
    /// Starts configuring a publisher.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_core::nats::NatsConfigError> {
    /// let publisher = outbox_core::nats::NatsPublisher::builder()
    ///     .servers("nats://127.0.0.1:4222")
    ///     .build()
    ///     .await?;
    /// # drop(publisher); Ok(()) }
    /// ```
    pub fn builder() -> NatsPublisherBuilder {
        NatsPublisherBuilder::default()
    }

    /// The longest a [`publish`](Publisher::publish) takes to give every message an outcome:
    /// the acknowledgement timeout plus 2 s. The relay's lease must be longer.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn run() -> Result<(), outbox_core::nats::NatsConfigError> {
    /// let publisher = outbox_core::nats::NatsPublisher::builder()
    ///     .servers("nats://127.0.0.1:4222")
    ///     .ack_timeout(Duration::from_secs(5))
    ///     .build()
    ///     .await?;
    /// assert_eq!(publisher.publish_timeout(), Duration::from_secs(7));
    /// # Ok(()) }
    /// ```
    pub fn publish_timeout(&self) -> Duration {
        self.ack_timeout + GRACE
    }

    /// The subject of `msg` on `topic` (prefixed): `<topic>.<aggregate id as a token>`.
    fn subject(&self, topic: &str, msg: &OutboxMessage) -> String {
        format!("{topic}.{}", subject_token(&msg.aggregate_id))
    }

    /// Finds (or creates) the stream of every topic of the batch not seen yet; the topics
    /// whose stream is missing map to why.
    async fn ensure_streams(&self, topics: &[String]) -> HashMap<String, String> {
        let mut missing = HashMap::new();
        if !self.create_streams {
            return missing;
        }
        let unknown: Vec<&String> = {
            let known = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
            let mut unknown: Vec<&String> = topics.iter().filter(|t| !known.contains(*t)).collect();
            unknown.sort_unstable();
            unknown.dedup();
            unknown
        };
        for topic in unknown {
            match streams::ensure(&self.jetstream, topic).await {
                Ok(_) => {
                    self.streams
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(topic.clone());
                }
                Err(why) => {
                    missing.insert(topic.clone(), why);
                }
            }
        }
        missing
    }

    /// Publishes one message of `topic` and awaits its acknowledgement. A stream gone since it
    /// was found (deleted by an operator) is looked for again, or created, at the next batch.
    async fn send(&self, topic: &str, subject: String, msg: &OutboxMessage) -> Delivery {
        let headers = match headers(msg) {
            Ok(headers) => headers,
            Err(why) => return Delivery::Failed(why),
        };
        let publish = PublishMessage::build()
            .payload(msg.payload.clone().into())
            .headers(headers);
        let acked = match self.jetstream.send_publish(subject.clone(), publish).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(_) => Delivery::Published,
            Err(e) => {
                if matches!(e.kind(), PublishErrorKind::StreamNotFound) {
                    self.streams
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(topic);
                }
                classify(&subject, &e, self.ack_timeout)
            }
        }
    }
}

/// The message's headers: `Nats-Msg-Id` (the event id), then [`wire_headers`]. A header that
/// NATS cannot carry as it is (a name with a space, `:` or a non-ASCII character, a value with
/// a line break) makes the message poison: it is never sent changed.
fn headers(msg: &OutboxMessage) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    headers.insert(
        async_nats::header::NATS_MESSAGE_ID,
        msg.id.hyphenated().to_string(),
    );
    for (key, value) in wire_headers(msg) {
        let name = HeaderName::from_str(key)
            .map_err(|_| format!("header `{key}` cannot be sent over NATS: a header name is printable ASCII without `:`"))?;
        let value = HeaderValue::from_str(&value).map_err(|_| {
            format!("the value of header `{key}` cannot be sent over NATS: it holds a line break")
        })?;
        headers.insert(name, value);
    }
    Ok(headers)
}

/// The outcome of a failed publish, by the error's kind and JetStream's error code: only a
/// message too large for the server or the stream is the message's fault.
fn classify(subject: &str, error: &PublishError, timeout: Duration) -> Delivery {
    let code = error
        .source()
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code);
    match (error.kind(), code) {
        (PublishErrorKind::MaxPayloadExceeded, _) => Delivery::Failed(format!(
            "message to `{subject}` is larger than the server's max_payload: {error}"
        )),
        (_, Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM)) => Delivery::Failed(format!(
            "message to `{subject}` is larger than its stream's max_msg_size: {error}"
        )),
        (PublishErrorKind::StreamNotFound, _) => Delivery::Unavailable(format!(
            "no JetStream stream captures `{subject}` (no responders): create one, or let the publisher create it"
        )),
        (PublishErrorKind::TimedOut, _) => Delivery::Unavailable(format!(
            "no publish acknowledgement for `{subject}` within {timeout:?}"
        )),
        _ => Delivery::Unavailable(format!("publishing to `{subject}` failed: {error}")),
    }
}

/// How long `ready` gives its own connection attempt once the client's has failed.
const DIAGNOSE_TIMEOUT: Duration = Duration::from_secs(3);

impl Publisher for NatsPublisher {
    /// Finds or creates the streams of the batch's new topics, then publishes each aggregate's
    /// messages in order, one at a time, and the aggregates side by side
    /// ([`publish_in_key_order`]).
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let topics: Vec<String> = batch.iter().map(|msg| self.router.topic(msg)).collect();
        let missing = self.ensure_streams(&topics).await;
        let (topics, missing) = (&topics, &missing);
        publish_in_key_order(batch, |i, msg| {
            let topic = &topics[i];
            let stream = missing.get(topic).cloned();
            let subject = self.subject(topic, msg);
            async move {
                match stream {
                    Some(why) => Delivery::Unavailable(why),
                    None => self.send(topic, subject, msg).await,
                }
            }
        })
        .await
    }

    fn unavailable(&self) -> Option<String> {
        match self.client.connection_state() {
            State::Connected => None,
            state => Some(match self.events.last_error() {
                // e.g. an authorization violation; a refused certificate is an "IO error".
                Some(why) => format!(
                    "NATS server {} unreachable ({state:?}): {why}",
                    self.servers
                ),
                None => format!("NATS server {} unreachable ({state:?})", self.servers),
            }),
        }
    }

    /// Asks JetStream's API for its information within `timeout`: `Ok` once it answered
    /// (a server without JetStream has no responder for it).
    async fn ready(&self, timeout: Duration) -> Result<(), NotReady> {
        let asked = self.client.request("$JS.API.INFO", Vec::new().into());
        let answer = tokio::time::timeout(timeout, asked).await;
        if matches!(answer, Ok(Ok(_))) {
            return Ok(());
        }
        if self.client.connection_state() != State::Connected {
            // The client's events say "IO error" where a connection of our own says why.
            let why = match self.recipe.diagnose(DIAGNOSE_TIMEOUT).await {
                Some(why) => Some(why),
                None => self.events.last_error(),
            };
            return Err(NotReady::new(match why {
                Some(why) => format!(
                    "cannot reach NATS at {} within {timeout:?}: {why}",
                    self.servers
                ),
                None => format!("cannot reach NATS at {} within {timeout:?}", self.servers),
            }));
        }
        Err(NotReady::new(match answer {
            Ok(Err(e)) => format!("JetStream at {} did not answer: {e}", self.servers),
            _ => format!(
                "JetStream at {} did not answer within {timeout:?}",
                self.servers
            ),
        }))
    }
}

impl fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("servers", &self.servers)
            .field("router", &self.router)
            .field("ack_timeout", &self.ack_timeout)
            .field("create_streams", &self.create_streams)
            .finish_non_exhaustive()
    }
}

/// Builds a [`NatsPublisher`]. Get one from [`NatsPublisher::builder`].
#[must_use = "a builder does nothing until `.build()`"]
pub struct NatsPublisherBuilder {
    servers: String,
    router: Router,
    ack_timeout: Duration,
    create_streams: bool,
    name: String,
    tls: TlsFiles,
    credentials: Option<std::path::PathBuf>,
}

impl Default for NatsPublisherBuilder {
    fn default() -> Self {
        NatsPublisherBuilder {
            servers: String::new(),
            router: Router::default(),
            ack_timeout: Duration::from_secs(10),
            create_streams: true,
            name: "outbox-relay".to_owned(),
            tls: TlsFiles::default(),
            credentials: None,
        }
    }
}

impl fmt::Debug for NatsPublisherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisherBuilder")
            .field("servers", &streams::redacted(&self.servers))
            .field("router", &self.router)
            .field("ack_timeout", &self.ack_timeout)
            .field("create_streams", &self.create_streams)
            .field("tls", &self.tls)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl NatsPublisherBuilder {
    /// The servers, comma-separated URLs: `nats://host:4222`, `tls://host:4222` (TLS),
    /// `nats://user:password@host:4222`. Required.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsPublisher::builder().servers("nats://n1:4222,nats://n2:4222");
    /// # drop(builder);
    /// ```
    pub fn servers(mut self, servers: impl Into<String>) -> Self {
        self.servers = servers.into();
        self
    }

    /// A prefix for every subject (and so every topic), e.g. `prod.`.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsPublisher::builder().subject_prefix("prod.");
    /// # drop(builder);
    /// ```
    pub fn subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.router.prefix = prefix.into();
        self
    }

    /// Maps a message to its topic, the subject's part before the aggregate id (default
    /// [`OutboxMessage::topic`]); the prefix still applies.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsPublisher::builder()
    ///     .topic_for(|msg| format!("{}.{}", msg.aggregate_type, msg.event_type));
    /// # drop(builder);
    /// ```
    pub fn topic_for(
        mut self,
        map: impl Fn(&OutboxMessage) -> String + Send + Sync + 'static,
    ) -> Self {
        self.router.map = Some(Arc::new(map));
        self
    }

    /// How long to wait for a publish acknowledgement (default 10 s). Past it the message's
    /// outcome is unknown: an outage, published again later (the duplicate window drops the
    /// repeat).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let builder = outbox_core::nats::NatsPublisher::builder().ack_timeout(Duration::from_secs(5));
    /// # drop(builder);
    /// ```
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// Whether to create a stream for a topic that no stream captures (default `true`). With
    /// `false` such a topic's messages wait, as an outage, until an operator creates one.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsPublisher::builder().create_streams(false);
    /// # drop(builder);
    /// ```
    pub fn create_streams(mut self, create: bool) -> Self {
        self.create_streams = create;
        self
    }

    /// The client's name, as the server's monitoring shows it (default `outbox-relay`).
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsPublisher::builder().client_name("billing-relay");
    /// # drop(builder);
    /// ```
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Authenticates with this `.creds` file: a user JWT and its nkey seed, as `nsc` and
    /// Synadia Cloud hand them out (operator-mode servers). [`build`](Self::build) reads it and
    /// refuses a file that is not one; its contents are never shown.
    ///
    /// ```
    /// let builder = outbox_core::nats::NatsPublisher::builder()
    ///     .credentials_file("/etc/outbox/relay.creds");
    /// # drop(builder);
    /// ```
    pub fn credentials_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.credentials = Some(path.into());
        self
    }

    tls_methods!(
        "outbox_core::nats::NatsPublisher::builder()",
        "They replace the system's roots (which are trusted without this file: the operating system's store, or `SSL_CERT_FILE` / `SSL_CERT_DIR`).",
        "With either, TLS is required of every server, whether its URL says `nats://` or `tls://`."
    );

    /// Checks the settings and starts connecting in the background: a server that is down
    /// now is an outage the relay waits out, not an error. Call it inside a Tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use outbox_core::nats::{NatsConfigError, NatsPublisher};
    /// let err = NatsPublisher::builder().build().await.unwrap_err();
    /// assert!(matches!(&err, NatsConfigError::InvalidOption { option, .. } if option == "servers"));
    /// # }
    /// ```
    pub async fn build(self) -> Result<NatsPublisher, NatsConfigError> {
        if self.ack_timeout.is_zero() {
            return Err(NatsConfigError::InvalidOption {
                option: "ack_timeout".into(),
                reason: "must be longer than zero".into(),
            });
        }
        let streams::Connected {
            client,
            events,
            recipe,
        } = streams::connect(
            &self.servers,
            &self.name,
            self.ack_timeout,
            &self.tls,
            self.credentials.as_deref(),
        )
        .await?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(self.ack_timeout)
            .backpressure_on_inflight(true)
            .build(client.clone());
        Ok(NatsPublisher {
            client,
            jetstream,
            servers: streams::redacted(&self.servers),
            router: self.router,
            ack_timeout: self.ack_timeout,
            create_streams: self.create_streams,
            streams: Mutex::new(HashSet::new()),
            events,
            recipe,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> OutboxMessage {
        OutboxMessage {
            seq: 1,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: "7".into(),
            event_type: "OrderPlaced".into(),
            event_version: 1,
            payload: "{}".into(),
            headers: Default::default(),
            topic: None,
            shard: 0,
            created_at: chrono::Utc::now(),
            attempts: 1,
        }
    }

    #[test]
    fn headers_carry_the_event_id_twice_and_refuse_what_nats_cannot_carry() {
        let mut msg = message();
        let sent = headers(&msg).unwrap();
        let id = msg.id.hyphenated().to_string();
        assert_eq!(
            sent.get("Nats-Msg-Id").map(HeaderValue::as_str),
            Some(id.as_str())
        );
        assert_eq!(sent.get("id").map(HeaderValue::as_str), Some(id.as_str()));
        assert_eq!(
            sent.get("event_type").map(HeaderValue::as_str),
            Some("OrderPlaced")
        );
        msg.headers = [("bad name".to_owned(), "v".to_owned())].into();
        assert!(headers(&msg).unwrap_err().contains("`bad name`"));
        msg.headers = [("note".to_owned(), "two\nlines".to_owned())].into();
        assert!(headers(&msg).unwrap_err().contains("`note`"));
    }

    #[test]
    fn only_a_message_too_large_is_its_own_fault() {
        let timeout = Duration::from_secs(1);
        let too_large = PublishError::new(PublishErrorKind::MaxPayloadExceeded);
        assert!(matches!(
            classify("order.7", &too_large, timeout),
            Delivery::Failed(_)
        ));
        for kind in [
            PublishErrorKind::TimedOut,
            PublishErrorKind::StreamNotFound,
            PublishErrorKind::BrokenPipe,
            PublishErrorKind::Other,
        ] {
            let outcome = classify("order.7", &PublishError::new(kind), timeout);
            assert!(outcome.is_outage(), "{outcome:?}");
        }
    }
}
