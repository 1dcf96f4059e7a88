//! The consumer side through a real Kafka-protocol broker (noida-db at `KAFKA_BROKERS` or
//! 127.0.0.1:9092; `scripts/kafka.sh start`): `KafkaConsumer` dispatching to `#[idempotent]`
//! handlers on real databases.
//!
//! - every message delivered twice: the effect once, on every backend (async);
//! - a handler that fails: nothing committed, retried, applied later; after the last attempt
//!   the message is in the dead-letter topic with the error;
//! - a consumer process SIGKILLed after its transaction committed and before its offset was
//!   committed: on restart the message comes again and is recognised as a duplicate;
//! - end to end: orders written with `transaction_with_outbox`, a relay process killed twice,
//!   Kafka, an idempotent consumer writing to another database: the effects match the orders
//!   one for one.
//!
//! The process tests re-run this test binary as the child (see [`child_process`]). The
//! consumers read assigned partitions, committing to their group (see outbox-core's
//! `consumer_runtime` tests for the group path).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::kafka::{ConsumerStats, KafkaConsumer, KafkaPublisher};
use outbox::relay::{Backoff, Delivery, OutboxMessage, Publisher};
use outbox::{Envelope, Outcome, idempotent};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers as _, Message as _, OwnedMessage};
use uuid::Uuid;

use crate::conns::*;
use crate::support::*;

const PARTITIONS: i32 = 3;
const DEADLINE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// Harness

pub(crate) fn bootstrap() -> String {
    let bootstrap = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    for addr in bootstrap.split(',') {
        let reachable = addr
            .trim()
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
        assert!(
            reachable,
            "no Kafka broker at {addr}: run `scripts/kafka.sh start` (or set KAFKA_BROKERS)"
        );
    }
    bootstrap
}

pub(crate) fn unique(what: &str) -> String {
    format!("outbox-{what}-{}", Uuid::now_v7().simple())
}

/// A fresh topic and its dead-letter topic.
pub(crate) async fn topic(what: &str) -> String {
    let topic = unique(what);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let dlt = format!("{topic}.dlt");
    let new = [
        NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1)),
        NewTopic::new(&dlt, PARTITIONS, TopicReplication::Fixed(1)),
    ];
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&new, &options).await.unwrap() {
        result.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
    topic
}

pub(crate) fn publisher(topic: &str) -> KafkaPublisher {
    let topic = topic.to_owned();
    KafkaPublisher::builder()
        .brokers(bootstrap())
        .topic_for(move |_| topic.clone())
        .build()
        .unwrap()
}

async fn publish(topic: &str, messages: &[OutboxMessage]) {
    let outcomes = publisher(topic).publish(messages).await;
    assert!(
        outcomes.iter().all(|o| *o == Delivery::Published),
        "{outcomes:?}"
    );
}

fn order(order_id: i64) -> OrderCreated {
    OrderCreated {
        order_id,
        total_cents: order_id * 100,
    }
}

/// A consumer of every partition of `topic`, retrying fast.
fn consumer(topic: &str, group: &str) -> outbox::kafka::KafkaConsumerBuilder {
    KafkaConsumer::builder()
        .brokers(bootstrap())
        .group(group)
        .assign(topic, 0..PARTITIONS)
        .set("fetch.wait.max.ms", "100")
        .retry_backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: 0.2,
        })
}

pub(crate) fn n(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Runs `consumer` until `done` holds, then shuts it down gracefully.
async fn run_until(
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
        assert!(Instant::now() < deadline, "gave up waiting: {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    task.await.unwrap();
    stats
}

/// Reads `topic` from the beginning until `n` records arrived.
pub(crate) async fn read(topic: &str, n: usize) -> Vec<OwnedMessage> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let mut assignment = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment
            .add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, consumer.recv()).await {
            Ok(Ok(m)) => got.push(m.detach()),
            Ok(Err(e)) => panic!("reading {topic}: {e}"),
            Err(_) => break,
        }
    }
    got
}

