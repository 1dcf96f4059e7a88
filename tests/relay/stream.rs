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

pub(crate) fn stream_config() -> RelayConfig {
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
pub(crate) fn insert(conn: &mut PgConnection, agg: &str, n: i64) {
    diesel::sql_query(format!(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload) \
         VALUES ('order', '{agg}', 'E', 1, jsonb_build_object('agg', '{agg}', 'n', {n}))"
    ))
    .execute(conn)
    .unwrap();
}

pub(crate) fn exec(conn: &mut PgConnection, sql: &str) {
    diesel::sql_query(sql).execute(conn).unwrap();
}

/// (aggregate, n) of each record published, in publish order.
pub(crate) fn delivered(broker: &MemoryBroker) -> Vec<(String, i64)> {
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
pub(crate) fn out_of_order(records: &[(String, i64)]) -> Vec<(String, i64)> {
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

pub(crate) type Stop = tokio::sync::oneshot::Sender<()>;

pub(crate) type Started = (Stop, tokio::task::JoinHandle<()>, Arc<RelayStats>);

fn start(db: &TestDatabase, broker: &Arc<MemoryBroker>) -> Started {
    start_with(db, broker, stream_config())
}

/// A stream relay with `config` over `db`, publishing to `broker`.
pub(crate) fn start_with(
    db: &TestDatabase,
    broker: &Arc<MemoryBroker>,
    config: RelayConfig,
) -> Started {
    start_reading(db, broker, config, None)
}

/// The same, its store reading `read_ahead` rows at least (`None`: the store's default).
pub(crate) fn start_reading(
    db: &TestDatabase,
    broker: &Arc<MemoryBroker>,
    config: RelayConfig,
    read_ahead: Option<usize>,
) -> Started {
    let mut store = PgRelayStore::new(&db.url);
    if let Some(rows) = read_ahead {
        store = store.stream_read_ahead(rows);
    }
    let relay = Relay::new(store, broker.clone(), config).unwrap();
    let stats = relay.stats();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    (stop, handle, stats)
}

/// The trap of an `id > last_id` cursor. Writer A inserts an event and keeps its transaction
/// open (2 s, and until the test has checked what it checks while A is open) while writer B
/// commits 1,000 events; a rolled-back transaction writes 5. A naive
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
    let (commit_tx, commit_rx) = std::sync::mpsc::channel::<()>();
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
            // Open until the test has seen what it checks while A is open (at least 2 s).
            std::thread::sleep(Duration::from_secs(2));
            let _ = commit_rx.recv_timeout(Duration::from_secs(30));
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

    // The stream relay publishes B's events while A is open, and not A's. (Settled: the
    // broker has a batch before the relay has moved its positions past it.)
    while (delivered(&broker).len() < 1000 || stats.published.load(Ordering::Relaxed) < 1000)
        && opened.elapsed() < Duration::from_secs(20)
    {
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
    // The positions name the oldest transaction open when their snapshot was taken: on this
    // shared server that may be another database's, which can end before the status reads
    // it; the relay's idle advance (every second) then takes a snapshot that names A.
    let mut status = admin.status().await.unwrap();
    let asked = Instant::now();
    while status
        .stream
        .as_ref()
        .is_some_and(|s| s.oldest_open_transaction.is_none())
        && asked.elapsed() < Duration::from_secs(3)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = admin.status().await.unwrap();
    }
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

    commit_tx.send(()).unwrap();
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
    let db = Postgres::database("stream_random");
    random_kills(&db, stream_config, None).await;
}

/// The same with batches of 4 and reads of 8 rows: each second batch is the last of its read,
/// and the next read is made while it is published, from where its positions will be; most
/// batches are published before the positions of the one before are written. The kills then
/// land between a publish and the write it owes, and between a read and the batch it assumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_relays_reading_beside_their_publishes_killed_at_random_lose_nothing() {
    let db = Postgres::database("stream_random_beside");
    let config = || RelayConfig {
        batch_size: 4,
        ..stream_config()
    };
    random_kills(&db, config, Some(8)).await;
}

/// The randomized test's body: writers, relays with `config()` (each its own relay id, its
/// store reading `read_ahead` rows at least) killed and started at random over `db`; returns
/// what was committed.
pub(crate) async fn random_kills(
    db: &TestDatabase,
    config: impl Fn() -> RelayConfig,
    read_ahead: Option<usize>,
) -> HashSet<(String, i64)> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {seed}");
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
    let mut relays: Vec<Started> = (0..2)
        .map(|_| start_reading(db, &broker, config(), read_ahead))
        .collect();
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
            relays.push(start_reading(db, &broker, config(), read_ahead));
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
    committed
}

