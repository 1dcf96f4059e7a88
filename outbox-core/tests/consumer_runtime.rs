//! `KafkaConsumer` against real Kafka-protocol brokers, with in-memory handlers (the database
//! side, `#[idempotent]` handlers, is tested in the facade's `consumer` tests). Every test runs
//! as `noida::<test>` (noida-db, `KAFKA_BROKERS` or 127.0.0.1:9092) and `tansu::<test>` (tansu,
//! `OUTBOX_TEST_TANSU` or 127.0.0.1:9094), except the consumer-group test, which runs on noida-db
//! only: tansu takes about 20 s to finish a group join, so the tansu tests read assigned
//! partitions (`KafkaConsumerBuilder::assign`), committing offsets to the group all the same.
//!
//! Each test makes its own topics (3 partitions) and consumer groups.
//!
//! ```text
//! scripts/kafka.sh start
//! cargo test -p outbox-kernel --features kafka --test consumer_runtime
//! ```

use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::fault::Transient;
use outbox_core::kafka::{
    AfterDeadLetter, ConsumerStats, KafkaConfigError, KafkaConsumer, KafkaConsumerBuilder,
    KafkaPublisher, NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy,
};
use outbox_core::relay::{Backoff, Delivery, OutboxMessage, Publisher};
use outbox_core::{Envelope, Headers, NewMessage, OutboxEvent, Outcome};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

const PARTITIONS: i32 = 3;
/// How long a test waits for the consumer to get through what it expects.
const DEADLINE: Duration = Duration::from_secs(90);

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

/// Headers and payload of a record produced by hand.
type RawRecord = (Vec<(&'static str, Vec<u8>)>, Vec<u8>);

struct Broker {
    name: &'static str,
    bootstrap: String,
}

fn broker(name: &'static str, var: &str, default: &str) -> Broker {
    let bootstrap = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    for addr in bootstrap.split(',') {
        let reachable = addr
            .trim()
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
        assert!(
            reachable,
            "the {name} broker at {addr} is not reachable: run `scripts/kafka.sh start` \
             (or point {var} at a running Kafka broker)"
        );
    }
    Broker { name, bootstrap }
}

fn noida() -> Broker {
    broker("noida-db", "KAFKA_BROKERS", "127.0.0.1:9092")
}

fn tansu() -> Broker {
    broker("tansu", "OUTBOX_TEST_TANSU", "127.0.0.1:9094")
}

macro_rules! on_both_brokers {
    ($($test:ident),* $(,)?) => {
        mod noida {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test(super::noida()).await })*
        }
        mod tansu {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test(super::tansu()).await })*
        }
    };
}

on_both_brokers!(
    handler_errors_are_retried_then_dead_lettered_with_the_error,
    undecodable_messages_are_dead_lettered_or_skipped_and_the_consumer_goes_on,
    every_partition_keeps_its_order_across_retries,
    shutdown_commits_what_is_done,
    transient_errors_are_retried_beyond_max_attempts_in_order,
    a_dead_letter_parks_the_later_messages_of_its_key_unless_skipping,
    a_second_service_and_a_rolling_deploy_dead_letter_nothing,
    an_unwritable_dead_letter_topic_blocks_the_partition_visibly,
);

fn unique(what: &str) -> String {
    format!("outbox-{what}-{}", Uuid::now_v7().simple())
}

impl Broker {
    async fn topic(&self, what: &str) -> String {
        let topic = unique(what);
        self.create_topics(&[&topic, &format!("{topic}.dlt")]).await;
        topic
    }

