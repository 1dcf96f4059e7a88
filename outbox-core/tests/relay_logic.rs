//! The relay's logic against the in-memory store and broker: ordering under failures,
//! leases, leadership, dead letters, outages and shutdown. (The same relay against real
//! databases and a real Kafka-protocol broker is tested in the workspace's integration tests.)
#![cfg(feature = "relay")]
#![allow(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox_core::relay::*;

fn fast(mode: Mode) -> RelayConfig {
    RelayConfig {
        mode,
        batch_size: 64,
        poll_interval: Duration::from_millis(5),
        lease: Duration::from_millis(600),
        publish_timeout: Duration::from_millis(300),
        max_attempts: 50,
        backoff: Backoff {
            initial: Duration::from_millis(2),
            max: Duration::from_millis(20),
            multiplier: 2.0,
            jitter: 0.5,
        },
        outage_backoff: Backoff {
            initial: Duration::from_millis(2),
            max: Duration::from_millis(20),
            multiplier: 2.0,
            jitter: 0.5,
        },
        ..RelayConfig::default()
    }
}

fn fill(store: &MemoryStore, aggregates: usize, per_aggregate: usize) -> usize {
    for i in 0..per_aggregate {
        for a in 0..aggregates {
            store.insert(test_message("order", &a.to_string(), &format!("E{i}")));
        }
    }
    aggregates * per_aggregate
}

/// Runs `n` relays until the store is drained (or the deadline passes), then stops them.
async fn run_relays(
    store: &MemoryStore,
    broker: &Arc<MemoryBroker>,
    configs: Vec<RelayConfig>,
    deadline: Duration,
) -> Vec<Arc<RelayStats>> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    let mut stats = Vec::new();
    for config in configs {
        let relay = Relay::new(store.clone(), broker.clone(), config).unwrap();
        stats.push(relay.stats());
        let mut rx = stop_rx.clone();
        handles.push(tokio::spawn(relay.run(async move {
            let _ = rx.wait_for(|stop| *stop).await;
        })));
    }
    let start = tokio::time::Instant::now();
    while !store.is_drained() && start.elapsed() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop_tx.send(true).unwrap();
    for h in handles {
        h.await.unwrap();
    }
    stats
}