/// The MySQL/MariaDB and SQLite stores refuse stream mode with a typed error naming it.
#[tokio::test]
async fn stream_mode_is_refused_where_it_is_not_built() {
    let claim = Claim {
        relay: "r",
        limit: 10,
        lease: Duration::from_secs(5),
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Stream {
            dead_letters_block: true,
        },
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
    failure_holds_the_position(100, None).await;
}

/// The same with batches of 4 handed out from rows read ahead: x5 is in the third, and the
/// outages and failures drop the rows read past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_read_ahead_failure_holds_the_position_and_outage_counts_no_attempt() {
    failure_holds_the_position(4, None).await;
}

/// The same with reads of 8 rows: x5's batch (the third) is the first of a read made while the
/// second was published; and the fourth batch, read while the failing third was published,
/// must not be published before x5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_read_beside_a_failing_publish_holds_the_position() {
    failure_holds_the_position(4, Some(8)).await;
}

/// x5 (of 20 events of x among 20 others) is unavailable twice (an outage: no attempt), then
/// refused twice (attempts 1 and 2, with the backoff between), then published at attempt 3;
/// everything is published once in per-aggregate order.
async fn failure_holds_the_position(batch_size: usize, read_ahead: Option<usize>) {
    let db = Postgres::database(&format!(
        "stream_fail_{batch_size}_{}",
        read_ahead.unwrap_or(0)
    ));
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
        batch_size,
        ..stream_config()
    };
    let (stop, handle, _) = start_reading(&db, &broker, config, read_ahead);
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

/// The dead letters of `db`'s stream: (aggregate id, n, attempts, parked behind a dead letter).
fn stream_dead_letters(db: &TestDatabase) -> Vec<(String, i64, i32, bool)> {
    #[derive(diesel::QueryableByName)]
    struct D {
        #[diesel(sql_type = diesel::sql_types::Text)]
        agg: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        attempts: i32,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        parked: bool,
    }
    let mut conn = PgConnection::establish(&db.url).unwrap();
    diesel::sql_query(
        "SELECT aggregate_id AS agg, (payload->>'n')::bigint AS n, attempts, \
         parked_behind IS NOT NULL AS parked FROM outbox_stream_dead_letters ORDER BY seq",
    )
    .load::<D>(&mut conn)
    .unwrap()
    .into_iter()
    .map(|d| (d.agg, d.n, d.attempts, d.parked))
    .collect()
}

/// Waits up to `secs` for `done`.
pub(crate) async fn wait_for(secs: u64, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > Duration::from_secs(secs) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// The stream config of the dead-letter tests: refused twice, an event is a dead letter;
/// retries after 50, then 100 ms.
fn dead_letter_config(batch_size: usize) -> RelayConfig {
    RelayConfig {
        batch_size,
        max_attempts: 2,
        backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.0,
        },
        ..stream_config()
    }
}

/// The numbers `n` of aggregate `agg`'s records, in publish order.
fn numbers_of(records: &[(String, i64)], agg: &str) -> Vec<i64> {
    records
        .iter()
        .filter(|(a, _)| a == agg)
        .map(|(_, n)| *n)
        .collect()
}

/// `dead` is `agg`'s event `n` as a dead letter after 2 attempts, then its next events
/// parked behind it, in order.
fn assert_dead_then_parked(dead: &[(String, i64, i32, bool)], agg: &str, n: i64) {
    assert_eq!(dead[0], (agg.to_owned(), n, 2, false), "{dead:?}");
    assert!(
        dead[1..]
            .iter()
            .zip(n + 1..)
            .all(|(d, k)| *d == (agg.to_owned(), k, 0, true)),
        "{dead:?}"
    );
}

