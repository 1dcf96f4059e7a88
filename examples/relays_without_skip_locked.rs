//! Scaling relays: no lock publishes twice, plain `FOR UPDATE` serialises the relays, `SKIP LOCKED` plus leases does neither. Needs PostgreSQL (`DATABASE_URL`).
//!
//! Two naive relay processes, each holding its own in-process mutex (which guards nothing
//! across processes), read the same pending rows under `READ COMMITTED` before either marks
//! them, and both publish all of them. With `FOR UPDATE` the second blocks on the first's
//! rows until its transaction (the whole publish) ends, and only then takes the next rows: two
//! relays take turns, as slow as one. With `FOR UPDATE SKIP LOCKED` the second takes the next rows at
//! once. Finally two real relays (`SKIP LOCKED`, leases) share 1,000 events with no duplicate.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{OrderPlaced, PgDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, PgRelayStore, RelayConfig};

#[derive(QueryableByName)]
struct Seq {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq: i64,
}

/// What one naive relay pass did.
struct Pass {
    rows: Vec<i64>,
    /// How long its select took (waiting for locks included).
    waited: Duration,
    /// When its select returned.
    selected_at: Instant,
}

/// How long the first relay "publishes" with its rows locked.
const HOLD: Duration = Duration::from_millis(300);

/// One naive relay pass: select up to 10 pending rows with `lock`, "publish" them (hold the
/// transaction `hold`), mark them. After the select it signals `selected`.
fn naive_pass(
    url: &str,
    lock: &str,
    selected: Option<std::sync::mpsc::Sender<()>>,
    hold: Duration,
) -> Pass {
    let mut conn = PgConnection::establish(url).unwrap();
    let (rows, waited, selected_at) = conn.transaction::<_, diesel::result::Error, _>(|c| {
        let start = Instant::now();
        let sql = format!(
            "SELECT seq FROM outbox_events WHERE published_at IS NULL ORDER BY seq LIMIT 10 {lock}"
        );
        let rows: Vec<i64> = diesel::sql_query(sql)
            .load::<Seq>(c)?
            .into_iter()
            .map(|s| s.seq)
            .collect();
        let waited = start.elapsed();
        let selected_at = Instant::now();
        if let Some(s) = selected {
            s.send(()).unwrap(); // its rows are read (and locked, if it locks)
        }
        std::thread::sleep(hold); // publishing to the broker
        let list = rows
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        if !rows.is_empty() {
            diesel::sql_query(format!(
                "UPDATE outbox_events SET published_at = now() WHERE seq IN ({list})"
            ))
            .execute(c)?;
        }
        Ok((rows, waited, selected_at))
    })
    .unwrap();
    Pass {
        rows,
        waited,
        selected_at,
    }
}

/// Two naive relays; the second starts once the first has selected. Returns both results.
fn two_relays(url: &str, lock: &'static str) -> (Pass, Pass) {
    diesel::sql_query("UPDATE outbox_events SET published_at = NULL")
        .execute(&mut PgConnection::establish(url).unwrap())
        .unwrap();
    let u1 = url.to_owned();
    let (selected, first_selected) = std::sync::mpsc::channel();
    let first = std::thread::spawn(move || naive_pass(&u1, lock, Some(selected), HOLD));
    first_selected.recv().unwrap(); // the second relay starts once the first has its rows
    let second = naive_pass(url, lock, None, Duration::ZERO);
    (first.join().unwrap(), second)
}

