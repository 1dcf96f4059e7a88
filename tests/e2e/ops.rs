//! The operator's commands, run as the `outbox` binary: `status --json`, `dead
//! list|retry|purge`, `replay`, `cleanup`. The admin calls on every backend; the round trips
//! through a relay on PostgreSQL and a real Kafka-protocol broker.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use diesel::{Connection, RunQueryDsl};
use outbox::prelude::*;
use serde_json::Value;

use crate::harness::*;
use crate::support::*;

fn outbox(args: &[&str]) -> Output {
    Command::new(outbox_bin())
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .expect("the outbox binary runs")
}

/// Runs `outbox args…`, expecting exit status `code`; returns its stdout.
fn run(code: i32, args: &[&str]) -> String {
    let out = outbox(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "outbox {args:?}: stdout {stdout}, stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn status(url: &str) -> Value {
    serde_json::from_str(&run(0, &["status", "--json", "--database-url", url])).unwrap()
}

#[derive(diesel::QueryableByName, Debug, PartialEq)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    aggregate_id: String,
}

/// Ten events: orders 1 and 2, five each, interleaved (seq 1..=10, odd seqs order 1).
macro_rules! ten_events {
    ($conn:expr) => {
        $conn
            .transaction_with_outbox(|tx| {
                for i in 0..5 {
                    for order_id in [1, 2] {
                        tx.publish(&OrderCreated {
                            order_id,
                            total_cents: i,
                        })?;
                    }
                }
                Ok::<_, AppError>(())
            })
            .unwrap()
    };
}

/// Rows as the admin calls see them (ids as text on every backend).
const ROWS_PG: &str = "SELECT seq, id::text AS id, aggregate_id FROM outbox_events ORDER BY seq";
const ROWS: &str = "SELECT seq, id, aggregate_id FROM outbox_events ORDER BY seq";