    async fn create_topics(&self, topics: &[&str]) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .unwrap();
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for result in admin.create_topics(&new, &options).await.unwrap() {
            result.unwrap_or_else(|(t, e)| panic!("{}: creating {t}: {e}", self.name));
        }
    }

    /// Publishes like the relay does: `KafkaPublisher`, every message to `topic`.
    async fn publish(&self, topic: &str, messages: &[OutboxMessage]) {
        let topic = topic.to_owned();
        let publisher = KafkaPublisher::builder()
            .brokers(&self.bootstrap)
            .topic_for(move |_| topic.clone())
            .build()
            .unwrap();
        let outcomes = publisher.publish(messages).await;
        assert!(
            outcomes.iter().all(|o| *o == Delivery::Published),
            "{}: {outcomes:?}",
            self.name
        );
    }

    /// Produces raw records to partition 0, in order, each with its key.
    async fn produce_raw(&self, topic: &str, records: &[(&str, RawRecord)]) {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("enable.idempotence", "true")
            .create()
            .unwrap();
        for (key, (headers, payload)) in records {
            let mut h = OwnedHeaders::new();
            for (k, v) in headers {
                h = h.insert(Header {
                    key: k,
                    value: Some(v.as_slice()),
                });
            }
            let record = FutureRecord::<str, [u8]>::to(topic)
                .partition(0)
                .key(*key)
                .payload(payload.as_slice())
                .headers(h);
            producer
                .send(record, Duration::from_secs(10))
                .await
                .unwrap_or_else(|(e, _)| panic!("{}: producing: {e}", self.name));
        }
    }

    /// A consumer of `topic` in a fresh group, reading every partition (assigned, not
    /// subscribed), retrying fast.
    fn consumer(&self, topic: &str, group: &str) -> KafkaConsumerBuilder {
        KafkaConsumer::builder()
            .brokers(&self.bootstrap)
            .group(group)
            .assign(topic, 0..PARTITIONS)
            .set("fetch.wait.max.ms", "100")
            .retry_backoff(Backoff {
                initial: Duration::from_millis(20),
                max: Duration::from_millis(100),
                multiplier: 2.0,
                jitter: 0.2,
            })
    }

    /// Reads `topic` from the beginning until `n` records arrived (or the deadline).
    async fn read(&self, topic: &str, n: usize) -> Vec<OwnedMessage> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "100")
            .create()
            .unwrap();
        let mut assignment = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        let deadline = Instant::now() + DEADLINE;
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, consumer.recv()).await {
                Ok(Ok(m)) => got.push(m.detach()),
                Ok(Err(e)) => panic!("{}: reading {topic}: {e}", self.name),
                Err(_) => break,
            }
        }
        got
    }
}

/// Runs `consumer` until `done` holds of its counters (panicking with them after the
/// deadline), then shuts it down gracefully.
async fn run_until(
    name: &str,
    consumer: KafkaConsumer,
    done: impl Fn(&ConsumerStats) -> bool,
) -> Arc<ConsumerStats> {
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));
    let deadline = Instant::now() + DEADLINE;
    while !done(&stats) {
        assert!(
            Instant::now() < deadline,
            "{name}: gave up waiting: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    task.await.unwrap();
    stats
}

fn n(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(std::sync::atomic::Ordering::Relaxed)
}

fn placed(order_id: u64, n: u64) -> OutboxMessage {
    claimed(
        NewMessage::from_event(&OrderPlaced { order_id, n }, Headers::new()).unwrap(),
        n as i64,
    )
}

fn claimed(m: NewMessage, seq: i64) -> OutboxMessage {
    OutboxMessage {
        seq,
        id: m.id,
        aggregate_type: m.aggregate_type.into_owned(),
        aggregate_id: m.aggregate_id,
        event_type: m.event_type.into_owned(),
        event_version: m.event_version,
        payload: m.payload,
        headers: m.headers,
        topic: None,
        shard: m.shard,
        created_at: m.created_at,
        attempts: 1,
    }
}

fn header<'a>(m: &'a OwnedMessage, name: &str) -> &'a str {
    let value = m
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == name))
        .and_then(|h| h.value)
        .unwrap_or_else(|| panic!("no header {name}"));
    std::str::from_utf8(value).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Order 1 fails twice (the first time with a panic) and then succeeds; order 2 always fails
/// and ends in the dead-letter topic after 3 attempts, with the error; order 3 succeeds at once.
async fn handler_errors_are_retried_then_dead_lettered_with_the_error(broker: Broker) {
    let topic = broker.topic("retry").await;
    let messages = [placed(1, 0), placed(2, 0), placed(3, 0)];
    broker.publish(&topic, &messages).await;

    let attempts: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let seen = attempts.clone();
    let consumer = broker
        .consumer(&topic, &unique("retry"))
        .max_attempts(3)
        .handler(move |event: Envelope<OrderPlaced>| {
            let seen = seen.clone();
            async move {
                let attempt = {
                    let mut seen = seen.lock().unwrap();
                    let a = seen.entry(event.order_id).or_default();
                    *a += 1;
                    *a
                };
                match (event.order_id, attempt) {
                    (1, 1) => panic!("the card reader exploded"),
                    (1, 2) | (2, _) => Err(format!("card declined for order {}", event.order_id)),
                    _ => Ok(Outcome::Applied(())),
                }
            }
        })
        .build()
        .unwrap();
    let stats = run_until(broker.name, consumer, |s| {
        n(&s.applied) == 2 && n(&s.dead_lettered) == 1
    })
    .await;
    assert_eq!(n(&stats.handler_errors), 2 + 3, "{stats:?}");
    assert_eq!(n(&stats.done), 3, "{stats:?}");
    assert_eq!(
        *attempts.lock().unwrap(),
        HashMap::from([(1, 3), (2, 3), (3, 1)])
    );

    let dead = broker.read(&format!("{topic}.dlt"), 1).await;
    assert_eq!(dead.len(), 1, "{}", broker.name);
    let d = &dead[0];
    assert_eq!(header(d, "outbox.error"), "card declined for order 2");
    assert_eq!(header(d, "outbox.error.kind"), "handler");
    assert_eq!(header(d, "outbox.attempts"), "3");
    assert_eq!(header(d, "outbox.original.topic"), topic);
    assert!(header(d, "outbox.consumer.group").starts_with("outbox-retry-"));
    header(d, "outbox.original.partition")
        .parse::<i32>()
        .unwrap();
    header(d, "outbox.original.offset").parse::<i64>().unwrap();
    // The original message travels as it was: key, payload, headers.
    assert_eq!(header(d, "id"), messages[1].id.hyphenated().to_string());
    assert_eq!(d.key(), Some(&b"2"[..]));
    assert_eq!(d.payload(), Some(messages[1].payload.as_bytes()));
}