/// Per key, the event ids at the broker must be increasing (UUIDv7 ids are created in insert
/// order), and every inserted event must be there.
fn assert_ordered_and_complete(broker: &MemoryBroker, expected: usize) {
    let records = broker.all_records();
    let mut last: HashMap<&str, uuid::Uuid> = HashMap::new();
    for r in &records {
        if let Some(prev) = last.insert(r.key.as_str(), r.id) {
            assert!(
                prev < r.id,
                "key {}: {} published after {}",
                r.key,
                r.id,
                prev
            );
        }
    }
    let distinct: HashSet<_> = records.iter().map(|r| r.id).collect();
    assert_eq!(distinct.len(), expected, "every event delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_relays_deliver_everything_once() {
    let store = MemoryStore::default();
    let n = fill(&store, 50, 40);
    let broker = Arc::new(MemoryBroker::new());
    let configs = (0..4).map(|_| fast(Mode::Unordered)).collect();
    let stats = run_relays(&store, &broker, configs, Duration::from_secs(20)).await;
    assert!(store.is_drained());
    let records = broker.all_records();
    assert_eq!(records.len(), n, "no crash, so no duplicates");
    let published: u64 = stats
        .iter()
        .map(|s| s.published.load(Ordering::Relaxed))
        .sum();
    assert_eq!(published, n as u64);
}

/// Random failures (10 % of publishes) with 4 sharded relays: every event arrives, and per
/// aggregate never out of order. Several seeds, as a property.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_relays_keep_order_under_random_failures() {
    for seed in 1..=5u64 {
        let store = MemoryStore::default();
        let n = fill(&store, 40, 25);
        let broker = Arc::new(MemoryBroker::new());
        let state = Arc::new(std::sync::Mutex::new(seed));
        let xorshift = move || {
            let mut s = state.lock().unwrap();
            *s ^= *s << 13;
            *s ^= *s >> 7;
            *s ^= *s << 17;
            *s
        };
        let next = xorshift.clone();
        broker.fail_when(move |m| {
            (next() % 10 == 0).then(|| format!("injected failure for {}", m.seq))
        });
        // Outages too: a tenth of the messages meet an unavailable broker (a partition
        // without a leader), and the whole broker goes away for a while, refusing and then
        // black-holing publishes. None of it may cost an attempt or break order.
        let next = xorshift.clone();
        broker.unavailable_when(move |m| {
            (next() % 10 == 1).then(|| format!("injected outage for {}", m.seq))
        });
        let flaky = broker.clone();
        let outages = tokio::spawn(async move {
            for _ in 0..2 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                flaky.set_available(false);
                tokio::time::sleep(Duration::from_millis(60)).await;
                flaky.set_available(true);
                flaky.set_black_hole(true);
                tokio::time::sleep(Duration::from_millis(400)).await;
                flaky.set_black_hole(false);
            }
        });
        let configs = (0..4).map(|_| fast(Mode::Sharded)).collect();
        let stats = run_relays(&store, &broker, configs, Duration::from_secs(30)).await;
        outages.await.unwrap();
        assert!(
            store.is_drained(),
            "seed {seed}: {} pending",
            store.pending()
        );
        assert_eq!(
            store.dead_letters(),
            [],
            "seed {seed}: outages never dead-letter"
        );
        let unavailable: u64 = stats
            .iter()
            .map(|s| s.unavailable.load(Ordering::Relaxed))
            .sum();
        assert!(unavailable > 0, "seed {seed}: outages were injected");
        assert_ordered_and_complete(&broker, n);
        assert_eq!(
            broker.all_records().len(),
            n,
            "seed {seed}: no crash, no duplicates"
        );
        let retried: u64 = stats
            .iter()
            .map(|s| s.retried.load(Ordering::Relaxed))
            .sum();
        assert!(retried > 0, "seed {seed}: failures were injected");
        let active = stats
            .iter()
            .filter(|s| s.shards.load(Ordering::Relaxed) > 0)
            .count();
        assert!(active >= 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_mode_has_one_active_relay_and_keeps_order() {
    let store = MemoryStore::default();
    let n = fill(&store, 20, 20);
    let broker = Arc::new(MemoryBroker::new());
    let configs = (0..3).map(|_| fast(Mode::Leader)).collect();
    let stats = run_relays(&store, &broker, configs, Duration::from_secs(20)).await;
    assert!(store.is_drained());
    assert_ordered_and_complete(&broker, n);
    let publishers = stats
        .iter()
        .filter(|s| s.published.load(Ordering::Relaxed) > 0)
        .count();
    assert_eq!(publishers, 1, "only the leader published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_when_leader_stops() {
    let store = MemoryStore::default();
    let broker = Arc::new(MemoryBroker::new());
    let mut first = fast(Mode::Leader);
    first.relay_id = "first".into();
    let relay = Relay::new(store.clone(), broker.clone(), first).unwrap();
    let first_stats = relay.stats();
    let (stop_first, rx) = tokio::sync::oneshot::channel::<()>();
    let h1 = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(first_stats.active.load(Ordering::Relaxed));

    let mut second = fast(Mode::Leader);
    second.relay_id = "second".into();
    let relay = Relay::new(store.clone(), broker.clone(), second).unwrap();
    let second_stats = relay.stats();
    let (stop_second, rx) = tokio::sync::oneshot::channel::<()>();
    let h2 = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second_stats.active.load(Ordering::Relaxed),
        "standby while the leader lives"
    );

    stop_first.send(()).unwrap();
    h1.await.unwrap();
    fill(&store, 3, 3);
    let start = std::time::Instant::now();
    while !store.is_drained() && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(store.is_drained(), "the standby took over");
    assert!(second_stats.active.load(Ordering::Relaxed));
    stop_second.send(()).unwrap();
    h2.await.unwrap();
}

/// A poison event is retried, then dead-lettered with its error; with `Block` the later
/// events of its aggregate wait, with `Skip` they flow; other aggregates flow either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_event_is_dead_lettered_and_blocks_or_skips() {
    for policy in [DeadLetterPolicy::Block, DeadLetterPolicy::Skip] {
        let store = MemoryStore::default();
        store.insert(test_message("order", "poisoned", "E0"));
        store.insert(test_message("order", "poisoned", "E1"));
        store.insert(test_message("order", "healthy", "E0"));
        store.insert(test_message("order", "poisoned", "E2"));
        store.insert(test_message("order", "healthy", "E1"));
        let broker = Arc::new(MemoryBroker::new());
        broker.fail_when(|m| {
            (m.aggregate_id == "poisoned" && m.event_type == "E0")
                .then(|| "message too large".to_owned())
        });
        let config = RelayConfig {
            max_attempts: 3,
            dead_letters: policy,
            ..fast(Mode::Sharded)
        };
        let stats = run_relays(&store, &broker, vec![config], Duration::from_millis(1500)).await;
        let dead = store.dead_letters();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].1, "message too large");
        assert_eq!(stats[0].dead_lettered.load(Ordering::Relaxed), 1);
        assert_eq!(
            stats[0].retried.load(Ordering::Relaxed),
            2,
            "retried before dead-lettering"
        );
        let keys: Vec<(String, String)> = broker
            .all_records()
            .into_iter()
            .map(|r| (r.key.clone(), r.header("event_type").unwrap().to_owned()))
            .collect();
        let healthy: Vec<_> = keys.iter().filter(|(k, _)| k == "healthy").collect();
        assert_eq!(healthy.len(), 2, "{policy:?}: other aggregates flow");
        let poisoned: Vec<&str> = keys
            .iter()
            .filter(|(k, _)| k == "poisoned")
            .map(|(_, t)| t.as_str())
            .collect();
        match policy {
            DeadLetterPolicy::Block => {
                assert!(
                    poisoned.is_empty(),
                    "blocked behind the dead letter: {poisoned:?}"
                );
                assert_eq!(store.pending(), 2);
            }
            DeadLetterPolicy::Skip => {
                assert_eq!(poisoned, ["E1", "E2"]);
                assert_eq!(store.pending(), 0);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_recovers_from_store_and_broker_outages() {
    let store = MemoryStore::default();
    let n = fill(&store, 10, 10);
    let broker = Arc::new(MemoryBroker::new());
    broker.set_available(false);
    store.fail_next_calls(20);
    let broker2 = broker.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        broker2.set_available(true);
    });
    let stats = run_relays(
        &store,
        &broker,
        vec![fast(Mode::Sharded)],
        Duration::from_secs(20),
    )
    .await;
    assert!(store.is_drained());
    assert_ordered_and_complete(&broker, n);
    assert!(stats[0].store_errors.load(Ordering::Relaxed) >= 20);
}

/// A broker outage (refused, then black-holed) with `max_attempts = 2`: nothing is
/// dead-lettered, nothing lost, order kept, the relay shows `waiting_for_broker` meanwhile,
/// and delivery resumes within the outage backoff's cap of the broker's return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_costs_no_attempt_and_resumes_quickly() {
    for black_hole in [false, true] {
        let store = MemoryStore::default();
        let n = fill(&store, 30, 10);
        let broker = Arc::new(MemoryBroker::new());
        let mut config = fast(Mode::Sharded);
        config.relay_id = "r".into();
        config.max_attempts = 2;
        config.outage_backoff.max = Duration::from_millis(200);
        config.batch_size = 16;
        // Down from the start (mid-drain outages: see the property test above), so the outage
        // is certain to be met.
        if black_hole {
            broker.set_black_hole(true);
        } else {
            broker.set_available(false);
        }
        let relay = Relay::new(store.clone(), broker.clone(), config).unwrap();
        let stats = relay.stats();
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let handle = tokio::spawn(relay.run(async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        }));
        tokio::time::sleep(Duration::from_millis(1500)).await; // many publishes fail meanwhile
        let during = broker.all_records().len();
        let (state, error) = store.relay_health("r").unwrap();
        assert_eq!(
            state,
            RelayState::WaitingForBroker,
            "black hole {black_hole}"
        );
        assert!(error.is_some_and(|e| !e.is_empty()));
        broker.set_black_hole(false);
        broker.set_available(true);
        let back = tokio::time::Instant::now();
        while broker.all_records().len() == during {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let resumed = back.elapsed();
        while !store.is_drained() && back.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
        eprintln!(
            "black hole {black_hole}: delivery resumed {resumed:?} after the broker returned"
        );
        assert!(resumed < Duration::from_millis(1000), "{resumed:?}");
        assert_eq!(store.dead_letters(), [], "black hole {black_hole}");
        assert_ordered_and_complete(&broker, n);
        assert!(stats.broker_waits.load(Ordering::Relaxed) >= 2);
        assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 0);
    }
}

