//! [`RabbitMqPublisher`]: one connection, one channel in confirm mode, each key in order.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation, Connection, ExchangeKind};
use tokio::time::Instant;

use super::builder::RabbitMqPublisherBuilder;
use super::classify::{
    ACCESS_REFUSED, NOT_FOUND, code_name, may_be_the_message, name_of, reply_code,
};
use super::connection::{RECONNECT_PAUSE, confirm_channel, connect};
use super::record::{Outgoing, Router, outgoing};
use super::topology::ensure_exchange;
use crate::broker_tls::TlsPem;
use crate::redact;
use crate::relay::{Delivery, NotReady, OutboxMessage, Publisher, publish_in_key_order};

/// Publishes outbox messages to RabbitMQ with publisher confirms: a message counts as
/// [`Published`](Delivery::Published) only once the broker acknowledged it.
///
/// Each message goes to the exchange named by its topic (see the [module docs](super) for the
/// message's properties and headers), routing key = aggregate id, `mandatory` and persistent.
/// A key's next message is sent only once the previous one was confirmed
/// ([`publish_in_key_order`]); keys travel side by side.
///
/// Failures, by the broker's AMQP reply code:
/// - no confirm within [`confirm_timeout`](RabbitMqPublisherBuilder::confirm_timeout), a
///   `basic.nack`, a lost channel or connection, a refused connection: an outage
///   ([`Unavailable`](Delivery::Unavailable)); the publisher reconnects on the next publish;
/// - no queue bound for the message (`basic.return`, NO_ROUTE), ACCESS_REFUSED on the
///   exchange, an exchange that cannot be declared: [`Unavailable`](Delivery::Unavailable),
///   naming the exchange (a topic-wide condition, not the event's fault; nothing is dropped);
/// - the broker closes the channel with PRECONDITION_FAILED or CONTENT_TOO_LARGE (e.g. a
///   message over `max_message_size`): the message is sent again *alone* on a new channel,
///   and only if it is refused again is it [`Failed`](Delivery::Failed) (poison), since the
///   close reached every message then in flight;
/// - an exchange name, routing key or header name over AMQP's 255 bytes: `Failed`.
///
/// One publisher holds one connection; share it (`Arc<RabbitMqPublisher>` is a [`Publisher`]
/// too) rather than building many.
///
/// ```no_run
/// use outbox_core::rabbitmq::RabbitMqPublisher;
/// use outbox_core::relay::{OutboxMessage, Publisher};
///
/// # async fn run(batch: Vec<OutboxMessage>) -> Result<(), Box<dyn std::error::Error>> {
/// let publisher = RabbitMqPublisher::builder()
///     .uri("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .build()?;
/// let outcomes = publisher.publish(&batch).await;
/// assert_eq!(outcomes.len(), batch.len());
/// # Ok(()) }
/// ```
pub struct RabbitMqPublisher {
    uri: String,
    tls: TlsPem,
    router: Router,
    exchange_kind: ExchangeKind,
    confirm_timeout: Duration,
    connection_name: String,
    slot: tokio::sync::Mutex<Slot>,
    /// Held shared by every publish, exclusively by a message sent again alone.
    gate: tokio::sync::RwLock<()>,
    /// Exchanges known to exist.
    exchanges: Mutex<HashSet<String>>,
    /// Held while declaring: a batch's first messages to a new exchange declare it once.
    declaring: tokio::sync::Mutex<()>,
    /// Why the broker is known to be unreachable.
    down: Mutex<Option<String>>,
}

/// The connection and its publishing channel, once connected.
#[derive(Default)]
struct Slot {
    link: Option<Link>,
    /// The last failed connection attempt: when, and why.
    failed: Option<(Instant, String)>,
}

#[derive(Clone)]
struct Link {
    connection: Arc<Connection>,
    channel: Channel,
}

/// How one attempt at a message ended.
enum Attempt {
    Done(Delivery),
    /// The broker closed the channel with a code that may be this message's fault, or that
    /// of another message in flight.
    Suspect(String),
}