/// Garbage bytes, a missing header, an unknown event type and a too-new version (each of its
/// own key; the last two treated as undecodable by policy, as they are not by default), each
/// followed by a good message (of another key) on the same partition: dead-lettered with the
/// reason (or skipped by policy), and the good messages are handled. A
/// last good message of the garbage's key is parked behind it (dead-letter policy) or handled
/// (skip policy: nothing was dead-lettered).
async fn undecodable_messages_are_dead_lettered_or_skipped_and_the_consumer_goes_on(
    broker: Broker,
) {
    let topic = broker.topic("undecodable").await;
    let good = |n: u64| {
        let m = placed(7, n);
        (headers_of(&m), m.payload.into_bytes())
    };
    let mut missing_id = good(1);
    missing_id.0.retain(|(k, _)| *k != "id");
    let mut unknown = good(2);
    set(&mut unknown.0, "event_type", b"OrderShipped");
    let mut too_new = good(3);
    set(&mut too_new.0, "event_version", b"3");
    let garbage = (good(0).0, b"\xff\x00 not json".to_vec());
    let records = [
        ("bad-0", garbage),
        ("k", good(10)),
        ("bad-1", missing_id),
        ("k", good(11)),
        ("bad-2", unknown),
        ("k", good(12)),
        ("bad-3", too_new),
        ("k", good(13)),
        ("bad-0", good(14)),
    ];
    broker.produce_raw(&topic, &records).await;

    let handled: Arc<Mutex<Vec<u64>>> = Arc::default();
    let handler = |handled: Arc<Mutex<Vec<u64>>>| {
        move |event: Envelope<OrderPlaced>| {
            handled.lock().unwrap().push(event.n);
            async { Ok::<_, String>(Outcome::Applied(())) }
        }
    };
    let consumer = broker
        .consumer(&topic, &unique("dead-letter"))
        .on_undecodable(UndecodablePolicy::DeadLetter)
        .on_unhandled(UnhandledPolicy::Undecodable)
        .on_newer_version(NewerVersionPolicy::Undecodable)
        .handler(handler(handled.clone()))
        .build()
        .unwrap();
    let stats = run_until(broker.name, consumer, |s| n(&s.done) == 9).await;
    assert_eq!(
        (n(&stats.applied), n(&stats.dead_lettered), n(&stats.parked)),
        (4, 5, 1),
        "{stats:?}"
    );
    assert_eq!(*handled.lock().unwrap(), [10, 11, 12, 13]);

    let mut dead = broker.read(&format!("{topic}.dlt"), 5).await;
    assert_eq!(dead.len(), 5, "{}", broker.name);
    // Dead letters of different keys land on different partitions: put them back in order.
    dead.sort_by_key(|d| header(d, "outbox.original.offset").parse::<i64>().unwrap());
    let parked = dead.pop().unwrap();
    assert_eq!(header(&parked, "outbox.error.kind"), "parked");
    assert_eq!(
        header(&parked, "outbox.parked.behind"),
        format!("{topic}/0/{}", header(&dead[0], "outbox.original.offset"))
    );
    let reasons: Vec<&str> = dead.iter().map(|d| header(d, "outbox.error")).collect();
    assert!(
        reasons[0].starts_with(
            "the payload of event `OrderPlaced` does not decode as `consumer_runtime::OrderPlaced`: expected value"
        ),
        "{reasons:?}"
    );
    assert!(reasons[1].starts_with("missing header `id`"), "{reasons:?}");
    assert_eq!(
        reasons[2],
        "no handler for event type `OrderShipped` of aggregate `order`; this consumer handles \
         order/OrderPlaced v2"
    );
    assert!(
        reasons[3].starts_with("event `OrderPlaced` has version 3, newer than version 2"),
        "{reasons:?}"
    );
    for d in &dead {
        assert_eq!(header(d, "outbox.error.kind"), "undecodable");
        assert_eq!(header(d, "outbox.attempts"), "0");
    }
    assert_eq!(dead[0].payload(), Some(&b"\xff\x00 not json"[..]));

    // Skipped by policy: another group reads the same topic, logs and goes on.
    handled.lock().unwrap().clear();
    let consumer = broker
        .consumer(&topic, &unique("skip"))
        .on_undecodable(UndecodablePolicy::Skip)
        .on_unhandled(UnhandledPolicy::Undecodable)
        .on_newer_version(NewerVersionPolicy::Undecodable)
        .handler(handler(handled.clone()))
        .build()
        .unwrap();
    let stats = run_until(broker.name, consumer, |s| n(&s.done) == 9).await;
    assert_eq!(
        (
            n(&stats.applied),
            n(&stats.skipped),
            n(&stats.dead_lettered)
        ),
        (5, 4, 0)
    );
    assert_eq!(*handled.lock().unwrap(), [10, 11, 12, 13, 14]);
}

