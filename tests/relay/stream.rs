//! Stream mode on real PostgreSQL: late commits are never skipped (where an id cursor skips
//! them), rolled-back events are never published, and relays that die and come back lose
//! nothing and keep each aggregate's order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::{Connection, PgConnection, RunQueryDsl};
use outbox::relay::*;

use crate::backends::{Backend, Contract, Postgres};
use crate::support::*;

fn stream_config() -> RelayConfig {
    RelayConfig {
        relay_id: default_relay_id(),
        mode: Mode::Stream,
        batch_size: 100,
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(3),
        publish_timeout: Duration::from_secs(1),
        session_check: Some(Duration::from_millis(200)),
        ..RelayConfig::default()
    }
}

/// Inserts one event of aggregate `agg`: its payload names the aggregate and its number `n`
/// (1, 2, … per aggregate, in commit order).
fn insert(conn: &mut PgConnection, agg: &str, n: i64) {
    diesel::sql_query(format!(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload) \
         VALUES ('order', '{agg}', 'E', 1, jsonb_build_object('agg', '{agg}', 'n', {n}))"
    ))
    .execute(conn)
    .unwrap();
}

fn exec(conn: &mut PgConnection, sql: &str) {
    diesel::sql_query(sql).execute(conn).unwrap();
}

/// (aggregate, n) of each record published, in publish order.
fn delivered(broker: &MemoryBroker) -> Vec<(String, i64)> {
    broker
        .records("order")
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(&r.payload).unwrap();
            (
                v["agg"].as_str().unwrap().to_owned(),
                v["n"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The events delivered out of their aggregate's order: an event whose first delivery comes
/// after the first delivery of a later event of its aggregate (redeliveries, at least once,
/// are not out of order).
fn out_of_order(records: &[(String, i64)]) -> Vec<(String, i64)> {
    let mut max: HashMap<&str, i64> = HashMap::new();
    let mut seen: HashSet<(&str, i64)> = HashSet::new();
    let mut bad = Vec::new();
    for (agg, n) in records {
        if !seen.insert((agg, *n)) {
            continue;
        }
        let m = max.entry(agg).or_insert(0);
        if *n < *m {
            bad.push((agg.clone(), *n));
        }
        *m = (*m).max(*n);
    }
    bad
}

type Stop = tokio::sync::oneshot::Sender<()>;

type Started = (Stop, tokio::task::JoinHandle<()>, Arc<RelayStats>);

fn start(db: &TestDatabase, broker: &Arc<MemoryBroker>) -> Started {
    let store = PgRelayStore::new(&db.url);
    let relay = Relay::new(store, broker.clone(), stream_config()).unwrap();
    let stats = relay.stats();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    (stop, handle, stats)
}

/// The trap of an `id > last_id` cursor. Writer A inserts an event and keeps its transaction
/// open 2 s while writer B commits 1,000 events; a rolled-back transaction writes 5. A naive
/// cursor relay (here, a loop of `seq > last`) reads B's events and moves past A's seq: A's
/// event is lost to it. The stream relay publishes B's 1,000 while A is open, A's event only
/// after A commits, all in per-aggregate order, never the rolled-back ones, and updates no
/// event row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_never_skips_a_late_commit() {
    let db = Postgres::database("stream_trap");
    let broker = Arc::new(MemoryBroker::new());
    let (stop, relay, stats) = start(&db, &broker);
    // The relay holds its shards before the writers start (so the 2 s window measures the
    // stream, not the relay's start).
    let started = Instant::now();
    while stats.shards.load(Ordering::Relaxed) < 256 && started.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let (inserted_tx, inserted_rx) = std::sync::mpsc::channel();
    let committed = Arc::new(AtomicBool::new(false));
    let writer_a = {
        let url = db.url.clone();
        let committed = committed.clone();
        std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            exec(&mut conn, "BEGIN");
            insert(&mut conn, "a", 1);
            #[derive(diesel::QueryableByName)]
            struct Pid {
                #[diesel(sql_type = diesel::sql_types::Integer)]
                pid: i32,
            }
            let pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
                .get_result::<Pid>(&mut conn)
                .unwrap()
                .pid;
            inserted_tx.send(pid).unwrap();
            std::thread::sleep(Duration::from_secs(2));
            exec(&mut conn, "COMMIT");
            committed.store(true, Ordering::SeqCst);
        })
    };
    let a_pid = inserted_rx.recv().unwrap();
    let opened = Instant::now();
    let mut b = PgConnection::establish(&db.url).unwrap();
    for t in 0..10 {
        exec(&mut b, "BEGIN");
        for i in 0..100 {
            // 50 aggregates, 20 events each, numbered in commit order.
            let k = t * 100 + i;
            insert(&mut b, &format!("b{}", k % 50), k / 50 + 1);
        }
        exec(&mut b, "COMMIT");
    }
    exec(&mut b, "BEGIN");
    for n in 1..=5 {
        insert(&mut b, "rolled-back", n);
    }
    exec(&mut b, "ROLLBACK");

    // The naive cursor relay, while A is still open: it reads every committed row past its
    // cursor, in seq order.
    #[derive(diesel::QueryableByName)]
    struct Seq {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        seq: i64,
    }
    let mut naive_last = 0i64;
    let mut naive: Vec<i64> = Vec::new();
    let mut poll_naive = |conn: &mut PgConnection| loop {
        let rows = diesel::sql_query(format!(
            "SELECT seq FROM outbox_events WHERE seq > {naive_last} ORDER BY seq LIMIT 100"
        ))
        .load::<Seq>(conn)
        .unwrap();
        let Some(last) = rows.last() else { break };
        naive_last = last.seq;
        naive.extend(rows.iter().map(|r| r.seq));
    };
    poll_naive(&mut b);

    // The stream relay publishes B's events while A is open, and not A's.
    while delivered(&broker).len() < 1000 && opened.elapsed() < Duration::from_millis(1900) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before_commit = delivered(&broker);
    assert!(
        !committed.load(Ordering::SeqCst),
        "A committed before the check"
    );
    assert_eq!(
        before_commit.len(),
        1000,
        "B's 1,000 events published while A is open"
    );
    assert!(!before_commit.iter().any(|(agg, _)| agg == "a"));
    // `outbox status` while A is open: B's events count as published although their rows
    // were never marked, A's uncommitted one is not seen, and the open transaction the
    // positions wait for is A (or one older than A: another database's, on this shared
    // server), open at least as long as A has been.
    let a_open_at_least = opened.elapsed().as_secs_f64();
    let mut admin = outbox::relay::admin::Admin::new(Postgres::admin(&db).await);
    let status = admin.status().await.unwrap();
    assert!(
        !committed.load(Ordering::SeqCst),
        "A committed before the status"
    );
    assert_eq!(status.pending, 0, "{status:?}");
    assert_eq!(status.published, 1000, "{status:?}");
    let open = status
        .stream
        .as_ref()
        .and_then(|s| s.oldest_open_transaction.as_ref())
        .unwrap_or_else(|| panic!("the open transaction is reported: {status:?}"));
    assert!(
        open.pid == a_pid || open.age_seconds >= a_open_at_least,
        "A (pid {a_pid}, open {a_open_at_least:.2} s) or an older one: {open:?}"
    );
    assert!(open.age_seconds >= a_open_at_least, "{open:?}");

    writer_a.join().unwrap();
    poll_naive(&mut b);
    let a_seq = Postgres::count(
        &db,
        "SELECT seq AS n FROM outbox_events WHERE aggregate_id = 'a'",
    );
    assert_eq!(naive.len(), 1000, "the naive cursor read B's 1,000 events");
    assert!(
        !naive.contains(&a_seq),
        "the naive cursor skipped A's late commit (seq {a_seq} < its cursor {naive_last})"
    );
    assert!(a_seq < naive_last);

    let waited = Instant::now();
    while delivered(&broker).len() < 1001 && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = delivered(&broker);
    stop.send(()).unwrap();
    relay.await.unwrap();
    let all_after_stop = delivered(&broker);
    let status = admin.status().await.unwrap();
    assert_eq!(
        (status.pending, status.published, status.oldest_pending),
        (0, 1001, None),
        "{status:?}"
    );
    assert_eq!(all.len(), 1001, "every committed event, once");
    assert_eq!(all_after_stop.len(), 1001, "nothing more after the stop");
    assert_eq!(all.last().unwrap(), &("a".to_owned(), 1));
    assert!(out_of_order(&all).is_empty());
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), 1001);
    assert!(!all.iter().any(|(agg, _)| agg == "rolled-back"));
    // Publishing wrote nothing to the event rows.
    assert_eq!(
        Postgres::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events \
             WHERE published_at IS NOT NULL OR locked_by IS NOT NULL OR attempts > 0"
        ),
        0
    );
    eprintln!(
        "naive cursor: {} of 1,001 (lost A's seq {a_seq}); stream: {}",
        naive.len(),
        all.len()
    );
}

