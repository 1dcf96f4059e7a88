//! `NatsPublisher` and `NatsConsumer` against a real NATS server with JetStream
//! (`OUTBOX_TEST_NATS_URL`, default `nats://127.0.0.1:4222`), read back with async-nats' own
//! client. Each test makes its own topics (so its own streams) and deletes them at the end.
//!
//! ```text
//! cargo test -p outbox-kernel --features nats,relay --test nats
//! ```

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer, consumer::pull};
use futures_util::StreamExt;
use outbox_core::fault::Transient;
use outbox_core::nats::{ConsumerStats, NatsConsumer, NatsConsumerBuilder, NatsPublisher};
use outbox_core::relay::{Backoff, Delivery, OutboxMessage, Publisher};
use outbox_core::{Envelope, Headers, NewMessage, OutboxEvent, Outcome};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderPlaced", version = 1)]
struct OrderPlaced {
    #[outbox(aggregate_id)]
    order_id: String,
    n: u64,
}

// ---------------------------------------------------------------------------------------------
// Harness

fn url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A topic of this test, deleted (with its dead letters) when dropped.
struct Topic {
    name: String,
    js: jetstream::Context,
}

impl Topic {
    async fn new(what: &str) -> Topic {
        let client = async_nats::connect(url())
            .await
            .expect("no NATS server: start nats-server -js, or set OUTBOX_TEST_NATS_URL");
        Topic {
            name: format!("t{what}{}", Uuid::now_v7().simple()),
            js: jetstream::new(client),
        }
    }

    /// Everything in `<topic>.>` (or `prefix.>`), in stream order, read by a consumer of
    /// async-nats' own.
    async fn read(&self, prefix: &str, expected: usize) -> Vec<async_nats::Message> {
        let stream_name = self
            .js
            .stream_by_subject(format!("{prefix}.>"))
            .await
            .expect("a stream for the subject");
        let stream = self.js.get_stream(&stream_name).await.unwrap();
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                filter_subject: format!("{prefix}.>"),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut messages = consumer.messages().await.unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + DEADLINE;
        while got.len() < expected {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = tokio::time::timeout(left, messages.next()).await;
            let message = next
                .unwrap_or_else(|_| panic!("read {} of {expected} from {prefix}", got.len()))
                .unwrap()
                .unwrap();
            got.push(message.message.clone());
            message.ack().await.unwrap();
        }
        got
    }
}

impl Drop for Topic {
    fn drop(&mut self) {
        let js = self.js.clone();
        let name = self.name.clone();
        // The streams the publisher and the consumer made: `<topic>` and `<topic>-dlt`.
        let cleanup = async move {
            for stream in [name.clone(), format!("{name}-dlt")] {
                let _ = js.delete_stream(&stream).await;
            }
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let _ = std::thread::spawn(move || handle.block_on(cleanup)).join();
        }
    }
}

fn placed(topic: &str, order_id: &str, n: u64) -> OutboxMessage {
    let m = NewMessage::from_event(
        &OrderPlaced {
            order_id: order_id.to_owned(),
            n,
        },
        Headers::new(),
    )
    .unwrap();
    OutboxMessage {
        seq: n as i64,
        id: m.id,
        aggregate_type: m.aggregate_type.into_owned(),
        aggregate_id: m.aggregate_id,
        event_type: m.event_type.into_owned(),
        event_version: m.event_version,
        payload: m.payload,
        headers: m.headers,
        topic: Some(topic.to_owned()),
        shard: m.shard,
        created_at: m.created_at,
        attempts: 1,
    }
}

async fn publisher() -> NatsPublisher {
    NatsPublisher::builder()
        .servers(url())
        .ack_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

fn consumer(topic: &Topic) -> NatsConsumerBuilder {
    NatsConsumer::builder()
        .servers(url())
        .group(format!("g{}", Uuid::now_v7().simple()))
        .topic(&topic.name)
        .retry_backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.2,
        })
        .outage_backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: 0.2,
        })
}

fn header<'a>(m: &'a async_nats::Message, name: &str) -> &'a str {
    m.headers
        .as_ref()
        .and_then(|h| h.get(name))
        .unwrap_or_else(|| panic!("no header {name}"))
        .as_str()
}