/// The events of the `shop` aggregate as their producer declares them: one enum.
mod shop_v1 {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "shop")]
    pub enum ShopEvent {
        OrderPlaced {
            #[outbox(aggregate_id)]
            order_id: u64,
            n: u64,
        },
        OrderCancelled {
            #[outbox(aggregate_id)]
            order_id: u64,
            n: u64,
        },
    }
}

/// The producer's next release: a new event type, and `OrderPlaced` in a version 2 (a struct
/// of its own now).
mod shop_v2 {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "shop")]
    pub enum ShopEvent {
        OrderShipped {
            #[outbox(aggregate_id)]
            order_id: u64,
            n: u64,
        },
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "shop", event_type = "OrderPlaced", version = 2)]
    pub struct OrderPlaced {
        #[outbox(aggregate_id)]
        pub order_id: u64,
        pub n: u64,
        #[serde(default)]
        pub note: String,
    }
}

/// What another service (billing) declares of the topic: `OrderPlaced` alone, as a struct.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(crate = outbox_core, aggregate = "shop", event_type = "OrderPlaced", version = 1)]
struct BillingOrderPlaced {
    #[outbox(aggregate_id)]
    order_id: u64,
    n: u64,
}

/// A second service consumes a topic whose producer declares its events as one enum, handling
/// only `OrderPlaced`, declared as its own struct; then the producer is deployed first with a
/// new event type and a version 2 of `OrderPlaced`, while that consumer runs; then the
/// consumer is upgraded (same group). With the defaults: the enum's variant decodes as the
/// struct, the other event types are acknowledged (not dead-lettered, no key parked), the
/// consumer holds at the first version 2 until the upgrade, and every `OrderPlaced` is applied
/// once, in order per order.
async fn a_second_service_and_a_rolling_deploy_dead_letter_nothing(broker: Broker) {
    use shop_v1::ShopEvent as V1;
    use shop_v2::ShopEvent as V2;
    const ORDERS: u64 = 6;
    let topic = broker.topic("shop").await;
    let mut messages = Vec::new();
    for order_id in 0..ORDERS {
        for (n, cancelled) in [(0, false), (1, true), (2, false)] {
            let event = match cancelled {
                false => V1::OrderPlaced { order_id, n },
                true => V1::OrderCancelled { order_id, n },
            };
            let seq = messages.len() as i64;
            messages.push(claimed(
                NewMessage::from_event(&event, Headers::new()).unwrap(),
                seq,
            ));
        }
    }
    // Written the wire's way: the variant's own fields, no wrapper naming it.
    assert_eq!(messages[0].payload, r#"{"order_id":0,"n":0}"#);
    broker.publish(&topic, &messages).await;
    let mut deployed = Vec::new();
    for order_id in 0..ORDERS {
        let shipped = V2::OrderShipped { order_id, n: 3 };
        let placed = shop_v2::OrderPlaced {
            order_id,
            n: 4,
            note: "gift".into(),
        };
        let seq = (messages.len() + deployed.len()) as i64;
        deployed.push(claimed(
            NewMessage::from_event(&shipped, Headers::new()).unwrap(),
            seq,
        ));
        deployed.push(claimed(
            NewMessage::from_event(&placed, Headers::new()).unwrap(),
            seq + 1,
        ));
    }
    broker.publish(&topic, &deployed).await;

    // What an `#[idempotent]` handler keeps: the inbox of event ids, and the effects.
    type Applied = Arc<Mutex<(std::collections::HashSet<Uuid>, Vec<(u64, u64)>)>>;
    let applied: Applied = Arc::default();
    let apply = |applied: &Applied, id: Uuid, order_id: u64, n: u64| {
        let mut a = applied.lock().unwrap();
        match a.0.insert(id) {
            true => {
                a.1.push((order_id, n));
                Outcome::Applied(())
            }
            false => Outcome::Duplicate,
        }
    };
    let group = unique("billing");
    let a = applied.clone();
    let old = broker
        .consumer(&topic, &group)
        .handler(move |event: Envelope<BillingOrderPlaced>| {
            let outcome = apply(&a, event.id, event.order_id, event.n);
            async move { Ok::<_, String>(outcome) }
        })
        .build()
        .unwrap();
    let stats = run_until(broker.name, old, |s| {
        n(&s.waiting_for_upgrade) == 1 && n(&s.newer_version_attempts) >= 2
    })
    .await;
    assert_eq!(
        (n(&stats.dead_lettered), n(&stats.parked), n(&stats.skipped)),
        (0, 0, 0),
        "{}: {stats:?}",
        broker.name
    );
    assert!(n(&stats.unhandled) >= 1, "{}: {stats:?}", broker.name);
    let before = applied.lock().unwrap().1.len();
    assert!(
        before >= 1,
        "{}: nothing applied before the hold",
        broker.name
    );
    let (old_unhandled, held) = (n(&stats.unhandled), n(&stats.newer_version_attempts));

    let a = applied.clone();
    let upgraded = broker
        .consumer(&topic, &group)
        .handler(move |event: Envelope<shop_v2::OrderPlaced>| {
            let outcome = apply(&a, event.id, event.order_id, event.n);
            async move { Ok::<_, String>(outcome) }
        })
        .build()
        .unwrap();
    let placed = (ORDERS * 3) as usize;
    let done = applied.clone();
    let upgraded_at = Instant::now();
    let stats = run_until(broker.name, upgraded, move |_| {
        done.lock().unwrap().0.len() == placed
    })
    .await;
    let caught_up = upgraded_at.elapsed();
    assert_eq!(
        (n(&stats.dead_lettered), n(&stats.parked)),
        (0, 0),
        "{}: {stats:?}",
        broker.name
    );
    let effects = applied.lock().unwrap().1.clone();
    assert_eq!(effects.len(), placed, "{}: each applied once", broker.name);
    for order_id in 0..ORDERS {
        let ns: Vec<u64> = effects
            .iter()
            .filter(|(o, _)| *o == order_id)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(ns, [0, 2, 4], "{}: order {order_id}", broker.name);
    }
    eprintln!(
        "{}: rolling deploy: {} messages written ({placed} OrderPlaced, v1 as an enum variant, \
         v2 as a struct); the old consumer applied {before}, acknowledged {old_unhandled} \
         without a handler, held {held} attempts at version 2, dead-lettered 0; the upgraded \
         one applied the rest in {caught_up:?}, dead-lettered 0, each once, in order",
        broker.name,
        messages.len() + deployed.len()
    );
}

/// 300 events of 10 orders over 3 partitions, some failing once: every order's events are
/// handled in publish order, each once.
async fn every_partition_keeps_its_order_across_retries(broker: Broker) {
    let topic = broker.topic("order").await;
    let messages: Vec<OutboxMessage> = (0..300).map(|i| placed(i % 10, i / 10)).collect();
    broker.publish(&topic, &messages).await;

    let handled: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let failed_once: Arc<Mutex<std::collections::HashSet<(u64, u64)>>> = Arc::default();
    let (h, f) = (handled.clone(), failed_once.clone());
    let consumer = broker
        .consumer(&topic, &unique("order"))
        .handler(move |event: Envelope<OrderPlaced>| {
            let key = (event.order_id, event.n);
            let fail = key.1 % 7 == 3 && f.lock().unwrap().insert(key);
            if !fail {
                h.lock().unwrap().push(key);
            }
            async move {
                if fail {
                    Err("transient")
                } else {
                    Ok(Outcome::Applied(()))
                }
            }
        })
        .build()
        .unwrap();
    let stats = run_until(broker.name, consumer, |s| n(&s.applied) == 300).await;
    assert_eq!(n(&stats.handler_errors), 10 * 4, "{stats:?}");
    let handled = handled.lock().unwrap();
    assert_eq!(handled.len(), 300);
    for order in 0..10 {
        let seq: Vec<u64> = handled
            .iter()
            .filter(|(o, _)| *o == order)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(
            seq,
            (0..30).collect::<Vec<_>>(),
            "{}: order {order}",
            broker.name
        );
    }
}

/// Offsets are committed on shutdown (background commits are off here): a new consumer of the
/// same group gets only what was published after.
async fn shutdown_commits_what_is_done(broker: Broker) {
    let topic = broker.topic("shutdown").await;
    let group = unique("shutdown");
    broker
        .publish(&topic, &(0..20).map(|i| placed(i, 0)).collect::<Vec<_>>())
        .await;
    let handler = |event: Envelope<OrderPlaced>| async move {
        let _ = event;
        Ok::<_, String>(Outcome::Applied(()))
    };
    let first = broker
        .consumer(&topic, &group)
        .set("auto.commit.interval.ms", "3600000")
        .handler(handler)
        .build()
        .unwrap();
    run_until(broker.name, first, |s| n(&s.applied) == 20).await;

    broker
        .publish(
            &topic,
            &(100..105).map(|i| placed(i, 0)).collect::<Vec<_>>(),
        )
        .await;
    let second = broker
        .consumer(&topic, &group)
        .handler(handler)
        .build()
        .unwrap();
    let stats = run_until(broker.name, second, |s| n(&s.applied) >= 5).await;
    assert_eq!(n(&stats.received), 5, "{}: {stats:?}", broker.name);
}

/// Subscribing as a group member (noida-db only, see the module docs): messages are handled,
/// and a member that joins later after a graceful shutdown resumes after the committed offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noida_group_subscription_resumes_after_the_committed_offsets() {
    let broker = noida();
    let topic = broker.topic("group").await;
    let group = unique("group");
    broker
        .publish(&topic, &(0..10).map(|i| placed(i, 0)).collect::<Vec<_>>())
        .await;
    let handler = |event: Envelope<OrderPlaced>| async move {
        let _ = event;
        Ok::<_, String>(Outcome::Applied(()))
    };
    let member = |group: &str| {
        KafkaConsumer::builder()
            .brokers(&broker.bootstrap)
            .group(group)
            .topic(&topic)
            .set("fetch.wait.max.ms", "100")
            .handler(handler)
            .build()
            .unwrap()
    };
    run_until(broker.name, member(&group), |s| n(&s.applied) == 10).await;
    broker
        .publish(&topic, &(10..12).map(|i| placed(i, 0)).collect::<Vec<_>>())
        .await;
    let stats = run_until(broker.name, member(&group), |s| n(&s.applied) >= 2).await;
    assert_eq!(n(&stats.received), 2, "{stats:?}");
}