impl RabbitMqPublisher {
    /// Starts configuring a publisher.
    ///
    /// ```
    /// let publisher = outbox_core::rabbitmq::RabbitMqPublisher::builder()
    ///     .uri("amqp://guest:guest@127.0.0.1:5672/%2f")
    ///     .build()?;
    /// # drop(publisher);
    /// # Ok::<(), outbox_core::rabbitmq::RabbitMqConfigError>(())
    /// ```
    pub fn builder() -> RabbitMqPublisherBuilder {
        RabbitMqPublisherBuilder::default()
    }

    pub(super) fn new(
        uri: String,
        tls: TlsPem,
        router: Router,
        exchange_kind: ExchangeKind,
        confirm_timeout: Duration,
        connection_name: String,
    ) -> Self {
        RabbitMqPublisher {
            uri,
            tls,
            router,
            exchange_kind,
            confirm_timeout,
            connection_name,
            slot: tokio::sync::Mutex::default(),
            gate: tokio::sync::RwLock::new(()),
            exchanges: Mutex::default(),
            declaring: tokio::sync::Mutex::default(),
            down: Mutex::default(),
        }
    }

    /// The exchange `msg` is published to.
    ///
    /// ```
    /// # use outbox_core::relay::OutboxMessage;
    /// # fn check(msg: OutboxMessage) -> Result<(), outbox_core::rabbitmq::RabbitMqConfigError> {
    /// let publisher = outbox_core::rabbitmq::RabbitMqPublisher::builder()
    ///     .uri("amqp://127.0.0.1:5672/%2f")
    ///     .exchange_prefix("prod.")
    ///     .build()?;
    /// assert_eq!(publisher.exchange_of(&msg), format!("prod.{}", msg.topic()));
    /// # Ok(()) }
    /// ```
    pub fn exchange_of(&self, msg: &OutboxMessage) -> String {
        self.router.topic(msg)
    }

    /// The confirm timeout the publisher was built with.
    ///
    /// ```
    /// let publisher = outbox_core::rabbitmq::RabbitMqPublisher::builder()
    ///     .uri("amqp://127.0.0.1:5672/%2f")
    ///     .build()?;
    /// assert_eq!(publisher.confirm_timeout(), outbox_core::rabbitmq::DEFAULT_CONFIRM_TIMEOUT);
    /// # Ok::<(), outbox_core::rabbitmq::RabbitMqConfigError>(())
    /// ```
    pub fn confirm_timeout(&self) -> Duration {
        self.confirm_timeout
    }

    /// The longest a [`publish`](Publisher::publish) should take to give every message an
    /// outcome: connecting and the confirm each within the confirm timeout, plus 2 s. The
    /// relay bounds each publish by it (its lease must be longer); a message without an
    /// outcome then is an outage.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let publisher = outbox_core::rabbitmq::RabbitMqPublisher::builder()
    ///     .uri("amqp://127.0.0.1:5672/%2f")
    ///     .confirm_timeout(Duration::from_secs(5))
    ///     .build()?;
    /// assert_eq!(publisher.publish_timeout(), Duration::from_secs(12));
    /// # Ok::<(), outbox_core::rabbitmq::RabbitMqConfigError>(())
    /// ```
    pub fn publish_timeout(&self) -> Duration {
        self.confirm_timeout * 2 + Duration::from_secs(2)
    }

    fn set_down(&self, why: Option<String>) {
        *self.down.lock().unwrap_or_else(PoisonError::into_inner) = why;
    }