/// Runs `consumer` until `done` holds of its counters, then shuts it down gracefully.
async fn run_until(
    consumer: NatsConsumer,
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

fn n(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// Publisher

/// The stream is created; each message is `<topic>.<escaped id>` with the event's headers and
/// `Nats-Msg-Id`; the same batch published again is dropped by the duplicate window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_carry_subject_headers_and_id_and_repeats_are_dropped() {
    let topic = Topic::new("wire").await;
    let publisher = publisher().await;
    publisher.ready(Duration::from_secs(5)).await.unwrap();
    assert_eq!(publisher.unavailable(), None);
    let batch = [
        placed(&topic.name, "42", 0),
        placed(&topic.name, "eu.west 7", 1),
    ];
    for _ in 0..2 {
        let outcomes = publisher.publish(&batch).await;
        assert_eq!(outcomes, [Delivery::Published, Delivery::Published]);
    }
    let stream = topic.js.get_stream(&topic.name).await.unwrap();
    assert_eq!(stream.cached_info().state.messages, 2, "repeats dropped");
    let got = topic.read(&topic.name, 2).await;
    assert_eq!(got[0].subject.as_str(), format!("{}.42", topic.name));
    assert_eq!(
        got[1].subject.as_str(),
        format!("{}.eu%2Ewest%207", topic.name)
    );
    let id = batch[0].id.hyphenated().to_string();
    assert_eq!(header(&got[0], "Nats-Msg-Id"), id);
    assert_eq!(header(&got[0], "id"), id);
    assert_eq!(header(&got[0], "event_type"), "OrderPlaced");
    assert_eq!(header(&got[0], "aggregate_type"), "order");
    assert_eq!(got[0].payload.as_ref(), batch[0].payload.as_bytes());
}

/// 3,000 messages of 50 aggregates in batches of 500: each aggregate's messages are stored
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_aggregate_is_stored_in_order() {
    let topic = Topic::new("order").await;
    let publisher = publisher().await;
    let messages: Vec<OutboxMessage> = (0..3000)
        .map(|i| placed(&topic.name, &format!("o{}", i % 50), i))
        .collect();
    for batch in messages.chunks(500) {
        let outcomes = publisher.publish(batch).await;
        assert!(
            outcomes.iter().all(|d| *d == Delivery::Published),
            "{outcomes:?}"
        );
    }
    let got = topic.read(&topic.name, 3000).await;
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in &got {
        let event: OrderPlaced = serde_json::from_slice(&m.payload).unwrap();
        if let Some(previous) = last.insert(event.order_id.clone(), event.n) {
            assert!(
                previous < event.n,
                "{}: {previous} then {}",
                event.order_id,
                event.n
            );
        }
    }
    assert_eq!(last.len(), 50);
}

/// A stream deleted by an operator while the publisher runs: the next batch finds no stream
/// (an outage for that batch, nothing `Failed`), and the one after creates it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_is_created_again() {
    let topic = Topic::new("deleted").await;
    let publisher = publisher().await;
    let first = publisher.publish(&[placed(&topic.name, "1", 0)]).await;
    assert_eq!(first, [Delivery::Published]);
    topic.js.delete_stream(&topic.name).await.unwrap();
    let gone = publisher.publish(&[placed(&topic.name, "1", 1)]).await;
    assert!(gone[0].is_outage(), "{gone:?}");
    let again = publisher.publish(&[placed(&topic.name, "1", 1)]).await;
    assert_eq!(again, [Delivery::Published]);
}

/// No server: every message is an outage (never `Failed`), within the acknowledgement
/// timeout, and `ready` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_an_outage() {
    let publisher = NatsPublisher::builder()
        .servers("nats://127.0.0.1:1")
        .ack_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let started = Instant::now();
    let outcomes = publisher
        .publish(&[placed("tdown", "1", 0), placed("tdown", "1", 1)])
        .await;
    assert!(started.elapsed() < publisher.publish_timeout() + Duration::from_secs(1));
    assert!(outcomes[0].is_outage(), "{outcomes:?}");
    assert_eq!(outcomes[1], Delivery::NotAttempted);
    assert!(publisher.unavailable().is_some());
    let err = publisher.ready(Duration::from_secs(1)).await.unwrap_err();
    assert!(err.reason().contains("127.0.0.1:1"), "{err}");
}