#[tokio::test]
async fn configuration_mistakes_are_refused_by_name() {
    let ok = |event: Envelope<OrderPlaced>| async move {
        let _ = event;
        Ok::<_, String>(Outcome::Applied(()))
    };
    let base = || {
        KafkaConsumer::builder()
            .brokers("127.0.0.1:9")
            .group("g")
            .topic("t")
    };
    let message = |b: KafkaConsumerBuilder| b.build().unwrap_err().to_string();
    assert_eq!(
        message(base()),
        "invalid `handler`: a consumer needs at least one handler: call `.handler(...)`"
    );
    assert_eq!(
        message(base().handler(ok).handler(ok)),
        "invalid `handler`: event type `OrderPlaced` of aggregate `order` has two handlers"
    );
    assert!(message(base().handler(ok).assign("t", [0])).starts_with("invalid `assign`"));
    assert!(message(base().handler(ok).max_attempts(0)).starts_with("invalid `max_attempts`"));
    // A NaN jitter made every wait zero, a negative multiplier shrank them: both were taken.
    let sane = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_secs(1),
        multiplier: 2.0,
        jitter: 0.2,
    };
    assert_eq!(
        message(base().handler(ok).retry_backoff(Backoff {
            jitter: f64::NAN,
            ..sane
        })),
        "invalid `retry_backoff.jitter`: must be between 0 and 1, got NaN"
    );
    assert_eq!(
        message(base().handler(ok).outage_backoff(Backoff {
            multiplier: -2.0,
            ..sane
        })),
        "invalid `outage_backoff.multiplier`: must be between 1 and 1000, got -2"
    );
    assert!(
        message(base().handler(ok).retry_backoff(Backoff {
            initial: Duration::from_secs(2),
            ..sane
        }))
        .starts_with("invalid `retry_backoff.max`")
    );
    assert!(
        message(base().handler(ok).set("enable.auto.offset.store", "true"))
            .contains("the consumer stores an offset only once its message is done")
    );
    let err = base()
        .handler(ok)
        .set("session.timeout.ms", "soon")
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, KafkaConfigError::Invalid { key, .. } if key == "session.timeout.ms"),
        "{err}"
    );
    assert!(matches!(
        KafkaConsumer::builder()
            .group("g")
            .topic("t")
            .handler(ok)
            .build(),
        Err(KafkaConfigError::MissingBrokers)
    ));
}

