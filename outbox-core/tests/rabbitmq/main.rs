//! `RabbitMqPublisher` and `RabbitMqConsumer` against a real RabbitMQ
//! (`OUTBOX_TEST_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`), read back with
//! lapin's own client. Each test makes its own exchanges and queues and deletes them.
//!
//! The reconnect tests close connections as an operator would, with `rabbitmqctl`'s
//! `close_connection`, and the size-limit test lowers the broker's `max_message_size` for a
//! moment (`rabbitmqctl eval`); run them where `rabbitmqctl` reaches the broker.
//!
//! ```text
//! cargo nextest run -p outbox-kernel --features rabbitmq,relay --test rabbitmq
//! ```

mod consumer;
mod publisher;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::rabbitmq::{
    ConsumerStats, RabbitMqConsumer, RabbitMqConsumerBuilder, RabbitMqPublisher,
};
use outbox_core::relay::{Backoff, Delivery, OutboxMessage, Publisher};
use outbox_core::{Headers, NewMessage, OutboxEvent};
use serde::{Deserialize, Serialize};

/// How long a test waits for the consumer to get through what it expects.
const DEADLINE: Duration = Duration::from_secs(30);
const FAST: Backoff = Backoff {
    initial: Duration::from_millis(10),
    max: Duration::from_millis(50),
    multiplier: 2.0,
    jitter: 0.0,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderPlaced", version = 2)]
struct OrderPlaced {
    #[outbox(aggregate_id)]
    order_id: u64,
    n: u64,
}

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

fn unique(what: &str) -> String {
    format!("outbox-test-{what}-{}", uuid::Uuid::now_v7().simple())
}

/// lapin's own connection, and what a test declared (deleted by `clean`).
struct Rabbit {
    _connection: Connection,
    channel: Channel,
    exchanges: Vec<String>,
    queues: Vec<String>,
}

impl Rabbit {
    async fn new() -> Rabbit {
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ is not reachable: start it or set OUTBOX_TEST_AMQP_URL");
        let channel = connection.create_channel().await.unwrap();
        Rabbit {
            _connection: connection,
            channel,
            exchanges: Vec::new(),
            queues: Vec::new(),
        }
    }

    async fn exchange(&mut self, name: &str, kind: ExchangeKind) {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let table = FieldTable::default();
        self.channel
            .exchange_declare(name.into(), kind, durable, table)
            .await
            .unwrap();
        self.exchanges.push(name.to_owned());
    }

    /// A durable queue bound to `exchange` with `#`; with `single_active`, as a consumer
    /// group's queue is declared.
    async fn queue(&mut self, name: &str, exchange: &str, single_active: bool) {
        let mut args = FieldTable::default();
        if single_active {
            args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        }
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        self.channel
            .queue_declare(name.into(), durable, args)
            .await
            .unwrap();
        let (bind, table) = (QueueBindOptions::default(), FieldTable::default());
        self.channel
            .queue_bind(name.into(), exchange.into(), "#".into(), bind, table)
            .await
            .unwrap();
        self.queues.push(name.to_owned());
    }

    /// Forgets about `name` on cleanup (the test declared it through the library).
    fn owns(&mut self, exchanges: &[&str], queues: &[&str]) {
        self.exchanges
            .extend(exchanges.iter().map(|e| e.to_string()));
        self.queues.extend(queues.iter().map(|q| q.to_string()));
    }

    /// Every message in `queue` (acknowledged).
    async fn drain(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let mut got = Vec::new();
        let ack = BasicGetOptions { no_ack: true };
        while let Some(m) = self.channel.basic_get(queue.into(), ack).await.unwrap() {
            got.push(m.delivery);
        }
        got
    }

    async fn clean(self) {
        for q in &self.queues {
            let _ = self
                .channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for e in &self.exchanges {
            let _ = self
                .channel
                .exchange_delete(e.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
    }
}

fn publisher() -> RabbitMqPublisher {
    RabbitMqPublisher::builder()
        .uri(amqp_url())
        .build()
        .unwrap()
}

fn placed(topic: &str, order_id: u64, n: u64) -> OutboxMessage {
    let m = NewMessage::from_event(&OrderPlaced { order_id, n }, Headers::new()).unwrap();
    OutboxMessage {
        seq: n as i64,
        id: m.id,
        aggregate_type: m.aggregate_type.into_owned(),
        aggregate_id: m.aggregate_id,
        event_type: m.event_type.into_owned(),
        event_version: m.event_version,
        payload: m.payload,
        headers: [("traceparent".to_owned(), "00-abc-def-01".to_owned())].into(),
        topic: Some(topic.to_owned()),
        shard: m.shard,
        created_at: m.created_at,
        attempts: 1,
    }
}

fn header(d: &lapin::message::Delivery, name: &str) -> String {
    match d
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name))
    {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("header {name}: {other:?}"),
    }
}

async fn publish_all(publisher: &RabbitMqPublisher, batch: &[OutboxMessage]) {
    let outcomes = publisher.publish(batch).await;
    assert!(
        outcomes.iter().all(|d| *d == Delivery::Published),
        "{outcomes:?}"
    );
}

/// A consumer running in the background.
struct Running {
    stats: Arc<ConsumerStats>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn start(consumer: RabbitMqConsumer) -> Running {
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));
    Running { stats, stop, task }
}

impl Running {
    async fn until(&self, what: &str, done: impl Fn(&ConsumerStats) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        while !done(&self.stats) {
            assert!(
                Instant::now() < deadline,
                "{what}: gave up waiting: {:?}",
                self.stats
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) -> Arc<ConsumerStats> {
        self.stop.send(()).unwrap();
        self.task.await.unwrap();
        self.stats
    }
}

fn consumer(group: &str, topic: &str) -> RabbitMqConsumerBuilder {
    RabbitMqConsumer::builder()
        .uri(amqp_url())
        .group(group)
        .topic(topic)
        .retry_backoff(FAST)
        .outage_backoff(FAST)
}

fn n(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(std::sync::atomic::Ordering::Relaxed)
}

/// Closes, as an operator would, every connection whose client-given name contains `name`;
/// how many.
fn close_connections(name: &str) -> usize {
    let rabbitmqctl = |args: &[&str]| {
        let out = std::process::Command::new("rabbitmqctl")
            .args(args)
            .output()
            .expect("the reconnect tests need `rabbitmqctl`");
        assert!(out.status.success(), "rabbitmqctl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = rabbitmqctl(&[
        "list_connections",
        "-q",
        "--no-table-headers",
        "pid",
        "client_properties",
    ]);
    let pids: Vec<&str> = listed
        .lines()
        .filter(|line| line.contains(name))
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    for pid in &pids {
        rabbitmqctl(&["close_connection", pid, "closed by an outbox test"]);
    }
    pids.len()
}
