//! Leader failover: a homemade leader flag lets a paused old leader publish after its successor; the library's leadership lease and fenced marks do not. Needs PostgreSQL (`DATABASE_URL`).
//!
//! The naive leader is a row holding the leader's name, taken over when its heartbeat goes
//! stale. Leader A reads the pending events, checks that it still leads, and pauses (a GC
//! pause, a frozen VM) before publishing. B takes over, publishes them and the next ones. A
//! resumes and publishes its stale batch: every event twice, and each order's first steps
//! after its last. A's mark then succeeds on rows it no longer owns: nothing fences it.
//!
//! Then `Mode::Leader`: relay A leads, relay B waits as a hot standby. A dies (its runtime
//! and database connection dropped) with a batch published but not yet marked. B sees A's
//! session gone and takes over well within the lease, publishes that batch again (at least
//! once: the duplicates are exactly what A published and did not mark) and the rest, in
//! order; a consumer deduplicating by event id sees every event once, each order in order.
//! A's id can neither take the leadership back nor mark the rows it lost.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{PgDb, ensure, expect};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{
    Completion, Delivery, Mode, OutboxMessage, PgRelayStore, Publisher, Relay, RelayConfig,
    RelayStore,
};

/// One step of an order's life; `step` counts from 1 per order.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, outbox::OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderStep", version = 1)]
struct OrderStep {
    #[outbox(aggregate_id)]
    order_id: i64,
    step: i64,
}

/// One message as the ordered log received it.
#[derive(Debug, Clone)]
struct Entry {
    by: &'static str,
    order: i64,
    step: i64,
    id: uuid::Uuid,
    at: Instant,
}

type Log = Arc<Mutex<Vec<Entry>>>;

fn append(log: &Log, by: &'static str, events: impl IntoIterator<Item = (i64, i64, uuid::Uuid)>) {
    let at = Instant::now();
    log.lock()
        .unwrap()
        .extend(events.into_iter().map(|(order, step, id)| Entry {
            by,
            order,
            step,
            id,
            at,
        }));
}

/// Each order's steps in the order the log received them; with `dedup`, as a consumer that
/// drops an event id it has seen (an inbox) applies them.
fn steps_by_order(log: &[Entry], dedup: bool) -> BTreeMap<i64, Vec<i64>> {
    let mut seen = HashSet::new();
    let mut by_order: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for e in log {
        if !dedup || seen.insert(e.id) {
            by_order.entry(e.order).or_default().push(e.step);
        }
    }
    by_order
}

fn write_steps(conn: &mut PgConnection, events: impl IntoIterator<Item = (i64, i64)>) {
    for (order_id, step) in events {
        conn.transaction_with_outbox(|tx| tx.publish(&OrderStep { order_id, step }))
            .unwrap();
    }
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    aggregate_id: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    step: i64,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: uuid::Uuid,
}

/// The homemade leader: the name in this row leads; anyone may take it over once its
/// heartbeat is older than 300 ms. No lease on the rows, no fencing of the marks.
const HOMEMADE: &str = "CREATE TABLE homemade_leader (id INT PRIMARY KEY, holder TEXT NOT NULL, heartbeat TIMESTAMPTZ NOT NULL); \
     INSERT INTO homemade_leader VALUES (1, 'nobody', now() - interval '1 hour')";

/// Becomes (or stays) the homemade leader: true if `me` holds the flag afterwards.
fn lead(c: &mut PgConnection, me: &str) -> bool {
    diesel::sql_query(
        "UPDATE homemade_leader SET holder = $1, heartbeat = now() \
         WHERE holder = $1 OR heartbeat < now() - interval '300 milliseconds'",
    )
    .bind::<diesel::sql_types::Text, _>(me)
    .execute(c)
    .unwrap()
        == 1
}

fn pending(c: &mut PgConnection) -> Vec<Row> {
    diesel::sql_query(
        "SELECT seq, aggregate_id, (payload->>'step')::bigint AS step, id FROM outbox_events \
         WHERE published_at IS NULL ORDER BY seq",
    )
    .load(c)
    .unwrap()
}

/// Publishes `rows` to the log and marks them; returns how many rows the mark updated.
fn publish_and_mark(c: &mut PgConnection, by: &'static str, rows: &[Row], log: &Log) -> usize {
    append(
        log,
        by,
        rows.iter()
            .map(|r| (r.aggregate_id.parse().unwrap(), r.step, r.id)),
    );
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    diesel::sql_query("UPDATE outbox_events SET published_at = now() WHERE seq = ANY($1)")
        .bind::<diesel::sql_types::Array<diesel::sql_types::BigInt>, _>(seqs)
        .execute(c)
        .unwrap()
}

