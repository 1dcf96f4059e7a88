//! The store contract, once, for every backend: the SQL stores and the memory store.
//!
//! A few points of the contract are SQL-only, and run on the SQL stores alone (see
//! [`store_suite!`](crate::store_suite)): rows of a shape the relay cannot publish written by
//! other programs (the memory store holds typed messages, none can be malformed), a database
//! whose migrations have not run, and statements blocked by another connection's locks (the
//! memory store takes no locks that outlive a call).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox::relay::*;

use crate::backends::{Backend, Contract, What};

const LEASE: Duration = Duration::from_secs(30);

fn unordered(relay: &str, limit: usize) -> Claim<'_> {
    Claim {
        relay,
        limit,
        lease: LEASE,
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Unordered,
    }
}

fn ordered(relay: &str, limit: usize, shards: bool, leader: bool, dead_block: bool) -> Claim<'_> {
    Claim {
        relay,
        limit,
        lease: LEASE,
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Ordered {
            owned_shards_only: shards,
            leader_only: leader,
            dead_letters_block: dead_block,
        },
    }
}

fn seqs(m: &[OutboxMessage]) -> Vec<i64> {
    m.iter().map(|m| m.seq).collect()
}

pub async fn claim_leases_and_fences<B: Contract>() {
    let db = B::database("claim");
    B::fill(&db, 10, 1);
    let (mut a, mut b) = (B::store(&db), B::store(&db));
    let first = a.claim(&unordered("a", 4)).await.unwrap();
    assert_eq!(first.len(), 4);
    assert!(
        first.windows(2).all(|w| w[0].seq < w[1].seq),
        "in seq order"
    );
    assert!(first.iter().all(|m| m.attempts == 1));
    let m = &first[0];
    assert_eq!(
        (
            m.aggregate_type.as_str(),
            m.event_type.as_str(),
            m.event_version
        ),
        ("order", "Paid", 1)
    );
    assert_eq!(m.topic(), "order-lifecycle");
    assert_eq!(m.shard, outbox::shard_of("order", &m.aggregate_id));
    let payload: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
    // The variant's own fields: no wrapper naming it (the event type says it).
    assert_eq!(payload["order_id"].to_string(), m.aggregate_id);

    let second = b.claim(&unordered("b", 100)).await.unwrap();
    assert_eq!(second.len(), 6, "leased rows are not claimed twice");
    assert!(b.claim(&unordered("b", 100)).await.unwrap().is_empty());

    // Fencing: b cannot settle a's rows.
    assert_eq!(
        b.complete("b", &seqs(&first), Completion::MarkPublished)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        a.complete("a", &seqs(&first), Completion::MarkPublished)
            .await
            .unwrap(),
        4
    );
    // Released rows come back, without an attempt counted.
    assert_eq!(b.release("b", &seqs(&second)).await.unwrap(), 6);
    let again = a.claim(&unordered("a", 100)).await.unwrap();
    assert_eq!(seqs(&again), seqs(&second));
    assert!(
        again.iter().all(|m| m.attempts == 1),
        "release gave the attempt back"
    );
    assert_eq!(
        a.complete("a", &seqs(&again), Completion::Delete)
            .await
            .unwrap(),
        6
    );
    assert_eq!(B::count_of(&db, What::Rows), 4, "deleted on completion");
    assert_eq!(B::count_of(&db, What::PublishedUnleased), 4);
}