/// An event refused past `max_attempts` becomes a dead letter (a copy in
/// `outbox_stream_dead_letters`) and its shard's position moves on: the other aggregates go on,
/// and the later events of its aggregate, also one written afterwards, are parked beside it
/// (copied, never published). A retry (what `outbox dead retry` writes) releases the
/// aggregate: the dead letter and its parked events are published in order, then the
/// aggregate's new events flow again. A purge (`outbox dead purge`) releases the parked events
/// of another aggregate without its dead letter. No event row is ever updated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_dead_letter_parks_its_aggregate_until_retried_or_purged() {
    let db = Postgres::database("stream_dead");
    let broker = Arc::new(MemoryBroker::new());
    let poison_x3 = Arc::new(AtomicBool::new(true));
    {
        let poison_x3 = poison_x3.clone();
        broker.fail_when(move |m| {
            let x3 = m.aggregate_id == "x" && m.payload.contains("\"n\": 3");
            let z1 = m.aggregate_id == "z" && m.payload.contains("\"n\": 1");
            ((x3 && poison_x3.load(Ordering::SeqCst)) || z1).then(|| "refused".to_owned())
        });
    }
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=10 {
        insert(&mut conn, "x", n);
        insert(&mut conn, &format!("y{n}"), 1);
    }
    let (stop, handle, _) = start_with(&db, &broker, dead_letter_config(100));
    let x = |records: &[(String, i64)]| numbers_of(records, "x");

    // x3 is refused twice: a dead letter; x4..x10 parked; the y's all published.
    assert!(
        wait_for(15, || stream_dead_letters(&db).len() == 8
            && delivered(&broker).iter().filter(|(a, _)| a != "x").count()
                >= 10)
        .await,
        "dead letters {:?}, delivered {:?}",
        stream_dead_letters(&db),
        delivered(&broker)
    );
    assert_dead_then_parked(&stream_dead_letters(&db), "x", 3);
    // A new event of the parked aggregate is parked too.
    insert(&mut conn, "x", 11);
    assert!(wait_for(10, || stream_dead_letters(&db).len() == 9).await);
    assert_eq!(
        x(&delivered(&broker)),
        [1, 2],
        "nothing of x after its dead letter"
    );

    // Retried: x3..x11 go, in order, and the aggregate is free again.
    poison_x3.store(false, Ordering::SeqCst);
    exec(
        &mut conn,
        "UPDATE outbox_stream_dead_letters SET retry_requested_at = now(), attempts = 0 \
         WHERE parked_behind IS NULL",
    );
    assert!(
        wait_for(10, || x(&delivered(&broker)).len() >= 11).await,
        "{:?}",
        delivered(&broker)
    );
    assert_eq!(x(&delivered(&broker)), (1..=11).collect::<Vec<_>>());
    assert!(stream_dead_letters(&db).is_empty());
    insert(&mut conn, "x", 12);
    assert!(wait_for(10, || x(&delivered(&broker)).len() >= 12).await);

    // z1 dead, z2 and z3 parked; purged: z2 and z3 go, z1 never.
    for n in 1..=3 {
        insert(&mut conn, "z", n);
    }
    assert!(
        wait_for(10, || stream_dead_letters(&db).len() == 3).await,
        "{:?}",
        stream_dead_letters(&db)
    );
    exec(
        &mut conn,
        "DELETE FROM outbox_stream_dead_letters WHERE parked_behind IS NULL",
    );
    let z = |records: &[(String, i64)]| numbers_of(records, "z");
    assert!(wait_for(10, || z(&delivered(&broker)).len() >= 2).await);
    stop.send(()).unwrap();
    handle.await.unwrap();
    let records = delivered(&broker);
    assert_eq!(z(&records), [2, 3]);
    assert!(stream_dead_letters(&db).is_empty());
    assert!(out_of_order(&records).is_empty(), "{records:?}");
    let unique: HashSet<_> = records.iter().collect();
    assert_eq!(unique.len(), records.len(), "no event twice: {records:?}");
    assert_eq!(
        Postgres::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events \
             WHERE published_at IS NOT NULL OR dead_at IS NOT NULL OR attempts > 0"
        ),
        0,
        "no event row written"
    );
}

/// A row whose `created_at` is `infinity` (valid PostgreSQL, written by another program) is a
/// dead letter at once with the column and value in its error, its aggregate's later events
/// are parked behind it, and every other aggregate is published: a row that does not decode
/// is no database outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_row_with_an_unrepresentable_time_is_a_dead_letter() {
    let db = Postgres::database("stream_bad_time");
    let broker = Arc::new(MemoryBroker::new());
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=3 {
        insert(&mut conn, "x", n);
        insert(&mut conn, &format!("y{n}"), 1);
    }
    exec(
        &mut conn,
        "UPDATE outbox_events SET created_at = 'infinity' \
         WHERE aggregate_id = 'x' AND payload->>'n' = '2'",
    );
    let (stop, handle, _) = start_with(&db, &broker, stream_config());
    assert!(
        wait_for(15, || stream_dead_letters(&db).len() == 2
            && delivered(&broker).iter().filter(|(a, _)| a != "x").count()
                >= 3)
        .await,
        "dead letters {:?}, delivered {:?}",
        stream_dead_letters(&db),
        delivered(&broker)
    );
    stop.send(()).unwrap();
    handle.await.unwrap();
    let dead = stream_dead_letters(&db);
    assert_eq!(
        (
            dead[0].0.as_str(),
            dead[0].1,
            dead[0].3,
            dead[1].1,
            dead[1].3
        ),
        ("x", 2, false, 3, true),
        "{dead:?}"
    );
    assert_eq!(numbers_of(&delivered(&broker), "x"), [1]);
    assert_eq!(
        Postgres::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters WHERE parked_behind IS NULL \
             AND last_error LIKE '%column `created_at` is not a time the relay can represent \
             (value \"infinity\")%'"
        ),
        1
    );
}