pub(crate) fn header<'a>(m: &'a OwnedMessage, name: &str) -> &'a str {
    let value = m
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == name))
        .and_then(|h| h.value)
        .unwrap_or_else(|| panic!("no header {name}"));
    std::str::from_utf8(value).unwrap()
}

/// How many of the next attempts of each order fail after writing their effect.
#[derive(Default)]
pub struct Faults(Mutex<HashMap<i64, u32>>);

impl Faults {
    fn fail(&self, order_id: i64, times: u32) {
        self.0.lock().unwrap().insert(order_id, times);
    }
    fn take(&self, order_id: i64) -> bool {
        let mut faults = self.0.lock().unwrap();
        match faults.get_mut(&order_id) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

#[idempotent(consumer = "billing")]
async fn bill<C: AsyncConn>(
    conn: &mut C,
    event: Envelope<OrderCreated>,
    faults: &Faults,
) -> Result<(), AppError> {
    conn.effect(
        "billing",
        &event.inbox_key(),
        event.order_id,
        event.total_cents,
    )
    .await?;
    if faults.take(event.order_id) {
        return Err(AppError::Business("card declined"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Delivered twice, and failing handlers, on every backend

/// 20 orders, each published twice (as a relay that died before marking would): 20 effects,
/// 20 duplicates recognised.
pub async fn delivered_twice_effect_once<C: AsyncConn>(db: TestDatabase) {
    let db = Arc::new(with_effects_async::<C>(db).await);
    let topic = topic("twice").await;
    let messages: Vec<OutboxMessage> = (1..=20).map(|i| claimed(&order(i))).collect();
    publish(&topic, &messages).await;
    publish(&topic, &messages).await;

    let faults = Arc::new(Faults::default());
    let handler_db = db.clone();
    let consumer = consumer(&topic, &unique("twice"))
        .handler(move |event: Envelope<OrderCreated>| {
            let (db, faults) = (handler_db.clone(), faults.clone());
            async move {
                let mut conn = C::open(&db).await;
                bill(&mut conn, event, &faults)
                    .await
                    .map_err(|e| format!("{e:?}"))
            }
        })
        .build()
        .unwrap();
    let stats = run_until(consumer, |s| n(&s.done) == 40).await;
    assert_eq!(
        (n(&stats.applied), n(&stats.duplicates)),
        (20, 20),
        "{stats:?}"
    );
    let mut conn = C::open(&db).await;
    assert_eq!(conn.count(COUNT_EFFECTS).await, 20);
    assert_eq!(conn.count(COUNT_INBOX).await, 20);
}

/// Order 1 fails twice, then is applied; order 2 fails every attempt and is dead-lettered with
/// the error. After each failed attempt neither its effect nor its inbox row is stored.
pub async fn a_failing_handler_commits_nothing_then_retries_then_dead_letters<C: AsyncConn>(
    db: TestDatabase,
) {
    let db = Arc::new(with_effects_async::<C>(db).await);
    let topic = topic("failing").await;
    let messages = [claimed(&order(1)), claimed(&order(2)), claimed(&order(3))];
    publish(&topic, &messages).await;

    let faults = Arc::new(Faults::default());
    faults.fail(1, 2);
    faults.fail(2, u32::MAX);
    // (order, effects, inbox rows) seen right after each failed attempt.
    let after_failures: Arc<Mutex<Vec<(i64, i64, i64)>>> = Arc::default();
    let (handler_db, seen) = (db.clone(), after_failures.clone());
    let consumer = consumer(&topic, &unique("failing"))
        .max_attempts(4)
        .handler(move |event: Envelope<OrderCreated>| {
            let (db, faults, seen) = (handler_db.clone(), faults.clone(), seen.clone());
            async move {
                let mut conn = C::open(&db).await;
                let (key, order_id) = (event.inbox_key(), event.order_id);
                let result = bill(&mut conn, event, &faults).await;
                if result.is_err() {
                    let (effects, inbox) = conn.count_key(&key).await;
                    seen.lock().unwrap().push((order_id, effects, inbox));
                }
                result.map_err(|e| format!("billing failed: {e:?}"))
            }
        })
        .build()
        .unwrap();
    let stats = run_until(consumer, |s| n(&s.done) == 3).await;
    assert_eq!(
        (n(&stats.applied), n(&stats.dead_lettered)),
        (2, 1),
        "{stats:?}"
    );
    assert_eq!(n(&stats.handler_errors), 2 + 4);
    let mut after = after_failures.lock().unwrap().clone();
    after.sort();
    assert_eq!(
        after,
        [
            (1, 0, 0),
            (1, 0, 0),
            (2, 0, 0),
            (2, 0, 0),
            (2, 0, 0),
            (2, 0, 0)
        ],
        "a failed attempt leaves neither an effect nor an inbox row"
    );
    let mut conn = C::open(&db).await;
    assert_eq!(conn.count(COUNT_EFFECTS).await, 2);
    assert_eq!(conn.count(COUNT_INBOX).await, 2);
    assert_eq!(conn.count_key(&messages[0].id.to_string()).await, (1, 1));
    assert_eq!(conn.count_key(&messages[1].id.to_string()).await, (0, 0));

    let dead = read(&format!("{topic}.dlt"), 1).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        header(&dead[0], "outbox.error"),
        "billing failed: Business(\"card declined\")"
    );
    assert_eq!(header(&dead[0], "outbox.attempts"), "4");
    assert_eq!(header(&dead[0], "id"), messages[1].id.to_string());
}

/// Instantiates the tests above for one async connection type.
#[macro_export]
macro_rules! through_broker_suite {
    ($module:ident, $conn:ty, $db:path) => {
        mod $module {
            use $crate::through_broker as s;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivered_twice_effect_once() {
                s::delivered_twice_effect_once::<$conn>($db("broker_twice")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failing_handler_commits_nothing_then_retries_then_dead_letters() {
                s::a_failing_handler_commits_nothing_then_retries_then_dead_letters::<$conn>($db(
                    "broker_failing",
                ))
                .await;
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Processes killed mid-way

/// A child process of this test binary, running `role`, with its stdout lines on a channel.
struct ChildProcess {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ChildProcess {
    fn spawn(role: &str, env: &[(&str, &str)]) -> ChildProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "through_broker::child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("OUTBOX_TEST_CHILD", role)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The harness prints `test through_broker::child_process ... ` without a newline
            // before the child's first line: look for the marker anywhere.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(at) = line.find("CHILD ") {
                    let _ = tx.send(line[at + "CHILD ".len()..].to_owned());
                }
            }
        });
        ChildProcess { child, lines }
    }

    /// Waits for the child to print a line starting with `prefix`; returns the line.
    fn expect(&self, prefix: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("the child printed no `{prefix}` line: {e}"),
            }
        }
    }

    /// SIGKILL: no destructor, no graceful shutdown, no commit.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn wait_success(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the child exited with {status}");
    }
}

impl Drop for ChildProcess {
    /// A test that fails leaves no child behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Not a test: the entry point of the child processes the tests above spawn, selected by
/// `OUTBOX_TEST_CHILD`. Without it, it does nothing.
#[test]
fn child_process() {
    let Ok(role) = std::env::var("OUTBOX_TEST_CHILD") else {
        return;
    };
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match role.as_str() {
        "consumer" => runtime.block_on(child_consumer(
            env("CHILD_DB"),
            env("CHILD_TOPIC"),
            env("CHILD_GROUP"),
            std::env::var("CHILD_HANG_AFTER_APPLY").is_ok(),
            env("CHILD_STOP_AFTER").parse().unwrap(),
        )),
        "relay" => runtime.block_on(child_relay(env("CHILD_DB"), env("CHILD_TOPIC"))),
        other => panic!("unknown child role {other}"),
    }
}

/// A consumer on PostgreSQL printing what its handler did. With `hang`, the handler never
/// returns after an applied message: its transaction has committed, its offset is not stored.
/// Stops gracefully once `stop_after` messages are done.
#[cfg(feature = "postgres")]
async fn child_consumer(db: String, topic: String, group: String, hang: bool, stop_after: u64) {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    let consumer = consumer(&topic, &group)
        .handler(move |event: Envelope<OrderCreated>| {
            let db = db.clone();
            async move {
                let id = event.id;
                let mut conn = AsyncPgConnection::establish(&db).await.unwrap();
                let outcome = bill(&mut conn, event, &Faults::default()).await;
                match &outcome {
                    Ok(Outcome::Applied(())) => {
                        println!("CHILD APPLIED {id}");
                        if hang {
                            std::future::pending::<()>().await;
                        }
                    }
                    Ok(Outcome::Duplicate) => println!("CHILD DUPLICATE {id}"),
                    Err(e) => println!("CHILD ERROR {id} {e:?}"),
                }
                outcome.map_err(|e| format!("{e:?}"))
            }
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    consumer
        .run(async move {
            while n(&stats.done) < stop_after {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    println!("CHILD STOPPED");
}

#[cfg(not(feature = "postgres"))]
async fn child_consumer(_: String, _: String, _: String, _: bool, _: u64) {
    unreachable!("the process tests need PostgreSQL")
}

/// A publisher that, once the broker acknowledged a batch, says so and lingers before the
/// relay may mark it: a kill then lands between the publish and the mark, the window in which
/// at-least-once delivery duplicates.
struct LingerAfterAck(KafkaPublisher);

impl Publisher for LingerAfterAck {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let outcomes = self.0.publish(batch).await;
        let acked = outcomes
            .iter()
            .filter(|o| **o == Delivery::Published)
            .count();
        println!("CHILD ACKED {acked}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        outcomes
    }
}

/// A relay on PostgreSQL publishing to `topic`, until it is killed.
#[cfg(feature = "postgres")]
async fn child_relay(db: String, topic: String) {
    use outbox::relay::{PgRelayStore, Relay, RelayConfig};
    let config = RelayConfig {
        batch_size: 20,
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(3),
        publish_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    };
    let publisher = LingerAfterAck(publisher(&topic));
    let relay = Relay::new(PgRelayStore::new(db), publisher, config).unwrap();
    println!("CHILD STARTED");
    relay.run(std::future::pending()).await;
}

#[cfg(not(feature = "postgres"))]
async fn child_relay(_: String, _: String) {
    unreachable!("the process tests need PostgreSQL")
}

/// A consumer process is SIGKILLed after its handler's transaction committed and before the
/// offset was stored or committed: on restart the message is delivered again, and the inbox
/// recognises it.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_killed_between_its_commit_and_the_offset_commit_sees_a_duplicate() {
    use diesel_async::AsyncPgConnection;
    let db = with_effects_async::<AsyncPgConnection>(TestDatabase::postgres("sigkill")).await;
    let topic = topic("sigkill").await;
    let group = unique("sigkill");
    let message = claimed(&order(7));
    publish(&topic, std::slice::from_ref(&message)).await;
    let id = message.id.to_string();
    let env = |hang: bool| {
        let mut env = vec![
            ("CHILD_DB", db.url.as_str()),
            ("CHILD_TOPIC", topic.as_str()),
            ("CHILD_GROUP", group.as_str()),
            ("CHILD_STOP_AFTER", "1"),
        ];
        if hang {
            env.push(("CHILD_HANG_AFTER_APPLY", "1"));
        }
        env
    };

    let first = ChildProcess::spawn("consumer", &env(true));
    assert_eq!(first.expect("APPLIED"), format!("APPLIED {id}"));
    first.kill();
    let mut conn = <AsyncPgConnection as AsyncConn>::open(&db).await;
    assert_eq!(
        conn.count_key(&id).await,
        (1, 1),
        "the transaction had committed"
    );

    let restarted = ChildProcess::spawn("consumer", &env(false));
    assert_eq!(restarted.expect("DUPLICATE"), format!("DUPLICATE {id}"));
    restarted.expect("STOPPED");
    restarted.wait_success();
    assert_eq!(conn.count_key(&id).await, (1, 1), "applied once");
    assert_eq!(conn.count(COUNT_EFFECTS).await, 1);

    // The restarted consumer committed its offset on shutdown: a third one starts after it.
    let next = claimed(&order(8));
    publish(&topic, std::slice::from_ref(&next)).await;
    let third = ChildProcess::spawn("consumer", &env(false));
    assert_eq!(third.expect("APPLIED"), format!("APPLIED {}", next.id));
    third.expect("STOPPED");
    third.wait_success();
    assert_eq!(conn.count(COUNT_EFFECTS).await, 2);
}

/// Orders written with `transaction_with_outbox` on PostgreSQL, relayed to Kafka by a relay
/// process that is SIGKILLed twice mid-run, consumed by an idempotent consumer writing to a
/// MariaDB database: one effect per order, none twice.
#[cfg(all(feature = "postgres", feature = "mysql"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_with_the_relay_killed_twice_applies_each_order_once() {
    use diesel::Connection;
    use diesel_async::AsyncMysqlConnection;
    use outbox::prelude::*;
    const ORDERS: i64 = 600;

    let source = TestDatabase::postgres("e2e_source");
    let sink =
        Arc::new(with_effects_async::<AsyncMysqlConnection>(TestDatabase::mysql("e2e_sink")).await);
    let topic = topic("e2e").await;

    // The consumer runs throughout, in this process.
    let faults = Arc::new(Faults::default());
    let handler_sink = sink.clone();
    let consumer = consumer(&topic, &unique("e2e"))
        .handler(move |event: Envelope<OrderCreated>| {
            let (sink, faults) = (handler_sink.clone(), faults.clone());
            async move {
                let mut conn = <AsyncMysqlConnection as AsyncConn>::open(&sink).await;
                bill(&mut conn, event, &faults)
                    .await
                    .map_err(|e| format!("{e:?}"))
            }
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));

    // The writer: one order and its event per transaction.
    let writer_url = source.url.clone();
    let writer = std::thread::spawn(move || {
        let mut conn = diesel::PgConnection::establish(&writer_url).unwrap();
        for order_id in 1..=ORDERS {
            conn.transaction_with_outbox(|tx| {
                use diesel::prelude::*;
                diesel::insert_into(crate::orders::table)
                    .values((
                        crate::orders::id.eq(order_id),
                        crate::orders::total_cents.eq(order_id * 100),
                    ))
                    .execute(tx.conn())?;
                tx.publish(&order(order_id))?;
                Ok::<_, AppError>(())
            })
            .unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    });

    // The relay, killed twice after the broker acknowledged its third batch and before it
    // marked it (see `LingerAfterAck`), then left to finish.
    let env = [
        ("CHILD_DB", source.url.as_str()),
        ("CHILD_TOPIC", topic.as_str()),
    ];
    let mut unmarked_at_kills = Vec::new();
    for _ in 0..2 {
        let relay = ChildProcess::spawn("relay", &env);
        relay.expect("STARTED");
        let mut acked_batches = 0;
        let acked = loop {
            let line = relay.expect("ACKED");
            let acked: u64 = line["ACKED ".len()..].parse().unwrap();
            acked_batches += u64::from(acked > 0);
            if acked_batches == 3 {
                break acked;
            }
        };
        relay.kill();
        unmarked_at_kills.push(acked);
    }
    let relay = ChildProcess::spawn("relay", &env);
    writer.join().unwrap();
    let deadline = Instant::now() + DEADLINE;
    while pending_in(&source) > 0 {
        assert!(
            Instant::now() < deadline,
            "the relay did not drain the outbox"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while n(&stats.applied) < ORDERS as u64 {
        assert!(
            Instant::now() < deadline,
            "the consumer did not apply every order: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let late duplicates arrive, then stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.kill();
    stop.send(()).unwrap();
    consuming.await.unwrap();

    let mut conn = <AsyncMysqlConnection as AsyncConn>::open(&sink).await;
    let per_order = effects_per_order(&mut conn).await;
    assert_eq!(per_order.len() as i64, ORDERS, "every order has an effect");
    assert!(
        per_order
            .iter()
            .all(|(order_id, (count, cents))| *count == 1 && *cents == order_id * 100),
        "no order has two effects"
    );
    assert_eq!(
        per_order.keys().copied().collect::<Vec<_>>(),
        (1..=ORDERS).collect::<Vec<_>>()
    );
    assert_eq!(conn.count(COUNT_INBOX).await, ORDERS);
    // Each kill left a published batch unmarked: the next relay published it again, and the
    // consumer recognised every one of those messages.
    let unmarked: u64 = unmarked_at_kills.iter().sum();
    assert!(
        n(&stats.duplicates) >= unmarked,
        "{unmarked_at_kills:?} published but unmarked at the kills, {stats:?}"
    );
    eprintln!(
        "e2e: relay killed with {unmarked_at_kills:?} messages published but unmarked; consumer \
         applied {}, recognised {} duplicates",
        n(&stats.applied),
        n(&stats.duplicates)
    );
}

#[cfg(feature = "postgres")]
fn pending_in(db: &TestDatabase) -> i64 {
    use diesel::{Connection, RunQueryDsl};
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    diesel::sql_query(
        "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .get_result::<Count>(&mut conn)
    .unwrap()
    .n
}

/// order id -> (effects, cents of the effect).
#[cfg(feature = "mysql")]
async fn effects_per_order(
    conn: &mut diesel_async::AsyncMysqlConnection,
) -> BTreeMap<i64, (i64, i64)> {
    use diesel::QueryableByName;
    use diesel::sql_types::BigInt;
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        order_id: i64,
        #[diesel(sql_type = BigInt)]
        n: i64,
        #[diesel(sql_type = BigInt)]
        cents: i64,
    }
    let rows: Vec<Row> = diesel_async::RunQueryDsl::load(
        diesel::sql_query(
            "SELECT order_id, COUNT(*) AS n, MAX(amount) AS cents FROM effects GROUP BY order_id",
        ),
        conn,
    )
    .await
    .unwrap();
    rows.into_iter()
        .map(|r| (r.order_id, (r.n, r.cents)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A topic that appears after the consumer started

/// A consumer subscribed (as a group member) to a topic that does not exist yet picks it up
/// within seconds of its creation (here: by the first publish), not after librdkafka's
/// default 5-minute metadata refresh.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_created_after_the_consumer_started_is_picked_up_within_seconds() {
    type C = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    let db = Arc::new(with_effects_async::<C>(TestDatabase::sqlite("late_topic")).await);
    let topic = unique("late");
    let handler_db = db.clone();
    let faults = Arc::new(Faults::default());
    let consumer = KafkaConsumer::builder()
        .brokers(bootstrap())
        .group(unique("late"))
        .topic(&topic)
        .handler(move |event: Envelope<OrderCreated>| {
            let (db, faults) = (handler_db.clone(), faults.clone());
            async move {
                let mut conn = C::open(&db).await;
                bill(&mut conn, event, &faults)
                    .await
                    .map_err(|e| format!("{e:?}"))
            }
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));
    // The consumer looks for the topic and finds nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    publish(&topic, &[claimed(&order(1))]).await;
    let published = Instant::now();
    while n(&stats.applied) < 1 {
        assert!(
            published.elapsed() < Duration::from_secs(60),
            "the consumer did not pick up the new topic within 60 s: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = published.elapsed();
    stop.send(()).unwrap();
    task.await.unwrap();
    eprintln!("a topic created after the consumer started: applied {took:?} after the publish");
    assert!(took < Duration::from_secs(15), "took {took:?}");
}
