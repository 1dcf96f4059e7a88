//! Scenario 4: the database breaks under the relays and the writers.
//!
//! - PostgreSQL restarted mid-drain (a private cluster, `pg_ctl restart -m fast`: every session
//!   is terminated, the server is gone for a moment).
//! - The relays' sessions killed with `pg_terminate_backend` every 2 s, as an operator or a
//!   connection-killing proxy would.
//! - Writers starved of connections: more writer threads than their pool has connections,
//!   each transaction holding its connection a while; the relays have their own connections
//!   and must be unaffected.

use std::time::{Duration, Instant};

use diesel::{Connection, RunQueryDsl};

use super::services::{PrivatePostgres, relay};
use super::tally::{commit_to_publish, count_up, named, outbox_rows, published, wait_settled};
use super::writers::{WriterLog, WriterSpec, Writers};
use super::{Area, Row, quantile, secs, size};
use crate::harness::{RelayProcess, noida, unique_prefix};
use crate::support::TestDatabase;

/// Reads back, counts, and records the figures every database scenario shares.
fn finish_common(
    row: &mut Row,
    url: &str,
    prefix: &str,
    log: &WriterLog,
    relays: &mut [RelayProcess],
) -> Vec<f64> {
    let rows = outbox_rows(url);
    let records = super::reader::read_published(&noida(), prefix, &rows);
    let exited = relays
        .iter_mut()
        .filter_map(|r| r.child.try_wait().ok())
        .filter(Option::is_some)
        .count();
    for r in relays.iter_mut() {
        r.terminate();
    }
    let (tally, first) = count_up(&rows, &records, Some(log));
    row.tally = tally;
    row.figure("relay processes that exited on their own", exited);
    row.figure(
        "writers",
        format!(
            "{} events committed in {:.1} s, {} transactions failed (fault), {} events of them ambiguous (COMMIT's fate unknown to the writer; the table decides)",
            log.committed.len(),
            log.elapsed.as_secs_f64(),
            log.failed,
            log.ambiguous.len()
        ),
    );
    let t = row.tally.clone();
    row.target_intact();
    row.target("0 dead letters", t.dead_lettered, t.dead_lettered == 0);
    commit_to_publish(&rows, &first, log, None)
}

fn latency_figures(row: &mut Row, mut latency: Vec<f64>) {
    let fmt = |v: Option<f64>| v.map_or("-".to_owned(), secs);
    let median = quantile(&mut latency, 0.5);
    let p99 = quantile(&mut latency, 0.99);
    row.figure("commit → publish, median", fmt(median));
    row.figure("commit → publish, p99", fmt(p99));
}