/// 20 events of order 1 and 20 of order 2. Order 1's first event fails 6 times with errors
/// marked or recognised as transient (a `Transient` marker, an io error `ConnectionRefused`
/// inside the user's error), with `max_attempts(2)`: it is retried until it passes, nothing is
/// dead-lettered, and every event is handled once, in order (the partition was paused while
/// the message was held, and resumed from after it).
async fn transient_errors_are_retried_beyond_max_attempts_in_order(broker: Broker) {
    #[derive(Debug)]
    struct DbDown(std::io::Error);
    impl std::fmt::Display for DbDown {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("could not reach the billing database")
        }
    }
    impl std::error::Error for DbDown {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    let topic = broker.topic("transient").await;
    let messages: Vec<OutboxMessage> = (0..40).map(|i| placed(1 + i % 2, i / 2)).collect();
    broker.publish(&topic, &messages).await;

    let handled: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let failures: Arc<Mutex<u32>> = Arc::default();
    let (h, f) = (handled.clone(), failures.clone());
    let consumer = broker
        .consumer(&topic, &unique("transient"))
        .max_attempts(2)
        .outage_backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: 0.2,
        })
        .handler(move |event: Envelope<OrderPlaced>| {
            let key = (event.order_id, event.n);
            let failure = if key == (1, 0) {
                let mut f = f.lock().unwrap();
                *f += 1;
                Some(*f).filter(|n| *n <= 6)
            } else {
                None
            };
            if failure.is_none() {
                h.lock().unwrap().push(key);
            }
            async move {
                match failure {
                    Some(n) if n % 2 == 0 => Err(Box::new(Transient::new(format!(
                        "the payment provider is rate limiting (failure {n})"
                    ))) as outbox_core::BoxError),
                    Some(_) => Err(
                        Box::new(DbDown(std::io::ErrorKind::ConnectionRefused.into()))
                            as outbox_core::BoxError,
                    ),
                    None => Ok(Outcome::Applied(())),
                }
            }
        })
        .build()
        .unwrap();
    let stats = run_until(broker.name, consumer, |s| n(&s.applied) == 40).await;
    assert_eq!(
        (
            n(&stats.transient_errors),
            n(&stats.handler_errors),
            n(&stats.dead_lettered)
        ),
        (6, 0, 0),
        "{}: {stats:?}",
        broker.name
    );
    let handled = handled.lock().unwrap();
    for order in [1, 2] {
        let seq: Vec<u64> = handled
            .iter()
            .filter(|(o, _)| *o == order)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(
            seq,
            (0..20).collect::<Vec<_>>(),
            "{}: order {order}",
            broker.name
        );
    }
}