/// With `DeadLetterPolicy::Skip` a dead letter is copied aside and its aggregate's later
/// events pass it; retried, it is published then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_dead_letter_skipped_lets_its_aggregate_pass() {
    let db = Postgres::database("stream_dead_skip");
    let broker = Arc::new(MemoryBroker::new());
    let poison = Arc::new(AtomicBool::new(true));
    {
        let poison = poison.clone();
        broker.fail_when(move |m| {
            (m.payload.contains("\"n\": 2") && poison.load(Ordering::SeqCst))
                .then(|| "refused".to_owned())
        });
    }
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=5 {
        insert(&mut conn, "x", n);
    }
    let config = RelayConfig {
        max_attempts: 1,
        dead_letters: DeadLetterPolicy::Skip,
        ..stream_config()
    };
    let (stop, handle, _) = start_with(&db, &broker, config);
    assert!(wait_for(10, || delivered(&broker).len() >= 4).await);
    assert!(wait_for(10, || !stream_dead_letters(&db).is_empty()).await);
    let ns: Vec<i64> = delivered(&broker).iter().map(|(_, n)| *n).collect();
    assert_eq!(ns, [1, 3, 4, 5]);
    assert_eq!(stream_dead_letters(&db), [("x".to_owned(), 2, 1, false)]);
    poison.store(false, Ordering::SeqCst);
    exec(
        &mut conn,
        "UPDATE outbox_stream_dead_letters SET retry_requested_at = now(), attempts = 0",
    );
    assert!(wait_for(10, || delivered(&broker).len() >= 5).await);
    stop.send(()).unwrap();
    handle.await.unwrap();
    let ns: Vec<i64> = delivered(&broker).iter().map(|(_, n)| *n).collect();
    assert_eq!(ns, [1, 3, 4, 5, 2]);
    assert!(stream_dead_letters(&db).is_empty());
}

/// Batches handed out from rows read ahead (batch 3, every row read by the first claim): a
/// failure holds its aggregate back although its later events were already read (x3 refused
/// once: x4 is not published before it), and a dead letter parks the aggregate's later events
/// read before it was written (x6 refused twice: x7..x15 parked, never published); the other
/// aggregates go on, each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_read_ahead_follows_failures_and_dead_letters() {
    read_ahead_follows_failures_and_dead_letters(None).await;
}

/// The same with reads of 6 rows (two batches): half the reads are made while a batch is
/// published, from where it will leave the positions, among them while x3 and x6 fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_reads_beside_the_publish_follow_failures_and_dead_letters() {
    read_ahead_follows_failures_and_dead_letters(Some(6)).await;
}

async fn read_ahead_follows_failures_and_dead_letters(read_ahead: Option<usize>) {
    let db = Postgres::database(&format!("stream_ahead_{}", read_ahead.unwrap_or(0)));
    let broker = Arc::new(MemoryBroker::new());
    let x3_refusals = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let x3_refusals = x3_refusals.clone();
        broker.fail_when(move |m| {
            let x3 = m.aggregate_id == "x"
                && m.payload.contains("\"n\": 3")
                && x3_refusals.fetch_add(1, Ordering::SeqCst) == 0;
            let x6 = m.aggregate_id == "x" && m.payload.contains("\"n\": 6");
            (x3 || x6).then(|| "refused".to_owned())
        });
    }
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=15 {
        insert(&mut conn, "x", n);
        insert(&mut conn, &format!("y{n}"), 1);
    }
    let (stop, handle, _) = start_reading(&db, &broker, dead_letter_config(3), read_ahead);
    assert!(
        wait_for(15, || stream_dead_letters(&db).len() == 10
            && delivered(&broker).iter().filter(|(a, _)| a != "x").count()
                >= 15)
        .await,
        "dead letters {:?}, delivered {:?}",
        stream_dead_letters(&db),
        delivered(&broker)
    );
    stop.send(()).unwrap();
    handle.await.unwrap();
    let records = delivered(&broker);
    assert_eq!(numbers_of(&records, "x"), [1, 2, 3, 4, 5], "{records:?}");
    assert!(out_of_order(&records).is_empty(), "{records:?}");
    let unique: HashSet<_> = records.iter().collect();
    assert_eq!(unique.len(), records.len(), "no event twice: {records:?}");
    assert_eq!(records.len(), 20, "{records:?}");
    assert_dead_then_parked(&stream_dead_letters(&db), "x", 6);
}

