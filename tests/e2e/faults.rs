//! Outages: a broker stopped for 30 s and a PostgreSQL server restarted, both mid-drain, on
//! private instances so that other tests are not disturbed. The relay recovers on its own and
//! nothing is lost.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use diesel::Connection;
use outbox::prelude::*;

use crate::chaos::services::PrivatePostgres;
use crate::harness::*;
use crate::scenarios::{fill, pending_pg};
use crate::support::*;

/// The broker the outage tests cut: a private tansu broker behind a proxy.
pub(crate) use crate::chaos::services::{PrivateBroker as CuttableBroker, free_port};

/// What `outbox status` prints about the relays.
fn status_relays(url: &str) -> String {
    outbox_ok(&["status", "--database-url", url])
        .lines()
        .filter(|l| l.starts_with("relay") || l.starts_with("   "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn dead_pg(url: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    use diesel::RunQueryDsl;
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query("SELECT COUNT(*) AS n FROM outbox_events WHERE dead_at IS NOT NULL")
        .get_result::<N>(&mut c)
        .unwrap()
        .n
}

/// A 30 s broker outage with `--max-attempts 2` (every publish in it fails): an outage is
/// never the events' fault, so nothing is dead-lettered, nothing lost, order kept; `outbox
/// status` shows the relay waiting for the broker; delivery resumes within 5 s of its return.
#[test]
fn relay_rides_out_a_30s_broker_outage() {
    let broker = CuttableBroker::start();
    let brokers = broker.address();
    let db = TestDatabase::postgres("e2e_broker_down");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    fill!(conn, 100, 100);
    let prefix = unique_prefix("brokerdown");
    let mut relay = RelayProcess::spawn(
        &db.url,
        &brokers,
        "sharded",
        &prefix,
        &["--batch-size", "100", "--max-attempts", "2"],
    );
    let start = Instant::now();
    while pending_pg(&db.url) > 7_000 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.cut();
    let during = pending_pg(&db.url);
    std::thread::sleep(Duration::from_secs(15));
    let status = status_relays(&db.url);
    assert!(
        status.contains(&format!("{} (sharded): waiting_for_broker", relay.id)),
        "outbox status shows the relay waiting for the broker: {status}"
    );
    std::thread::sleep(Duration::from_secs(15));
    let stuck = pending_pg(&db.url);
    assert!(
        stuck > 0,
        "nothing can be published while the broker is unreachable"
    );
    assert_eq!(dead_pg(&db.url), 0, "an outage dead-letters nothing");
    broker.restore();
    let restored = Instant::now();
    while pending_pg(&db.url) == stuck {
        assert!(
            restored.elapsed() < Duration::from_secs(30),
            "delivery did not resume"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let resumed = restored.elapsed();
    wait_drained(|| pending_pg(&db.url), Duration::from_secs(180));
    let messages = consume(
        &brokers,
        &format!("{prefix}order-lifecycle"),
        10_000,
        Duration::from_secs(60),
    );
    let status_after = status_relays(&db.url);
    relay.terminate();
    eprintln!(
        "broker outage 30 s ({during} pending at the cut): delivery resumed {resumed:?} after \
         the broker's return; status during the outage:\n{status}\nafter:\n{status_after}"
    );
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(
        ids.len(),
        10_000,
        "nothing lost ({during} were pending when the broker went away)"
    );
    assert_eq!(dead_pg(&db.url), 0, "nothing dead-lettered");
    assert_per_key_order(&messages);
    assert!(
        resumed < Duration::from_secs(5),
        "delivery resumed within 5 s of the broker's return: {resumed:?}"
    );
    assert!(
        status_after.contains(": running"),
        "running again: {status_after}"
    );
    let log = relay.log_text();
    assert!(
        log.contains("broker unavailable; waiting for it"),
        "the relay saw the outage: {log}"
    );
}

#[test]
fn relay_rides_out_a_postgres_restart() {
    let pg = PrivatePostgres::start();
    let url = pg.url();
    let mut conn = diesel::PgConnection::establish(&url).unwrap();
    outbox::migrations::run(&mut conn).unwrap();
    fill!(conn, 100, 100);
    drop(conn);
    let prefix = unique_prefix("pgrestart");
    let mut relay =
        RelayProcess::spawn(&url, &noida(), "sharded", &prefix, &["--batch-size", "100"]);
    let start = Instant::now();
    while pending_pg(&url) > 7_000 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    pg.ctl("restart");
    wait_drained(|| pending_pg(&url), Duration::from_secs(180));
    let messages = consume(
        &noida(),
        &format!("{prefix}order-lifecycle"),
        10_000,
        Duration::from_secs(60),
    );
    relay.terminate();
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(ids.len(), 10_000, "nothing lost across the restart");
    assert_per_key_order(&messages);
    assert!(
        relay.log_text().contains("outbox store unavailable")
            || relay.log_text().contains("settling a batch failed"),
        "the relay saw the outage: {}",
        relay.log_text()
    );
}