/// Status field by field, dead-letter listing and a purge of exactly the selected rows, on
/// one backend: seq 1 and 3 (order 1) dead, 2 and 4 (order 2) published, the rest pending.
fn status_and_purge(url: &str, exec: impl Fn(&str), rows: impl Fn() -> Vec<Row>) {
    exec(
        "UPDATE outbox_events SET dead_at = created_at, attempts = 3, last_error = 'poison' WHERE seq IN (1, 3)",
    );
    exec("UPDATE outbox_events SET published_at = created_at WHERE seq IN (2, 4)");
    let s = status(url);
    let fields: std::collections::BTreeSet<&str> =
        s.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        fields,
        std::collections::BTreeSet::from([
            "pending",
            "in_flight",
            "retrying",
            "dead",
            "published",
            "oldest_pending",
            "oldest_pending_age_seconds",
            "blocked_aggregates",
            "relays",
            "leader",
            "stream"
        ]),
        "exactly the documented fields"
    );
    assert_eq!(
        s["stream"],
        serde_json::Value::Null,
        "stream mode never ran: {s}"
    );
    assert_eq!(s["pending"], 6, "{s}");
    assert_eq!(s["in_flight"], 0, "{s}");
    assert_eq!(s["retrying"], 0, "{s}");
    assert_eq!(s["dead"], 2, "{s}");
    assert_eq!(s["published"], 2, "{s}");
    assert_eq!(
        s["blocked_aggregates"], 1,
        "order 1's later events wait: {s}"
    );
    let oldest: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(s["oldest_pending"].clone()).unwrap();
    assert!(
        (chrono::Utc::now() - oldest).num_seconds().abs() < 60,
        "{s}"
    );
    let age = s["oldest_pending_age_seconds"].as_f64().unwrap();
    assert!((0.0..60.0).contains(&age), "{s}");
    assert_eq!(s["relays"], Value::Array(vec![]), "{s}");
    assert_eq!(s["leader"], Value::Null, "{s}");

    // List, as JSON lines.
    let listed = run(0, &["dead", "list", "--json", "--database-url", url]);
    let dead: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dead.len(), 2, "{listed}");
    assert_eq!(
        (dead[0]["seq"].clone(), dead[1]["seq"].clone()),
        (1.into(), 3.into())
    );
    assert_eq!(dead[0]["last_error"], "poison");
    assert_eq!(dead[0]["aggregate_id"], "1");
    let ids: Vec<String> = rows().into_iter().map(|r| r.id).collect();
    assert_eq!(dead[1]["id"], ids[2].as_str());
    let paged = run(
        0,
        &[
            "dead",
            "list",
            "--json",
            "--after-seq",
            "1",
            "--limit",
            "1",
            "--database-url",
            url,
        ],
    );
    assert_eq!(paged.lines().count(), 1);
    assert!(paged.contains("\"seq\":3"), "{paged}");

    // Purge: without --yes nothing happens; with it exactly seq 3 goes (seq 2 is published,
    // seq 5 pending: never purged).
    let dry = run(
        2,
        &["dead", "purge", "--seq", "3,2,5", "--database-url", url],
    );
    assert!(dry.contains("would delete 1 dead letters"), "{dry}");
    assert_eq!(rows().len(), 10);
    run(
        0,
        &[
            "dead",
            "purge",
            "--seq",
            "3,2,5",
            "--yes",
            "--database-url",
            url,
        ],
    );
    let left: Vec<i64> = rows().into_iter().map(|r| r.seq).collect();
    assert_eq!(left, [1, 2, 4, 5, 6, 7, 8, 9, 10]);
    // Destructive commands need a selection or --all.
    run(1, &["dead", "purge", "--yes", "--database-url", url]);
    // Retry the rest: nothing dead, nothing blocked.
    run(
        0,
        &["dead", "retry", "--all", "--yes", "--database-url", url],
    );
    let s = status(url);
    assert_eq!(
        (
            s["dead"].clone(),
            s["blocked_aggregates"].clone(),
            s["pending"].clone()
        ),
        (0.into(), 0.into(), 7.into()),
        "{s}"
    );
    // Replay the published rows of order 2: both pending again, ids unchanged.
    run(2, &["replay", "--aggregate-id", "2", "--database-url", url]);
    run(
        0,
        &[
            "replay",
            "--aggregate-id",
            "2",
            "--yes",
            "--database-url",
            url,
        ],
    );
    let s = status(url);
    assert_eq!(
        (s["published"].clone(), s["pending"].clone()),
        (0.into(), 9.into()),
        "{s}"
    );
    assert_eq!(
        rows().into_iter().map(|r| r.id).collect::<Vec<_>>(),
        [&ids[..2], &ids[3..]].concat()
    );
    // Cleanup needs --yes, and keeps what is not old enough.
    run(2, &["cleanup", "--older-than", "1h", "--database-url", url]);
    run(
        0,
        &[
            "cleanup",
            "--older-than",
            "1h",
            "--yes",
            "--database-url",
            url,
        ],
    );
    assert_eq!(rows().len(), 9);
}

#[test]
fn admin_commands_on_sqlite() {
    let db = TestDatabase::sqlite("ops");
    let mut conn = diesel::SqliteConnection::establish(&db.url).unwrap();
    ten_events!(conn);
    let url = db.url.clone();
    status_and_purge(
        &db.url,
        |sql| {
            let mut c = diesel::SqliteConnection::establish(&url).unwrap();
            diesel::sql_query(sql).execute(&mut c).unwrap();
        },
        || {
            diesel::sql_query(ROWS)
                .load(&mut diesel::SqliteConnection::establish(&db.url).unwrap())
                .unwrap()
        },
    );
}

#[test]
fn admin_commands_on_mariadb() {
    let db = TestDatabase::mysql("ops");
    let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
    ten_events!(conn);
    let url = db.url.clone();
    status_and_purge(
        &db.url,
        |sql| {
            let mut c = diesel::MysqlConnection::establish(&url).unwrap();
            diesel::sql_query(sql).execute(&mut c).unwrap();
        },
        || {
            diesel::sql_query(ROWS)
                .load(&mut diesel::MysqlConnection::establish(&db.url).unwrap())
                .unwrap()
        },
    );
}