/// A small deterministic generator (the seed is printed, so a failure can be replayed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Writers with random transaction lengths (0–150 ms) and rollbacks (1 in 5), while 2–4
/// stream relays are killed (their task dropped: the connection closes mid-batch) and
/// started again at random for 8 s: afterwards every committed event is published (0 lost),
/// nothing else is (0 phantom, no rolled-back event), and each aggregate's events come in
/// order (redeliveries allowed: at least once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_relays_killed_at_random_lose_nothing_and_keep_order() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {seed}");
    let db = Postgres::database("stream_random");
    let broker = Arc::new(MemoryBroker::new());
    let writing = Duration::from_secs(8);
    // (aggregate, n) of committed events; the writers' rolled-back ones are numbered < 0.
    let committed: Arc<Mutex<HashSet<(String, i64)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let url = db.url.clone();
        let committed = committed.clone();
        writers.push(std::thread::spawn(move || {
            let mut rng = Rng(seed ^ (w + 1).wrapping_mul(0x1234_5678_9ABC));
            let mut conn = PgConnection::establish(&url).unwrap();
            let mut next: BTreeMap<String, i64> = BTreeMap::new();
            let mut rolled_back = 0i64;
            let started = Instant::now();
            while started.elapsed() < writing {
                let rollback = rng.below(5) == 0;
                let hold = Duration::from_millis(rng.below(150));
                let mut txn = Vec::new();
                exec(&mut conn, "BEGIN");
                for _ in 0..1 + rng.below(5) {
                    let agg = format!("w{w}-{}", rng.below(10));
                    let n = if rollback {
                        rolled_back -= 1;
                        rolled_back
                    } else {
                        next.get(&agg).copied().unwrap_or(0)
                            + 1
                            + txn.iter().filter(|(a, _)| *a == agg).count() as i64
                    };
                    insert(&mut conn, &agg, n);
                    txn.push((agg, n));
                }
                std::thread::sleep(hold);
                if rollback {
                    exec(&mut conn, "ROLLBACK");
                } else {
                    exec(&mut conn, "COMMIT");
                    let mut c = committed.lock().unwrap();
                    for (agg, n) in txn {
                        next.insert(agg.clone(), n);
                        c.insert((agg, n));
                    }
                }
            }
        }));
    }

    let mut rng = Rng(seed);
    let mut relays: Vec<Started> = (0..2).map(|_| start(&db, &broker)).collect();
    let (mut kills, mut starts) = (0, 2);
    let began = Instant::now();
    while began.elapsed() < writing {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(500))).await;
        // Kill one (2–4 stay, 1–3 for a moment), then start some, to 2–4.
        let victim = rng.below(relays.len() as u64) as usize;
        let (_stop, handle, _) = relays.swap_remove(victim);
        handle.abort();
        let _ = handle.await;
        kills += 1;
        let want = 2 + rng.below(3) as usize;
        while relays.len() < want {
            relays.push(start(&db, &broker));
            starts += 1;
        }
    }
    for w in writers {
        w.join().unwrap();
    }
    let committed = committed.lock().unwrap().clone();
    let waited = Instant::now();
    loop {
        let got: HashSet<(String, i64)> = delivered(&broker).into_iter().collect();
        if committed.is_subset(&got) || waited.elapsed() > Duration::from_secs(15) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (stop, handle, _) in relays {
        let _ = stop.send(());
        handle.await.unwrap();
    }
    let records = delivered(&broker);
    let got: HashSet<(String, i64)> = records.iter().cloned().collect();
    let lost: Vec<_> = committed.difference(&got).collect();
    let phantom: Vec<_> = got.difference(&committed).collect();
    let disorder = out_of_order(&records);
    eprintln!(
        "seed {seed}: {} committed, {} records ({} redelivered), {kills} kills, {starts} starts, \
         lost {}, phantom {}, out of order {}",
        committed.len(),
        records.len(),
        records.len() - got.len(),
        lost.len(),
        phantom.len(),
        disorder.len()
    );
    assert!(committed.len() > 200, "the writers wrote too little");
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(phantom.is_empty(), "phantom: {phantom:?}");
    assert!(disorder.is_empty(), "out of order: {disorder:?}");
}

