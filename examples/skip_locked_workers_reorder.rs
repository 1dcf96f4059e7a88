//! Scaling relays: `SKIP LOCKED` workers share the rows but reorder an aggregate's events; sharded relays keep the order. Needs PostgreSQL (`DATABASE_URL`).
//!
//! Two naive workers claim from one outbox table with `FOR UPDATE SKIP LOCKED`. Worker A
//! takes order 7's steps 1 and 2 and is slow to publish them; worker B skips the locked rows,
//! takes step 3 and publishes it at once. The ordered log (one partition per key, as on Kafka)
//! gets order 7 as 3, 1, 2: no row was published twice, and the order is gone. Then three
//! real relays in `Mode::Sharded` drain 30 orders of 4 steps with batches of 2, the relay
//! holding order 7's first batch kept slow until the others have published 10 events: each order's
//! steps arrive as 1, 2, 3, 4, because an aggregate's shard belongs to one relay at a time
//! and its later events wait until the earlier ones are settled.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{PgDb, ensure, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{Delivery, Mode, OutboxMessage, PgRelayStore, Publisher, RelayConfig};

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
    worker: &'static str,
    order: i64,
    step: i64,
    id: uuid::Uuid,
}

type Log = Arc<Mutex<Vec<Entry>>>;

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

/// Each order's steps in the order the log received them.
fn steps_by_order(log: &[Entry]) -> BTreeMap<i64, Vec<i64>> {
    let mut by_order: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for e in log {
        by_order.entry(e.order).or_default().push(e.step);
    }
    by_order
}

fn write_steps(conn: &mut PgConnection, events: impl IntoIterator<Item = (i64, i64)>) {
    for (order_id, step) in events {
        conn.transaction_with_outbox(|tx| tx.publish(&OrderStep { order_id, step }))
            .unwrap();
    }
}

/// A naive worker's claim: up to `limit` pending rows, locked, skipping locked ones.
fn claim(c: &mut PgConnection, limit: i64) -> QueryResult<Vec<Row>> {
    diesel::sql_query(format!(
        "SELECT seq, aggregate_id, (payload->>'step')::bigint AS step, id FROM outbox_events \
         WHERE published_at IS NULL ORDER BY seq LIMIT {limit} FOR UPDATE SKIP LOCKED"
    ))
    .load(c)
}

/// A naive worker's publish and mark: append to the log, then mark the rows published.
fn publish_and_mark(c: &mut PgConnection, worker: &'static str, rows: &[Row], log: &Log) {
    log.lock().unwrap().extend(rows.iter().map(|r| Entry {
        worker,
        order: r.aggregate_id.parse().unwrap(),
        step: r.step,
        id: r.id,
    }));
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    diesel::sql_query("UPDATE outbox_events SET published_at = now() WHERE seq = ANY($1)")
        .bind::<diesel::sql_types::Array<diesel::sql_types::BigInt>, _>(seqs)
        .execute(c)
        .unwrap();
}

/// A publisher for one relay that appends to the shared log. The first batch holding order
/// 7's step 1 is slow: it waits until the other relays have published 10 events.
struct Recorder {
    relay: &'static str,
    log: Log,
    hold: Arc<Hold>,
}

/// What happened while order 7's first batch was held.
#[derive(Default)]
struct Hold {
    taken: AtomicBool,
    /// (relay holding it, events the others published meanwhile, of which order 7's)
    seen: Mutex<Option<(&'static str, usize, usize)>>,
}

impl Publisher for Recorder {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let events: Vec<OrderStep> = batch
            .iter()
            .map(|m| serde_json::from_str(&m.payload).unwrap())
            .collect();
        let first_of_7 = events.iter().any(|e| e.order_id == 7 && e.step == 1);
        if first_of_7 && !self.hold.taken.swap(true, Ordering::SeqCst) {
            let from = self.log.lock().unwrap().len();
            let started = Instant::now();
            let others = || -> Vec<Entry> {
                let log = self.log.lock().unwrap();
                log[from..]
                    .iter()
                    .filter(|e| e.worker != self.relay)
                    .cloned()
                    .collect()
            };
            // A bound only (the publish timeout is 2 s): the others publish within milliseconds.
            while others().len() < 10 && started.elapsed() < Duration::from_millis(1500) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let meanwhile = others();
            let of_7 = meanwhile.iter().filter(|e| e.order == 7).count();
            *self.hold.seen.lock().unwrap() = Some((self.relay, meanwhile.len(), of_7));
        }
        let mut log = self.log.lock().unwrap();
        for (m, e) in batch.iter().zip(&events) {
            log.push(Entry {
                worker: self.relay,
                order: e.order_id,
                step: e.step,
                id: m.id,
            });
        }
        vec![Delivery::Published; batch.len()]
    }
}