/// A message larger than the server's `max_payload` is poison; the others of the batch,
/// its own aggregate's earlier one included, are published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_too_large_is_poison_and_the_rest_goes_on() {
    let topic = Topic::new("large").await;
    let publisher = publisher().await;
    let mut large = placed(&topic.name, "1", 1);
    large.payload = format!("\"{}\"", "x".repeat(2 * 1024 * 1024));
    let batch = [
        placed(&topic.name, "1", 0),
        large,
        placed(&topic.name, "1", 2),
        placed(&topic.name, "2", 0),
    ];
    let outcomes = publisher.publish(&batch).await;
    assert_eq!(outcomes[0], Delivery::Published);
    assert!(
        matches!(&outcomes[1], Delivery::Failed(e) if e.contains("max_payload")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2], Delivery::NotAttempted);
    assert_eq!(outcomes[3], Delivery::Published);
}

// ---------------------------------------------------------------------------------------------
// Consumer

/// Order `a` fails for good and is dead-lettered after 2 attempts; its later event is parked
/// behind it; order `b` is applied; an outage of order `c` is retried beyond max_attempts and
/// never dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_dead_lettered_and_parks_its_key_and_outages_wait() {
    let topic = Topic::new("poison").await;
    let publisher = publisher().await;
    let batch = [
        placed(&topic.name, "a", 0),
        placed(&topic.name, "b", 0),
        placed(&topic.name, "a", 1),
        placed(&topic.name, "c", 0),
    ];
    assert!(
        publisher
            .publish(&batch)
            .await
            .iter()
            .all(|d| *d == Delivery::Published)
    );

    let applied: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let outages = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (a, o) = (applied.clone(), outages.clone());
    let consumer = consumer(&topic)
        .max_attempts(2)
        .handler(move |event: Envelope<OrderPlaced>| {
            let (a, o) = (a.clone(), o.clone());
            async move {
                match event.order_id.as_str() {
                    "a" => Err(outbox_core::BoxError::from("card declined")),
                    "c" if o.fetch_add(1, Ordering::Relaxed) < 5 => {
                        Err(Box::new(Transient::new("database restarting"))
                            as outbox_core::BoxError)
                    }
                    _ => {
                        a.lock().unwrap().push((event.order_id.clone(), event.n));
                        Ok(Outcome::Applied(()))
                    }
                }
            }
        })
        .build()
        .await
        .unwrap();
    let stats = run_until(consumer, |s| n(&s.done) == 4).await;
    assert_eq!(
        (
            n(&stats.dead_lettered),
            n(&stats.parked),
            n(&stats.transient_errors)
        ),
        (2, 1, 5),
        "the poison message and the one parked behind it: {stats:?}"
    );
    let mut applied = applied.lock().unwrap().clone();
    applied.sort();
    assert_eq!(applied, [("b".to_owned(), 0), ("c".to_owned(), 0)]);

    let letters = topic.read(&format!("{}-dlt", topic.name), 2).await;
    assert_eq!(letters[0].subject.as_str(), format!("{}-dlt.a", topic.name));
    assert_eq!(header(&letters[0], "outbox.error.kind"), "handler");
    assert!(header(&letters[0], "outbox.error").contains("card declined"));
    assert_eq!(header(&letters[0], "outbox.attempts"), "2");
    assert_eq!(header(&letters[0], "outbox.original.topic"), topic.name);
    assert_eq!(
        header(&letters[0], "id"),
        batch[0].id.hyphenated().to_string()
    );
    assert_eq!(header(&letters[1], "outbox.error.kind"), "parked");
    assert_eq!(
        header(&letters[1], "outbox.parked.behind.id"),
        batch[0].id.hyphenated().to_string()
    );
}