    /// The connection and a channel in confirm mode: the current ones, a new channel if only
    /// the channel was closed, or a new connection (at most one attempt per
    /// [`RECONNECT_PAUSE`]; within it, the last attempt's error).
    async fn link(&self) -> Result<Link, String> {
        let mut slot = self.slot.lock().await;
        if let Some(link) = &mut slot.link {
            if link.channel.status().connected() {
                return Ok(link.clone());
            }
            if link.connection.status().connected()
                && let Ok(Ok(channel)) =
                    tokio::time::timeout(self.confirm_timeout, confirm_channel(&link.connection))
                        .await
            {
                link.channel = channel;
                return Ok(link.clone());
            }
        }
        slot.link = None;
        if let Some((at, why)) = &slot.failed
            && at.elapsed() < RECONNECT_PAUSE
        {
            return Err(why.clone());
        }
        let connected = async {
            let connection = connect(
                &self.uri,
                &self.tls,
                &self.connection_name,
                self.confirm_timeout,
            )
            .await?;
            let channel = tokio::time::timeout(self.confirm_timeout, confirm_channel(&connection))
                .await
                .map_err(|_| format!("opening a channel on {} timed out", redact::url(&self.uri)))?
                .map_err(|e| {
                    format!(
                        "opening a channel on {} failed: {e}",
                        redact::url(&self.uri)
                    )
                })?;
            Ok::<_, String>(Link {
                connection: Arc::new(connection),
                channel,
            })
        }
        .await;
        match connected {
            Ok(link) => {
                slot.failed = None;
                slot.link = Some(link.clone());
                self.set_down(None);
                Ok(link)
            }
            Err(why) => {
                slot.failed = Some((Instant::now(), why.clone()));
                self.set_down(Some(why.clone()));
                Err(why)
            }
        }
    }

    /// Declares `exchange` on its first use (see [`ensure_exchange`]).
    async fn ensure_exchange(&self, link: &Link, out: &Outgoing) -> Result<(), Delivery> {
        let name = out.exchange.as_str();
        let known = |e: &Mutex<HashSet<String>>| {
            e.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(name)
        };
        if known(&self.exchanges) {
            return Ok(());
        }
        let _declaring = self.declaring.lock().await;
        if known(&self.exchanges) {
            return Ok(());
        }
        let declared = tokio::time::timeout(
            self.confirm_timeout,
            ensure_exchange(&link.connection, &out.exchange, &self.exchange_kind),
        )
        .await;
        match declared {
            Ok(Ok(())) => {
                self.exchanges
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(name.to_owned());
                Ok(())
            }
            Ok(Err(e)) if reply_code(&e) == Some(ACCESS_REFUSED) => {
                Err(Delivery::Unavailable(format!(
                    "exchange `{name}`: the broker refuses access to it (ACCESS_REFUSED): {e}; \
                     every message for it waits until the user may use it"
                )))
            }
            Ok(Err(e)) => Err(Delivery::Unavailable(format!(
                "exchange `{name}` could not be declared ({}): {e}",
                code_name(&e)
            ))),
            Err(_) => Err(Delivery::Unavailable(format!(
                "exchange `{name}`: declaring it took longer than {:?}",
                self.confirm_timeout
            ))),
        }
    }

