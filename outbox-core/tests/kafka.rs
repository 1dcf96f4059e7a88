//! `KafkaPublisher` against real Kafka-protocol brokers. Every broker test runs twice, as
//! `noida::<test>` (noida-db, at `KAFKA_BROKERS` or 127.0.0.1:9092) and `tansu::<test>` (tansu,
//! at `OUTBOX_TEST_TANSU` or 127.0.0.1:9094). Start both with `scripts/kafka.sh start`; a broker
//! that is not reachable fails its tests with a message saying so.
//!
//! Each test makes its own topic and reads it back with a real rdkafka consumer (its own group,
//! `auto.offset.reset=earliest`). The consumer assigns itself every partition instead of joining
//! the group (tansu takes about 5 s to finish a group join), and reads until it has what it
//! expects or a generous deadline passes, never trusting watermarks (tansu's are not reliable).
//!
//! ```text
//! scripts/kafka.sh start
//! cargo test -p outbox-kernel --features kafka --test kafka -- --nocapture   # prints timings
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use outbox_core::kafka::{KafkaConfigError, KafkaPublisher};
use outbox_core::relay::{Delivery, OutboxMessage, Publisher};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers as _, Message as _, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use uuid::Uuid;

/// How long a consumer may take to see everything that was published.
const READ_DEADLINE: Duration = Duration::from_secs(60);
const PARTITIONS: i32 = 3;

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// A broker under test, checked reachable.
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

/// Declares `noida::$test` and `tansu::$test` for each `async fn $test(Broker)` below.
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
    records_carry_key_headers_and_payload,
    ten_thousand_messages_over_100_keys_arrive_complete_and_in_key_order,
    a_too_large_message_fails_and_holds_back_its_key_only,
    a_message_the_broker_rejects_lets_no_later_one_of_its_key_through,
    a_topic_the_broker_refuses_whole_is_an_outage_naming_the_topic_and_code,
    a_relay_dead_letters_nothing_of_a_topic_the_broker_refuses_whole,
);

impl Broker {
    /// A fresh topic with [`PARTITIONS`] partitions.
    async fn topic(&self, test: &str) -> String {
        self.topic_with(test, PARTITIONS).await
    }

    /// A fresh topic with `partitions` partitions.
    async fn topic_with(&self, test: &str, partitions: i32) -> String {
        let topic = format!("outbox-{test}-{}", Uuid::now_v7().simple());
        self.create_topic_with(&topic, partitions).await;
        topic
    }

    async fn create_topic(&self, topic: &str) {
        self.create_topic_with(topic, PARTITIONS).await
    }

    async fn create_topic_with(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .unwrap();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let created = admin
            .create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &options,
            )
            .await
            .unwrap_or_else(|e| panic!("{}: CreateTopics failed: {e}", self.name));
        for result in created {
            result.unwrap_or_else(|(t, e)| panic!("{}: creating {t}: {e}", self.name));
        }
    }

    fn publisher(&self) -> KafkaPublisher {
        KafkaPublisher::builder()
            .brokers(&self.bootstrap)
            .set("linger.ms", "5")
            .build()
            .unwrap()
    }

    /// Reads `topic` from the beginning of every partition until `done` says it has enough, or
    /// [`READ_DEADLINE`] passes. Returns what it read.
    async fn read(&self, topic: &str, done: impl Fn(&[OwnedMessage]) -> bool) -> Vec<OwnedMessage> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set(
                "group.id",
                format!("outbox-test-{}", Uuid::now_v7().simple()),
            )
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "100")
            .create()
            .unwrap();
        let deadline = Instant::now() + READ_DEADLINE;
        let partitions = loop {
            let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(5));
            let count = metadata.map_or(0, |m| {
                m.topics().first().map_or(0, |t| t.partitions().len())
            });
            if count > 0 {
                break count as i32;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no metadata for {topic}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        let mut got = Vec::new();
        while !done(&got) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, consumer.recv()).await {
                Ok(Ok(m)) => got.push(m.detach()),
                Ok(Err(e)) => panic!("{}: consuming {topic}: {e}", self.name),
                Err(_) => break,
            }
        }
        got
    }
}

