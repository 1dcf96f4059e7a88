//! Delivery, ordering, leadership and dead letters through relay processes.

use std::collections::HashSet;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, RunQueryDsl};
use outbox::prelude::*;

use crate::harness::*;
use crate::support::*;

/// Writes `per` events for each of `aggregates` aggregates (interleaved), 2,000 per
/// transaction, through `transaction_with_outbox` on any sync connection.
macro_rules! fill {
    ($conn:expr, $aggregates:expr, $per:expr) => {{
        let mut all = Vec::new();
        for i in 0..$per {
            for a in 0..$aggregates {
                all.push(OrderEvent::Paid {
                    order_id: a as i64,
                    amount: i as i64,
                });
            }
        }
        for chunk in all.chunks(2000) {
            $conn
                .transaction_with_outbox(|tx| {
                    for e in chunk {
                        tx.publish(e)?;
                    }
                    Ok::<_, AppError>(())
                })
                .unwrap();
        }
    }};
}
pub(crate) use fill;

pub fn pending_pg(url: &str) -> i64 {
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query(
        "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .get_result::<Count>(&mut c)
    .unwrap()
    .n
}

/// The relay holding the leader lease on PostgreSQL, if any.
pub fn leader_of(url: &str) -> Option<String> {
    #[derive(diesel::QueryableByName)]
    struct H {
        #[diesel(sql_type = diesel::sql_types::Text)]
        holder: String,
    }
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query("SELECT holder FROM outbox_leader WHERE lease_until > now()")
        .load::<H>(&mut c)
        .unwrap()
        .pop()
        .map(|h| h.holder)
}

/// Waits (30 s at most) for a relay to hold the leader lease on PostgreSQL; returns its id.
pub fn wait_for_leader(url: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        if let Some(h) = leader_of(url) {
            return h;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no leader elected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn pending_mysql(url: &str) -> i64 {
    let mut c = diesel::MysqlConnection::establish(url).unwrap();
    diesel::sql_query(
        "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .get_result::<Count>(&mut c)
    .unwrap()
    .n
}

/// Key, headers and payload are right on both brokers; a rolled-back transaction's event
/// never appears.
fn messages_are_right_on(brokers: &str) {
    let db = TestDatabase::postgres("e2e_msg");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.transaction_with_outbox(|tx| {
        tx.set_header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        tx.publish(&OrderCreated {
            order_id: 7,
            total_cents: 1250,
        })?;
        tx.publish(&OrderEvent::Cancelled {
            order_id: 7,
            reason: "changed mind".into(),
        })?;
        Ok::<_, AppError>(())
    })
    .unwrap();
    let rolled_back = conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderCreated {
            order_id: 8,
            total_cents: 1,
        })?;
        Err::<(), _>(AppError::Business("declined"))
    });
    assert!(rolled_back.is_err());
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderCreated {
            order_id: 9,
            total_cents: 99,
        })
    })
    .unwrap();

    let prefix = unique_prefix("msg");
    let mut relay = RelayProcess::spawn(&db.url, brokers, "unordered", &prefix, &[]);
    wait_drained(|| pending_pg(&db.url), Duration::from_secs(60));
    let orders = consume(
        brokers,
        &format!("{prefix}order"),
        2,
        Duration::from_secs(30),
    );
    let lifecycle = consume(
        brokers,
        &format!("{prefix}order-lifecycle"),
        1,
        Duration::from_secs(30),
    );
    relay.terminate();

    assert_eq!(
        orders.len(),
        2,
        "two committed OrderCreated, the rolled-back one absent: {orders:?}"
    );
    let keys: HashSet<&str> = orders.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, HashSet::from(["7", "9"]));
    let seven = orders.iter().find(|m| m.key == "7").unwrap();
    assert_eq!(seven.headers["event_type"], "OrderCreated");
    assert_eq!(seven.headers["event_version"], "3");
    assert_eq!(seven.headers["aggregate_type"], "order");
    assert_eq!(
        seven.headers["traceparent"],
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    );
    assert_eq!(
        uuid::Uuid::parse_str(seven.id()).unwrap().get_version_num(),
        7
    );
    assert!(chrono::DateTime::parse_from_rfc3339(&seven.headers["created_at"]).is_ok());
    let payload: serde_json::Value = serde_json::from_str(&seven.payload).unwrap();
    assert_eq!(
        payload,
        serde_json::json!({"order_id": 7, "total_cents": 1250})
    );
    assert_eq!(lifecycle.len(), 1);
    assert_eq!(lifecycle[0].headers["event_type"], "OrderCancelled");
    assert_eq!(lifecycle[0].key, "7");
}