/// A relay stopped gracefully writes the positions it owes (with reads beside the publish,
/// a batch is published before the positions of the one before it are written): a relay
/// started after it publishes the rest, and nothing is published twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_stream_relay_owes_no_position() {
    let db = Postgres::database("stream_owed");
    let broker = Arc::new(MemoryBroker::new());
    // 2 ms a message: the first relay is stopped mid-way.
    broker.fail_when(|_| {
        std::thread::sleep(Duration::from_millis(2));
        None
    });
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=100 {
        for a in 0..4 {
            insert(&mut conn, &format!("a{a}"), n);
        }
    }
    let config = || RelayConfig {
        batch_size: 4,
        ..stream_config()
    };
    let (stop, handle, _) = start_reading(&db, &broker, config(), Some(8));
    assert!(wait_for(10, || delivered(&broker).len() >= 100).await);
    stop.send(()).unwrap();
    handle.await.unwrap();
    let first = delivered(&broker).len();
    assert!(
        first < 400,
        "the first relay published all {first} before it was stopped"
    );
    let (stop, handle, _) = start_reading(&db, &broker, config(), Some(8));
    assert!(wait_for(20, || delivered(&broker).len() >= 400).await);
    stop.send(()).unwrap();
    handle.await.unwrap();
    let records = delivered(&broker);
    let unique: HashSet<_> = records.iter().collect();
    assert_eq!(unique.len(), 400, "every event published");
    assert_eq!(records.len(), 400, "{first} by the first relay, none again");
    assert!(out_of_order(&records).is_empty(), "{records:?}");
}

/// A delta larger than a batch, spread over every shard (transactions of 1,000 events over
/// 1,000 aggregates, batches of 100: each claim can take the rows of only some shards): every
/// event is published, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_delta_larger_than_a_batch_loses_nothing() {
    let db = Postgres::database("stream_wide");
    let broker = Arc::new(MemoryBroker::new());
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for t in 0..3 {
        exec(&mut conn, "BEGIN");
        for i in 0..1000 {
            insert(&mut conn, &format!("w{i}"), t + 1);
        }
        exec(&mut conn, "COMMIT");
    }
    let (stop, relay, _) = start(&db, &broker);
    let ok = wait_for(30, || delivered(&broker).len() >= 3000).await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    let records = delivered(&broker);
    let unique: HashSet<_> = records.iter().collect();
    assert!(ok, "{} of 3,000 published", unique.len());
    assert_eq!(unique.len(), 3000);
    assert!(out_of_order(&records).is_empty());
}

/// The stream claim's statements stay on the `(shard, xid)` stream index on a table that
/// fills under them (statistics of an empty table, then of 20,000 rows with 100,000 in it,
/// then analysed), under the relay's session settings: never a walk of the `seq`-ordered
/// pending index filtered by shard, which reads every held shard's whole backlog on each
/// claim (3.5 s a claim in the stream SIGKILL storm before the fix).
#[test]
fn stream_claim_keeps_the_stream_index_while_the_table_fills() {
    use diesel::connection::SimpleConnection;
    let db = Postgres::database("stream_plan");
    let mut conn = PgConnection::establish(&db.url).unwrap();
    exec(
        &mut conn,
        "ALTER TABLE outbox_events SET (autovacuum_enabled = false)",
    );
    conn.batch_execute(outbox::relay::__sql::PG_SESSION_SQL)
        .unwrap();
    let candidates = outbox::relay::__sql::PG_STREAM_CANDIDATES;
    exec(
        &mut conn,
        &format!("PREPARE cand(smallint[], text[], text[], int8[], bigint, bool) AS {candidates}"),
    );
    exec(
        &mut conn,
        "UPDATE outbox_shard_leases SET owner = 'r', lease_until = now() + interval '1 hour'",
    );
    let fill = |from: i32, to: i32| {
        format!(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, \
               event_version, payload, shard) \
             SELECT 'order', (g % 1000)::text, 'E', 1, '{{}}', g % 256 \
             FROM generate_series({from}, {to}) g"
        )
    };
    for phase in [
        "empty",
        "20,000 analysed",
        "100,000 stale",
        "100,000 analysed",
    ] {
        match phase {
            "empty" => {}
            "20,000 analysed" => {
                exec(&mut conn, &fill(1, 20_000));
                exec(&mut conn, "ANALYZE outbox_events");
            }
            "100,000 stale" => exec(&mut conn, &fill(20_001, 100_000)),
            _ => exec(&mut conn, "ANALYZE outbox_events"),
        }
        // Every shard from the positions of the migration (before every row) to now, its
        // cursor half-way through the backlog: the storm's case.
        #[derive(diesel::QueryableByName)]
        struct Arrays {
            #[diesel(sql_type = diesel::sql_types::Text)]
            shards: String,
            #[diesel(sql_type = diesel::sql_types::Text)]
            lasts: String,
            #[diesel(sql_type = diesel::sql_types::Text)]
            curs: String,
            #[diesel(sql_type = diesel::sql_types::Text)]
            cursors: String,
        }
        let a: Arrays = diesel::sql_query(
            "SELECT array_agg(shard ORDER BY shard)::text AS shards, \
               array_agg(last_snapshot::text ORDER BY shard)::text AS lasts, \
               array_agg(pg_current_snapshot()::text)::text AS curs, \
               array_agg(50000::int8)::text AS cursors FROM outbox_stream_positions",
        )
        .get_result(&mut conn)
        .unwrap();
        for batch in [100, 1000] {
            let plan = crate::postgres::plan_of(
                &mut conn,
                &format!(
                    "EXPLAIN EXECUTE cand('{}', '{}', '{}', '{}', {batch}, true)",
                    a.shards, a.lasts, a.curs, a.cursors
                ),
            );
            let at = format!("batch {batch}, {phase}: {plan}");
            assert!(
                plan.contains("using outbox_events_stream on outbox_events"),
                "{at}"
            );
            assert!(!plan.contains("using outbox_events_pending"), "{at}");
            if phase != "empty" {
                // (An empty table's payloads are joined by a scan of it: nothing to read.)
                assert!(!plan.contains("Seq Scan on outbox_events "), "{at}");
                // The batch's payloads are read by the scan's ctid, a TID scan a row.
                assert!(plan.contains("Tid Scan on outbox_events"), "{at}");
            }
            assert!(!plan.contains("JIT:"), "{at}");
        }
    }
}