fn main() {
    let db = PgDb::new("skip_reorder");
    let mut conn = db.conn();

    println!("1. Two naive workers, FOR UPDATE SKIP LOCKED, one table.");
    write_steps(&mut conn, (1..=3).map(|step| (7, step)));
    write_steps(&mut conn, (1..=3).map(|step| (8, step)));
    let log: Log = Arc::default();
    let (claimed, a_claimed) = std::sync::mpsc::channel();
    let (go, a_may_publish) = std::sync::mpsc::channel::<()>();
    let (url, a_log) = (db.url.clone(), log.clone());
    let worker_a = std::thread::spawn(move || {
        let mut c = PgConnection::establish(&url).unwrap();
        c.transaction::<_, diesel::result::Error, _>(|c| {
            let rows = claim(c, 2)?;
            claimed.send(rows.len()).unwrap();
            a_may_publish.recv().unwrap(); // slow: a GC pause, a slow broker, a full batch
            publish_and_mark(c, "A", &rows, &a_log);
            Ok(rows.len())
        })
        .unwrap()
    });
    let a_took = a_claimed.recv().unwrap();
    // Worker B claims while A holds its rows: it skips them and takes the next ones.
    let b_took = conn
        .transaction::<_, diesel::result::Error, _>(|c| {
            let rows = claim(c, 10)?;
            publish_and_mark(c, "B", &rows, &log);
            Ok(rows.len())
        })
        .unwrap();
    go.send(()).unwrap();
    worker_a.join().unwrap();
    let naive = log.lock().unwrap().clone();
    let ids: HashSet<_> = naive.iter().map(|e| e.id).collect();
    let by_order = steps_by_order(&naive);
    println!("   worker A claimed {a_took} rows, worker B {b_took}; the log got:");
    for e in &naive {
        println!(
            "     order {} step {} (worker {})",
            e.order, e.step, e.worker
        );
    }
    println!(
        "   order 7 arrived as steps {:?}, order 8 as {:?}; {} messages, {} distinct",
        by_order[&7],
        by_order[&8],
        naive.len(),
        ids.len()
    );
    ensure(
        naive.len() == 6 && ids.len() == 6,
        "each row published once",
    );
    expect(
        by_order[&7] != [1, 2, 3],
        "order 7's step 3 published before its steps 1 and 2",
    );

    println!("\n2. Three relays in Mode::Sharded, 30 orders of 4 steps, batches of 2.");
    diesel::sql_query("DELETE FROM outbox_events")
        .execute(&mut conn)
        .unwrap();
    let log: Log = Arc::default();
    let hold: Arc<Hold> = Arc::default();
    const TOTAL: usize = 30 * 4;
    let names = ["relay-1", "relay-2", "relay-3"];
    let stats: Arc<Mutex<Vec<Arc<outbox::relay::RelayStats>>>> = Arc::default();
    let relays: Vec<_> = names
        .into_iter()
        .map(|relay| {
            let recorder = Recorder {
                relay,
                log: log.clone(),
                hold: hold.clone(),
            };
            let config = RelayConfig {
                relay_id: relay.into(),
                mode: Mode::Sharded,
                batch_size: 2,
                lease: Duration::from_secs(3),
                publish_timeout: Duration::from_secs(2),
                ..common::quick_config()
            };
            let (url, log, stats) = (db.url.clone(), log.clone(), stats.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let relay = outbox::relay::Relay::new(PgRelayStore::new(url), recorder, config)
                    .expect("a valid relay configuration");
                stats.lock().unwrap().push(relay.stats());
                let started = Instant::now();
                runtime.block_on(relay.run(async move {
                    while log.lock().unwrap().len() < TOTAL
                        && started.elapsed() < Duration::from_secs(30)
                    {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }));
            })
        })
        .collect();
    // The workload starts once every relay holds shards (they rebalance as they join).
    let started = Instant::now();
    let shares = || -> Vec<u64> {
        let stats = stats.lock().unwrap();
        stats
            .iter()
            .map(|s| s.shards.load(Ordering::Relaxed))
            .collect()
    };
    while !(shares().len() == 3 && shares().iter().all(|&n| n > 0))
        && started.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    ensure(
        shares().iter().all(|&n| n > 0),
        "every relay to hold shards",
    );
    println!("   shards held: {:?}", shares());
    write_steps(
        &mut conn,
        (1..=4).flat_map(|step| (1..=30).map(move |order| (order, step))),
    );
    for r in relays {
        r.join().unwrap();
    }
    let log = log.lock().unwrap().clone();
    let ids: HashSet<_> = log.iter().map(|e| e.id).collect();
    let by_order = steps_by_order(&log);
    let in_order = by_order.values().filter(|s| **s == [1, 2, 3, 4]).count();
    let per_relay: Vec<usize> = names
        .iter()
        .map(|n| log.iter().filter(|e| e.worker == *n).count())
        .collect();
    let (holder, meanwhile, of_7) = hold.seen.lock().unwrap().unwrap_or(("none", 0, 0));
    println!(
        "   {holder} held order 7's first batch while the others published {meanwhile} events ({of_7} of order 7)"
    );
    println!(
        "   {} messages, {} distinct, per relay {per_relay:?}; order 7 arrived as {:?}",
        log.len(),
        ids.len(),
        by_order.get(&7).cloned().unwrap_or_default()
    );
    println!("   orders whose steps arrived as [1, 2, 3, 4]: {in_order} of 30");
    ensure(
        log.len() == TOTAL && ids.len() == TOTAL,
        "every event published once",
    );
    expect(
        meanwhile > 0 && of_7 == 0,
        "the other relays to keep publishing, none of order 7's later steps",
    );
    expect(in_order == 30, "every order's steps in order");
    println!(
        "\nSKIP LOCKED shares rows, not aggregates: to keep order, an aggregate's events must go\nthrough one relay at a time (Mode::Sharded), and its later events wait for the earlier ones."
    );
}