pub async fn ordered_claims_block_per_aggregate<B: Contract>() {
    let db = B::database("ordered");
    B::fill(&db, 2, 3); // a0 b0 a1 b1 a2 b2 (aggregates "0" and "1")
    let mut s = B::store(&db);
    let all = s
        .claim(&ordered("r", 100, false, false, true))
        .await
        .unwrap();
    assert_eq!(
        all.len(),
        6,
        "consecutive claimable events of an aggregate come together"
    );
    let (zero, one): (Vec<_>, Vec<_>) = all.iter().partition(|m| m.aggregate_id == "0");
    // Aggregate 0's head fails; its later events were not attempted.
    let fail = [Failure {
        seq: zero[0].seq,
        error: "broker said no".into(),
        retry_after: Some(Duration::from_millis(500)),
    }];
    assert_eq!(s.fail("r", &fail).await.unwrap(), 1);
    assert_eq!(
        s.release("r", &[zero[1].seq, zero[2].seq]).await.unwrap(),
        2
    );
    assert_eq!(
        s.complete(
            "r",
            &seqs(&one.into_iter().cloned().collect::<Vec<_>>()),
            Completion::MarkPublished
        )
        .await
        .unwrap(),
        3
    );
    assert!(
        s.claim(&ordered("r", 100, false, false, true))
            .await
            .unwrap()
            .is_empty(),
        "the aggregate waits behind its head's backoff"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let retry = s
        .claim(&ordered("r", 100, false, false, true))
        .await
        .unwrap();
    assert_eq!(
        seqs(&retry),
        seqs(&zero.iter().map(|m| (*m).clone()).collect::<Vec<_>>())
    );
    assert_eq!(retry[0].attempts, 2);
    // Dead-letter the head: with Block the rest waits, with Skip it flows.
    let dead = [Failure {
        seq: retry[0].seq,
        error: "too large".into(),
        retry_after: None,
    }];
    s.fail("r", &dead).await.unwrap();
    s.release("r", &[retry[1].seq, retry[2].seq]).await.unwrap();
    assert!(
        s.claim(&ordered("r", 100, false, false, true))
            .await
            .unwrap()
            .is_empty()
    );
    let skipped = s
        .claim(&ordered("r", 100, false, false, false))
        .await
        .unwrap();
    assert_eq!(seqs(&skipped), vec![retry[1].seq, retry[2].seq]);
    assert_eq!(B::count_of(&db, What::DeadWithError("too large")), 1);
}

pub async fn leadership_is_exclusive_and_expires<B: Contract>() {
    let db = B::database("leader");
    B::fill(&db, 3, 1);
    let (mut a, mut b) = (B::store(&db), B::store(&db));
    let short = Duration::from_millis(800);
    assert!(a.acquire_leadership("a", short).await.unwrap());
    assert!(!b.acquire_leadership("b", short).await.unwrap());
    assert!(
        a.acquire_leadership("a", short).await.unwrap(),
        "the leader renews"
    );
    assert!(
        b.claim(&ordered("b", 10, false, true, true))
            .await
            .unwrap()
            .is_empty(),
        "not the leader"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        b.acquire_leadership("b", LEASE).await.unwrap(),
        "expired lease taken over"
    );
    assert!(!a.acquire_leadership("a", short).await.unwrap());
    assert!(
        a.claim(&ordered("a", 10, false, true, true))
            .await
            .unwrap()
            .is_empty(),
        "fenced"
    );
    assert_eq!(
        b.claim(&ordered("b", 10, false, true, true))
            .await
            .unwrap()
            .len(),
        3
    );
    b.release_all("b").await.unwrap();
    assert!(
        a.acquire_leadership("a", short).await.unwrap(),
        "released on shutdown"
    );
}

pub async fn shards_rebalance<B: Contract>() {
    let db = B::database("shards");
    B::fill(&db, 64, 1);
    let (mut a, mut b) = (B::store(&db), B::store(&db));
    assert_eq!(
        a.rebalance_shards("a", LEASE).await.unwrap().owned.len(),
        256
    );
    let b1 = b.rebalance_shards("b", LEASE).await.unwrap();
    assert_eq!((b1.owned.len(), b1.live_relays), (0, 2), "nothing free yet");
    assert_eq!(
        a.rebalance_shards("a", LEASE).await.unwrap().owned.len(),
        128,
        "a gives up its surplus"
    );
    let b2 = b.rebalance_shards("b", LEASE).await.unwrap();
    assert_eq!(b2.owned.len(), 128);
    let a_claim = a
        .claim(&ordered("a", 1000, true, false, true))
        .await
        .unwrap();
    let b_claim = b
        .claim(&ordered("b", 1000, true, false, true))
        .await
        .unwrap();
    assert_eq!(a_claim.len() + b_claim.len(), 64);
    let b_shards: HashSet<i16> = b2.owned.iter().copied().collect();
    assert!(
        b_claim.iter().all(|m| b_shards.contains(&m.shard)),
        "only owned shards"
    );
    assert!(a_claim.iter().all(|m| !b_shards.contains(&m.shard)));
    a.release_all("a").await.unwrap();
    assert_eq!(B::count_of(&db, What::LeasedTo("a")), 0);
    assert_eq!(
        b.rebalance_shards("b", LEASE).await.unwrap().owned.len(),
        256,
        "a's shards freed"
    );
}

pub async fn cleanup_in_bounded_batches<B: Contract>() {
    let db = B::database("cleanup");
    B::fill(&db, 30, 1);
    let mut s = B::store(&db);
    let all = s.claim(&unordered("r", 100)).await.unwrap();
    s.complete("r", &seqs(&all), Completion::MarkPublished)
        .await
        .unwrap();
    assert_eq!(
        s.cleanup(Duration::from_secs(3600), 10).await.unwrap(),
        0,
        "too recent"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut rounds = Vec::new();
    loop {
        let n = s.cleanup(Duration::from_millis(10), 12).await.unwrap();
        rounds.push(n);
        if n == 0 {
            break;
        }
    }
    assert_eq!(rounds, [12, 12, 6, 0]);
    assert_eq!(B::count_of(&db, What::Rows), 0);
}

fn fast(mode: Mode) -> RelayConfig {
    RelayConfig {
        mode,
        batch_size: 200,
        poll_interval: Duration::from_millis(20),
        lease: Duration::from_secs(5),
        publish_timeout: Duration::from_secs(2),
        max_attempts: 50,
        backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: 0.5,
        },
        ..RelayConfig::default()
    }
}

/// Relays drain a real outbox through the in-memory broker: unordered exactly once without
/// crashes; sharded and leader in per-aggregate order despite injected failures.
pub async fn relays_drain<B: Contract>(mode: Mode, relays: usize, fail_one_in: u64) {
    let db = B::database("drain");
    let (aggregates, per) = (40, 25);
    B::fill(&db, aggregates, per);
    let total = aggregates * per;
    let broker = Arc::new(MemoryBroker::new());
    if fail_one_in > 0 {
        let state = std::sync::Mutex::new(0x2545_F491_4F6C_DD1Du64);
        broker.fail_when(move |_| {
            let mut s = state.lock().unwrap();
            *s ^= *s << 13;
            *s ^= *s >> 7;
            *s ^= *s << 17;
            s.is_multiple_of(fail_one_in).then(|| "injected".to_owned())
        });
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    let mut stats = Vec::new();
    for _ in 0..relays {
        let relay = Relay::new(B::store(&db), broker.clone(), fast(mode)).unwrap();
        stats.push(relay.stats());
        let mut rx = stop_rx.clone();
        handles.push(tokio::spawn(relay.run(async move {
            let _ = rx.wait_for(|s| *s).await;
        })));
    }
    let start = std::time::Instant::now();
    let pending = What::Unpublished;
    while B::count_of(&db, pending) > 0 && start.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = start.elapsed();
    stop_tx.send(true).unwrap();
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(B::count_of(&db, pending), 0, "{mode:?}: drained");
    let records = broker.all_records();
    let ids: HashSet<_> = records.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), total, "{mode:?}: every event delivered");
    assert_eq!(records.len(), total, "{mode:?}: no crash, no duplicates");
    if mode != Mode::Unordered {
        let mut last: HashMap<&str, uuid::Uuid> = HashMap::new();
        for r in &records {
            if let Some(prev) = last.insert(r.key.as_str(), r.id) {
                assert!(prev < r.id, "{mode:?}: key {} out of order", r.key);
            }
        }
    }
    if mode == Mode::Leader {
        let active = stats
            .iter()
            .filter(|s| s.published.load(Ordering::Relaxed) > 0)
            .count();
        assert_eq!(active, 1, "one leader published");
    }
    eprintln!(
        "{mode:?} x{relays}: {total} events in {elapsed:?} ({:.0}/s)",
        total as f64 / elapsed.as_secs_f64()
    );
}