/// One naive relay process: an in-process mutex (real, and useless across processes), a
/// plain `SELECT`, "publish" (wait for a line on stdin), mark.
fn relay_process(url: &str) {
    static ONE_RELAY_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _guard = ONE_RELAY_AT_A_TIME.lock().unwrap();
    let mut conn = PgConnection::establish(url).unwrap();
    conn.transaction::<_, diesel::result::Error, _>(|c| {
        let sql = "SELECT seq FROM outbox_events WHERE published_at IS NULL ORDER BY seq LIMIT 10";
        let rows: Vec<String> = diesel::sql_query(sql)
            .load::<Seq>(c)?
            .into_iter()
            .map(|s| s.seq.to_string())
            .collect();
        println!("{}", rows.join(","));
        std::io::stdin().read_line(&mut String::new()).unwrap(); // publishing
        let marked = format!(
            "UPDATE outbox_events SET published_at = now() WHERE seq IN ({})",
            rows.join(",")
        );
        diesel::sql_query(marked).execute(c)?;
        Ok(())
    })
    .unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == "--relay-process" {
        return relay_process(&args[2]);
    }
    let db = PgDb::new("skip_locked");
    let mut conn = db.conn();
    for order_id in 1..=20 {
        conn.transaction_with_outbox(|tx| {
            tx.publish(&OrderPlaced {
                order_id,
                total_cents: 1,
            })
        })
        .unwrap();
    }

    println!("1. No lock (READ COMMITTED), two relay processes, each with its own mutex.");
    let mut children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--relay-process", &db.url])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Each child prints what it read, then waits for a line before marking: both have read
    // before either marks, every run.
    let read: Vec<Vec<i64>> = children
        .iter_mut()
        .map(|c| {
            let mut line = String::new();
            BufReader::new(c.stdout.as_mut().unwrap())
                .read_line(&mut line)
                .unwrap();
            line.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .collect();
    for c in &mut children {
        writeln!(c.stdin.as_mut().unwrap()).unwrap();
    }
    let ok = children
        .into_iter()
        .all(|mut c| c.wait().unwrap().success());
    let (a, b) = (&read[0], &read[1]);
    let both: Vec<_> = a.iter().filter(|s| b.contains(s)).collect();
    println!(
        "   process 1 published {a:?}\n   process 2 published {b:?}: {} rows twice.",
        both.len()
    );
    expect(
        ok && both.len() == 10,
        "every row of the batch published by both processes",
    );

    println!("\n2. FOR UPDATE: the second relay waits for the first.");
    let (one, two) = two_relays(&db.url, "FOR UPDATE");
    let (a, b) = (&one.rows, &two.rows);
    println!(
        "   relay 1 took {:?}..; relay 2 waited {:.0?} (relay 1's whole publish) before it got {:?}..",
        a.first(),
        two.waited,
        b.first()
    );
    // Relay 1 holds its rows' locks for HOLD after its select: relay 2's select returned no
    // sooner.
    expect(
        two.selected_at.duration_since(one.selected_at) >= HOLD && !a.iter().any(|s| b.contains(s)),
        "relay 2 to block until relay 1 is done",
    );

    println!("\n3. FOR UPDATE SKIP LOCKED: the second relay takes the next rows at once.");
    let (one, two) = two_relays(&db.url, "FOR UPDATE SKIP LOCKED");
    let (a, b) = (&one.rows, &two.rows);
    println!(
        "   relay 1 took {:?}..; relay 2 waited {:.0?} and took {:?}..",
        a.first(),
        two.waited,
        b.first()
    );
    // Relay 2 had its rows while relay 1 still held its locks. (Not "within 100 ms": on a
    // loaded machine connecting and selecting alone took that long.)
    expect(
        two.selected_at.duration_since(one.selected_at) < HOLD
            && b.len() == 10
            && !a.iter().any(|s| b.contains(s)),
        "disjoint batches without waiting",
    );

    println!("\n4. Two real relays (SKIP LOCKED, leases) on 1,000 events.");
    diesel::sql_query("DELETE FROM outbox_events")
        .execute(&mut conn)
        .unwrap();
    conn.transaction_with_outbox(|tx| {
        (1..=1000).try_for_each(|order_id| {
            tx.publish(&OrderPlaced {
                order_id,
                total_cents: 1,
            })
        })
    })
    .unwrap();
    let broker = Arc::new(MemoryBroker::new());
    let relays: Vec<_> = ["relay-1", "relay-2"]
        .into_iter()
        .map(|id| {
            let (url, broker, seen) = (db.url.clone(), broker.clone(), broker.clone());
            let config = RelayConfig {
                relay_id: id.into(),
                batch_size: 50,
                ..common::quick_config()
            };
            std::thread::spawn(move || {
                common::relay_until(
                    PgRelayStore::new(url),
                    broker,
                    config,
                    Duration::from_secs(30),
                    move || seen.all_records().len() >= 1000,
                )
                .1
            })
        })
        .collect();
    let shares: Vec<u64> = relays
        .into_iter()
        .map(|r| {
            r.join()
                .unwrap()
                .published
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .collect();
    let records = broker.all_records();
    let unique: HashSet<_> = records.iter().map(|r| r.id).collect();
    println!(
        "   {} messages, {} distinct; relay shares {shares:?}.",
        records.len(),
        unique.len()
    );
    expect(
        records.len() == 1000 && unique.len() == 1000,
        "every event exactly once across both relays",
    );
}
