//! Ordering in Kafka: the key picks the partition, so key = aggregate id keeps an aggregate's events in one partition, in order. Needs PostgreSQL (`DATABASE_URL`) and a Kafka-protocol broker (`KAFKA_BROKERS`, default 127.0.0.1:9092).
//!
//! A topic with 4 partitions; 20 orders emit steps 1 to 5. Kafka orders messages only within a
//! partition. The naive producer sends without a key, so its partitioner spreads the messages
//! round-robin (done explicitly here, so the run is deterministic): every order's steps end up
//! in several partitions, and consumers of different partitions see them in any order. The
//! relay publishes with the aggregate id as the key (and in `Sharded` mode, in outbox order
//! per aggregate): each order lands in exactly one partition, its steps in order.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{OrderPlaced, PgDb, expect};
use outbox::kafka::KafkaPublisher;
use outbox::prelude::*;
use outbox::relay::{Mode, PgRelayStore, RelayConfig};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

const PARTITIONS: i32 = 4;
const ORDERS: i64 = 20;
const STEPS: i64 = 5;

/// Reads the whole topic: per key, the partitions it was found in and its steps in offset order.
fn read_back(brokers: &str, topic: &str) -> BTreeMap<String, (BTreeSet<i32>, Vec<i64>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", topic)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut by_key: BTreeMap<String, (BTreeSet<i32>, Vec<i64>)> = BTreeMap::new();
    let (mut read, start) = (0, std::time::Instant::now());
    while read < ORDERS * STEPS && start.elapsed() < Duration::from_secs(30) {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let event: OrderPlaced = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap();
        let entry = by_key.entry(event.order_id.to_string()).or_default();
        entry.0.insert(m.partition());
        entry.1.push(event.total_cents); // the step
        read += 1;
    }
    common::ensure(read == ORDERS * STEPS, "to read back every message");
    by_key
}

fn main() {
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let admin: AdminClient<_> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let topic = |what: &str| {
        let name = format!("outbox-ex-{what}-{}", uuid::Uuid::now_v7().simple());
        let new = NewTopic::new(&name, PARTITIONS, TopicReplication::Fixed(1));
        let created = runtime.block_on(
            admin.create_topics(
                [&new],
                &AdminOptions::new()
                    .request_timeout(Some(Duration::from_secs(10)))
                    .operation_timeout(Some(Duration::from_secs(10))),
            ),
        );
        common::ensure(
            created
                .map(|r| r.iter().all(Result::is_ok))
                .unwrap_or(false),
            "to create a topic (is a Kafka broker at KAFKA_BROKERS?)",
        );
        name
    };

    println!("1. The naive producer: no key, round-robin over {PARTITIONS} partitions.");
    let naive = topic("nokey");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    for order_id in 1..=ORDERS {
        for step in 1..=STEPS {
            let json = serde_json::to_string(&OrderPlaced {
                order_id,
                total_cents: step,
            })
            .unwrap();
            let partition = ((order_id * STEPS + step) % PARTITIONS as i64) as i32;
            let record = FutureRecord::<(), _>::to(&naive)
                .payload(&json)
                .partition(partition);
            runtime
                .block_on(producer.send(record, Duration::from_secs(10)))
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    let spread = read_back(&brokers, &naive);
    let scattered = spread.values().filter(|(parts, _)| parts.len() > 1).count();
    println!(
        "   {scattered} of {ORDERS} orders are spread over several partitions (order 1: {:?}).",
        spread["1"].0
    );
    expect(
        scattered as i64 == ORDERS,
        "every order's events to be scattered",
    );

    println!("\n2. The relay: key = aggregate id, Sharded mode.");
    let keyed = topic("keyed");
    let db = PgDb::new("kafka_order");
    let mut conn = db.conn();
    for step in 1..=STEPS {
        conn.transaction_with_outbox(|tx| {
            (1..=ORDERS).try_for_each(|order_id| {
                tx.publish(&OrderPlaced {
                    order_id,
                    total_cents: step,
                })
            })
        })
        .unwrap();
    }
    let target = keyed.clone();
    let publisher = KafkaPublisher::builder()
        .brokers(brokers.clone())
        .message_timeout(Duration::from_secs(10))
        .topic_for(move |_| target.clone())
        .build()
        .unwrap();
    let config = RelayConfig {
        mode: Mode::Sharded,
        poll_interval: Duration::from_millis(20),
        publish_timeout: publisher.publish_timeout(),
        ..RelayConfig::default()
    };
    let url = db.url.clone();
    let (done, _) = common::relay_until(
        PgRelayStore::new(db.url.clone()),
        publisher,
        config,
        Duration::from_secs(60),
        move || {
            count!(
                &mut <diesel::PgConnection as diesel::Connection>::establish(&url).unwrap(),
                "outbox_events WHERE published_at IS NULL"
            ) == 0
        },
    );
    common::ensure(done, "the relay to publish every event");
    let keyed_back = read_back(&brokers, &keyed);
    let single = keyed_back
        .values()
        .filter(|(parts, _)| parts.len() == 1)
        .count();
    let ordered = keyed_back
        .values()
        .filter(|(_, steps)| steps.windows(2).all(|w| w[0] < w[1]))
        .count();
    let used: BTreeSet<i32> = keyed_back
        .values()
        .flat_map(|(p, _)| p.iter().copied())
        .collect();
    println!(
        "   {single} of {ORDERS} orders in exactly one partition, {ordered} with steps in order; partitions used: {used:?}."
    );
    expect(
        single as i64 == ORDERS && ordered as i64 == ORDERS,
        "each order in one partition, in order",
    );
    expect(
        used.len() > 1,
        "the orders still spread over the partitions (parallelism kept)",
    );
}