fn health(mode: Mode, state: RelayState, track_session: bool) -> RelayHealth {
    RelayHealth {
        mode,
        state,
        last_error: (state == RelayState::WaitingForBroker).then(|| "all brokers down".into()),
        track_session,
    }
}

/// Heartbeats record health; a relay whose session ended is reaped (its shards, leadership
/// and row leases freed at once) on backends that see sessions, and never one that tracks no
/// session or is still connected.
pub async fn heartbeat_and_reap<B: Contract>() {
    let db = B::database("reap");
    B::fill(&db, 8, 1);
    let (mut a, mut b, mut c) = (B::store(&db), B::store(&db), B::store(&db));
    let started = std::time::Instant::now();
    a.heartbeat(
        "a",
        LEASE,
        &health(Mode::Sharded, RelayState::Running, true),
    )
    .await
    .unwrap();
    assert_eq!(
        a.rebalance_shards("a", LEASE).await.unwrap().owned.len(),
        256
    );
    assert_eq!(
        a.claim(&ordered("a", 100, true, false, true))
            .await
            .unwrap()
            .len(),
        8
    );
    a.heartbeat(
        "a",
        LEASE,
        &health(Mode::Sharded, RelayState::WaitingForBroker, true),
    )
    .await
    .unwrap();
    assert_eq!(
        B::count_of(
            &db,
            What::Health {
                relay: "a",
                mode: "sharded",
                state: "waiting_for_broker",
                last_error: "all brokers down",
            }
        ),
        1
    );
    // Relays of other modes heartbeat too, without shrinking the sharded relays' share.
    b.heartbeat("b", LEASE, &health(Mode::Leader, RelayState::Standby, true))
        .await
        .unwrap();
    c.heartbeat(
        "c",
        LEASE,
        &health(Mode::Leader, RelayState::Standby, false),
    )
    .await
    .unwrap();
    assert_eq!(
        a.rebalance_shards("a", LEASE).await.unwrap().owned.len(),
        256
    );
    assert!(c.acquire_leadership("c", LEASE).await.unwrap());
    assert_eq!(B::count_of(&db, What::Relays), 3);

    // Nobody is dead yet (after the grace a fresh connection waits).
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(started.elapsed())).await;
    assert_eq!(b.reap_dead_relays("b").await.unwrap(), Vec::<String>::new());

    B::end_session(a, "a"); // its connection closes, as when its process is killed
    B::end_session(c, "c"); // so does c's, but c tracks no session: the lease is its rule
    let mut reaped = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while B::SESSIONS && reaped.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        reaped = b.reap_dead_relays("b").await.unwrap();
    }
    if !B::SESSIONS {
        assert!(b.reap_dead_relays("b").await.unwrap().is_empty());
        return;
    }
    assert_eq!(reaped, ["a"], "a's session ended; c records none");
    assert_eq!(
        b.reap_dead_relays("b").await.unwrap(),
        Vec::<String>::new(),
        "reaped once"
    );
    assert_eq!(B::count_of(&db, What::Relays), 2);
    assert!(
        !b.acquire_leadership("b", LEASE).await.unwrap(),
        "c's lease holds"
    );
    assert_eq!(
        b.rebalance_shards("b", LEASE).await.unwrap().owned.len(),
        256,
        "a's shards are free at once"
    );
    let got = b
        .claim(&ordered("b", 100, true, false, true))
        .await
        .unwrap();
    assert_eq!(
        got.len(),
        8,
        "a's claimed rows are free at once, not after its lease"
    );
}