/// Retention in stream mode deletes what the positions passed and nothing else: not before
/// `keep`, not an event committed after the relay stopped, not one whose transaction was
/// still open while the relay ran (it committed later, with a lower seq than rows that were
/// published; the open transaction holds back nothing else), and never more than the batch
/// asked for. A lease-mode row marked published is deleted by the same statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_retention_deletes_only_what_the_positions_passed() {
    let db = Postgres::database("stream_retention");
    let broker = Arc::new(MemoryBroker::new());
    let mut conn = PgConnection::establish(&db.url).unwrap();
    let mut late = PgConnection::establish(&db.url).unwrap();
    exec(&mut late, "BEGIN");
    insert(&mut late, "late", 1);
    for i in 0..200 {
        insert(&mut conn, &format!("a{}", i % 20), i / 20 + 1);
    }
    let (stop, relay, _) = start(&db, &broker);
    let ok = wait_for(30, || delivered(&broker).len() >= 200).await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    assert!(ok, "{} of 200 published", delivered(&broker).len());
    for i in 0..10 {
        insert(&mut conn, "after", i + 1);
    }
    // A row a lease mode published (before a switch to stream): retention's too.
    exec(
        &mut conn,
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, \
         payload, published_at) VALUES ('order', 'leased', 'E', 1, '{}', now() - interval '1 day')",
    );

    // Retention knows a stream row's age from its ticks (at most one a second, recorded by
    // the cleanup itself): the first one below is newer than every committed row.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut store = PgRelayStore::new(&db.url);
    assert_eq!(
        store
            .cleanup(Duration::from_secs(3600), 1000)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .cleanup(Duration::from_secs(3600), 1000)
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.cleanup(Duration::ZERO, 1).await.unwrap(), 1);
    assert_eq!(1 + clean_up_all(&mut store).await, 200);
    let left: Vec<(String, i64)> = aggregates_left(&mut conn);
    let expected: Vec<(String, i64)> = (1..=10).map(|n| ("after".to_owned(), n)).collect();
    assert_eq!(
        left, expected,
        "only the events the positions had not passed are kept"
    );

    // The open transaction commits: its event (the lowest seq of the table) is published
    // with those written after, and only then deleted.
    exec(&mut late, "COMMIT");
    assert_eq!(store.cleanup(Duration::ZERO, 1000).await.unwrap(), 0);
    let (stop, relay, _) = start(&db, &broker);
    let ok = wait_for(30, || delivered(&broker).len() >= 211).await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    assert!(ok, "{} of 211 published", delivered(&broker).len());
    // The tick the previous cleanups used may have seen the late transaction open: then the
    // first call below keeps its event and records the tick by which the next deletes it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(clean_up_all(&mut store).await, 11);
    assert!(aggregates_left(&mut conn).is_empty());
    assert!(out_of_order(&delivered(&broker)).is_empty());
}