/// An outbox message as the relay would claim it.
fn message(seq: i64, aggregate_id: &str, payload: String) -> OutboxMessage {
    OutboxMessage {
        seq,
        id: Uuid::now_v7(),
        aggregate_type: "order".into(),
        aggregate_id: aggregate_id.into(),
        event_type: "OrderCreated".into(),
        event_version: 1,
        payload,
        headers: BTreeMap::new(),
        topic: None,
        shard: 0,
        created_at: Utc::now(),
        attempts: 1,
    }
}

fn headers_of(m: &OwnedMessage) -> Vec<(String, String)> {
    m.headers().map_or_else(Vec::new, |h| {
        h.iter()
            .map(|h| {
                let value = String::from_utf8(h.value.unwrap_or_default().to_vec()).unwrap();
                (h.key.to_owned(), value)
            })
            .collect()
    })
}

fn text(bytes: Option<&[u8]>) -> &str {
    std::str::from_utf8(bytes.unwrap_or_default()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Broker tests
// ---------------------------------------------------------------------------------------------

async fn records_carry_key_headers_and_payload(broker: Broker) {
    // Routed by aggregate type, then prefixed: the topic is "<prefix>order".
    let prefix = format!("outbox-records-{}.", Uuid::now_v7().simple());
    let topic = format!("{prefix}order");
    broker.create_topic(&topic).await;
    let publisher = KafkaPublisher::builder()
        .brokers(&broker.bootstrap)
        .topic_prefix(&prefix)
        .build()
        .unwrap();

    let mut msg = message(
        1,
        "order-42",
        r#"{"order_id":"order-42","total_cents":1250}"#.into(),
    );
    msg.event_version = 3;
    msg.created_at = Utc.timestamp_opt(1_735_689_600, 123_456_789).unwrap();
    msg.headers.insert(
        "traceparent".into(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
    );
    msg.headers.insert("tenant".into(), "acme".into());
    msg.headers.insert("event_type".into(), "spoofed".into()); // a reserved name: left out
    assert_eq!(publisher.topic_of(&msg), topic);

    let outcomes = publisher.publish(std::slice::from_ref(&msg)).await;
    assert_eq!(outcomes, [Delivery::Published], "{}", broker.name);

    let got = broker.read(&topic, |got| !got.is_empty()).await;
    assert_eq!(got.len(), 1, "{}: expected the record", broker.name);
    let record = &got[0];
    assert_eq!(record.topic(), topic);
    assert_eq!(text(record.key()), "order-42");
    assert_eq!(text(record.payload()), msg.payload);
    let mut headers = headers_of(record);
    headers.sort();
    let id = msg.id.hyphenated().to_string();
    let mut want = vec![
        ("aggregate_type", "order"),
        ("created_at", "2025-01-01T00:00:00.123456Z"),
        ("event_type", "OrderCreated"),
        ("event_version", "3"),
        ("id", id.as_str()),
        ("tenant", "acme"),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
    ];
    want.sort();
    let want: Vec<(String, String)> = want
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(headers, want, "{}", broker.name);
}

async fn ten_thousand_messages_over_100_keys_arrive_complete_and_in_key_order(broker: Broker) {
    const KEYS: usize = 100;
    const TOTAL: usize = 10_000;
    const BATCH: usize = 1_000;
    let topic = broker.topic("ten-thousand").await;
    let publisher = broker.publisher();

    let messages: Vec<OutboxMessage> = (0..TOTAL)
        .map(|i| {
            let key = format!("key-{}", i % KEYS);
            let n = i / KEYS;
            let mut msg = message(i as i64, &key, format!(r#"{{"key":"{key}","n":{n}}}"#));
            msg.topic = Some(topic.clone());
            msg
        })
        .collect();

    // The first batch also pays for connecting and getting a producer id.
    let mut took = Vec::new();
    for batch in messages.chunks(BATCH) {
        let started = Instant::now();
        let outcomes = publisher.publish(batch).await;
        took.push(started.elapsed());
        assert!(
            outcomes.iter().all(|o| *o == Delivery::Published),
            "{}: {:?}",
            broker.name,
            outcomes.iter().find(|o| **o != Delivery::Published)
        );
    }
    let total: Duration = took.iter().sum();
    let warm: Duration = took[1..].iter().sum();

    let started = Instant::now();
    let got = broker.read(&topic, |got| got.len() >= TOTAL).await;
    let read = started.elapsed();
    eprintln!(
        "{}: published {TOTAL} messages over {KEYS} keys in batches of {BATCH} in {total:.2?}: \
         first batch {:.2?} (connect, producer id), then {:.0} msg/s; read back in {read:.2?}",
        broker.name,
        took[0],
        (TOTAL - BATCH) as f64 / warm.as_secs_f64()
    );
    assert_eq!(
        got.len(),
        TOTAL,
        "{}: incomplete or duplicated",
        broker.name
    );

    let mut per_key: HashMap<String, Vec<u64>> = HashMap::new();
    let mut partition_of: HashMap<String, i32> = HashMap::new();
    for record in &got {
        let key = text(record.key()).to_owned();
        let payload: serde_json::Value = serde_json::from_slice(record.payload().unwrap()).unwrap();
        assert_eq!(payload["key"], key.as_str());
        per_key
            .entry(key.clone())
            .or_default()
            .push(payload["n"].as_u64().unwrap());
        let p = *partition_of
            .entry(key.clone())
            .or_insert(record.partition());
        assert_eq!(
            p,
            record.partition(),
            "{}: key {key} on two partitions",
            broker.name
        );
    }
    assert_eq!(per_key.len(), KEYS);
    let expected: Vec<u64> = (0..(TOTAL / KEYS) as u64).collect();
    for (key, ns) in &per_key {
        assert_eq!(
            ns, &expected,
            "{}: key {key} out of order or incomplete",
            broker.name
        );
    }
}

async fn a_too_large_message_fails_and_holds_back_its_key_only(broker: Broker) {
    let topic = broker.topic("too-large").await;
    let publisher = broker.publisher();
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(1_500_000)); // > message.max.bytes (1 MB)
    let batch: Vec<OutboxMessage> = [
        ("a", "a0".to_owned()),
        ("b", "b0".to_owned()),
        ("a", big),
        ("b", "b1".to_owned()),
        ("a", "a2".to_owned()),
        ("c", "c0".to_owned()),
        ("a", "a3".to_owned()),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (key, payload))| {
        let payload = if payload.starts_with('{') {
            payload
        } else {
            format!(r#""{payload}""#)
        };
        let mut msg = message(i as i64, key, payload);
        msg.topic = Some(topic.clone());
        msg
    })
    .collect();

    let outcomes = publisher.publish(&batch).await;
    assert_eq!(outcomes.len(), batch.len());
    let Delivery::Failed(reason) = &outcomes[2] else {
        panic!(
            "{}: the 1.5 MB message was not Failed: {outcomes:?}",
            broker.name
        )
    };
    assert!(
        reason.contains("too large") && reason.contains("message.max.bytes"),
        "{}: unclear error: {reason}",
        broker.name
    );
    use Delivery::{NotAttempted, Published};
    assert_eq!(
        [&outcomes[..2], &outcomes[3..]].concat(),
        [
            Published,
            Published,
            Published,
            NotAttempted,
            Published,
            NotAttempted
        ],
        "{}",
        broker.name
    );

    // Key `a` again, in a later batch: once it is read, everything sent before it on `a`'s
    // partition has been read too, so a2 and a3 would have shown up.
    let mut sentinel = message(100, "a", r#""a-sentinel""#.into());
    sentinel.topic = Some(topic.clone());
    assert_eq!(publisher.publish(&[sentinel]).await, [Published]);

    let got = broker
        .read(&topic, |got| {
            let payloads: Vec<&str> = got.iter().map(|m| text(m.payload())).collect();
            ["\"a0\"", "\"b0\"", "\"b1\"", "\"c0\"", "\"a-sentinel\""]
                .iter()
                .all(|p| payloads.contains(p))
        })
        .await;
    let mut payloads: Vec<&str> = got.iter().map(|m| text(m.payload())).collect();
    payloads.sort();
    assert_eq!(
        payloads,
        ["\"a-sentinel\"", "\"a0\"", "\"b0\"", "\"b1\"", "\"c0\""],
        "{}: a2/a3 must not be published after a1 failed",
        broker.name
    );
}

/// The producer lets a 3 MB record through (`message.max.bytes` raised), so only the broker can
/// refuse it, after it was enqueued and its key's later messages with it: the asynchronous case.
/// noida-db refuses records over 1 MB (the gap-less guarantee then stops the producer and the
/// publisher replaces it and sends the other keys' messages again on the new one); tansu takes
/// them. Either way no later message of the key may be published after a failed one, the
/// other key's messages are published in the same call, and the next publish works. One
/// partition, so that the other key's messages queue behind the refused record (with noida-db
/// they are then purged with the dead producer's queue, or refused out of sequence).
async fn a_message_the_broker_rejects_lets_no_later_one_of_its_key_through(broker: Broker) {
    let topic = broker.topic_with("broker-rejects", 1).await;
    let publisher = KafkaPublisher::builder()
        .brokers(&broker.bootstrap)
        .set("message.max.bytes", "10000000")
        .build()
        .unwrap();
    let big = format!(r#""{}""#, "x".repeat(3_000_000));
    let payloads = [
        r#""a0""#.to_owned(),
        big,
        r#""a2""#.to_owned(),
        r#""a3""#.to_owned(),
    ];
    let mut batch: Vec<OutboxMessage> = payloads
        .iter()
        .enumerate()
        .map(|(i, payload)| message(i as i64, "a", payload.clone()))
        .collect();
    for i in 0..5 {
        batch.push(message(4 + i, "b", format!(r#""b{i}""#)));
    }
    for msg in &mut batch {
        msg.topic = Some(topic.clone());
    }

    let outcomes = publisher.publish(&batch).await;
    assert_eq!(outcomes.len(), batch.len());
    let published_a: Vec<&str> = (0..4)
        .filter(|&i| outcomes[i] == Delivery::Published)
        .map(|i| payloads[i].as_str())
        .collect();
    match &outcomes[1] {
        Delivery::Published => {
            eprintln!("{}: accepted a 3 MB record", broker.name);
            assert!(
                outcomes.iter().all(|o| *o == Delivery::Published),
                "{outcomes:?}"
            );
        }
        Delivery::Failed(reason) => {
            eprintln!("{}: refused a 3 MB record: {reason}", broker.name);
            assert!(reason.contains("too large"), "{}: {reason}", broker.name);
            assert!(
                outcomes[2..4].iter().all(|o| *o != Delivery::Published),
                "{}: a later message of the key got through: {outcomes:?}",
                broker.name
            );
        }
        other => panic!("a record too large is poison, not {other:?}: {outcomes:?}"),
    }
    // Key `b` had nothing refused: if the refusal stopped the producer (gap-less guarantee), the
    // same publish sent what the dead producer did not deliver again on the new one.
    assert!(
        outcomes[4..].iter().all(|o| *o == Delivery::Published),
        "{}: another key's messages are not held back by a refused record: {outcomes:?}",
        broker.name
    );

    // The publisher still works (with a new producer, if the old one stopped).
    let mut after = message(10, "a", r#""a-after""#.into());
    after.topic = Some(topic.clone());
    assert_eq!(
        publisher.publish(&[after]).await,
        [Delivery::Published],
        "{}",
        broker.name
    );

    // Key `a` on the broker: exactly what was reported published, in order, then `a-after`.
    let got = broker
        .read(&topic, |got| {
            got.iter().any(|m| text(m.payload()) == r#""a-after""#)
        })
        .await;
    let on_broker: Vec<&str> = got
        .iter()
        .filter(|m| text(m.key()) == "a")
        .map(|m| text(m.payload()))
        .collect();
    let want: Vec<&str> = published_a.into_iter().chain([r#""a-after""#]).collect();
    assert!(
        on_broker == want,
        "{}: key a on the broker is not what was reported",
        broker.name
    );
}

/// A topic the broker refuses for every record (here a name no broker accepts, as a router or
/// an event type could produce; an ACL or a missing topic with auto-creation off answer the
/// same way): an outage of that topic, never the record's fault, with a reason that names the
/// topic and librdkafka's code. Another topic's message in the same publish is delivered.
async fn a_topic_the_broker_refuses_whole_is_an_outage_naming_the_topic_and_code(broker: Broker) {
    let good = broker.topic("refused-beside").await;
    let bad = format!("outbox refused {}!", Uuid::now_v7().simple());
    let publisher = KafkaPublisher::builder()
        .brokers(&broker.bootstrap)
        .set("message.timeout.ms", "10000")
        .build()
        .unwrap();
    let mut refused = message(0, "a", r#""a0""#.into());
    refused.topic = Some(bad.clone());
    let mut beside = message(1, "b", r#""b0""#.into());
    beside.topic = Some(good.clone());
    let outcomes = publisher.publish(&[refused, beside]).await;
    eprintln!("{}: {outcomes:?}", broker.name);
    let Delivery::Unavailable(reason) = &outcomes[0] else {
        panic!(
            "{}: a topic refused whole is an outage, not {:?}",
            broker.name, outcomes[0]
        );
    };
    assert!(
        reason.contains(&format!("topic `{bad}` refuses every record (")),
        "{}: the reason names the topic and the code: {reason}",
        broker.name
    );
    assert_eq!(outcomes[1], Delivery::Published, "{}", broker.name);
}

/// The relay, with two attempts before a dead letter, publishing to a topic the broker refuses
/// for every record and to a good one: after many publishes the refused topic's events are not
/// dead-lettered and have spent no attempt, the relay's health says it waits with the topic and
/// the code, and the good topic's events are delivered.
async fn a_relay_dead_letters_nothing_of_a_topic_the_broker_refuses_whole(broker: Broker) {
    use outbox_core::relay::{MemoryStore, Relay, RelayConfig, RelayState, test_message};
    let good = broker.topic("relay-beside").await;
    let bad = format!("outbox refused {}!", Uuid::now_v7().simple());
    let store = MemoryStore::default();
    for i in 0..5 {
        store.insert(test_message(&bad, &format!("r{i}"), "Refused"));
        store.insert(test_message(&good, &format!("g{i}"), "Delivered"));
    }
    let config = RelayConfig {
        max_attempts: 2,
        poll_interval: Duration::from_millis(50),
        outage_backoff: outbox_core::relay::Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.2,
        },
        ..RelayConfig::default()
    };
    let relay_id = config.relay_id.clone();
    let publisher = KafkaPublisher::builder()
        .brokers(&broker.bootstrap)
        .build()
        .unwrap();
    let relay = Relay::new(store.clone(), publisher, config).unwrap();
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async move {
        stopped.await.ok();
    }));
    let deadline = Instant::now() + READ_DEADLINE;
    while stats
        .broker_waits
        .load(std::sync::atomic::Ordering::Relaxed)
        < 10
    {
        assert!(
            Instant::now() < deadline,
            "{}: the relay never waited: {stats:?}",
            broker.name
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let health = store.relay_health(&relay_id);
    stop.send(()).unwrap();
    running.await.unwrap();

    assert_eq!(store.dead_letters(), [], "{}: {stats:?}", broker.name);
    let rows = store.rows();
    let (refused, delivered): (Vec<_>, Vec<_>) = rows
        .iter()
        .partition(|r| r.last_error.as_deref().is_some_and(|e| e.contains(&bad)) || !r.published);
    assert_eq!(
        (refused.len(), delivered.len()),
        (5, 5),
        "{}: {rows:?}",
        broker.name
    );
    assert!(
        refused.iter().all(|r| r.attempts == 0 && !r.dead),
        "{}: no attempt spent on a refused topic: {rows:?}",
        broker.name
    );
    let Some((RelayState::WaitingForBroker, Some(error))) = health else {
        panic!("{}: the relay's health: {health:?}", broker.name);
    };
    // The broker answers `InvalidTopic` for the name, or librdkafka reports the topic
    // unknown first (its metadata came back without it): both are the topic's, not the
    // record's.
    assert!(
        ["InvalidTopic", "UnknownTopic"]
            .iter()
            .any(|code| error.contains(&format!("topic `{bad}` refuses every record ({code})"))),
        "{}: {error}",
        broker.name
    );
}

// ---------------------------------------------------------------------------------------------
// Tests without a broker
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_unreachable_broker_is_an_outage_for_every_message_within_the_timeout() {
    let publisher = KafkaPublisher::builder()
        .brokers("127.0.0.1:1")
        .message_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let batch: Vec<OutboxMessage> = (0..6)
        .map(|i| message(i, ["x", "y"][i as usize % 2], "{}".into()))
        .collect();
    let started = Instant::now();
    let outcomes = tokio::time::timeout(Duration::from_secs(30), publisher.publish(&batch))
        .await
        .expect("publish hung");
    let took = started.elapsed();
    assert_eq!(outcomes.len(), batch.len());
    for outcome in &outcomes {
        // The broker's fault, never the message's: no attempt is counted for it.
        let Delivery::Unavailable(reason) = outcome else {
            panic!("an unreachable broker is an outage: {outcomes:?}")
        };
        assert!(reason.contains("timed out"), "{reason}");
    }
    assert!(took <= publisher.publish_timeout(), "took {took:?}");
    assert!(
        took >= Duration::from_millis(1900),
        "failed before the timeout: {took:?}"
    );
    eprintln!(
        "unreachable broker: {} messages failed in {took:.2?}",
        outcomes.len()
    );
}

#[test]
fn builder_errors_name_the_bad_setting() {
    fn err(builder: outbox_core::kafka::KafkaPublisherBuilder) -> KafkaConfigError {
        builder.build().expect_err("should not build")
    }
    let base = || KafkaPublisher::builder().brokers("127.0.0.1:9092");

    assert_eq!(
        err(KafkaPublisher::builder()),
        KafkaConfigError::MissingBrokers
    );
    assert!(
        err(KafkaPublisher::builder())
            .to_string()
            .contains(".brokers(")
    );

    for (key, value) in [
        ("linger.ms", "soon"),
        ("linger.mss", "5"),
        ("compression.type", "rar"),
    ] {
        let e = err(base().set(key, value));
        assert!(
            matches!(&e, KafkaConfigError::Invalid { key: k, .. } if k == key),
            "{key}: {e:?}"
        );
        assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
    }

    for (key, value) in [
        ("enable.idempotence", "false"),
        ("acks", "1"),
        ("request.required.acks", "0"), // an alias, reported under librdkafka's main name
        ("transactional.id", "relay-1"),
        ("message.timeout.ms", "0"),
    ] {
        let e = err(base().set(key, value));
        let KafkaConfigError::Forbidden { key: k, .. } = &e else {
            panic!("{e:?}")
        };
        let main = if key == "request.required.acks" {
            "acks"
        } else {
            key
        };
        assert_eq!(k.as_str(), main);
        assert!(e.to_string().contains(&format!("`{main}`")), "{e}");
        // The key is named, the value never echoed (it might be a secret elsewhere).
        assert!(
            !format!("{e} {e:?}").contains(&format!("`{value}`")),
            "{e:?}"
        );
    }

    let e = err(base().set("delivery.timeout.ms", "ten"));
    assert!(
        matches!(&e, KafkaConfigError::Invalid { key, .. } if key == "message.timeout.ms"),
        "{e:?}"
    );

    // A combination only librdkafka's producer check rejects; its message names the setting.
    let e = err(base().set("max.in.flight", "10"));
    assert!(matches!(e, KafkaConfigError::Rejected { .. }), "{e:?}");
    assert!(e.to_string().contains("max.in.flight"), "{e}");

    // Settings that are fine build.
    let publisher = base()
        .set("linger.ms", "20")
        .set("delivery.timeout.ms", "4000")
        .set("enable.gapless.guarantee", "false")
        .build()
        .unwrap();
    assert_eq!(publisher.message_timeout(), Duration::from_secs(4));
}

/// The largest event the writer accepts under the default limit (a key, a `traceparent` and
/// a header of its own besides the relay's headers) is published by a producer with
/// librdkafka's default `message.max.bytes`; a record one byte larger, which the writer
/// refuses, that producer refuses too: the writer counts what the producer counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_event_the_writer_accepts_is_published() {
    use outbox_core::{DEFAULT_MAX_PAYLOAD_BYTES, EventError, Headers, NewMessage};

    #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    #[outbox(crate = outbox_core, aggregate = "doc")]
    struct DocStored {
        #[outbox(aggregate_id)]
        id: String,
        body: String,
    }

    let broker = noida();
    let topic = broker.topic("largest").await;
    let headers: Headers = [
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        ("tenant", "acme"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .into();
    let event = |len: usize| DocStored {
        id: "doc-2026-0001".into(),
        body: "x".repeat(len),
    };
    let write = |len: usize| {
        NewMessage::from_event_with_limit(&event(len), headers.clone(), DEFAULT_MAX_PAYLOAD_BYTES)
    };
    let framing = NewMessage::from_event_with_limit(&event(0), headers.clone(), usize::MAX)
        .unwrap()
        .record_size();
    let largest =
        write(DEFAULT_MAX_PAYLOAD_BYTES - framing).expect("the largest event is accepted");
    assert_eq!(largest.record_size(), DEFAULT_MAX_PAYLOAD_BYTES);
    assert!(
        matches!(
            write(DEFAULT_MAX_PAYLOAD_BYTES - framing + 1),
            Err(EventError::PayloadTooLarge { .. })
        ),
        "one byte more is refused by the writer"
    );

    let claimed = |m: &NewMessage| OutboxMessage {
        seq: 1,
        id: m.id,
        aggregate_type: m.aggregate_type.to_string(),
        aggregate_id: m.aggregate_id.clone(),
        event_type: m.event_type.to_string(),
        event_version: m.event_version,
        payload: m.payload.clone(),
        headers: m.headers.clone(),
        topic: Some(topic.clone()),
        shard: m.shard,
        created_at: m.created_at,
        attempts: 1,
    };
    // librdkafka's defaults, `message.max.bytes` included.
    let publisher = KafkaPublisher::builder()
        .brokers(&broker.bootstrap)
        .build()
        .unwrap();
    let sent = claimed(&largest);
    assert_eq!(
        publisher.publish(std::slice::from_ref(&sent)).await,
        [Delivery::Published]
    );
    let mut one_more = claimed(&largest);
    one_more.payload.push(' ');
    let outcome = publisher.publish(std::slice::from_ref(&one_more)).await;
    assert!(
        matches!(&outcome[..], [Delivery::Failed(why)] if why.contains("too large")),
        "{outcome:?}"
    );

    // The writer used to accept any payload up to the limit: one of exactly the limit, which
    // the producer refuses once its key and headers are added, is refused at write time now.
    let mut full = claimed(&largest);
    full.payload = format!(
        r#"{{"id":"doc-2026-0001","body":"{}"}}"#,
        "x".repeat(DEFAULT_MAX_PAYLOAD_BYTES - 32)
    );
    assert_eq!(full.payload.len(), DEFAULT_MAX_PAYLOAD_BYTES);
    let outcome = publisher.publish(std::slice::from_ref(&full)).await;
    assert!(
        matches!(&outcome[..], [Delivery::Failed(why)] if why.contains("too large")),
        "{outcome:?}"
    );
    assert!(matches!(
        write(DEFAULT_MAX_PAYLOAD_BYTES - 32),
        Err(EventError::PayloadTooLarge { .. })
    ));

    let got = broker.read(&topic, |got| !got.is_empty()).await;
    assert_eq!(got.len(), 1);
    assert_eq!(text(got[0].payload()).len(), sent.payload.len());
    assert_eq!(text(got[0].key()), "doc-2026-0001");
}