fn naive(db: &PgDb) {
    println!("1. A homemade leader flag (a row, a heartbeat, no fencing).");
    let mut conn = db.conn();
    conn.batch_execute(HOMEMADE).unwrap();
    write_steps(
        &mut conn,
        (1..=4).flat_map(|step| (1..=3).map(move |order| (order, step))),
    );
    let log: Log = Arc::default();
    let (paused, a_paused) = std::sync::mpsc::channel();
    let (resume, a_resumes) = std::sync::mpsc::channel::<()>();
    let (url, a_log) = (db.url.clone(), log.clone());
    let leader_a = std::thread::spawn(move || {
        let mut c = PgConnection::establish(&url).unwrap();
        assert!(lead(&mut c, "A"), "A leads");
        let rows = pending(&mut c);
        let still_leads = lead(&mut c, "A"); // checked right before publishing
        paused.send((rows.len(), still_leads)).unwrap();
        a_resumes.recv().unwrap(); // the pause falls between the check and the send
        publish_and_mark(&mut c, "A", &rows, &a_log)
    });
    let (a_read, a_checked) = a_paused.recv().unwrap();
    println!(
        "   A leads, reads {a_read} pending events, checks it still leads ({a_checked}), pauses"
    );
    // A's heartbeat goes stale while it is paused (A is blocked: nothing races here).
    std::thread::sleep(Duration::from_millis(400));
    ensure(lead(&mut conn, "B"), "B to take the stale flag over");
    let rows = pending(&mut conn);
    publish_and_mark(&mut conn, "B", &rows, &log);
    write_steps(&mut conn, (1..=3).map(|order| (order, 5)));
    ensure(lead(&mut conn, "B"), "B to still lead");
    let rows = pending(&mut conn);
    publish_and_mark(&mut conn, "B", &rows, &log);
    println!("   B takes over and publishes steps 1-5 of orders 1-3; A resumes");
    resume.send(()).unwrap();
    let a_marked = leader_a.join().unwrap();
    let log = log.lock().unwrap().clone();
    let distinct: HashSet<_> = log.iter().map(|e| e.id).collect();
    let raw = steps_by_order(&log, false);
    println!(
        "   {} messages, {} distinct; order 1 arrived as steps {:?}; A's mark updated {a_marked} rows B had marked",
        log.len(),
        distinct.len(),
        raw[&1]
    );
    expect(
        log.len() - distinct.len() == a_read
            && raw.values().all(|s| s.windows(2).any(|w| w[1] < w[0])),
        "A's stale batch published again after B's, every order out of order",
    );
    expect(
        a_marked == a_read,
        "A's mark to go through on rows it no longer owned",
    );
}

/// A publisher for one relay that appends to the shared log. Given `die_at`, it publishes
/// batches until that one, appends it (the broker has it), reports its rows, and never
/// returns: the relay is killed before it can mark them.
struct Recorder {
    by: &'static str,
    log: Log,
    die_at: Option<(usize, std::sync::mpsc::Sender<Vec<i64>>)>,
    batches: std::sync::atomic::AtomicUsize,
}

impl Publisher for Recorder {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        append(
            &self.log,
            self.by,
            batch.iter().map(|m| {
                let e: OrderStep = serde_json::from_str(&m.payload).unwrap();
                (e.order_id, e.step, m.id)
            }),
        );
        let n = self.batches.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((at, died)) = &self.die_at
            && n == *at
        {
            died.send(batch.iter().map(|m| m.seq).collect()).unwrap();
            std::future::pending::<()>().await;
        }
        vec![Delivery::Published; batch.len()]
    }
}

const ORDERS: i64 = 5;
const STEPS: i64 = 20;
const TOTAL: usize = (ORDERS * STEPS) as usize;
const LEASE: Duration = Duration::from_secs(8);

fn config(relay_id: &str) -> RelayConfig {
    RelayConfig {
        relay_id: relay_id.into(),
        mode: Mode::Leader,
        batch_size: 10,
        // One batch at a time: the batch A dies with is the only one published and unmarked.
        max_in_flight: 1,
        lease: LEASE,
        publish_timeout: Duration::from_secs(2),
        ..common::quick_config()
    }
}

fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(sql))
        .get_result(conn)
        .unwrap()
}