/// Runs the store's cleanup (nothing kept, 1,000 rows a statement) until it deletes nothing;
/// returns how many rows it deleted.
async fn clean_up_all(store: &mut PgRelayStore) -> u64 {
    let mut deleted = 0;
    loop {
        match store.cleanup(Duration::ZERO, 1000).await.unwrap() {
            0 => return deleted,
            n => deleted += n,
        }
    }
}

/// (aggregate, n) of the rows left in `outbox_events`, in seq order.
pub(crate) fn aggregates_left(conn: &mut PgConnection) -> Vec<(String, i64)> {
    #[derive(diesel::QueryableByName)]
    struct Left {
        #[diesel(sql_type = diesel::sql_types::Text)]
        agg: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(
        "SELECT aggregate_id AS agg, (payload->>'n')::bigint AS n FROM outbox_events ORDER BY seq",
    )
    .load::<Left>(conn)
    .unwrap()
    .into_iter()
    .map(|l| (l.agg, l.n))
    .collect()
}

/// An operator's replay and retry after a switch from `sharded` to `stream` (as `docs/relaying.md`
/// allows): 20 events published by a sharded relay, 20 more by a stream relay; `replay` of
/// everything makes the stream relay publish all 40 again (the stream never reads a row its
/// positions passed, so they go through its release, in order per aggregate); a dead row
/// the positions passed, retried, is published again too. Nothing is left in the dead
/// letters, and each aggregate sees its events in order, then the replays in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_retry_after_switching_to_stream_publish_again() {
    use diesel_async::AsyncConnection;
    use outbox::relay::admin::{Admin, Filter};

    let db = Postgres::database("stream_replay");
    let broker = Arc::new(MemoryBroker::new());
    let mut conn = PgConnection::establish(&db.url).unwrap();
    let aggs = ["a", "b", "c", "d"];
    for n in 1..=5 {
        for a in aggs {
            insert(&mut conn, a, n);
        }
    }
    let sharded = RelayConfig {
        mode: Mode::Sharded,
        ..stream_config()
    };
    let (stop, handle, _) = start_with(&db, &broker, sharded);
    assert!(wait_for(15, || delivered(&broker).len() >= 20).await);
    stop.send(()).unwrap();
    handle.await.unwrap();
    for n in 6..=10 {
        for a in aggs {
            insert(&mut conn, a, n);
        }
    }
    let (stop, handle, _) = start_with(&db, &broker, stream_config());
    assert!(wait_for(15, || delivered(&broker).len() >= 40).await);

    let mut admin = Admin::new(
        diesel_async::AsyncPgConnection::establish(&db.url)
            .await
            .unwrap(),
    );
    let replayed = admin.replay(&Filter::default(), 7, |_| {}).await.unwrap();
    assert_eq!(replayed, 40, "every published event, the stream's too");
    assert!(
        wait_for(15, || delivered(&broker).len() >= 80).await,
        "{} delivered",
        delivered(&broker).len()
    );
    let records = delivered(&broker);
    for a in aggs {
        let twice: Vec<i64> = (1..=10).chain(1..=10).collect();
        assert_eq!(numbers_of(&records, a), twice, "{a}");
    }
    // Each copy goes once its publish is settled.
    assert!(
        wait_for(5, || Postgres::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters"
        ) == 0)
        .await
    );
    assert_eq!(admin.count(&Filter::default(), true).await.unwrap(), 0);

    // A dead row the positions passed (a lease mode's dead letter the stream skipped).
    exec(
        &mut conn,
        "UPDATE outbox_events SET dead_at = now(), last_error = 'refused' \
         WHERE aggregate_id = 'c' AND payload->>'n' = '10'",
    );
    assert_eq!(admin.count(&Filter::default(), true).await.unwrap(), 1);
    assert_eq!(admin.retry_dead(&Filter::default()).await.unwrap(), 1);
    assert!(wait_for(15, || delivered(&broker).len() >= 81).await);
    assert_eq!(numbers_of(&delivered(&broker), "c").last(), Some(&10));
    assert!(
        wait_for(5, || Postgres::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters"
        ) == 0)
        .await
    );
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(delivered(&broker).len(), 81, "nothing else");
}

