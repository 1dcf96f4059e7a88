//! The pipelined relay (`RelayConfig::max_in_flight`) against the in-memory store and broker:
//! the next batches are claimed while one is published, never with an event of an aggregate
//! that is in flight, and a graceful shutdown settles every batch in flight.
#![cfg(feature = "relay")]
#![allow(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::relay::*;

/// A broker whose publishes wait until the gate opens, recording each batch as it starts and
/// how many publishes were in flight at once.
struct Gated {
    broker: Arc<MemoryBroker>,
    gate: tokio::sync::watch::Receiver<bool>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// The batches whose publish started, as `(aggregate id, event type)` per message.
    started: Mutex<Vec<Vec<(String, String)>>>,
}

impl Gated {
    fn new(broker: Arc<MemoryBroker>) -> (Arc<Self>, tokio::sync::watch::Sender<bool>) {
        let (open, gate) = tokio::sync::watch::channel(false);
        let gated = Gated {
            broker,
            gate,
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            started: Mutex::new(Vec::new()),
        };
        (Arc::new(gated), open)
    }

    fn started(&self) -> Vec<Vec<(String, String)>> {
        self.started.lock().unwrap().clone()
    }
}

impl Publisher for Gated {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        self.started.lock().unwrap().push(
            batch
                .iter()
                .map(|m| (m.aggregate_id.clone(), m.event_type.clone()))
                .collect(),
        );
        let _ = self.gate.clone().wait_for(|open| *open).await;
        let out = self.broker.publish(batch).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

fn config(max_in_flight: usize) -> RelayConfig {
    RelayConfig {
        relay_id: "pipe".into(),
        batch_size: 2,
        max_in_flight,
        poll_interval: Duration::from_millis(5),
        lease: Duration::from_secs(20),
        publish_timeout: Duration::from_secs(10),
        ..RelayConfig::default()
    }
}

/// Aggregates `a`, `b`, `c`, `d`, `e`, three events each, written aggregate by aggregate.
fn fill(store: &MemoryStore) {
    for aggregate in ["a", "b", "c", "d", "e"] {
        for i in 0..3 {
            store.insert(test_message("order", aggregate, &format!("E{i}")));
        }
    }
}

/// After an ordered relay's first claims (it claims one batch at a time for its first 32,
/// see `RelayConfig::max_in_flight`), made on events of other aggregates published through
/// the open gate, the last one not full (so that the relay has caught up, not met a backlog
/// it cannot reach): closes the gate and forgets what was seen.
fn warm_up(gated: &Gated, open: &tokio::sync::watch::Sender<bool>) {
    open.send(false).unwrap();
    gated.started.lock().unwrap().clear();
    gated.most_in_flight.store(0, Ordering::SeqCst);
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// While the first batch's publish is held, the relay claims and starts more batches, up to
/// `max_in_flight`; none of them holds an event of an aggregate already in flight (the
/// claimed, unsettled event holds its aggregate back). With `max_in_flight = 1` only one is
/// ever in flight. Once released, everything is published in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_claimed_while_one_is_in_flight() {
    for max_in_flight in [3, 1] {
        let store = MemoryStore::default();
        // The measured events, held by another relay's lease while the relay warms up.
        fill(&store);
        let mut other = store.clone();
        let held: Vec<i64> = other
            .claim(&Claim {
                relay: "other",
                limit: 100,
                lease: Duration::from_secs(60),
                look_ahead: None,
                settling: &[],
                order: ClaimOrder::Unordered,
            })
            .await
            .unwrap()
            .iter()
            .map(|m| m.seq)
            .collect();
        assert_eq!(held.len(), 15);
        for i in 0..81 {
            store.insert(test_message("warm-up", &i.to_string(), "W"));
        }
        let broker = Arc::new(MemoryBroker::new());
        let (gated, open) = Gated::new(broker.clone());
        open.send(true).unwrap();
        let relay = Relay::new(store.clone(), gated.clone(), config(max_in_flight)).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(relay.run(async move {
            let _ = stopped.await;
        }));
        wait_until("warmed up", || store.pending() == 15).await;
        warm_up(&gated, &open);
        // All at once: the relay finds them together.
        other.release("other", &held).await.unwrap();

        wait_until("the window is full", || {
            gated.in_flight.load(Ordering::SeqCst) == max_in_flight
        })
        .await;
        // Give the relay time to (wrongly) start more.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(gated.most_in_flight.load(Ordering::SeqCst), max_in_flight);
        // The batches, in claim order: a's first two events, then b's (a's third waits for
        // them), then c's: none holds an event of an aggregate already in flight.
        let mut started = gated.started();
        started.sort();
        let expected: Vec<Vec<(String, String)>> = ["a", "b", "c"][..max_in_flight]
            .iter()
            .map(|a| vec![(a.to_string(), "E0".into()), (a.to_string(), "E1".into())])
            .collect();
        assert_eq!(started, expected);
        let leased = store
            .rows()
            .iter()
            .filter(|r| r.locked_by.is_some())
            .count();
        assert_eq!(
            leased,
            2 * max_in_flight,
            "every batch in flight is claimed"
        );

        open.send(true).unwrap();
        wait_until("drained", || store.is_drained()).await;
        stop.send(()).unwrap();
        handle.await.unwrap();
        for aggregate in ["a", "b", "c", "d", "e"] {
            let events: Vec<String> = broker
                .records("order")
                .iter()
                .filter(|r| r.key == aggregate)
                .map(|r| r.header("event_type").unwrap_or_default().to_owned())
                .collect();
            assert_eq!(events, ["E0", "E1", "E2"], "aggregate {aggregate}");
        }
    }
}

/// A shutdown while batches are in flight waits for their publishes and settles them: the
/// published rows are marked, the rest released (no lease left behind), nothing published
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_settles_every_batch_in_flight() {
    let store = MemoryStore::default();
    fill(&store);
    let broker = Arc::new(MemoryBroker::new());
    let (gated, open) = Gated::new(broker.clone());
    let mut config = config(3);
    config.mode = Mode::Unordered;
    let relay = Relay::new(store.clone(), gated.clone(), config).unwrap();
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut handle = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    wait_until("three batches in flight", || {
        gated.in_flight.load(Ordering::SeqCst) == 3
    })
    .await;

    stop.send(()).unwrap();
    // The relay does not stop while its publishes are held...
    let early = tokio::time::timeout(Duration::from_millis(200), &mut handle).await;
    assert!(early.is_err(), "the relay stopped with batches in flight");
    // ...and once they finish, it settles them and stops.
    open.send(true).unwrap();
    handle.await.unwrap();

    let rows = store.rows();
    assert_eq!(rows.iter().filter(|r| r.published).count(), 6);
    assert_eq!(broker.records("order").len(), 6);
    assert_eq!(stats.published.load(Ordering::Relaxed), 6);
    assert!(
        rows.iter().all(|r| r.locked_by.is_none()),
        "a lease left behind: {rows:?}"
    );
    assert_eq!(
        gated.started().len(),
        3,
        "nothing claimed after the shutdown"
    );
}

/// A broker outage met by one batch while others are in flight: every batch goes back without
/// costing an attempt, the relay waits for the broker, and then delivers everything in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_sends_the_whole_window_back() {
    let store = MemoryStore::default();
    fill(&store);
    let broker = Arc::new(MemoryBroker::new());
    broker.set_available(false);
    let (gated, open) = Gated::new(broker.clone());
    let mut config = config(3);
    config.mode = Mode::Unordered;
    config.max_attempts = 1; // an attempt counted would dead-letter
    let relay = Relay::new(store.clone(), gated.clone(), config).unwrap();
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    wait_until("three batches in flight", || {
        gated.in_flight.load(Ordering::SeqCst) == 3
    })
    .await;
    open.send(true).unwrap();
    wait_until("the relay waits for the broker", || {
        stats.broker_waits.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert_eq!(gated.most_in_flight.load(Ordering::SeqCst), 3);
    assert_eq!(
        gated.in_flight.load(Ordering::SeqCst),
        0,
        "the window was drained"
    );
    // During the outage the relay probes with one batch at a time.
    gated.most_in_flight.store(0, Ordering::SeqCst);
    wait_until("more outage waits", || {
        stats.broker_waits.load(Ordering::Relaxed) >= 3
    })
    .await;
    assert_eq!(gated.most_in_flight.load(Ordering::SeqCst), 1);
    broker.set_available(true);
    wait_until("drained", || store.is_drained()).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(store.dead_letters(), []);
    assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 0);
    assert!(
        store.rows().iter().all(|r| r.attempts <= 1),
        "{:?}",
        store.rows()
    );
    assert_eq!(broker.records("order").len(), 15);
}

/// After a claim that found rows, the relay looks again every few milliseconds for its wake
/// window, so an event committed inside it (whose notification a writer's throttle may have
/// dropped) is published at once, not after the poll interval; after the window the relay
/// waits for the poll interval (or a notification; the in-memory store has none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_inside_the_wake_window_does_not_wait_a_poll_interval() {
    let store = MemoryStore::default();
    store.insert(test_message("order", "1", "First"));
    let broker = Arc::new(MemoryBroker::new());
    let config = RelayConfig {
        relay_id: "wake".into(),
        poll_interval: Duration::from_secs(3),
        wake_window: Duration::from_millis(300),
        ..RelayConfig::default()
    };
    let relay = Relay::new(store.clone(), broker.clone(), config).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    wait_until("the first event", || store.is_drained()).await;