#[test]
fn messages_are_right_on_noida() {
    messages_are_right_on(&noida());
}

#[test]
fn messages_are_right_on_tansu() {
    messages_are_right_on(&tansu());
}

/// Four unordered relays, 100,000 events: all delivered, none twice.
#[test]
fn unordered_four_relays_deliver_100k_once() {
    let db = TestDatabase::postgres("e2e_unordered");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    fill!(conn, 1000, 100);
    let prefix = unique_prefix("unordered");
    let start = std::time::Instant::now();
    let mut relays: Vec<_> = (0..4)
        .map(|_| {
            RelayProcess::spawn(
                &db.url,
                &noida(),
                "unordered",
                &prefix,
                &["--batch-size", "1000"],
            )
        })
        .collect();
    let took = wait_drained(|| pending_pg(&db.url), Duration::from_secs(300));
    let messages = consume(
        &noida(),
        &format!("{prefix}order-lifecycle"),
        100_000,
        Duration::from_secs(120),
    );
    for r in &mut relays {
        r.terminate();
    }
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(ids.len(), 100_000, "every event delivered");
    assert_eq!(messages.len(), 100_000, "no crash, so no duplicates");
    eprintln!(
        "unordered x4: 100,000 events drained in {took:?} ({:.0} events/s; {:?} with start-up)",
        100_000.0 / took.as_secs_f64(),
        start.elapsed()
    );
}

/// Four sharded relays, 1,000 aggregates × 50 events; one relay is SIGKILLed mid-run and a
/// new one started: everything delivered, per-aggregate order intact, duplicates bounded by
/// the killed relay's leased batches (its window of batches in flight).
#[test]
fn sharded_relays_survive_a_kill_in_order() {
    let db = TestDatabase::postgres("e2e_sharded");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    fill!(conn, 1000, 50);
    let prefix = unique_prefix("sharded");
    let args = ["--batch-size", "200"];
    let mut relays: Vec<_> = (0..4)
        .map(|_| RelayProcess::spawn(&db.url, &noida(), "sharded", &prefix, &args))
        .collect();
    // Let them take their shards and start, then kill one mid-drain.
    let start = std::time::Instant::now();
    while pending_pg(&db.url) > 40_000 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = pending_pg(&db.url);
    assert!(left > 0, "killed before the drain ended");
    relays[1].kill();
    relays.push(RelayProcess::spawn(
        &db.url,
        &noida(),
        "sharded",
        &prefix,
        &args,
    ));
    let took = wait_drained(|| pending_pg(&db.url), Duration::from_secs(300));
    let messages = consume(
        &noida(),
        &format!("{prefix}order-lifecycle"),
        50_000,
        Duration::from_secs(120),
    );
    for r in &mut relays {
        r.terminate();
    }
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(ids.len(), 50_000, "every event delivered");
    let duplicates = assert_per_key_order(&messages);
    // The killed relay may have had every batch of its window in flight (published, not yet
    // marked): the default `max_in_flight` batches of 200.
    let window = outbox::relay::RelayConfig::default().max_in_flight * 200;
    assert!(
        duplicates <= window,
        "duplicates only from the killed relay's leased batches (at most {window}): {duplicates}"
    );
    eprintln!(
        "sharded x4 (one killed at {left} pending): 50,000 events, {duplicates} duplicates, drained in {:?} ({:.0} events/s)",
        start.elapsed(),
        50_000.0 / start.elapsed().as_secs_f64()
    );
    let _ = took;
}

