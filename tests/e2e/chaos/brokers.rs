//! The brokers a scenario can run against, each reached through a [`TcpProxy`] the scenario
//! breaks, and read back with the broker's own client.
//!
//! - Kafka: a private tansu broker ([`PrivateBroker`]), which advertises the proxy's address.
//! - NATS JetStream: the machine's server (`OUTBOX_TEST_NATS_URL`, default
//!   `nats://127.0.0.1:4222`); a single server advertises no other address, so every
//!   connection goes through the proxy. Read back through an ephemeral pull consumer of the
//!   topic's stream.
//! - RabbitMQ: the machine's broker (`OUTBOX_TEST_AMQP_URL`, default
//!   `amqp://guest:guest@127.0.0.1:5672/%2f`). A queue of the test's, bound to the topic's
//!   exchange before any relay starts ([`prepare`]), is read live by a thread of its own, which
//!   stamps each message with the time it arrived (AMQP's own timestamp is in whole seconds,
//!   and RabbitMQ 3.10 stamps none of its own): so RabbitMQ's "commit → publish" is commit →
//!   delivered to the reader, the broker's queueing included. The reader takes deliveries
//!   without acknowledgements (`no_ack`), so that it is never what holds them back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::AckPolicy, consumer::PullConsumer, consumer::pull};
use futures_util::StreamExt;

use super::proxy::{Mode, TcpProxy};
use super::reader::{ReadWindow, Record};
use super::services::PrivateBroker;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kafka,
    Nats,
    RabbitMq,
}

impl Kind {
    /// The name in a scenario's row, e.g. `nats`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kafka => "kafka",
            Kind::Nats => "nats",
            Kind::RabbitMq => "rabbitmq",
        }
    }

    /// The name in a scenario's title, e.g. `NATS JetStream`.
    pub fn title(self) -> &'static str {
        match self {
            Kind::Kafka => "Kafka",
            Kind::Nats => "NATS JetStream",
            Kind::RabbitMq => "RabbitMQ",
        }
    }

    /// The machine's own server of this kind, unproxied, as `outbox relay` takes it.
    pub fn shared(self) -> String {
        match self {
            Kind::Kafka => crate::harness::noida(),
            Kind::Nats => nats_url(),
            Kind::RabbitMq => amqp_url(),
        }
    }
}

pub fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// `host:port` of a `scheme://[user@]host:port[/…]` URL.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

pub fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A broker behind a proxy of this scenario's.
pub enum ChaosBroker {
    Kafka(PrivateBroker),
    Proxied { kind: Kind, proxy: TcpProxy },
}

impl ChaosBroker {
    pub fn start(kind: Kind) -> ChaosBroker {
        match kind {
            Kind::Kafka => ChaosBroker::Kafka(PrivateBroker::start()),
            kind => ChaosBroker::Proxied {
                kind,
                proxy: TcpProxy::start(0, &host_port(&kind.shared())),
            },
        }
    }

    /// The broker as `outbox relay` and [`super::reader`] take it: Kafka's bootstrap
    /// servers, or a URL.
    pub fn address(&self) -> String {
        match self {
            ChaosBroker::Kafka(broker) => broker.address(),
            ChaosBroker::Proxied {
                kind: Kind::Nats,
                proxy,
            } => {
                format!("nats://127.0.0.1:{}", proxy.port())
            }
            ChaosBroker::Proxied { kind, proxy } => {
                // The shared URL with the proxy's address: the same user and virtual host.
                let shared = kind.shared();
                shared.replacen(&host_port(&shared), &proxy.address(), 1)
            }
        }
    }

    pub fn set(&self, mode: Mode) {
        match self {
            ChaosBroker::Kafka(broker) => broker.set(mode),
            ChaosBroker::Proxied { proxy, .. } => proxy.set(mode),
        }
    }
}

/// What a scenario needs on the broker before any relay publishes: for RabbitMQ, the topic's
/// exchange and a queue of the test's bound to it, read from now on (a message that no queue
/// takes is not accepted: the relay would wait for one). Nothing for the others.
pub fn prepare(brokers: &str, topic: &str) {
    if brokers.starts_with("amqp://") {
        rabbit::listen(&amqp_url(), topic);
    }
}

/// Deletes what a scenario left on a shared broker: the stream of `topic` (NATS), the
/// exchange and queue of `topic` (RabbitMQ). Kafka's topics live on brokers of the test run's
/// own.
pub fn forget(brokers: &str, topic: &str) {
    if brokers.starts_with("amqp://") {
        rabbit::forget(&amqp_url(), topic);
    }
    if brokers.starts_with("nats://") {
        runtime().block_on(async {
            if let Ok(client) = async_nats::connect(brokers).await {
                let js = jetstream::new(client);
                let _ = js.delete_stream(outbox::nats::stream_name(topic)).await;
            }
        });
    }
}

/// A current-thread runtime for one blocking call into an async client.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// [`super::reader`]'s read for the brokers given as URLs: until `done` says so or
/// `deadline`, then half a second more.
pub fn read_until(
    url: &str,
    topic: &str,
    deadline: Duration,
    wait: bool,
    done: impl FnMut(&Record) -> bool,
) -> Vec<Record> {
    if url.starts_with("amqp://") {
        return rabbit::read_until(topic, deadline, wait, done);
    }
    assert!(url.starts_with("nats://"), "no reader for {url}");
    runtime().block_on(read_nats(url, topic, deadline, wait, done))
}