#[test]
fn admin_commands_on_postgres() {
    let db = TestDatabase::postgres("ops");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    ten_events!(conn);
    let url = db.url.clone();
    status_and_purge(
        &db.url,
        |sql| {
            let mut c = diesel::PgConnection::establish(&url).unwrap();
            diesel::sql_query(sql).execute(&mut c).unwrap();
        },
        || {
            diesel::sql_query(ROWS_PG)
                .load(&mut diesel::PgConnection::establish(&db.url).unwrap())
                .unwrap()
        },
    );
}

/// `outbox partition`: nothing without `--yes`; with it the ten events are copied into the
/// ring and the admin commands work on it as before; a second run, a slot count out of range
/// and an SQLite database are refused, each naming why.
#[test]
fn partition_command_on_postgres() {
    let db = TestDatabase::postgres("ops_partition");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    ten_events!(conn);
    let url = db.url.as_str();
    let partitions = || {
        #[derive(diesel::QueryableByName)]
        struct N {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query(
            "SELECT count(*) AS n FROM pg_inherits WHERE inhparent = 'outbox_events'::regclass",
        )
        .get_result::<N>(&mut diesel::PgConnection::establish(url).unwrap())
        .unwrap()
        .n
    };
    run(2, &["partition", "--database-url", url]);
    assert_eq!(partitions(), 0);
    let out = outbox(&["partition", "--slots", "65", "--yes", "--database-url", url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("slots must be between 2 and 64, got 65"),
        "{err}"
    );
    let said = run(
        0,
        &[
            "partition",
            "--slots",
            "3",
            "--slot-xids",
            "1000",
            "--yes",
            "--database-url",
            url,
        ],
    );
    assert!(
        said.contains("3 partitions of 1000 transaction ids each (10 rows copied)"),
        "{said}"
    );
    assert_eq!(partitions(), 3);
    assert_eq!(status(url)["pending"], 10);
    let out = outbox(&["partition", "--yes", "--database-url", url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("already partitioned"), "{err}");

    let sqlite = TestDatabase::sqlite("ops_partition");
    let mut conn = diesel::SqliteConnection::establish(&sqlite.url).unwrap();
    ten_events!(conn);
    let out = outbox(&["partition", "--yes", "--database-url", &sqlite.url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("on PostgreSQL only"), "{err}");
}

fn wait_until(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An event the relay's producer refuses while `message.max.bytes` is too small for it: a
/// poison by configuration, fixed by restarting the relay with the right setting.
#[derive(serde::Serialize, outbox::OutboxEvent)]
#[outbox(aggregate = "order", event_type = "Large")]
struct Large {
    #[outbox(aggregate_id)]
    order_id: i64,
    blob: String,
}

/// A dead letter of an ordered aggregate is listed, retried, and then published before the
/// aggregate's later events; `status --json` shows the live relay; a replayed seq range is
/// published again with its original ids. PostgreSQL, sharded relays, noida-db.
#[test]
fn dead_letter_retried_in_order_and_seq_range_replayed() {
    let db = TestDatabase::postgres("e2e_ops");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.transaction_with_outbox(|tx| {
        tx.publish(&Large {
            order_id: 7,
            blob: "x".repeat(5_000),
        })?;
        for i in 0..3 {
            tx.publish(&OrderCreated {
                order_id: 7,
                total_cents: i,
            })?;
        }
        for i in 0..4 {
            tx.publish(&OrderCreated {
                order_id: 100 + i,
                total_cents: i,
            })?;
        }
        Ok::<_, AppError>(())
    })
    .unwrap();
    let rows = || -> Vec<Row> {
        diesel::sql_query(ROWS_PG)
            .load(&mut diesel::PgConnection::establish(&db.url).unwrap())
            .unwrap()
    };
    let ids: Vec<String> = rows().into_iter().map(|r| r.id).collect();
    let prefix = unique_prefix("ops");
    let topic = format!("{prefix}order");

    let mut relay = RelayProcess::spawn(
        &db.url,
        &noida(),
        "sharded",
        &prefix,
        &[
            "--max-attempts",
            "2",
            "--kafka-config",
            "message.max.bytes=2000",
        ],
    );
    wait_until("the dead letter", Duration::from_secs(60), || {
        status(&db.url)["dead"] == 1
    });
    wait_until("the other orders", Duration::from_secs(60), || {
        status(&db.url)["pending"] == 3
    });
    relay.terminate();
    let listed = run(
        0,
        &[
            "dead",
            "list",
            "--json",
            "--aggregate-id",
            "7",
            "--database-url",
            &db.url,
        ],
    );
    let dead: Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!(dead["seq"], 1, "{listed}");
    assert_eq!(dead["id"], ids[0].as_str());
    assert_eq!(dead["attempts"], 2);
    assert_eq!(status(&db.url)["blocked_aggregates"], 1);
    run(
        2,
        &[
            "dead",
            "retry",
            "--aggregate-id",
            "7",
            "--database-url",
            &db.url,
        ],
    );
    assert_eq!(status(&db.url)["dead"], 1, "not retried without --yes");
    run(
        0,
        &[
            "dead",
            "retry",
            "--aggregate-type",
            "order",
            "--aggregate-id",
            "7",
            "--yes",
            "--database-url",
            &db.url,
        ],
    );

    let relay = RelayProcess::spawn(&db.url, &noida(), "sharded", &prefix, &[]);
    let messages = consume(&noida(), &topic, 8, Duration::from_secs(60));
    let order7: Vec<&str> = messages
        .iter()
        .filter(|m| m.key == "7")
        .map(|m| m.id())
        .collect();
    assert_eq!(
        order7,
        ids[..4].iter().map(String::as_str).collect::<Vec<_>>(),
        "the retried event first, then the later ones in order"
    );
    assert_eq!(messages.len(), 8);
    wait_until("the outbox to drain", Duration::from_secs(30), || {
        status(&db.url)["published"] == 8
    });

    let s = status(&db.url);
    let relays = s["relays"].as_array().unwrap();
    assert_eq!(relays.len(), 1, "{s}");
    assert_eq!(relays[0]["relay_id"], relay.id.as_str());
    assert_eq!(relays[0]["mode"], "sharded");
    assert_eq!(relays[0]["state"], "running");
    assert_eq!(relays[0]["live"], true);
    assert_eq!(relays[0]["shards"], 256, "{s}");
    assert!(relays[0]["state_since"].is_string(), "{s}");
    assert_eq!(s["leader"], Value::Null);
    assert_eq!(
        (
            s["pending"].clone(),
            s["dead"].clone(),
            s["oldest_pending"].clone()
        ),
        (0.into(), 0.into(), Value::Null)
    );

    // Replay seq 3..=5: exactly those are published again, with their ids.
    let dry = run(
        2,
        &[
            "replay",
            "--from-seq",
            "3",
            "--to-seq",
            "5",
            "--database-url",
            &db.url,
        ],
    );
    assert!(dry.contains("would publish 3 events again"), "{dry}");
    run(
        0,
        &[
            "replay",
            "--from-seq",
            "3",
            "--to-seq",
            "5",
            "--yes",
            "--database-url",
            &db.url,
        ],
    );
    let messages = consume(&noida(), &topic, 11, Duration::from_secs(60));
    assert_eq!(messages.len(), 11);
    let again: Vec<&str> = messages[8..].iter().map(|m| m.id()).collect();
    let mut again_sorted = again.clone();
    again_sorted.sort();
    let mut want: Vec<&str> = ids[2..5].iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(
        again_sorted, want,
        "seq 3..=5 again, with their original ids"
    );
    wait_until("the replay to drain", Duration::from_secs(30), || {
        status(&db.url)["published"] == 8
    });
    drop(relay);
}