/// Three leader-mode relays: one publishes at a time; SIGKILL it and a standby takes over
/// within one lease; nothing is lost. Who held which rows when is recorded by the database
/// (see `holds`): no two relays ever held rows at the same time.
#[test]
fn leader_fails_over_to_a_standby() {
    let db = TestDatabase::postgres("e2e_leader");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.batch_execute(crate::holds::AUDIT_SQL).unwrap();
    fill!(conn, 100, 50);
    let prefix = unique_prefix("leader");
    let mut relays: Vec<_> = (0..3)
        .map(|_| {
            RelayProcess::spawn(
                &db.url,
                &noida(),
                "leader",
                &prefix,
                &["--batch-size", "100"],
            )
        })
        .collect();
    let start = std::time::Instant::now();
    let leader = wait_for_leader(&db.url);
    // Only the leader has published so far.
    while pending_pg(&db.url) == 5000 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let leader_index = relays
        .iter()
        .position(|r| r.id == leader)
        .expect("the leader is one of ours");
    relays[leader_index].kill();
    let killed_at = std::time::Instant::now();
    let death = crate::holds::db_now(&db.url);
    let new_leader = loop {
        if let Some(h) = leader_of(&db.url).filter(|h| *h != leader) {
            break h;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(20),
            "no standby took over"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let takeover = killed_at.elapsed();
    // The dead leader's lease ends at most one lease (6 s) after the kill; standbys look
    // every tenth of a lease.
    assert!(
        takeover <= Duration::from_millis(6000 + 600 + 400),
        "takeover within about a lease: {takeover:?}"
    );
    wait_drained(|| pending_pg(&db.url), Duration::from_secs(120));
    let messages = consume(
        &noida(),
        &format!("{prefix}order-lifecycle"),
        5000,
        Duration::from_secs(60),
    );
    for r in &mut relays {
        r.terminate();
    }
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(ids.len(), 5000, "nothing lost");
    assert_per_key_order(&messages);
    // Only ever one publishing relay. The killed leader's leases run on after its death, but
    // it publishes nothing after it: its holds end at the latest at its death.
    let mut batches = crate::holds::batches(&db.url);
    for b in &mut batches {
        if b.relay == leader {
            b.end = b.end.min(death);
        }
    }
    crate::holds::assert_one_at_a_time(&batches);
    let held: i64 = batches.iter().map(|b| b.rows).sum();
    assert!(held >= 5000, "every row was claimed and recorded: {held}");
    let holders: HashSet<&str> = batches.iter().map(|b| b.relay.as_str()).collect();
    assert_eq!(
        holders,
        HashSet::from([leader.as_str(), new_leader.as_str()]),
        "only the two leaders ever claimed rows"
    );
    eprintln!("leader: {leader} killed; {new_leader} took over after {takeover:?}");
}

/// The check of `leader_fails_over_to_a_standby` sees two relays publishing at once: two
/// `unordered` relays, which do, are caught by it.
#[test]
fn hold_check_sees_concurrent_relays() {
    let db = TestDatabase::postgres("e2e_holds");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.batch_execute(crate::holds::AUDIT_SQL).unwrap();
    fill!(conn, 100, 50);
    let prefix = unique_prefix("holds");
    let mut relays: Vec<_> = (0..2)
        .map(|_| {
            RelayProcess::spawn(
                &db.url,
                &noida(),
                "unordered",
                &prefix,
                &["--batch-size", "100"],
            )
        })
        .collect();
    wait_drained(|| pending_pg(&db.url), Duration::from_secs(120));
    for r in &mut relays {
        r.terminate();
    }
    let batches = crate::holds::batches(&db.url);
    assert!(
        crate::holds::overlap(&batches).is_some(),
        "two unordered relays held rows at once: {} batches",
        batches.len()
    );
}

/// A poison event (larger than the broker accepts) is retried with backoff, then
/// dead-lettered with its error; its aggregate's later events wait (the default policy) while
/// other aggregates flow.
#[test]
fn poison_event_is_dead_lettered_and_blocks_its_aggregate() {
    #[derive(serde::Serialize, outbox::OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "Huge")]
    struct Huge {
        #[outbox(aggregate_id)]
        order_id: i64,
        blob: String,
    }
    let db = TestDatabase::postgres("e2e_poison");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.transaction_with_outbox(|tx| {
        // Above the broker's `message.max.bytes`, which the outbox's own limit (1,000,000 by
        // default) would refuse at `publish`: raised here so that the broker refuses it.
        tx.set_max_payload_bytes(4 << 20);
        tx.publish(&Huge {
            order_id: 666,
            blob: "x".repeat(3 << 20),
        })?;
        tx.publish(&OrderCreated {
            order_id: 666,
            total_cents: 1,
        })?;
        for i in 0..20 {
            tx.publish(&OrderCreated {
                order_id: i,
                total_cents: i,
            })?;
        }
        Ok::<_, AppError>(())
    })
    .unwrap();
    let prefix = unique_prefix("poison");
    let mut relay = RelayProcess::spawn(
        &db.url,
        &noida(),
        "sharded",
        &prefix,
        &["--max-attempts", "3"],
    );
    #[derive(diesel::QueryableByName, Debug)]
    struct Dead {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        attempts: i32,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        last_error: Option<String>,
    }
    let start = std::time::Instant::now();
    let dead = loop {
        let rows = diesel::sql_query(
            "SELECT attempts, last_error FROM outbox_events WHERE dead_at IS NOT NULL",
        )
        .load::<Dead>(&mut conn)
        .unwrap();
        if let Some(d) = rows.into_iter().next() {
            break d;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never dead-lettered"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let messages = consume(
        &noida(),
        &format!("{prefix}order"),
        20,
        Duration::from_secs(30),
    );
    relay.terminate();
    assert_eq!(dead.attempts, 3, "retried, then dead-lettered: {dead:?}");
    let error = dead.last_error.unwrap_or_default().to_lowercase();
    assert!(
        error.contains("too large") || error.contains("size"),
        "{error}"
    );
    assert_eq!(messages.len(), 20, "other aggregates flowed");
    assert!(
        messages.iter().all(|m| m.key != "666"),
        "the aggregate's later event waits behind its dead letter"
    );
    assert_eq!(
        pending_pg(&db.url),
        1,
        "order 666's OrderCreated is still pending"
    );
}

/// MariaDB: unordered, leader and sharded relays deliver everything, in per-aggregate order
/// for the ordered modes.
#[test]
fn mariadb_relays_deliver() {
    for (mode, relays) in [("unordered", 3), ("leader", 2), ("sharded", 3)] {
        let db = TestDatabase::mysql("e2e_maria");
        let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
        fill!(conn, 200, 25);
        let prefix = unique_prefix(mode);
        let mut procs: Vec<_> = (0..relays)
            .map(|_| {
                RelayProcess::spawn(&db.url, &noida(), mode, &prefix, &["--batch-size", "250"])
            })
            .collect();
        let took = wait_drained(|| pending_mysql(&db.url), Duration::from_secs(180));
        let messages = consume(
            &noida(),
            &format!("{prefix}order-lifecycle"),
            5000,
            Duration::from_secs(60),
        );
        for p in &mut procs {
            p.terminate();
        }
        let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
        assert_eq!(ids.len(), 5000, "{mode}: every event delivered");
        assert_eq!(
            messages.len(),
            5000,
            "{mode}: no duplicates without a crash"
        );
        if mode != "unordered" {
            assert_per_key_order(&messages);
        }
        eprintln!(
            "MariaDB {mode} x{relays}: 5,000 events in {took:?} ({:.0}/s)",
            5000.0 / took.as_secs_f64()
        );
    }
}