/// A switch from `stream` back to a lease mode: a lease-mode claim is refused while the stream
/// left rows behind (what it published unmarked, its dead letters and parked events), naming
/// the command that hands the table over; after the handover a sharded relay publishes
/// nothing twice, keeps the stream's dead letter dead with its parked events behind it, and
/// publishes them in order once it is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_from_stream_to_a_lease_mode_is_refused_until_handed_over() {
    use diesel_async::AsyncConnection;
    use outbox::relay::admin::{Admin, Filter};

    let db = Postgres::database("stream_handover");
    let broker = Arc::new(MemoryBroker::new());
    let poison_x3 = Arc::new(AtomicBool::new(true));
    {
        let poison_x3 = poison_x3.clone();
        broker.fail_when(move |m| {
            let x3 = m.aggregate_id == "x" && m.payload.contains("\"n\": 3");
            (x3 && poison_x3.load(Ordering::SeqCst)).then(|| "refused".to_owned())
        });
    }
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=5 {
        insert(&mut conn, "x", n);
    }
    for n in 1..=3 {
        insert(&mut conn, &format!("y{n}"), 1);
    }
    let (stop, handle, _) = start_with(&db, &broker, dead_letter_config(100));
    assert!(
        wait_for(15, || stream_dead_letters(&db).len() == 3
            && delivered(&broker).len() >= 5)
        .await
    );
    stop.send(()).unwrap();
    handle.await.unwrap();
    insert(&mut conn, "x", 6);
    insert(&mut conn, "z", 1);

    let sharded = RelayConfig {
        mode: Mode::Sharded,
        ..dead_letter_config(100)
    };
    let mut store = PgRelayStore::new(&db.url);
    store
        .rebalance_shards("r", Duration::from_secs(5))
        .await
        .unwrap();
    let claim = Claim {
        relay: "r",
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
    let err = store.claim(&claim).await.unwrap_err();
    let left = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<StreamLeftBehind>())
        .unwrap_or_else(|| panic!("a StreamLeftBehind: {err}"));
    assert!(left.unmarked && left.stream_dead_letters == 3, "{left:?}");
    assert!(
        err.to_string().contains("outbox stream-handover --yes"),
        "{err}"
    );

    let mut admin = Admin::new(
        diesel_async::AsyncPgConnection::establish(&db.url)
            .await
            .unwrap(),
    );
    let done = admin.hand_over_from_stream().await.unwrap();
    assert_eq!((done.marked, done.restored), (5, 3), "{done:?}");
    assert_eq!(admin.stream_left_behind().await.unwrap(), None);
    assert_eq!(
        admin.count(&Filter::default(), true).await.unwrap(),
        1,
        "x3"
    );
    assert!(store.claim(&claim).await.is_ok(), "handed over");
    store.release_all("r").await.unwrap();

    poison_x3.store(false, Ordering::SeqCst);
    let (stop, handle, _) = start_with(&db, &broker, sharded);
    assert!(wait_for(15, || numbers_of(&delivered(&broker), "z") == [1]).await);
    assert_eq!(numbers_of(&delivered(&broker), "x"), [1, 2], "behind x3");
    assert_eq!(admin.retry_dead(&Filter::default()).await.unwrap(), 1);
    assert!(wait_for(15, || numbers_of(&delivered(&broker), "x").len() >= 6).await);
    stop.send(()).unwrap();
    handle.await.unwrap();
    let records = delivered(&broker);
    assert_eq!(numbers_of(&records, "x"), (1..=6).collect::<Vec<_>>());
    assert_eq!(records.len(), 10, "nothing twice: {records:?}");
}

/// A switch to `stream` on a table with a lease mode's dead letter: a stream claim that
/// keeps dead letters blocking is refused (stream mode would publish the aggregate's later
/// events past it), naming what to do; once it is purged, the stream claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_to_stream_with_lease_dead_letters_is_refused_until_they_are_dealt_with() {
    let db = Postgres::database("stream_after_dead");
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=3 {
        insert(&mut conn, "x", n);
    }
    exec(
        &mut conn,
        "UPDATE outbox_events SET dead_at = now(), attempts = 10, last_error = 'refused' \
         WHERE payload->>'n' = '1'",
    );
    let mut store = PgRelayStore::new(&db.url);
    store
        .rebalance_shards("r", Duration::from_secs(5))
        .await
        .unwrap();
    let claim = Claim {
        relay: "r",
        limit: 100,
        lease: Duration::from_secs(5),
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Stream {
            dead_letters_block: true,
        },
    };
    let err = store.claim(&claim).await.unwrap_err();
    let dead = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<LeaseDeadLetters>())
        .unwrap_or_else(|| panic!("a LeaseDeadLetters: {err}"));
    assert_eq!(dead.count, 1);
    assert!(
        err.to_string().contains("retry or purge them first"),
        "{err}"
    );
    exec(
        &mut conn,
        "DELETE FROM outbox_events WHERE dead_at IS NOT NULL",
    );
    let got = store.claim(&claim).await.unwrap();
    assert_eq!(got.len(), 2, "x2 and x3");
}