/// Order 1's first event is poison (fails every attempt); its two later events come after it
/// on the same partition; order 2 has one event. By default order 1's later events are parked:
/// in the dead-letter topic behind the first, marked, not applied; order 2 is applied. With
/// `AfterDeadLetter::SkipAhead` (another group) they are applied.
async fn a_dead_letter_parks_the_later_messages_of_its_key_unless_skipping(broker: Broker) {
    let topic = broker.topic("parking").await;
    let messages = [placed(1, 0), placed(1, 1), placed(2, 0), placed(1, 2)];
    broker.publish(&topic, &messages).await;

    let run = |policy: AfterDeadLetter| {
        let handled: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
        let h = handled.clone();
        let consumer = broker
            .consumer(&topic, &unique("parking"))
            .max_attempts(2)
            .after_dead_letter(policy)
            .handler(move |event: Envelope<OrderPlaced>| {
                let key = (event.order_id, event.n);
                let poison = key == (1, 0);
                if !poison {
                    h.lock().unwrap().push(key);
                }
                async move {
                    if poison {
                        Err("card declined")
                    } else {
                        Ok(Outcome::Applied(()))
                    }
                }
            })
            .build()
            .unwrap();
        (consumer, handled)
    };

    let (consumer, handled) = run(AfterDeadLetter::ParkKey);
    let stats = run_until(broker.name, consumer, |s| n(&s.done) == 4).await;
    assert_eq!(*handled.lock().unwrap(), [(2, 0)], "{}", broker.name);
    assert_eq!(
        (n(&stats.dead_lettered), n(&stats.parked), n(&stats.applied)),
        (3, 2, 1),
        "{}: {stats:?}",
        broker.name
    );
    let dead = broker.read(&format!("{topic}.dlt"), 3).await;
    assert_eq!(dead.len(), 3, "{}", broker.name);
    let (first, parked) = (&dead[0], &dead[1..]);
    assert_eq!(header(first, "outbox.error.kind"), "handler");
    assert_eq!(header(first, "id"), messages[0].id.hyphenated().to_string());
    let behind = format!(
        "{topic}/{}/{}",
        header(first, "outbox.original.partition"),
        header(first, "outbox.original.offset")
    );
    for (d, m) in parked.iter().zip([&messages[1], &messages[3]]) {
        assert_eq!(header(d, "id"), m.id.hyphenated().to_string(), "in order");
        assert_eq!(header(d, "outbox.error.kind"), "parked");
        assert_eq!(header(d, "outbox.parked.behind"), behind);
        assert_eq!(
            header(d, "outbox.parked.behind.id"),
            messages[0].id.hyphenated().to_string()
        );
        assert_eq!(header(d, "outbox.attempts"), "0");
        assert_eq!(d.key(), Some(&b"1"[..]));
    }

    let (consumer, handled) = run(AfterDeadLetter::SkipAhead);
    let stats = run_until(broker.name, consumer, |s| n(&s.done) == 4).await;
    let mut handled = handled.lock().unwrap().clone();
    handled.sort();
    assert_eq!(handled, [(1, 1), (1, 2), (2, 0)], "{}", broker.name);
    assert_eq!(
        (n(&stats.dead_lettered), n(&stats.parked)),
        (1, 0),
        "{}: {stats:?}",
        broker.name
    );
}