    // Inside the window: published within milliseconds.
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.insert(test_message("order", "2", "Second"));
    let inserted = tokio::time::Instant::now();
    wait_until("the second event", || store.is_drained()).await;
    let took = inserted.elapsed();
    assert!(took < Duration::from_millis(250), "{took:?}");

    // Long after the window: the relay waits for its poll interval.
    tokio::time::sleep(Duration::from_millis(800)).await;
    store.insert(test_message("order", "3", "Third"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!store.is_drained(), "claimed before the poll interval");
    stop.send(()).unwrap();
    handle.await.unwrap();
}

/// Large events: 60 events of 100 KB, batch 50, 4 batches in flight, and the events in flight
/// bounded at 1 MB. Without the bound the first batch would hold 5 MB and four in flight
/// 20 MB; with it the relay claims fewer rows once it has seen how large they are, and never
/// has more than the bound (plus the one batch claimed before it knew) in flight. Every
/// event is published once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_in_flight_stay_under_their_bound_in_bytes() {
    /// Publishes slowly, recording the bytes of payload in flight as each publish starts.
    struct Weighing {
        broker: MemoryBroker,
        in_flight: AtomicUsize,
        at_start: Mutex<Vec<usize>>,
    }
    impl Publisher for Weighing {
        async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
            let bytes: usize = batch.iter().map(|m| m.payload.len()).sum();
            let now = self.in_flight.fetch_add(bytes, Ordering::SeqCst) + bytes;
            self.at_start.lock().unwrap().push(now);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let out = self.broker.publish(batch).await;
            self.in_flight.fetch_sub(bytes, Ordering::SeqCst);
            out
        }
    }

    const EVENT: usize = 100_000;
    const BOUND: usize = 1_000_000;
    let store = MemoryStore::default();
    for i in 0..60 {
        let mut m = test_message("doc", &format!("d{i}"), "Uploaded");
        m.payload = format!("\"{}\"", "x".repeat(EVENT - 2));
        store.insert(m);
    }
    let publisher = Arc::new(Weighing {
        broker: MemoryBroker::new(),
        in_flight: AtomicUsize::new(0),
        at_start: Mutex::new(Vec::new()),
    });
    let relay = Relay::new(
        store.clone(),
        publisher.clone(),
        RelayConfig {
            mode: Mode::Unordered,
            batch_size: 50,
            max_in_flight_bytes: BOUND,
            ..config(4)
        },
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async move {
        stopped.await.ok();
    }));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while publisher.broker.records("doc").len() < 60 {
        assert!(std::time::Instant::now() < deadline, "not all published");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(publisher.broker.records("doc").len(), 60, "each once");
    // The first claim, made before any event was seen, takes a whole batch; every publish
    // after it starts with at most the bound in flight (and the one event that reaches it).
    let at_start = publisher.at_start.lock().unwrap().clone();
    assert_eq!(at_start[0], 50 * EVENT, "{at_start:?}");
    assert!(
        at_start[1..].iter().all(|b| *b <= BOUND + EVENT),
        "bytes in flight as each publish started: {at_start:?}"
    );
    assert!(at_start.len() > 2, "{at_start:?}");
}