fn wait_published(url: &str, at_least: i64) {
    let t0 = Instant::now();
    while published(url).unwrap_or(0) < at_least {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the relays never published {at_least} events"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn chaos_postgres_restart_mid_drain() {
    restart_mid_drain(
        "postgres_restart_mid_drain",
        "PostgreSQL restarted mid-drain",
        "fast",
    );
}

/// The server crashes (`pg_ctl restart -m immediate`: killed, then recovered from its WAL).
/// The relays commit their own writes without waiting for the flush (`ASYNC_COMMIT_SQL`), so
/// the crash may take back their last claims, marks and lease renewals: that may publish
/// events again, never lose one nor break an aggregate's order (the writers' commits keep
/// `synchronous_commit = on`).
#[test]
fn chaos_postgres_crash_mid_drain() {
    restart_mid_drain(
        "postgres_crash_mid_drain",
        "PostgreSQL crashed mid-drain (immediate restart)",
        "immediate",
    );
}

fn restart_mid_drain(name: &str, title: &str, mode: &str) {
    let started = Instant::now();
    let mut row = Row::new(name, title, Area::Relay);
    let pg = PrivatePostgres::start();
    let url = pg.url();
    {
        let mut c = diesel::PgConnection::establish(&url).unwrap();
        outbox::migrations::run(&mut c).unwrap();
    }
    let prefix = unique_prefix("pgrestart");
    let backlog: u64 = size(5_000, 50_000);
    // A backlog first, written fast, then writers at a steady rate through the restart.
    let fill = Writers::start(
        &url,
        &WriterSpec {
            threads: 2,
            pool_size: 2,
            aggregates: 250,
            events: backlog,
            rate: 20_000.0,
            hold: Duration::ZERO,
        },
    )
    .join();
    let mut relays: Vec<_> = (0..3)
        .map(|_| relay(&url, &noida(), &prefix, &[]))
        .collect();
    let writers = Writers::start(
        &url,
        &WriterSpec {
            threads: 2,
            pool_size: 2,
            aggregates: 250,
            events: u64::MAX,
            rate: 200.0,
            hold: Duration::ZERO,
        },
    );
    wait_published(&url, backlog as i64 / 2);
    let restart = Instant::now();
    pg.ctl_with("restart", mode);
    let down = restart.elapsed();
    let back = Instant::now();
    let published_at_back = published(&url).unwrap_or(0);
    let resumed = loop {
        if published(&url).unwrap_or(0) > published_at_back {
            break Some(back.elapsed());
        }
        if back.elapsed() > Duration::from_secs(120) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(3));
    let mut log = writers.stop();
    log.committed.extend(fill.committed);
    log.rolled_back_after_insert += fill.rolled_back_after_insert;
    log.rolled_back_never_inserted += fill.rolled_back_never_inserted;
    let settled = wait_settled(&url, Duration::from_secs(300)).map(|_| back.elapsed());
    let latency = finish_common(&mut row, &url, &prefix, &log, &mut relays);
    latency_figures(&mut row, latency);
    let fmt =
        |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    row.recover_s = settled.map(|d| d.as_secs_f64());
    row.recover_means = "from the server accepting connections again to the backlog drained".into();
    row.figure("relays", "3 sharded, relay defaults");
    row.figure("backlog before the restart", format!("{backlog} events, restarted when half were published; writers at 200 events/s throughout"));
    row.figure(
        &format!("`pg_ctl restart -m {mode}` took"),
        format!("{:.1} s", down.as_secs_f64()),
    );
    row.figure("delivery resumed after the restart", fmt(resumed));
    row.figure("backlog drained after the restart", fmt(settled));
    row.finish(started);
}

#[test]
fn chaos_killed_database_sessions() {
    let started = Instant::now();
    let mut row = Row::new(
        "killed_database_sessions",
        "Relays' database sessions killed every 2 s",
        Area::Relay,
    );
    let db = TestDatabase::postgres("chaos_sessions");
    let prefix = unique_prefix("sessions");
    let storm = Duration::from_secs(size(10, 60));
    let mut relays: Vec<_> = (0..3)
        .map(|_| relay(&db.url, &noida(), &prefix, &[]))
        .collect();
    let writers = Writers::start(
        &named(&db.url, "chaos-writer"),
        &WriterSpec {
            threads: 2,
            pool_size: 2,
            aggregates: 250,
            events: u64::MAX,
            rate: 300.0,
            hold: Duration::ZERO,
        },
    );
    let mut admin = diesel::PgConnection::establish(&named(&db.url, "chaos-monitor")).unwrap();
    #[derive(diesel::QueryableByName)]
    struct Killed {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let (mut rounds, mut sessions) = (0, 0);
    let t0 = Instant::now();
    while t0.elapsed() < storm {
        std::thread::sleep(Duration::from_secs(2));
        let killed: Killed = diesel::sql_query(
            "SELECT COUNT(*) AS n FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
             AND application_name NOT IN ('chaos-writer', 'chaos-monitor')) k",
        )
        .get_result(&mut admin)
        .unwrap();
        rounds += 1;
        sessions += killed.n;
    }
    let log = writers.stop();
    let last_write = log.last_commit.expect("the writers committed");
    let settled = wait_settled(&db.url, Duration::from_secs(300)).map(|_| last_write.elapsed());
    let latency = finish_common(&mut row, &db.url, &prefix, &log, &mut relays);
    latency_figures(&mut row, latency);
    row.recover_s = settled.map(|d| d.as_secs_f64());
    row.recover_means = "from the last write (and the last kill) to the backlog drained".into();
    row.figure("relays", "3 sharded, relay defaults");
    row.figure(
        "kill rounds",
        format!(
            "{rounds} (every 2 s for {} s), {sessions} sessions terminated",
            storm.as_secs()
        ),
    );
    row.figure(
        "drain after the last write",
        settled.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
    );
    row.finish(started);
}

#[test]
fn chaos_writer_pool_exhaustion() {
    let started = Instant::now();
    let mut row = Row::new(
        "writer_pool_exhaustion",
        "Writers starved of pool connections",
        Area::Relay,
    );
    let db = TestDatabase::postgres("chaos_pool");
    let prefix = unique_prefix("pool");
    let run = Duration::from_secs(size(10, 60));
    let mut relays: Vec<_> = (0..2)
        .map(|_| relay(&db.url, &noida(), &prefix, &[]))
        .collect();
    let spec = WriterSpec {
        threads: 16,
        pool_size: 4,
        aggregates: 50,
        events: u64::MAX,
        rate: 5_000.0,
        hold: Duration::from_millis(20),
    };
    let writers = Writers::start(&db.url, &spec);
    std::thread::sleep(run);
    let mut log = writers.stop();
    let last_write = log.last_commit.expect("the writers committed");
    let settled = wait_settled(&db.url, Duration::from_secs(300)).map(|_| last_write.elapsed());
    let latency = finish_common(&mut row, &db.url, &prefix, &log, &mut relays);
    latency_figures(&mut row, latency);
    let mut waits: Vec<f64> = log
        .pool_waits
        .drain(..)
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    let fmt_ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
    row.recover_s = settled.map(|d| d.as_secs_f64());
    row.recover_means = "from the last write to the backlog drained".into();
    row.figure("relays", "2 sharded, relay defaults, their own connections");
    row.figure("writers", format!("{} threads on a pool of {} (r2d2, default 30 s checkout timeout), each transaction holding its connection {} ms", spec.threads, spec.pool_size, spec.hold.as_millis()));
    row.figure(
        "writer transactions per second",
        format!("{:.0}", waits.len() as f64 / log.elapsed.as_secs_f64()),
    );
    row.figure(
        "pool checkout wait, median",
        fmt_ms(quantile(&mut waits, 0.5)),
    );
    row.figure(
        "pool checkout wait, p99",
        fmt_ms(quantile(&mut waits, 0.99)),
    );
    row.figure("pool checkout timeouts", log.pool_timeouts);
    row.figure(
        "drain after the last write",
        settled.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
    );
    row.finish(started);
}