/// The headers the publisher would send with `m`.
fn headers_of(m: &OutboxMessage) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("id", m.id.hyphenated().to_string().into_bytes()),
        ("event_type", m.event_type.clone().into_bytes()),
        ("event_version", m.event_version.to_string().into_bytes()),
        ("aggregate_type", m.aggregate_type.clone().into_bytes()),
        (
            "created_at",
            m.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                .into_bytes(),
        ),
    ]
}

fn set(headers: &mut [(&str, Vec<u8>)], name: &str, value: &[u8]) {
    for (k, v) in headers {
        if *k == name {
            *v = value.to_vec();
        }
    }
}

/// A dead-letter topic the broker refuses (here a name no broker accepts; an ACL or a missing
/// topic answer the same way): the message is never dropped, its partition waits, and the
/// wait shows: `dead_letter_blocked` (and its gauge) while it lasts, the failed writes counted
/// by topic and code. A later message of the same partition is not handled meanwhile.
async fn an_unwritable_dead_letter_topic_blocks_the_partition_visibly(broker: Broker) {
    let topic = broker.topic("dlt-refused").await;
    // One order: one key, one partition, in order.
    broker.publish(&topic, &[placed(1, 0), placed(1, 1)]).await;
    let handled: Arc<Mutex<Vec<u64>>> = Arc::default();
    let seen = handled.clone();
    let consumer = broker
        .consumer(&topic, &unique("dlt-refused"))
        .max_attempts(1)
        .dead_letter_topic(format!("refused dead letters {}!", Uuid::now_v7().simple()))
        .handler(move |event: Envelope<OrderPlaced>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(event.n);
                Err::<Outcome<()>, _>("card declined".to_owned())
            }
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));
    let deadline = Instant::now() + DEADLINE;
    while !stats.dead_letter_blocked.load(Ordering::Relaxed) {
        assert!(
            Instant::now() < deadline,
            "{}: the unwritable dead letter never showed: {stats:?}",
            broker.name
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        stats.dead_letter_blocked.load(Ordering::Relaxed),
        "{}: {stats:?}",
        broker.name
    );
    assert_eq!(
        (n(&stats.dead_lettered), n(&stats.done)),
        (0, 0),
        "{}: nothing dropped, nothing done past it: {stats:?}",
        broker.name
    );
    assert_eq!(*handled.lock().unwrap(), [0], "{}", broker.name);
    stop.send(()).unwrap();
    task.await.unwrap();
    assert!(
        !stats.dead_letter_blocked.load(Ordering::Relaxed),
        "{}: shutdown ends the wait: {stats:?}",
        broker.name
    );
}
