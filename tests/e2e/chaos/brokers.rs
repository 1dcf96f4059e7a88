//! The brokers a scenario can run against, each reached through a [`TcpProxy`] the scenario
//! breaks, and read back with the broker's own client.
//!
//! - Kafka: a private tansu broker ([`PrivateBroker`]), which advertises the proxy's address.
//! - NATS JetStream: the machine's server (`OUTBOX_TEST_NATS_URL`, default
//!   `nats://127.0.0.1:4222`); a single server advertises no other address, so every
//!   connection goes through the proxy. Read back through an ephemeral pull consumer of the
//!   topic's stream.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::AckPolicy, consumer::PullConsumer, consumer::pull};
use futures_util::StreamExt;

use super::proxy::{Mode, TcpProxy};
use super::reader::Record;
use super::services::PrivateBroker;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kafka,
    Nats,
}

impl Kind {
    /// The name in a scenario's row, e.g. `nats`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kafka => "kafka",
            Kind::Nats => "nats",
        }
    }

    /// The name in a scenario's title, e.g. `NATS JetStream`.
    pub fn title(self) -> &'static str {
        match self {
            Kind::Kafka => "Kafka",
            Kind::Nats => "NATS JetStream",
        }
    }

    /// The machine's own server of this kind, unproxied, as `outbox relay` takes it.
    pub fn shared(self) -> String {
        match self {
            Kind::Kafka => crate::harness::noida(),
            Kind::Nats => nats_url(),
        }
    }
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
            Kind::Nats => {
                let upstream = nats_url().trim_start_matches("nats://").to_owned();
                ChaosBroker::Proxied {
                    kind,
                    proxy: TcpProxy::start(0, &upstream),
                }
            }
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
            ChaosBroker::Proxied { proxy, .. } => proxy.address(),
        }
    }

    pub fn set(&self, mode: Mode) {
        match self {
            ChaosBroker::Kafka(broker) => broker.set(mode),
            ChaosBroker::Proxied { proxy, .. } => proxy.set(mode),
        }
    }
}

/// Deletes what a scenario left on a shared broker: the stream of `topic` (NATS). Kafka's
/// topics live on brokers of the test run's own.
pub fn forget(brokers: &str, topic: &str) {
    if brokers.starts_with("nats://") {
        runtime().block_on(async {
            if let Ok(client) = async_nats::connect(brokers).await {
                let js = jetstream::new(client);
                let _ = js.delete_stream(outbox::nats::stream_name(topic)).await;
            }
        });
    }
}

fn runtime() -> tokio::runtime::Runtime {
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
    let mut complete = !wait;
    let mut extra_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        match extra_until {
            None if complete || start.elapsed() > deadline => {
                extra_until = Some(now + Duration::from_millis(500));
            }
            Some(t) if now > t => break,
            _ => {}
        }
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
        complete |= done(&record);
        out.push(record);
    }
    out
}