/// Reads `topic`'s subjects from the start of its stream, once the stream exists.
async fn read_nats(
    url: &str,
    topic: &str,
    deadline: Duration,
    wait: bool,
    mut done: impl FnMut(&Record) -> bool,
) -> Vec<Record> {
    let start = Instant::now();
    let client = async_nats::connect(url).await.expect("the NATS server");
    let js = jetstream::new(client);
    let stream = loop {
        match js.get_stream(outbox::nats::stream_name(topic)).await {
            Ok(stream) => break stream,
            Err(_) if start.elapsed() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(_) => return Vec::new(),
        }
    };
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config {
            filter_subject: format!("{topic}.>"),
            ack_policy: AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("an ephemeral consumer");
    let mut messages = consumer.messages().await.expect("the consumer's messages");
    let mut out = Vec::new();
    let mut window = ReadWindow::new(start, deadline, wait);
    while !window.over() {
        let Ok(Some(next)) =
            tokio::time::timeout(Duration::from_millis(100), messages.next()).await
        else {
            continue;
        };
        let message = match next {
            Ok(message) => message,
            Err(e) => {
                eprintln!("chaos reader: {e}");
                continue;
            }
        };
        let info = message.info().expect("a JetStream message");
        let record = Record {
            partition: 0,
            offset: info.stream_sequence as i64,
            id: message
                .headers
                .as_ref()
                .and_then(|h| h.get("id"))
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
            timestamp_ms: Some((info.published.unix_timestamp_nanos() / 1_000_000) as i64),
        };
        window.saw(done(&record));
        out.push(record);
    }
    out
}

/// RabbitMQ: a queue per topic, read by a thread from [`prepare`] to [`forget`].
mod rabbit {
    use super::*;
    use lapin::options::{
        BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{Connection, ConnectionProperties, ExchangeKind};

    /// What each topic's reader received so far, and whether it is to stop.
    type Received = Arc<(Mutex<Vec<Record>>, std::sync::atomic::AtomicBool)>;

    fn readers() -> &'static Mutex<HashMap<String, Received>> {
        static READERS: OnceLock<Mutex<HashMap<String, Received>>> = OnceLock::new();
        READERS.get_or_init(Mutex::default)
    }

    fn queue(topic: &str) -> String {
        format!("{topic}.chaos-reader")
    }

    pub fn listen(url: &str, topic: &str) {
        let received: Received = Arc::default();
        readers()
            .lock()
            .unwrap()
            .insert(topic.to_owned(), received.clone());
        let (url, topic) = (url.to_owned(), topic.to_owned());
        let (ready, is_ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            runtime().block_on(async move {
                let connection = Connection::connect(&url, ConnectionProperties::default())
                    .await
                    .expect("RabbitMQ is reachable");
                let channel = connection.create_channel().await.unwrap();
                let durable = ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                channel
                    .exchange_declare(
                        topic.as_str().into(),
                        ExchangeKind::Topic,
                        durable,
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let queue = queue(&topic);
                let options = QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                channel
                    .queue_declare(queue.as_str().into(), options, FieldTable::default())
                    .await
                    .unwrap();
                channel
                    .queue_bind(
                        queue.as_str().into(),
                        topic.as_str().into(),
                        "#".into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let mut deliveries = channel
                    .basic_consume(
                        queue.as_str().into(),
                        "chaos-reader".into(),
                        BasicConsumeOptions {
                            no_ack: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                ready.send(()).unwrap();
                let mut offset = 0;
                while !received.1.load(std::sync::atomic::Ordering::SeqCst) {
                    let next =
                        tokio::time::timeout(Duration::from_millis(100), deliveries.next()).await;
                    let Ok(Some(Ok(delivery))) = next else {
                        continue;
                    };
                    let id = delivery
                        .properties
                        .headers()
                        .as_ref()
                        .and_then(|h| h.inner().get("id"))
                        .and_then(|v| match v {
                            AMQPValue::LongString(s) => Some(s.to_string()),
                            _ => None,
                        })
                        .unwrap_or_default();
                    let now = chrono::Utc::now().timestamp_millis();
                    received.0.lock().unwrap().push(Record {
                        partition: 0,
                        offset,
                        id,
                        timestamp_ms: Some(now),
                    });
                    offset += 1;
                }
                let _ = connection.close(200, "done".into()).await;
            });
        });
        is_ready
            .recv_timeout(Duration::from_secs(30))
            .expect("the RabbitMQ reader started");
    }

    pub fn read_until(
        topic: &str,
        deadline: Duration,
        wait: bool,
        mut done: impl FnMut(&Record) -> bool,
    ) -> Vec<Record> {
        let received = readers()
            .lock()
            .unwrap()
            .get(topic)
            .cloned()
            .unwrap_or_else(|| panic!("no reader for {topic}: call prepare() before the relays"));
        let mut window = ReadWindow::new(Instant::now(), deadline, wait);
        let mut seen = 0;
        while !window.over() {
            let records = received.0.lock().unwrap().clone();
            for record in &records[seen..] {
                window.saw(done(record));
            }
            seen = records.len();
            std::thread::sleep(Duration::from_millis(50));
        }
        received.0.lock().unwrap().clone()
    }

    pub fn forget(url: &str, topic: &str) {
        if let Some(received) = readers().lock().unwrap().remove(topic) {
            received.1.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        runtime().block_on(async {
            if let Ok(connection) = Connection::connect(url, ConnectionProperties::default()).await
                && let Ok(channel) = connection.create_channel().await
            {
                let _ = channel
                    .queue_delete(queue(topic).as_str().into(), QueueDeleteOptions::default())
                    .await;
                let _ = channel
                    .exchange_delete(topic.into(), ExchangeDeleteOptions::default())
                    .await;
                let _ = connection.close(200, "done".into()).await;
            }
        });
    }
}