fn library(db: &PgDb) {
    println!("\n2. Mode::Leader: relay A leads, relay B stands by; A dies mid-batch.");
    let mut conn = db.conn();
    diesel::sql_query("DELETE FROM outbox_events")
        .execute(&mut conn)
        .unwrap();
    write_steps(
        &mut conn,
        (1..=STEPS).flat_map(|step| (1..=ORDERS).map(move |order| (order, step))),
    );
    let log: Log = Arc::default();
    let (died, a_died) = std::sync::mpsc::channel();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };

    let relay_a = Relay::new(
        PgRelayStore::new(db.url.clone()),
        Recorder {
            by: "A",
            log: log.clone(),
            die_at: Some((3, died)),
            batches: Default::default(),
        },
        config("relay-a"),
    )
    .unwrap();
    let a_stats = relay_a.stats();
    let runtime_a = runtime();
    runtime_a.spawn(relay_a.run(std::future::pending()));
    let started = Instant::now();
    while !a_stats.active.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    ensure(a_stats.active.load(Ordering::Relaxed), "relay A to lead");

    let relay_b = Relay::new(
        PgRelayStore::new(db.url.clone()),
        Recorder {
            by: "B",
            log: log.clone(),
            die_at: None,
            batches: Default::default(),
        },
        config("relay-b"),
    )
    .unwrap();
    let b_stats = relay_b.stats();
    let (fenced, fence_checked) = tokio::sync::oneshot::channel::<()>();
    let runtime_b = runtime();
    let b_done = runtime_b.spawn(relay_b.run(async move {
        let _ = fence_checked.await;
    }));

    // A has a batch published and unmarked; B is up as a standby: kill A.
    let in_flight: Vec<i64> = a_died
        .recv_timeout(Duration::from_secs(10))
        .expect("relay A to reach its third batch");
    while count(&mut conn, "(SELECT COUNT(*) FROM outbox_relays)") < 2
        && started.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    ensure(
        !b_stats.active.load(Ordering::Relaxed),
        "relay B to stand by while A leads",
    );
    let a_published = log.lock().unwrap().len();
    runtime_a.shutdown_background(); // its tasks and its database connection are gone
    let killed = Instant::now();
    println!(
        "   A published {a_published} events in 3 batches and died before marking the last {}",
        in_flight.len()
    );

    while log
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect::<HashSet<_>>()
        .len()
        < TOTAL
        && killed.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    // While B leads: A's id can neither lead again nor mark the rows it lost.
    let (took_back, marked) = runtime_b.block_on(async {
        let mut zombie = PgRelayStore::new(db.url.clone());
        let took_back = zombie.acquire_leadership("relay-a", LEASE).await.unwrap();
        let marked = zombie
            .complete("relay-a", &in_flight, Completion::MarkPublished)
            .await
            .unwrap();
        (took_back, marked)
    });
    let _ = fenced.send(());
    runtime_b.block_on(b_done).unwrap();

    let log = log.lock().unwrap().clone();
    let distinct: HashSet<_> = log.iter().map(|e| e.id).collect();
    let first_b = log.iter().position(|e| e.by == "B");
    let takeover = first_b.map(|i| log[i].at.duration_since(killed));
    let a_ids: Vec<_> = log.iter().filter(|e| e.by == "A").map(|e| e.id).collect();
    let unmarked = &a_ids[a_ids.len() - in_flight.len()..];
    let twice: Vec<_> = log
        .iter()
        .filter(|e| e.by == "B" && a_ids.contains(&e.id))
        .map(|e| e.id)
        .collect();
    let raw = steps_by_order(&log, false);
    let applied = steps_by_order(&log, true);
    let expected: Vec<i64> = (1..=STEPS).collect();
    println!(
        "   B took over {:.1?} after A died (lease {LEASE:?}; B reaped A: {})",
        takeover.unwrap_or_default(),
        b_stats.reaped.load(Ordering::Relaxed)
    );
    println!(
        "   {} messages, {} distinct; {} published twice (A's unmarked batch); order 1 on the wire: {:?}",
        log.len(),
        distinct.len(),
        twice.len(),
        raw[&1]
    );
    println!(
        "   after dedup by id, order 1: {:?}; A's id takes the leadership back: {took_back}, marks {marked} of its lost rows",
        applied[&1]
    );
    expect(distinct.len() == TOTAL, "every event published (none lost)");
    expect(
        takeover.is_some_and(|t| t < LEASE),
        "the standby to take over within the lease",
    );
    expect(
        first_b.is_some_and(|i| log[i..].iter().all(|e| e.by == "B")),
        "one leader publishing at a time",
    );
    expect(
        twice.len() == in_flight.len() && twice.iter().all(|id| unmarked.contains(id)),
        "duplicates only of the batch A published and did not mark",
    );
    expect(
        applied.len() == ORDERS as usize && applied.values().all(|s| *s == expected),
        "every order in order once deduplicated by event id",
    );
    expect(!took_back && marked == 0, "the dead leader fenced out");
}

fn main() {
    let db = PgDb::new("leader_failover");
    naive(&db);
    library(&db);
    println!(
        "\nA leader flag needs a lease and fencing: the standby takes over when the lease lapses or\nthe leader's session ends, and a leader that lost it can no longer mark rows. Publishing\nstays at least once: what the old leader sent and did not mark goes again, under the same\nids, and consumers deduplicate by id."
    );
}
