//! `RabbitMqPublisher` and `RabbitMqConsumer` against a real RabbitMQ
//! (`OUTBOX_TEST_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`), read back with
//! lapin's own client. Each test makes its own exchanges and queues and deletes them.
//!
//! ```text
//! cargo nextest run -p outbox-kernel --features rabbitmq,relay --test rabbitmq
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::fault::Transient;
use outbox_core::rabbitmq::{
    ConsumerStats, RabbitMqConsumer, RabbitMqConsumerBuilder, RabbitMqPublisher,
};
use outbox_core::relay::{Backoff, Delivery, OutboxMessage, Publisher};
use outbox_core::{BoxError, Envelope, Headers, NewMessage, OutboxEvent, Outcome};
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

// ---------------------------------------------------------------------------------------------
// The publisher
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_published_message_reads_back_with_its_event() {
    let mut rabbit = Rabbit::new().await;
    let (topic, queue) = (unique("order"), unique("read"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit.queue(&queue, &topic, false).await;
    let msg = placed(&topic, 42, 1);
    publish_all(&publisher(), std::slice::from_ref(&msg)).await;

    let got = rabbit.drain(&queue).await;
    assert_eq!(got.len(), 1);
    let d = &got[0];
    assert_eq!(
        (d.exchange.as_str(), d.routing_key.as_str()),
        (topic.as_str(), "42")
    );
    assert_eq!(d.data, msg.payload.as_bytes());
    let p = &d.properties;
    let id = msg.id.hyphenated().to_string();
    assert_eq!(
        p.message_id().as_ref().map(|s| s.as_str()),
        Some(id.as_str())
    );
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(*p.timestamp(), Some(msg.created_at.timestamp() as u64));
    assert_eq!(header(d, "id"), id);
    assert_eq!(header(d, "event_type"), "OrderPlaced");
    assert_eq!(header(d, "event_version"), "2");
    assert_eq!(header(d, "aggregate_type"), "order");
    assert_eq!(header(d, "traceparent"), "00-abc-def-01");
    rabbit.clean().await;
}

#[tokio::test]
async fn each_key_keeps_its_order_over_thousands_of_messages() {
    let mut rabbit = Rabbit::new().await;
    let (topic, queue) = (unique("order"), unique("order-read"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit.queue(&queue, &topic, false).await;
    let publisher = publisher();
    let all: Vec<OutboxMessage> = (0..3_000).map(|i| placed(&topic, i % 50, i)).collect();
    for batch in all.chunks(500) {
        publish_all(&publisher, batch).await;
    }
    let got = rabbit.drain(&queue).await;
    assert_eq!(got.len(), all.len());
    let mut last: HashMap<String, u64> = HashMap::new();
    for d in &got {
        let event: OrderPlaced = serde_json::from_slice(&d.data).unwrap();
        let before = last.insert(d.routing_key.to_string(), event.n);
        assert!(
            before.is_none_or(|b| b < event.n),
            "{before:?} then {}",
            event.n
        );
    }
    assert_eq!(last.len(), 50);
    rabbit.clean().await;
}

/// The publisher declares a missing exchange (no queue yet: unroutable, an outage naming
/// the exchange), and keeps an existing one of another kind as it is.
#[tokio::test]
async fn unroutable_messages_wait_until_a_queue_is_bound() {
    let mut rabbit = Rabbit::new().await;
    let (topic, queue) = (unique("new"), unique("late"));
    let publisher = publisher();
    let msg = placed(&topic, 7, 1);
    rabbit.owns(&[&topic], &[]);
    let outcomes = publisher.publish(std::slice::from_ref(&msg)).await;
    let why = outcomes[0].error().unwrap_or_default().to_owned();
    assert!(outcomes[0].is_outage(), "{outcomes:?}");
    assert!(
        why.contains(&topic) && why.contains("`7`") && why.contains("NO_ROUTE"),
        "{why}"
    );
    rabbit.queue(&queue, &topic, false).await;
    publish_all(&publisher, std::slice::from_ref(&msg)).await;
    let got = rabbit.drain(&queue).await;
    assert_eq!(got.len(), 1, "nothing lost, nothing twice");

    // A fanout exchange declared beforehand stays a fanout: an active declare as `topic`
    // would have been refused (PRECONDITION_FAILED).
    let (fanout, fan_queue) = (unique("fanout"), unique("fan"));
    rabbit.exchange(&fanout, ExchangeKind::Fanout).await;
    rabbit.queue(&fan_queue, &fanout, false).await;
    publish_all(&publisher, &[placed(&fanout, 8, 1)]).await;
    assert_eq!(rabbit.drain(&fan_queue).await.len(), 1);
    rabbit.clean().await;
}

#[tokio::test]
async fn an_unreachable_broker_is_an_outage_and_not_ready() {
    let publisher = RabbitMqPublisher::builder()
        .uri("amqp://relay:s3cret@127.0.0.1:1/%2f")
        .confirm_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let started = Instant::now();
    let outcomes = publisher
        .publish(&[placed("order", 1, 1), placed("order", 2, 1)])
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(outcomes.iter().all(Delivery::is_outage), "{outcomes:?}");
    let why = publisher.unavailable().expect("known down");
    let not_ready = publisher.ready(Duration::from_secs(1)).await.unwrap_err();
    for shown in [why, not_ready.to_string(), format!("{publisher:?}")] {
        assert!(
            shown.contains("127.0.0.1:1") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
    assert!(
        self::publisher()
            .ready(Duration::from_secs(5))
            .await
            .is_ok()
    );
}

// ---------------------------------------------------------------------------------------------
// The consumer
// ---------------------------------------------------------------------------------------------

/// Order 1 is applied; order 2 always fails and is dead-lettered after 2 attempts, its next
/// event parked behind it; order 3 fails with an outage three times and is then applied,
/// never dead-lettered. Everything is acknowledged.
#[tokio::test]
async fn handled_retried_dead_lettered_and_parked() {
    let mut rabbit = Rabbit::new().await;
    let (topic, group) = (unique("order"), unique("billing"));
    let (queue, dlt) = (format!("{group}.{topic}"), format!("{topic}.dlt"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit.queue(&queue, &topic, true).await;
    rabbit.owns(&[&dlt], &[&dlt]);
    let batch = [
        placed(&topic, 1, 0),
        placed(&topic, 2, 0),
        placed(&topic, 2, 1),
        placed(&topic, 3, 0),
    ];
    publish_all(&publisher(), &batch).await;

    let outages = Arc::new(Mutex::new(0));
    let seen = outages.clone();
    let running = start(
        consumer(&group, &topic)
            .max_attempts(2)
            .handler(move |event: Envelope<OrderPlaced>| {
                let seen = seen.clone();
                async move {
                    match event.order_id {
                        2 => Err::<Outcome<()>, BoxError>("card declined".into()),
                        3 => {
                            let mut seen = seen.lock().unwrap();
                            *seen += 1;
                            if *seen <= 3 {
                                return Err(
                                    Box::new(Transient::new("database restarting")) as BoxError
                                );
                            }
                            Ok(Outcome::Applied(()))
                        }
                        _ => Ok(Outcome::Applied(())),
                    }
                }
            })
            .build()
            .unwrap(),
    );
    running.until("handled", |s| n(&s.done) == 4).await;
    let stats = running.stop().await;
    assert_eq!(
        (n(&stats.applied), n(&stats.dead_lettered), n(&stats.parked)),
        (2, 2, 1),
        "{stats:?}"
    );
    assert_eq!(
        (n(&stats.transient_errors), n(&stats.handler_errors)),
        (3, 2),
        "{stats:?}"
    );

    let dead = rabbit.drain(&dlt).await;
    assert_eq!(dead.len(), 2);
    assert_eq!(header(&dead[0], "outbox.error"), "card declined");
    assert_eq!(header(&dead[0], "outbox.error.kind"), "handler");
    assert_eq!(header(&dead[0], "outbox.attempts"), "2");
    assert_eq!(header(&dead[0], "outbox.original.topic"), topic);
    assert_eq!(header(&dead[0], "outbox.consumer.group"), group);
    assert_eq!(header(&dead[0], "id"), batch[1].id.hyphenated().to_string());
    assert_eq!(dead[0].routing_key.as_str(), "2");
    assert_eq!(dead[0].data, batch[1].payload.as_bytes());
    assert_eq!(header(&dead[1], "outbox.error.kind"), "parked");
    assert_eq!(header(&dead[1], "id"), batch[2].id.hyphenated().to_string());
    assert!(
        rabbit.drain(&queue).await.is_empty(),
        "every delivery was acknowledged"
    );
    rabbit.clean().await;
}

/// A consumer that dies with a delivery in its handler never acknowledged it: the next
/// consumer of the group gets it again, and the one after it.
#[tokio::test]
async fn a_delivery_not_acknowledged_comes_again_to_the_next_consumer() {
    let mut rabbit = Rabbit::new().await;
    let (topic, group) = (unique("order"), unique("billing"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit
        .queue(&format!("{group}.{topic}"), &topic, true)
        .await;
    rabbit.owns(&[&format!("{topic}.dlt")], &[&format!("{topic}.dlt")]);
    let msg = placed(&topic, 5, 0);
    publish_all(&publisher(), std::slice::from_ref(&msg)).await;

    let (called, mut called_rx) = tokio::sync::mpsc::unbounded_channel();
    let stuck = start(
        consumer(&group, &topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                called.send(event.id).ok();
                async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok::<_, String>(Outcome::Applied(()))
                }
            })
            .build()
            .unwrap(),
    );
    let first = tokio::time::timeout(DEADLINE, called_rx.recv())
        .await
        .unwrap()
        .unwrap();
    stuck.task.abort(); // a crash: the connection goes, the delivery was never acknowledged

    let ids: Arc<Mutex<Vec<uuid::Uuid>>> = Arc::default();
    let got = ids.clone();
    let next = start(
        consumer(&group, &topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                got.lock().unwrap().push(event.id);
                async { Ok::<_, String>(Outcome::Applied(())) }
            })
            .build()
            .unwrap(),
    );
    next.until("redelivered", |s| n(&s.done) == 1).await;
    next.stop().await;
    assert_eq!((first, ids.lock().unwrap().clone()), (msg.id, vec![msg.id]));
    rabbit.clean().await;
}

/// Two consumers of one group: one is active and gets everything; when it stops, the other
/// takes over.
#[tokio::test]
async fn a_single_active_consumer_and_its_standby() {
    let mut rabbit = Rabbit::new().await;
    let (topic, group) = (unique("order"), unique("billing"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit
        .queue(&format!("{group}.{topic}"), &topic, true)
        .await;
    rabbit.owns(&[&format!("{topic}.dlt")], &[&format!("{topic}.dlt")]);
    let handled: Arc<Mutex<Vec<(&str, u64)>>> = Arc::default();
    let member = |name: &'static str| {
        let handled = handled.clone();
        consumer(&group, &topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                handled.lock().unwrap().push((name, event.n));
                async { Ok::<_, String>(Outcome::Applied(())) }
            })
            .build()
            .unwrap()
    };
    let publisher = publisher();
    let active = start(member("a"));
    publish_all(
        &publisher,
        &(0..10).map(|i| placed(&topic, i, i)).collect::<Vec<_>>(),
    )
    .await;
    active.until("a", |s| n(&s.done) == 10).await;
    let standby = start(member("b"));
    publish_all(
        &publisher,
        &(10..20).map(|i| placed(&topic, i, i)).collect::<Vec<_>>(),
    )
    .await;
    active.until("a again", |s| n(&s.done) == 20).await;
    active.stop().await;
    publish_all(
        &publisher,
        &(20..30).map(|i| placed(&topic, i, i)).collect::<Vec<_>>(),
    )
    .await;
    standby.until("b", |s| n(&s.done) == 10).await;
    standby.stop().await;
    let handled = handled.lock().unwrap().clone();
    let by = |who: &str| -> Vec<u64> {
        handled
            .iter()
            .filter(|(w, _)| *w == who)
            .map(|(_, n)| *n)
            .collect()
    };
    assert_eq!(by("a"), (0..20).collect::<Vec<_>>());
    assert_eq!(by("b"), (20..30).collect::<Vec<_>>());
    rabbit.clean().await;
}
