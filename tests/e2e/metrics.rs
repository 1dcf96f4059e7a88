//! `outbox relay --metrics-addr`: Prometheus metrics during a real drain (PostgreSQL,
//! noida-db), and `/readyz` following a broker that is cut and restored.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use diesel::Connection;
use outbox::prelude::*;

use crate::faults::{CuttableBroker, free_port};
use crate::harness::*;
use crate::scenarios::{fill, pending_pg};
use crate::support::*;

/// `GET path` on `addr`: the status code and the body (`None` if nothing listens yet).
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

/// A sample's value in a Prometheus text page (`name` exactly, no labels).
fn value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn wait_for<T>(what: &str, deadline: Duration, mut f: impl FnMut() -> Option<T>) -> (T, Duration) {
    let start = Instant::now();
    loop {
        if let Some(t) = f() {
            return (t, start.elapsed());
        }
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn metrics_move_during_a_drain_and_the_backlog_reaches_zero() {
    let db = TestDatabase::postgres("e2e_metrics");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    fill!(conn, 50, 100); // 5,000 events
    let addr = format!("127.0.0.1:{}", free_port());
    let prefix = unique_prefix("metrics");
    let relay = RelayProcess::spawn(
        &db.url,
        &noida(),
        "sharded",
        &prefix,
        &["--metrics-addr", &addr, "--batch-size", "100"],
    );
    let (first, _) = wait_for("/metrics", Duration::from_secs(30), || {
        let (code, page) = get(&addr, "/metrics")?;
        (code == 200).then_some(page)
    });
    assert_eq!(get(&addr, "/healthz").unwrap().0, 200);
    let mut seen = vec![value(&first, "outbox_relay_published_total").unwrap_or(0.0)];
    let start = Instant::now();
    while pending_pg(&db.url) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the outbox never drained"
        );
        if let Some((200, page)) = get(&addr, "/metrics") {
            seen.push(value(&page, "outbox_relay_published_total").unwrap_or(0.0));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The backlog gauge is sampled every 10 s: it reaches 0 within a sample or two.
    let (page, after) = wait_for("the backlog gauge at 0", Duration::from_secs(30), || {
        let (_, page) = get(&addr, "/metrics")?;
        (value(&page, "outbox_relay_backlog") == Some(0.0)
            && value(&page, "outbox_relay_published_total") == Some(5_000.0))
        .then_some(page)
    });
    drop(relay);
    eprintln!(
        "published_total while draining: {seen:?}; backlog gauge 0 {after:?} after the drain"
    );
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "a counter never goes down: {seen:?}"
    );
    let distinct: std::collections::BTreeSet<u64> = seen.iter().map(|v| *v as u64).collect();
    assert!(
        distinct.len() >= 3,
        "seen moving, not only its start and end: {seen:?}"
    );
    assert_eq!(
        value(&page, "outbox_relay_claimed_total"),
        Some(5_000.0),
        "{page}"
    );
    assert_eq!(
        value(&page, "outbox_relay_dead_lettered_total").unwrap_or(0.0),
        0.0
    );
    assert_eq!(
        value(&page, "outbox_relay_commit_to_ack_seconds_count"),
        Some(5_000.0),
        "{page}"
    );
    assert!(
        value(&page, "outbox_relay_claim_duration_seconds_count").unwrap() >= 50.0,
        "{page}"
    );
    assert!(value(&page, "outbox_relay_publish_duration_seconds_count").unwrap() >= 50.0);
    assert!(value(&page, "outbox_relay_mark_duration_seconds_count").unwrap() >= 50.0);
    assert_eq!(value(&page, "outbox_relay_shards"), Some(256.0), "{page}");
    assert_eq!(
        value(&page, "outbox_relay_oldest_pending_age_seconds"),
        Some(0.0)
    );
    assert!(
        page.contains("# HELP outbox_relay_published_total"),
        "described: {page}"
    );
}

#[test]
fn readyz_turns_unready_within_a_lease_of_a_broker_cut_and_ready_after() {
    let broker = CuttableBroker::start();
    let db = TestDatabase::postgres("e2e_readyz");
    let addr = format!("127.0.0.1:{}", free_port());
    let prefix = unique_prefix("readyz");
    let lease = Duration::from_millis(6_000); // the harness's --lease
    let relay = RelayProcess::spawn(
        &db.url,
        &broker.address(),
        "sharded",
        &prefix,
        &["--metrics-addr", &addr],
    );
    wait_for("ready", Duration::from_secs(30), || {
        (get(&addr, "/readyz")?.0 == 200).then_some(())
    });
    broker.cut();
    let ((), unready) = wait_for("unready", Duration::from_secs(30), || {
        let (code, body) = get(&addr, "/readyz")?;
        (code == 503 && body.contains("broker")).then_some(())
    });
    assert_eq!(get(&addr, "/healthz").unwrap().0, 200, "alive all along");
    broker.restore();
    let ((), ready) = wait_for("ready again", Duration::from_secs(30), || {
        (get(&addr, "/readyz")?.0 == 200).then_some(())
    });
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderCreated {
            order_id: 1,
            total_cents: 1,
        })?;
        Ok::<_, AppError>(())
    })
    .unwrap();
    wait_for("delivery after the cut", Duration::from_secs(30), || {
        (pending_pg(&db.url) == 0).then_some(())
    });
    drop(relay);
    eprintln!(
        "/readyz: unready {unready:?} after the cut (lease {lease:?}), ready {ready:?} after the restore"
    );
    assert!(
        unready <= lease,
        "unready {unready:?} after the cut: more than a lease"
    );
}