/// A relay that dies without a word (its task dropped, its session ended) is replaced at the
/// next session check: its shards and its claimed rows move at once, not after its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_relay_is_reaped_by_its_session_not_its_lease() {
    let store = MemoryStore::default();
    let n = fill(&store, 20, 5);
    let broker = Arc::new(MemoryBroker::new());
    broker.set_black_hole(true); // the victim claims rows and hangs publishing them
    let mut victim = fast(Mode::Sharded);
    victim.relay_id = "victim".into();
    victim.lease = Duration::from_secs(60);
    victim.publish_timeout = Duration::from_secs(50);
    victim.session_check = Some(Duration::from_millis(20));
    let relay = Relay::new(store.clone(), broker.clone(), victim.clone()).unwrap();
    let handle = tokio::spawn(relay.run(std::future::pending()));
    // Until the victim holds every shard and has claimed a batch (its publish hangs).
    let mut probe = store.clone();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let claim = Claim {
            relay: "probe",
            limit: 1000,
            lease: Duration::from_secs(1),
            look_ahead: None,
            settling: &[],
            order: ClaimOrder::Unordered,
        };
        let free = probe.claim(&claim).await.unwrap();
        probe
            .release("probe", &free.iter().map(|m| m.seq).collect::<Vec<_>>())
            .await
            .unwrap();
        if free.len() < n {
            break;
        }
    }
    handle.abort(); // killed: nothing released
    let _ = handle.await;
    store.end_session("victim");
    broker.set_black_hole(false);

    let mut survivor = victim;
    survivor.relay_id = "survivor".into();
    let started = tokio::time::Instant::now();
    let stats = run_relays(&store, &broker, vec![survivor], Duration::from_secs(10)).await;
    let took = started.elapsed();
    eprintln!("dead relay replaced and its rows drained in {took:?}");
    assert!(store.is_drained(), "{} pending", store.pending());
    assert!(
        took < Duration::from_secs(5),
        "not the 60 s lease: {took:?}"
    );
    assert_eq!(stats[0].reaped.load(Ordering::Relaxed), 1);
    assert!(store.relay_health("victim").is_none());
    assert_ordered_and_complete(&broker, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_everything() {
    let store = MemoryStore::default();
    fill(&store, 5, 5);
    let broker = Arc::new(MemoryBroker::new());
    broker.set_available(false); // nothing gets published; rows stay leased between tries
    let mut config = fast(Mode::Sharded);
    config.relay_id = "leaving".into();
    let relay = Relay::new(store.clone(), broker.clone(), config).unwrap();
    let h = tokio::spawn(relay.run(tokio::time::sleep(Duration::from_millis(200))));
    h.await.unwrap();
    // Everything the relay held is free: another relay claims at once, rows and shards.
    let mut other = store.clone();
    let shards = other
        .rebalance_shards("other", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(shards.owned.len(), 256);
    let claim = Claim {
        relay: "other",
        limit: 100,
        lease: Duration::from_secs(5),
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Ordered {
            owned_shards_only: true,
            leader_only: false,
            dead_letters_block: true,
        },
    };
    tokio::time::sleep(Duration::from_millis(50)).await; // past the retry backoff
    let claimed = other.claim(&claim).await.unwrap();
    assert_eq!(
        claimed.len(),
        25,
        "no row is still leased by the stopped relay"
    );
}

#[test]
fn backoff_grows_and_is_bounded() {
    let b = Backoff::default();
    assert_eq!(b.delay(1, 0.5), Duration::from_secs(1));
    assert_eq!(b.delay(2, 0.5), Duration::from_secs(2));
    assert_eq!(b.delay(30, 0.5), Duration::from_secs(300));
    assert!(
        b.delay(3, 0.0) >= Duration::from_millis(3200)
            && b.delay(3, 1.0) <= Duration::from_millis(4800)
    );
}

#[test]
fn config_validation_names_the_setting() {
    for (config, needle) in [
        (
            RelayConfig {
                batch_size: 0,
                ..RelayConfig::default()
            },
            "batch_size",
        ),
        (
            RelayConfig {
                max_attempts: 0,
                ..RelayConfig::default()
            },
            "max_attempts",
        ),
        (
            RelayConfig {
                relay_id: String::new(),
                ..RelayConfig::default()
            },
            "relay_id",
        ),
        (
            RelayConfig {
                publish_timeout: Duration::from_secs(31),
                ..RelayConfig::default()
            },
            "publish_timeout",
        ),
        (
            RelayConfig {
                session_check: Some(Duration::from_millis(1)),
                ..RelayConfig::default()
            },
            "session_check",
        ),
        (
            RelayConfig {
                outage_backoff: Backoff {
                    max: Duration::ZERO,
                    ..RelayConfig::default().outage_backoff
                },
                ..RelayConfig::default()
            },
            "outage_backoff.max",
        ),
    ] {
        assert!(
            config.validate().unwrap_err().to_string().contains(needle),
            "{needle}"
        );
    }
    assert!(
        RelayConfig {
            session_check: None,
            ..RelayConfig::default()
        }
        .validate()
        .is_ok(),
        "session detection off"
    );
    assert_eq!("sharded".parse::<Mode>(), Ok(Mode::Sharded));
    assert!(
        "round-robin"
            .parse::<Mode>()
            .unwrap_err()
            .contains("round-robin")
    );
}

/// Two relays configured with one id (one config cloned for both): the second one's
/// heartbeat finds the id held by the first's live session, so it claims nothing and takes
/// no shards; the events come out in order, all by one relay. The id is free once the first
/// relay's session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_id_in_use_is_refused() {
    let store = MemoryStore::default();
    let n = fill(&store, 20, 10);
    let broker = Arc::new(MemoryBroker::new());
    let config = fast(Mode::Sharded);
    let stats = run_relays(
        &store,
        &broker,
        vec![config.clone(), config.clone()],
        Duration::from_secs(10),
    )
    .await;
    assert!(store.is_drained(), "{} pending", store.pending());
    assert_ordered_and_complete(&broker, n);
    let claimed: Vec<u64> = stats
        .iter()
        .map(|s| s.claimed.load(Ordering::Relaxed))
        .collect();
    assert_eq!(
        claimed.iter().filter(|&&c| c > 0).count(),
        1,
        "one relay did the work: {claimed:?}"
    );

    // At the store: a second session is refused until the first one's ends.
    let lease = Duration::from_secs(5);
    let health = RelayHealth {
        mode: Mode::Sharded,
        state: RelayState::Running,
        last_error: None,
        track_session: true,
    };
    let (mut first, mut second) = (store.clone(), store.clone());
    first.heartbeat("same", lease, &health).await.unwrap();
    let e = second.heartbeat("same", lease, &health).await.unwrap_err();
    assert_eq!(e.relay_id_in_use().unwrap().relay_id, "same");
    assert!(e.to_string().contains("--relay-id"), "{e}");
    assert!(second.rebalance_shards("same", lease).await.is_err());
    assert!(second.acquire_leadership("same", lease).await.is_err());
    store.end_session("same");
    second.heartbeat("same", lease, &health).await.unwrap();
    assert_eq!(
        second
            .rebalance_shards("same", lease)
            .await
            .unwrap()
            .owned
            .len(),
        256
    );
}

/// Retention keeps up with the outbox: a cleanup that deleted a whole batch runs again at the
/// relay's next turn, not a whole `every` later (one batch per `every` would bound retention
/// to `batch / every` rows a second whatever the outbox's rate).
#[tokio::test]
async fn retention_deletes_batch_after_batch_until_done() {
    let store = MemoryStore::default();
    let broker = Arc::new(MemoryBroker::new());
    let n = fill(&store, 50, 40);
    let config = RelayConfig {
        retention: Some(Retention {
            keep: Duration::from_secs(1),
            batch: 100,
            every: Duration::from_secs(1),
        }),
        ..fast(Mode::Unordered)
    };
    let relay = Relay::new(store.clone(), broker.clone(), config).unwrap();
    let stats = relay.stats();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    let started = std::time::Instant::now();
    while stats.published.load(Ordering::Relaxed) < n as u64
        && started.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let published_at = std::time::Instant::now();
    // Published 1 s ago at the earliest at the next cleanup (`every`): then 2,000 rows in
    // batches of 100. At a batch per `every` that would take 20 s.
    while !store.rows().is_empty() && published_at.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = store.rows().len();
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(stats.published.load(Ordering::Relaxed), n as u64);
    assert_eq!(
        left,
        0,
        "{left} of {n} published rows left {:?} after publication",
        published_at.elapsed()
    );
}

/// The in-memory store's ordered claim honours `Claim::settling` as the PostgreSQL store does
/// (`rows_being_marked_count_as_published_in_an_ordered_claim` in the SQL stores' tests): rows
/// of the claiming relay being marked count as published; rows leased by another relay, or
/// given back, count as what they are.
#[tokio::test]
async fn rows_being_marked_count_as_published_in_an_ordered_claim() {
    let mut store = MemoryStore::default();
    let seq: Vec<i64> = (0..9)
        .map(|g| store.insert(test_message("order", &(g % 3).to_string(), "Paid")))
        .collect();
    let claim = |relay, limit, settling| Claim {
        relay,
        limit,
        lease: Duration::from_secs(30),
        look_ahead: None,
        settling,
        order: ClaimOrder::Ordered {
            owned_shards_only: false,
            leader_only: false,
            dead_letters_block: true,
        },
    };
    let seqs = |batch: Vec<OutboxMessage>| batch.iter().map(|m| m.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(store.claim(&claim("a", 3, &[])).await.unwrap()),
        seq[0..3]
    );
    assert!(store.claim(&claim("a", 100, &[])).await.unwrap().is_empty());
    assert_eq!(
        seqs(store.claim(&claim("a", 100, &seq[0..2])).await.unwrap()),
        [seq[3], seq[4], seq[6], seq[7]]
    );
    assert!(
        store
            .claim(&claim("b", 100, &seq[2..3]))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.release("a", &seq[2..3]).await.unwrap(), 1);
    assert_eq!(
        seqs(store.claim(&claim("a", 100, &seq[2..3])).await.unwrap()),
        [seq[2], seq[5], seq[8]]
    );
    assert_eq!(store.pending(), 9);
}

/// A sharded relay settles beside its claims while it is the only live one and between them
/// while another shares the shards (see `Relay::run`): a second relay joins a running one and
/// leaves again while events keep coming and a tenth of the publishes fail. Every event
/// arrives, per aggregate in order, whichever way each batch was settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_relay_joined_and_left_by_another_keeps_order() {
    for seed in 1..=3u64 {
        let store = MemoryStore::default();
        let broker = Arc::new(MemoryBroker::new());
        let state = Arc::new(std::sync::Mutex::new(seed));
        broker.fail_when(move |m| {
            let mut s = state.lock().unwrap();
            *s ^= *s << 13;
            *s ^= *s >> 7;
            *s ^= *s << 17;
            (*s % 10 == 0).then(|| format!("injected failure for {}", m.seq))
        });
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                let mut n = 0;
                for round in 0..100 {
                    for a in 0..40 {
                        store.insert(test_message("order", &a.to_string(), &format!("E{round}")));
                        n += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                n
            })
        };
        let start = |id: &str| {
            let mut config = fast(Mode::Sharded);
            config.relay_id = id.into();
            let relay = Relay::new(store.clone(), broker.clone(), config).unwrap();
            let (stop, mut stopped) = tokio::sync::watch::channel(false);
            let run = tokio::spawn(relay.run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            }));
            (stop, run)
        };
        let (stop_a, a) = start("alone-first");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (stop_b, b) = start("joins-later");
        tokio::time::sleep(Duration::from_millis(400)).await;
        stop_b.send(true).unwrap();
        b.await.unwrap();
        let n = writer.await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !store.is_drained() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop_a.send(true).unwrap();
        a.await.unwrap();
        assert!(
            store.is_drained(),
            "seed {seed}: {} pending",
            store.pending()
        );
        assert_ordered_and_complete(&broker, n);
    }
}