/// Two stores with one relay id on different connections (two processes configured with
/// one `--relay-id`): the first keeps the id; the second's heartbeat reports the conflict,
/// naming the id, the other session and the fix, and its claims, rebalances and leadership
/// are refused and its `release_all` leaves the first's leases alone, until the first's
/// session ends; then the second takes the id within about a heartbeat.
pub async fn relay_id_in_use_is_refused<B: Contract>() {
    if !B::SESSIONS {
        return; // SQLite: one relay by design, no sessions to compare
    }
    let db = B::database("relayid");
    B::fill(&db, 4, 1);
    let (mut first, mut second) = (B::store(&db), B::store(&db));
    let beat = health(Mode::Sharded, RelayState::Running, true);
    first.heartbeat("same", LEASE, &beat).await.unwrap();
    assert_eq!(
        first
            .rebalance_shards("same", LEASE)
            .await
            .unwrap()
            .owned
            .len(),
        256
    );

    let e = second.heartbeat("same", LEASE, &beat).await.unwrap_err();
    let conflict = e
        .relay_id_in_use()
        .expect("the heartbeat reports the id in use");
    assert_eq!(conflict.relay_id, "same");
    let message = e.to_string();
    for part in ["`same`", "--relay-id", "OUTBOX_RELAY_ID", "leave it unset"] {
        assert!(message.contains(part), "{part} in: {message}");
    }
    assert!(
        conflict.holder.contains(B::HOLDER),
        "names the other session: {message}"
    );
    let refused = [
        second
            .claim(&ordered("same", 100, true, false, true))
            .await
            .map(|_| ())
            .unwrap_err(),
        second
            .rebalance_shards("same", LEASE)
            .await
            .map(|_| ())
            .unwrap_err(),
        second
            .acquire_leadership("same", LEASE)
            .await
            .map(|_| ())
            .unwrap_err(),
    ];
    for e in refused {
        assert_eq!(e.relay_id_in_use(), Some(conflict), "{e}");
        assert!(e.to_string().contains("--relay-id"), "{e}");
    }

    // The first keeps working, and the duplicate's shutdown does not touch its leases.
    first.heartbeat("same", LEASE, &beat).await.unwrap();
    assert_eq!(
        first
            .claim(&ordered("same", 100, true, false, true))
            .await
            .unwrap()
            .len(),
        4
    );
    second.release_all("same").await.unwrap();
    assert_eq!(B::count_of(&db, What::LeasedTo("same")), 4);
    assert_eq!(B::count_of(&db, What::ShardsOf("same")), 256);
    assert_eq!(B::count_of(&db, What::Relay("same")), 1);

    // The first's connection closes (its process ended): the id is free within a heartbeat.
    B::end_session(first, "same");
    let gone = std::time::Instant::now();
    loop {
        match second.heartbeat("same", LEASE, &beat).await {
            Ok(()) => break,
            Err(e) => {
                assert!(e.relay_id_in_use().is_some(), "{e}");
                assert!(
                    gone.elapsed() < Duration::from_secs(3),
                    "the id is still refused {:?} after its holder ended: {e}",
                    gone.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eprintln!("relay id free {:?} after its holder ended", gone.elapsed());
    assert_eq!(
        second
            .rebalance_shards("same", LEASE)
            .await
            .unwrap()
            .owned
            .len(),
        256
    );
    second
        .claim(&ordered("same", 100, true, false, true))
        .await
        .unwrap();
    assert!(second.acquire_leadership("same", LEASE).await.unwrap());
}

/// Rows of a shape the relay cannot publish (written by other programs, before the
/// constraints that refuse them) are dead-lettered at once with a `last_error` naming the
/// column and value, never published with a field dropped; the later events of their
/// aggregates claimed with them are given back, not published past them.
pub async fn malformed_rows_are_dead_lettered<B: Backend>() {
    let db = B::database("malformed");
    // Later migrations refuse such rows at insert; this test is about the ones that got in.
    B::revert_after(&db, "20261130000001");
    B::fill(&db, 5, 2); // seq 1..5: E0 of aggregates 0..4; seq 6..10: their E1
    let first = B::count(&db, "SELECT MIN(seq) AS n FROM outbox_events");
    for (offset, set) in [
        (0, "headers = '[1]'"),
        (1, "headers = '\"x\"'"),
        (2, "headers = 'null'"),
        (3, "event_type = ''"),
    ] {
        B::exec(
            &db,
            &format!(
                "UPDATE outbox_events SET {set} WHERE seq = {}",
                first + offset
            ),
        );
    }
    let mut store = B::store(&db);
    assert_eq!(
        store
            .rebalance_shards("r", LEASE)
            .await
            .unwrap()
            .owned
            .len(),
        256
    );
    let got = store
        .claim(&ordered("r", 100, true, false, true))
        .await
        .unwrap();
    assert_eq!(
        got.iter().map(|m| m.seq).collect::<Vec<_>>(),
        [first + 4, first + 9],
        "only aggregate 4 is whole"
    );
    for (offset, text) in [
        (0, "column `headers` is not a JSON object (value \"[1]\")"),
        (1, "column `headers` is not a JSON object"),
        (2, "column `headers` is not a JSON object (value \"null\")"),
        (3, "column `event_type` is empty"),
    ] {
        let seq = first + offset;
        let n = B::count(
            &db,
            &format!(
                "SELECT COUNT(*) AS n FROM outbox_events WHERE seq = {seq} \
                 AND dead_at IS NOT NULL AND published_at IS NULL AND locked_by IS NULL"
            ),
        );
        assert_eq!(n, 1, "row {seq} dead-lettered");
        let error = B::count(
            &db,
            &format!(
                "SELECT COUNT(*) AS n FROM outbox_events WHERE seq = {seq} \
                 AND last_error LIKE '%{}%'",
                text.replace('\'', "''")
            ),
        );
        assert_eq!(error, 1, "row {seq}: last_error names {text}");
    }
    assert_eq!(
        B::count(
            &db,
            &format!(
                "SELECT COUNT(*) AS n FROM outbox_events WHERE seq BETWEEN {} AND {} \
                 AND locked_by IS NULL AND attempts = 0 AND dead_at IS NULL",
                first + 5,
                first + 8
            )
        ),
        4,
        "the later events of the malformed rows' aggregates were given back"
    );
    assert!(
        store
            .claim(&ordered("r", 100, true, false, true))
            .await
            .unwrap()
            .is_empty(),
        "they wait behind their dead letters"
    );
}

/// A row whose `created_at` no `DateTime<Utc>` represents (written by another program:
/// PostgreSQL's `infinity`, MySQL's zero date, SQLite text in no date format) is dead-lettered
/// alone with a `last_error` naming the column and the value, and every other row is
/// claimed: the bad row's later events are given back (an ordered claim then holds them
/// behind the dead letter, an unordered one claims them next). Before, the claim statement failed as a whole and the relay took it for a
/// database outage, publishing nothing.
pub async fn unrepresentable_created_at_is_dead_lettered_alone<B: Backend>(ordered_claim: bool) {
    let db = B::database("bad_time");
    B::fill(&db, 5, 2); // seq 1..5: E0 of aggregates 0..4; seq 6..10: their E1
    let first = B::count(&db, "SELECT MIN(seq) AS n FROM outbox_events");
    B::exec(
        &db,
        &format!(
            "UPDATE outbox_events SET created_at = {} WHERE seq = {}",
            B::UNREPRESENTABLE_TIME,
            first + 2
        ),
    );
    let mut store = B::store(&db);
    let claim = match ordered_claim {
        true => {
            store.rebalance_shards("r", LEASE).await.unwrap();
            ordered("r", 100, true, false, true)
        }
        false => unordered("r", 100),
    };
    let got = store.claim(&claim).await.unwrap();
    let want: Vec<i64> = (0..10)
        .map(|i| first + i)
        .filter(|s| *s != first + 2 && *s != first + 7)
        .collect();
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), want);
    let next = store.claim(&claim).await.unwrap();
    let next: Vec<i64> = next.iter().map(|m| m.seq).collect();
    match ordered_claim {
        true => assert!(next.is_empty(), "{next:?} waits behind the dead letter"),
        false => assert_eq!(next, [first + 7]),
    }
    let value = B::UNREPRESENTABLE_TIME.trim_matches('\'');
    let text =
        format!("column `created_at` is not a time the relay can represent (value \"{value}");
    let dead = B::count(
        &db,
        &format!(
            "SELECT COUNT(*) AS n FROM outbox_events WHERE seq = {} AND dead_at IS NOT NULL \
             AND published_at IS NULL AND locked_by IS NULL AND last_error LIKE '%{}%'",
            first + 2,
            text.replace('\'', "''")
        ),
    );
    let error = B::count(
        &db,
        "SELECT COUNT(*) AS n FROM outbox_events WHERE last_error IS NOT NULL",
    );
    assert_eq!(
        (dead, error),
        (1, 1),
        "row {} dead-lettered: {text}",
        first + 2
    );
}

/// A store on a database without the outbox's tables says which table is missing and how to
/// create it, in one line.
pub async fn missing_tables_are_named<B: Backend>() {
    let db = B::database("no_tables");
    B::revert_after(&db, "0");
    let mut s = B::store(&db);
    let e = s.claim(&unordered("r", 10)).await.unwrap_err().to_string();
    assert!(
        e.contains("the table `outbox_events` does not exist") && e.contains("outbox migrate"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    let health = health(Mode::Sharded, RelayState::Running, false);
    let e = s
        .heartbeat("r", LEASE, &health)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the table `outbox_relays` does not exist"),
        "{e}"
    );
}

/// A relay built as a library with a short lease keeps its store's statements within a
/// third of the lease, the renewal interval, without anyone configuring the store: a claim
/// that waits for a lock held longer than that fails (and the relay retries it) instead of
/// waiting the store's default (10 s; SQLite 5 s) and acting on a lease that ran out
/// meanwhile. What bounds the wait is the backend's own: PostgreSQL's `statement_timeout`,
/// MariaDB's `max_statement_time` and `innodb_lock_wait_timeout`, SQLite's `busy_timeout`.
pub async fn short_lease_bounds_blocked_claims<B: Backend>() {
    let db = B::database("timeout");
    B::fill(&db, 3, 1);
    let lease = Duration::from_millis(1500);
    let hold = Duration::from_secs(4);
    let leader = ClaimOrder::Ordered {
        owned_shards_only: false,
        leader_only: true,
        dead_letters_block: true,
    };

    // The store, as a relay drives it: the lease its calls carry bounds the wait.
    let mut store = B::store(&db);
    assert!(store.acquire_leadership("s", lease).await.unwrap());
    let blocker = B::hold_lock(&db, hold);
    let started = std::time::Instant::now();
    let claim = Claim {
        relay: "s",
        limit: 10,
        lease,
        look_ahead: None,
        settling: &[],
        order: leader,
    };
    let err = store
        .claim(&claim)
        .await
        .expect_err("blocked past a third of the lease");
    let waited = started.elapsed();
    eprintln!("blocked claim failed after {waited:?}: {err}");
    assert!(
        waited < lease,
        "waited {waited:?}, longer than the lease: {err}"
    );
    blocker.join().unwrap();
    store.release_all("s").await.unwrap();

    // A relay: its blocked claims fail within the lease, and it drains once the lock goes.
    let broker = Arc::new(MemoryBroker::new());
    let config = RelayConfig {
        mode: Mode::Leader,
        lease,
        publish_timeout: Duration::from_millis(500),
        poll_interval: Duration::from_millis(20),
        ..RelayConfig::default()
    };
    let blocker = B::hold_lock(&db, hold);
    let started = std::time::Instant::now();
    let relay = Relay::new(B::store(&db), broker.clone(), config).unwrap();
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    while stats.store_errors.load(Ordering::Relaxed) == 0 && started.elapsed() < hold {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let failed_after = started.elapsed();
    assert!(
        failed_after < lease,
        "the relay's first blocked claim failed after {failed_after:?} (lease {lease:?})"
    );
    assert!(
        broker.all_records().is_empty(),
        "nothing published while blocked"
    );
    blocker.join().unwrap();
    while broker.all_records().len() < 3 && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(
        broker.all_records().len(),
        3,
        "drained once the lock was released"
    );
}

/// Instantiates the contract for one backend (the memory store; the SQL stores get it with
/// [`store_suite!`]).
#[macro_export]
macro_rules! contract_suite {
    ($backend:ty) => {
        use outbox::relay::Mode;
        use $crate::store_suite as s;
        #[tokio::test]
        async fn claim_leases_and_fences() {
            s::claim_leases_and_fences::<$backend>().await;
        }
        #[tokio::test]
        async fn ordered_claims_block_per_aggregate() {
            s::ordered_claims_block_per_aggregate::<$backend>().await;
        }
        #[tokio::test]
        async fn leadership_is_exclusive_and_expires() {
            s::leadership_is_exclusive_and_expires::<$backend>().await;
        }
        #[tokio::test]
        async fn shards_rebalance() {
            s::shards_rebalance::<$backend>().await;
        }
        #[tokio::test]
        async fn heartbeat_and_reap() {
            s::heartbeat_and_reap::<$backend>().await;
        }
        #[tokio::test]
        async fn relay_id_in_use_is_refused() {
            s::relay_id_in_use_is_refused::<$backend>().await;
        }
        #[tokio::test]
        async fn cleanup_in_bounded_batches() {
            s::cleanup_in_bounded_batches::<$backend>().await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn unordered_relays_drain_exactly_once() {
            s::relays_drain::<$backend>(Mode::Unordered, 4, 0).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sharded_relays_drain_in_order_despite_failures() {
            s::relays_drain::<$backend>(Mode::Sharded, 3, 20).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn leader_relays_drain_in_order_despite_failures() {
            s::relays_drain::<$backend>(Mode::Leader, 3, 20).await;
        }
    };
}

/// Instantiates the suite for one SQL backend: the contract, and its SQL-only points.
#[macro_export]
macro_rules! store_suite {
    ($backend:ty) => {
        $crate::contract_suite!($backend);
        #[tokio::test]
        async fn malformed_rows_are_dead_lettered() {
            s::malformed_rows_are_dead_lettered::<$backend>().await;
        }
        #[tokio::test]
        async fn unrepresentable_created_at_is_dead_lettered_alone_ordered() {
            s::unrepresentable_created_at_is_dead_lettered_alone::<$backend>(true).await;
        }
        #[tokio::test]
        async fn unrepresentable_created_at_is_dead_lettered_alone_unordered() {
            s::unrepresentable_created_at_is_dead_lettered_alone::<$backend>(false).await;
        }
        #[tokio::test]
        async fn missing_tables_are_named() {
            s::missing_tables_are_named::<$backend>().await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn short_lease_bounds_blocked_claims() {
            s::short_lease_bounds_blocked_claims::<$backend>().await;
        }
    };
}
