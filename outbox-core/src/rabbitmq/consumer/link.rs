//! [`Link`]: the consumer's connection, its consuming channel and consumers, and the channel
//! its dead letters are published on; (re)built with the whole topology declared again.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer, ExchangeKind};
use tokio::time::Instant;

use super::message::Incoming;
use crate::broker_tls::TlsPem;
use crate::rabbitmq::classify::code_name;
use crate::rabbitmq::connection::{RECONNECT_PAUSE, confirm_channel, connect};
use crate::rabbitmq::topology::{TopicQueues, declare_consumer};

/// How long connecting and declaring the topology may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the consumer could not read, acknowledge or connect; logged by the runtime, which
/// retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkError(pub(crate) String);

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a link is built from.
pub(crate) struct Setup {
    pub(crate) uri: String,
    pub(crate) tls: TlsPem,
    pub(crate) group: String,
    pub(crate) queues: Vec<TopicQueues>,
    pub(crate) exchange_kind: ExchangeKind,
    pub(crate) prefetch: u16,
}

/// A connection with the consumer's topology declared and its queues consumed.
pub(crate) struct Link {
    connection: Connection,
    channel: Channel,
    consumers: Vec<(Arc<str>, Consumer)>,
    /// The consumer polled first next time, so that one busy queue does not starve another.
    next: usize,
    pub(crate) dead_letters: Channel,
}

/// The current link, if any, and the last failed attempt to build one.
#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) link: Option<Link>,
    failed: Option<(Instant, LinkError)>,
}

impl Slot {
    /// The link: the current one while its connection and channel are open (a new
    /// dead-letter channel if only that one was closed), else a new one, at most one attempt
    /// per [`RECONNECT_PAUSE`].
    pub(crate) async fn ensure(&mut self, setup: &Setup) -> Result<&mut Link, LinkError> {
        let usable = self.link.as_ref().is_some_and(|link| {
            link.connection.status().connected() && link.channel.status().connected()
        });
        if !usable {
            self.link = None;
            if let Some((at, why)) = &self.failed
                && at.elapsed() < RECONNECT_PAUSE
            {
                return Err(why.clone());
            }
            match tokio::time::timeout(SETUP_TIMEOUT, Link::open(setup)).await {
                Ok(Ok(link)) => {
                    self.failed = None;
                    self.link = Some(link);
                }
                Ok(Err(why)) => return Err(self.fail(why)),
                Err(_) => {
                    let why = format!(
                        "connecting to RabbitMQ at {} and declaring the queues took longer than \
                         {SETUP_TIMEOUT:?}",
                        crate::redact::url(&setup.uri)
                    );
                    return Err(self.fail(LinkError(why)));
                }
            }
        }
        let Some(link) = self.link.as_mut() else {
            return Err(LinkError("no connection".into()));
        };
        if !link.dead_letters.status().connected() {
            link.dead_letters = confirm_channel(&link.connection)
                .await
                .map_err(|e| LinkError(format!("opening the dead-letter channel failed: {e}")))?;
        }
        Ok(link)
    }

    fn fail(&mut self, why: LinkError) -> LinkError {
        self.failed = Some((Instant::now(), why.clone()));
        why
    }
}

impl Link {
    /// Connects, declares every topic's queues and dead-letter exchange, sets the prefetch and
    /// consumes the queues.
    async fn open(setup: &Setup) -> Result<Link, LinkError> {
        let name = format!("outbox-consumer {}", setup.group);
        let connection = connect(&setup.uri, &setup.tls, &name, SETUP_TIMEOUT)
            .await
            .map_err(LinkError)?;
        let failed = |what: &str, e: lapin::Error| {
            LinkError(format!("{what} failed ({}): {e}", code_name(&e)))
        };
        for queues in &setup.queues {
            declare_consumer(&connection, queues, &setup.exchange_kind)
                .await
                .map_err(|e| {
                    failed(
                        &format!("declaring the queues of topic `{}`", queues.topic),
                        e,
                    )
                })?;
        }
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| failed("opening a channel", e))?;
        channel
            .basic_qos(setup.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| failed("setting the prefetch", e))?;
        let mut consumers = Vec::with_capacity(setup.queues.len());
        for queues in &setup.queues {
            let consumer = channel
                .basic_consume(
                    queues.queue.clone(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| failed(&format!("consuming queue `{}`", queues.queue), e))?;
            consumers.push((Arc::from(queues.topic.as_str()), consumer));
        }
        let dead_letters = confirm_channel(&connection)
            .await
            .map_err(|e| failed("opening the dead-letter channel", e))?;
        Ok(Link {
            connection,
            channel,
            consumers,
            next: 0,
            dead_letters,
        })
    }

    /// The next delivery of any queue; an error once a consumer ends or fails (its channel or
    /// connection was closed: the link must be rebuilt). Cancel-safe: a delivery is taken from
    /// lapin's buffer only when it is returned.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Incoming, LinkError>> {
        let count = self.consumers.len();
        for i in 0..count {
            let at = (self.next + i) % count;
            let (topic, consumer) = &mut self.consumers[at];
            match consumer.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(delivery))) => {
                    self.next = (at + 1) % count;
                    return Poll::Ready(Ok(Incoming::new(topic.clone(), delivery)));
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(LinkError(format!(
                        "the consumer of topic `{topic}` stopped ({}): {e}",
                        code_name(&e)
                    ))));
                }
                Poll::Ready(None) => {
                    return Poll::Ready(Err(LinkError(format!(
                        "the consumer of topic `{topic}` was cancelled (its channel was closed, \
                         or its queue deleted)"
                    ))));
                }
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }

    /// Cancels the consumers and closes the channels and the connection: the broker requeues
    /// every delivery not acknowledged.
    pub(crate) async fn close(self) {
        for (_, consumer) in &self.consumers {
            let _ = self
                .channel
                .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                .await;
        }
        let _ = self.channel.close(200, "OK".into()).await;
        let _ = self.dead_letters.close(200, "OK".into()).await;
        let _ = self.connection.close(200, "OK".into()).await;
    }
}