/// A consumer that stops while its handler runs acknowledges nothing: the next consumer of
/// the group gets the message again, and then the rest in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_message_comes_again_first() {
    let topic = Topic::new("again").await;
    let publisher = publisher().await;
    let batch: Vec<OutboxMessage> = (0..5).map(|i| placed(&topic.name, "k", i)).collect();
    assert!(
        publisher
            .publish(&batch)
            .await
            .iter()
            .all(|d| *d == Delivery::Published)
    );
    let group = format!("g{}", Uuid::now_v7().simple());

    // The first consumer blocks in its handler of the first message and is stopped.
    let (entered, mut entered_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let first = consumer(&topic)
        .group(&group)
        .ack_wait(Duration::from_secs(2))
        .shutdown_grace(Duration::from_millis(100))
        .handler(move |event: Envelope<OrderPlaced>| {
            let entered = entered.clone();
            async move {
                entered.send(event.n).ok();
                std::future::pending::<()>().await;
                Ok::<_, String>(Outcome::Applied(()))
            }
        })
        .build()
        .await
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(first.run(async move {
        stopped.await.ok();
    }));
    assert_eq!(entered_rx.recv().await, Some(0));
    stop.send(()).unwrap();
    task.await.unwrap();

    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let s = seen.clone();
    let second = consumer(&topic)
        .group(&group)
        .ack_wait(Duration::from_secs(2))
        .handler(move |event: Envelope<OrderPlaced>| {
            s.lock().unwrap().push(event.n);
            async { Ok::<_, String>(Outcome::Applied(())) }
        })
        .build()
        .await
        .unwrap();
    run_until(second, |s| n(&s.done) == 5).await;
    assert_eq!(*seen.lock().unwrap(), [0, 1, 2, 3, 4]);
}

/// An outage longer than `ack_wait`: the held message is kept in progress, not delivered
/// again, and the order holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_outage_keeps_the_message_in_progress() {
    let topic = Topic::new("long").await;
    let publisher = publisher().await;
    let batch: Vec<OutboxMessage> = (0..3).map(|i| placed(&topic.name, "k", i)).collect();
    assert!(
        publisher
            .publish(&batch)
            .await
            .iter()
            .all(|d| *d == Delivery::Published)
    );
    let started = Instant::now();
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let s = seen.clone();
    let consumer = consumer(&topic)
        .ack_wait(Duration::from_secs(2))
        .handler(move |event: Envelope<OrderPlaced>| {
            let s = s.clone();
            async move {
                if event.n == 0 && started.elapsed() < Duration::from_secs(5) {
                    return Err(Box::new(Transient::new("database down")) as outbox_core::BoxError);
                }
                s.lock().unwrap().push(event.n);
                Ok(Outcome::Applied(()))
            }
        })
        .build()
        .await
        .unwrap();
    let stats = run_until(consumer, |s| n(&s.done) == 3).await;
    assert_eq!(*seen.lock().unwrap(), [0, 1, 2]);
    assert_eq!(n(&stats.received), 3, "nothing delivered twice: {stats:?}");
}

#[tokio::test]
async fn configuration_mistakes_are_refused_by_name() {
    let handler = |_: Envelope<OrderPlaced>| async { Ok::<_, String>(Outcome::Applied(())) };
    let refused = |builder: NatsConsumerBuilder, option: &str| {
        let option = option.to_owned();
        async move {
            match builder.build().await {
                Err(outbox_core::nats::NatsConfigError::InvalidOption { option: got, .. }) => {
                    assert_eq!(got, option)
                }
                other => panic!("expected {option} to be refused: {other:?}"),
            }
        }
    };
    let base = || NatsConsumer::builder().servers(url()).handler(handler);
    refused(base().topic("order"), "group").await;
    refused(base().group("billing"), "topic").await;
    refused(base().group("bill.ing").topic("order"), "group").await;
    refused(base().group("billing").topic("order.*"), "topic").await;
    refused(
        NatsConsumer::builder()
            .servers(url())
            .group("g")
            .topic("order"),
        "handler",
    )
    .await;
    refused(
        base().group("g").topic("order").max_ack_pending(0),
        "max_ack_pending",
    )
    .await;
    let err = NatsPublisher::builder()
        .servers("nats://user:hunter2@[::1")
        .build()
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}