    /// Sends `msg` once and awaits its confirm.
    async fn attempt(&self, msg: &OutboxMessage, out: &Outgoing) -> Attempt {
        let link = match self.link().await {
            Ok(link) => link,
            Err(why) => return Attempt::Done(Delivery::Unavailable(why)),
        };
        if let Err(outage) = self.ensure_exchange(&link, out).await {
            return Attempt::Done(outage);
        }
        let (exchange, key) = (out.exchange.as_str(), out.routing_key.as_str());
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let confirmed = tokio::time::timeout(self.confirm_timeout, async {
            link.channel
                .basic_publish(
                    out.exchange.clone(),
                    out.routing_key.clone(),
                    options,
                    msg.payload.as_bytes(),
                    out.properties.clone(),
                )
                .await?
                .await
        })
        .await;
        let outage = |why: String| Attempt::Done(Delivery::Unavailable(why));
        match confirmed {
            Ok(Ok(Confirmation::Ack(None))) => Attempt::Done(Delivery::Published),
            Ok(Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)))) => {
                outage(format!(
                    "exchange `{exchange}` routes routing key `{key}` to no queue ({}): the \
                     message was not stored; bind a queue to the exchange (it is sent again)",
                    name_of(returned.reply_code)
                ))
            }
            Ok(Ok(Confirmation::Nack(None))) => outage(format!(
                "exchange `{exchange}`, routing key `{key}`: the broker refused the message \
                 (basic.nack, an internal error of the broker)"
            )),
            Ok(Ok(Confirmation::NotRequested)) => outage(format!(
                "exchange `{exchange}`, routing key `{key}`: the channel was not in confirm mode"
            )),
            Ok(Err(e)) => {
                let why = format!(
                    "exchange `{exchange}`, routing key `{key}`: not published ({}): {e}",
                    code_name(&e)
                );
                if reply_code(&e) == Some(NOT_FOUND) {
                    // Deleted since it was declared: declare it again next time.
                    self.exchanges
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(exchange);
                }
                if may_be_the_message(&e) {
                    return Attempt::Suspect(why);
                }
                if !link.connection.status().connected() {
                    self.set_down(Some(why.clone()));
                }
                outage(why)
            }
            Err(_) => outage(format!(
                "exchange `{exchange}`, routing key `{key}`: no publisher confirm within {:?}; \
                 the outcome is unknown",
                self.confirm_timeout
            )),
        }
    }

    /// Publishes one message and awaits its confirm; a message the broker may have refused
    /// for itself is sent again with no other message in flight, to know.
    async fn send(&self, msg: &OutboxMessage) -> Delivery {
        let exchange = self.router.topic(msg);
        let out = match outgoing(&exchange, msg) {
            Ok(out) => out,
            Err(why) => {
                return Delivery::Failed(format!("not sent to exchange `{exchange}`: {why}"));
            }
        };
        let first = {
            let _shared = self.gate.read().await;
            self.attempt(msg, &out).await
        };
        let why = match first {
            Attempt::Done(delivery) => return delivery,
            Attempt::Suspect(why) => why,
        };
        let _alone = self.gate.write().await;
        match self.attempt(msg, &out).await {
            Attempt::Done(delivery) => delivery,
            Attempt::Suspect(again) => Delivery::Failed(format!(
                "{again}; refused again when sent alone: the broker refuses this message \
                 (first: {why})"
            )),
        }
    }
}

impl Publisher for RabbitMqPublisher {
    /// Publishes each message and awaits its confirm, a key's messages one after the other
    /// (the next only once the previous one was confirmed), keys side by side
    /// ([`publish_in_key_order`]).
    ///
    /// ```no_run
    /// # use outbox_core::relay::{Delivery, OutboxMessage, Publisher};
    /// # async fn run(batch: &[OutboxMessage]) -> Result<(), outbox_core::rabbitmq::RabbitMqConfigError> {
    /// let publisher = outbox_core::rabbitmq::RabbitMqPublisher::builder()
    ///     .uri("amqp://guest:guest@127.0.0.1:5672/%2f")
    ///     .build()?;
    /// let outcomes = publisher.publish(batch).await;
    /// let published = outcomes.iter().filter(|d| **d == Delivery::Published).count();
    /// println!("{published} of {} published", batch.len());
    /// # Ok(()) }
    /// ```
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        publish_in_key_order(batch, |_, msg| self.send(msg)).await
    }

    /// Why the broker is unreachable, while the last connection attempt failed or the
    /// connection was lost, until a connection succeeds.
    fn unavailable(&self) -> Option<String> {
        self.down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Connects (or checks the connection and its channel) within `timeout`.
    async fn ready(&self, timeout: Duration) -> Result<(), NotReady> {
        match tokio::time::timeout(timeout, self.link()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(why)) => Err(NotReady::new(why)),
            Err(_) => Err(NotReady::new(format!(
                "cannot connect to RabbitMQ at {} within {timeout:?}",
                redact::url(&self.uri)
            ))),
        }
    }
}

/// Shows the URI without its password.
impl fmt::Debug for RabbitMqPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqPublisher")
            .field("uri", &redact::url(&self.uri))
            .field("router", &self.router)
            .field("exchange_kind", &self.exchange_kind)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("connection_name", &self.connection_name)
            .finish_non_exhaustive()
    }
}
