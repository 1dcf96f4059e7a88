//! Polling publisher versus change data capture: latency, load on the database, operations. Starts a private PostgreSQL cluster (`wal_level = logical`; server binaries under /usr/lib/postgresql).
//!
//! The same events go out two ways at once: the polling relay (500 ms poll; then woken by the
//! writers' throttled `NOTIFY`, the default on PostgreSQL) and a CDC reader streaming the logical slot (`pg_recvlogical`, test_decoding).
//! Measured: commit-to-delivery latency of ten events, one per transaction, and the WAL each
//! way writes per event (the relay marks every row published, an `UPDATE`; the CDC reader
//! writes nothing). The price of CDC is operational: `wal_level = logical` (a restart), a
//! replication slot that retains WAL while its reader is down (replication_slot_retains_wal),
//! a connector to run and replication privileges; the relay needs none of these.

mod common;

use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{OrderPlaced, PrivatePg, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, PgRelayStore, RelayConfig};

const LSN: &str = "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint";

fn main() {
    let pg = PrivatePg::start();
    let mut conn = PgConnection::establish(&pg.url()).unwrap();
    outbox::migrations::run(&mut conn).unwrap();
    diesel::sql_query("SELECT pg_create_logical_replication_slot('cdc', 'test_decoding')")
        .execute(&mut conn)
        .unwrap();

    // The CDC reader: a streaming replication connection; each COMMIT is timed on arrival.
    // Killed when dropped (also when a demonstration fails and unwinds out of `main`), and
    // `--no-loop`: it would otherwise retry for ever once the private cluster is gone.
    let mut reader = Reader(
        std::process::Command::new(PrivatePg::bin("pg_recvlogical"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &pg.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "--slot",
                "cdc",
                "--start",
                "--no-loop",
                "-F",
                "0",
                "-f",
                "-",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start pg_recvlogical"),
    );
    let (commits_tx, commits) = std::sync::mpsc::channel();
    let out = reader.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        // Only transactions that inserted outbox rows count (the relay's own writes are
        // decoded too).
        let mut inserted = false;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            inserted |= line.starts_with("table public.outbox_events: INSERT");
            if line.starts_with("COMMIT")
                && std::mem::take(&mut inserted)
                && commits_tx.send(Instant::now()).is_err()
            {
                break;
            }
        }
    });

    let broker = Arc::new(MemoryBroker::new());
    let mut results = Vec::new();
    for listen in [false, true] {
        let relay = Background::start(&pg, &broker, listen);
        let (mut relay_ms, mut cdc_ms) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            // Past the relay's wake window (after a batch it claims again every 2 ms for
            // `RelayConfig::wake_window`, 150 ms), so that the polling relay waits for its poll
            // as a quiet outbox's would: spaced 120 ms apart the events came within the window
            // and "polling" averaged 47 ms.
            std::thread::sleep(Duration::from_millis(250));
            let start = Instant::now();
            let published = broker.all_records().len();
            conn.transaction_with_outbox(|tx| {
                tx.publish(&OrderPlaced {
                    order_id: 1,
                    total_cents: 1,
                })
            })
            .unwrap();
            let cdc_at = commits
                .recv_timeout(Duration::from_secs(10))
                .expect("the CDC reader to see the commit");
            while broker.all_records().len() == published {
                std::thread::sleep(Duration::from_millis(1));
            }
            relay_ms.push(start.elapsed().as_secs_f64() * 1000.0);
            cdc_ms.push(cdc_at.duration_since(start).as_secs_f64() * 1000.0);
        }
        relay.stop();
        let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        results.push((avg(&relay_ms), avg(&cdc_ms)));
    }
    let [(polling, cdc), (notified, _)] = results[..] else {
        unreachable!()
    };
    println!("1. Latency, commit to delivery, ten events one per transaction (average):");
    println!(
        "   polling relay (500 ms poll): {polling:.0} ms; relay woken by NOTIFY: {notified:.1} ms; CDC stream: {cdc:.1} ms"
    );
    expect(
        cdc < polling / 4.0,
        "the stream to deliver well before the next poll",
    );

    println!("\n2. Load: WAL written per event to get 1,000 events out.");
    let before = PrivatePg::bigint(&mut conn, LSN);
    conn.transaction_with_outbox(|tx| {
        (0..1000).try_for_each(|order_id| {
            tx.publish(&OrderPlaced {
                order_id,
                total_cents: 1,
            })
        })
    })
    .unwrap();
    let inserted = PrivatePg::bigint(&mut conn, LSN);
    commits
        .recv_timeout(Duration::from_secs(10))
        .expect("the CDC reader to see the batch");
    let after_cdc = PrivatePg::bigint(&mut conn, LSN);
    let relay = Background::start(&pg, &broker, true);
    while broker.all_records().len() < 1020 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let after_relay = PrivatePg::bigint(&mut conn, LSN);
    relay.stop();
    drop(reader);
    let per = |bytes: i64| bytes as f64 / 1000.0;
    println!(
        "   writing the events: {:.0} B/event; CDC reading them: {:.1} B/event; relay marking them: {:.0} B/event",
        per(inserted - before),
        per(after_cdc - inserted),
        per(after_relay - after_cdc)
    );
    expect(
        after_relay - after_cdc > 50_000 && after_cdc - inserted < 1000,
        "the relay to write per event and CDC not to",
    );
    println!(
        "\nPolling costs a claim query per poll and an UPDATE per event; CDC costs a slot, a connector\nand wal_level = logical. Both publish only committed events."
    );
}

/// The CDC reader's process, killed (and waited for) when dropped.
struct Reader(std::process::Child);

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A relay running in a thread until stopped.
struct Background(Arc<AtomicBool>, std::thread::JoinHandle<()>);

impl Background {
    fn start(pg: &PrivatePg, broker: &Arc<MemoryBroker>, listen: bool) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let (store, broker, flag) = (
            PgRelayStore::new(pg.url()).listen(listen),
            broker.clone(),
            stop.clone(),
        );
        let config = RelayConfig {
            poll_interval: Duration::from_millis(500),
            ..common::quick_config()
        };
        Background(
            stop,
            std::thread::spawn(move || {
                common::relay_until(store, broker, config, Duration::from_secs(120), move || {
                    flag.load(Ordering::SeqCst)
                });
            }),
        )
    }

    fn stop(self) {
        self.0.store(true, Ordering::SeqCst);
        self.1.join().unwrap();
    }
}