/// The MySQL/MariaDB and SQLite stores refuse stream mode with a typed error naming it.
#[tokio::test]
async fn stream_mode_is_refused_where_it_is_not_built() {
    let claim = Claim {
        relay: "r",
        limit: 10,
        lease: Duration::from_secs(5),
        look_ahead: None,
        order: ClaimOrder::Stream,
    };
    #[cfg(feature = "sqlite")]
    {
        let db = TestDatabase::sqlite("stream_refused");
        let err = SqliteRelayStore::new(&db.url)
            .claim(&claim)
            .await
            .unwrap_err();
        let refused = err.unsupported_mode().expect("an UnsupportedMode");
        assert_eq!((refused.mode, refused.backend), ("stream", "SQLite"));
        assert!(err.to_string().contains("`stream` mode"), "{err}");
    }
    #[cfg(feature = "mysql")]
    {
        let db = TestDatabase::mysql("stream_refused");
        let err = MysqlRelayStore::new(&db.url)
            .claim(&claim)
            .await
            .unwrap_err();
        let refused = err.unsupported_mode().expect("an UnsupportedMode");
        assert_eq!((refused.mode, refused.backend), ("stream", "MySQL/MariaDB"));
    }
}

/// A failing event stops its shard's position before it: it is retried after the backoff
/// with its attempt counted (1, 2, then published at 3), the later events of its aggregate
/// are first delivered after it, and an outage before that (twice `Unavailable`) counts no
/// attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_failure_holds_the_position_and_outage_counts_no_attempt() {
    let db = Postgres::database("stream_fail");
    let broker = Arc::new(MemoryBroker::new());
    let seen: Arc<Mutex<Vec<(&'static str, i32)>>> = Arc::default();
    let is_x5 = |m: &OutboxMessage| m.aggregate_id == "x" && m.payload.contains("\"n\": 5");
    {
        let seen = seen.clone();
        broker.unavailable_when(move |m| {
            if !is_x5(m) {
                return None;
            }
            let mut s = seen.lock().unwrap();
            let outages = s.iter().filter(|(k, _)| *k == "unavailable").count();
            (outages < 2).then(|| {
                s.push(("unavailable", m.attempts));
                "broker down".to_owned()
            })
        });
    }
    {
        let seen = seen.clone();
        broker.fail_when(move |m| {
            if !is_x5(m) {
                return None;
            }
            let mut s = seen.lock().unwrap();
            if m.attempts < 3 {
                s.push(("failed", m.attempts));
                Some("refused".to_owned())
            } else {
                s.push(("published", m.attempts));
                None
            }
        });
    }
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=20 {
        insert(&mut conn, "x", n);
        insert(&mut conn, &format!("y{n}"), 1);
    }
    let config = RelayConfig {
        backoff: Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_millis(400),
            multiplier: 2.0,
            jitter: 0.0,
        },
        outage_backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.0,
        },
        ..stream_config()
    };
    let relay = Relay::new(PgRelayStore::new(&db.url), broker.clone(), config).unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    let started = Instant::now();
    while delivered(&broker).iter().collect::<HashSet<_>>().len() < 40
        && started.elapsed() < Duration::from_secs(15)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    handle.await.unwrap();
    let records = delivered(&broker);
    let unique: HashSet<_> = records.iter().cloned().collect();
    assert_eq!(unique.len(), 40, "every event published");
    assert!(out_of_order(&records).is_empty(), "{records:?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            ("unavailable", 1),
            ("unavailable", 1),
            ("failed", 1),
            ("failed", 2),
            ("published", 3)
        ]
    );
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "two backoffs of 200 and 400 ms"
    );
}
