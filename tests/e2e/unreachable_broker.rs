//! An unreachable broker, with the binary's default log filter (no `RUST_LOG`), as a new user
//! would meet it:
//!
//! - `outbox relay` started with nothing at `--brokers` stops at once with one line naming the
//!   address;
//! - a broker lost while the relay runs: the relay's outage warning and `outbox status` name
//!   the bootstrap servers, and the log stays short (librdkafka's repeated connection errors
//!   are rate-limited, see `kafka::log` in outbox-core).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use diesel::Connection;
use outbox::prelude::*;

use crate::faults::{CuttableBroker, free_port};
use crate::harness::*;
use crate::support::*;

/// How long the broker stays cut: several publish attempts (2 s message timeout each, then
/// the outage backoff).
const CUT: Duration = Duration::from_secs(15);

/// The most log lines the relay may write while the broker is cut for [`CUT`].
const MAX_LINES: usize = 20;

/// Writes one order beside a running relay: SQLite has one writer at a time, so the connection
/// waits for the relay's claim or mark to commit (`busy_timeout`, as any application writing to
/// a SQLite file that a relay shares must set) instead of failing with "database is locked".
fn write_order(url: &str, order_id: i64) {
    let mut conn = diesel::SqliteConnection::establish(url).unwrap();
    diesel::connection::SimpleConnection::batch_execute(&mut conn, "PRAGMA busy_timeout = 5000")
        .unwrap();
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderCreated {
            order_id,
            total_cents: 100,
        })?;
        Ok::<_, outbox::Error>(())
    })
    .unwrap();
}

fn relay(url: &str, brokers: &str, log: &tempfile::NamedTempFile) -> std::process::Child {
    Command::new(outbox_bin())
        .args(["relay", "--database-url", url, "--brokers", brokers])
        .args(["--relay-id", "unreachable", "--message-timeout", "2000"])
        .args(["--lease", "6000", "--poll-interval", "100"])
        .args(["--topic-prefix", &unique_prefix("unreachable")])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .expect("the outbox binary runs")
}

fn lines(log: &tempfile::NamedTempFile) -> Vec<String> {
    std::fs::read_to_string(log.path())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_relay_started_without_a_broker_says_so_in_one_line_naming_it() {
    let db = TestDatabase::sqlite("unreachable_start");
    let brokers = format!("127.0.0.1:{}", free_port()); // bound once, then freed
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = relay(&db.url, &brokers, &log);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the relay neither started nor stopped: {:?}",
            lines(&log)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let lines = lines(&log);
    eprintln!("{} lines, {status}:\n{}", lines.len(), lines.join("\n"));
    assert!(!status.success());
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("error: cannot reach Kafka at") && l.contains(&brokers)),
        "the last line names the address: {lines:?}"
    );
    assert!(lines.len() <= 6, "a short log: {lines:?}");
    assert!(
        !lines.iter().any(|l| l.contains("enable.gapless.guarantee")),
        "librdkafka's start-up warning about the gap-less guarantee is at debug: {lines:?}"
    );
}

/// The same for NATS and RabbitMQ (`--broker`): the relay's start-up check fails within its
/// 10 s, naming the address without the password.
#[test]
fn every_broker_unreachable_at_start_is_named_without_its_password() {
    let db = TestDatabase::sqlite("unreachable_brokers");
    for (url, shown) in [
        (
            format!("nats://relay:hunter2@127.0.0.1:{}", free_port()),
            "nats://relay:***@127.0.0.1:",
        ),
        (
            format!("amqp://relay:hunter2@127.0.0.1:{}/%2f", free_port()),
            "amqp://relay:***@127.0.0.1:",
        ),
    ] {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new(outbox_bin())
            .args([
                "relay",
                "--database-url",
                &db.url,
                "--relay-id",
                "unreachable",
            ])
            .env("OUTBOX_BROKER", &url)
            .env_remove("KAFKA_BROKERS")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log.reopen().unwrap()))
            .spawn()
            .expect("the outbox binary runs");
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the relay neither started nor stopped: {:?}",
                lines(&log)
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let lines = lines(&log);
        eprintln!(
            "{url}: {} lines, {status}:\n{}",
            lines.len(),
            lines.join("\n")
        );
        assert!(!status.success());
        assert!(
            lines
                .last()
                .is_some_and(|l| l.starts_with("error: ") && l.contains(shown)),
            "the last line names the address: {lines:?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("hunter2")),
            "no password: {lines:?}"
        );
        assert!(lines.len() <= 6, "a short log: {lines:?}");
    }
}

#[test]
fn a_broker_lost_while_relaying_is_named_and_the_log_stays_short() {
    let broker = CuttableBroker::start();
    let brokers = broker.address();
    let db = TestDatabase::sqlite("unreachable_cut");
    write_order(&db.url, 1);
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = relay(&db.url, &brokers, &log);
    let started = Instant::now();
    while !outbox_ok(&["status", "--database-url", &db.url]).contains("published (kept):   1") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the first event was never published: {:?}",
            lines(&log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = lines(&log).len();
    broker.cut();
    write_order(&db.url, 2);
    let cut = Instant::now();
    let mut status = String::new();
    while cut.elapsed() < CUT {
        std::thread::sleep(Duration::from_millis(500));
        status = outbox_ok(&["status", "--database-url", &db.url]);
    }
    let _ = child.kill();
    let _ = child.wait();
    let during: Vec<String> = lines(&log).split_off(before);
    eprintln!(
        "{} lines in the {CUT:?} the broker at {brokers} was cut:\n{}\nstatus:\n{status}",
        during.len(),
        during.join("\n")
    );
    assert!(
        during
            .iter()
            .any(|l| l.contains("broker unavailable") && l.contains(&brokers)),
        "the relay's outage warning names the bootstrap servers: {during:?}"
    );
    assert!(
        status.contains("unreachable (sharded): waiting_for_broker"),
        "`outbox status` shows the relay waiting for the broker: {status}"
    );
    assert!(
        status
            .lines()
            .any(|l| l.contains("last outage:") && l.contains(&brokers)),
        "`outbox status` names the bootstrap servers: {status}"
    );
    assert!(
        during.len() <= MAX_LINES,
        "{} lines in {CUT:?} (at most {MAX_LINES}): {during:?}",
        during.len()
    );
}
