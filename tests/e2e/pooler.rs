//! `outbox relay --transaction-pooler` behind a real PgBouncer in transaction mode: two
//! sharded CLI relays publish to Kafka in order per order, with no failed statement, and
//! leave the server connections with the server's settings.

use std::collections::HashSet;
use std::time::Duration;

use outbox::prelude::*;

use crate::harness::*;
use crate::pgbouncer::{PgBouncer, pool_settings, server_settings, writer};
use crate::scenarios::pending_pg;
use crate::support::{AppError, OrderEvent, TestDatabase};

#[test]
fn cli_relays_behind_pgbouncer_publish_in_order_and_leave_no_settings() {
    let db = TestDatabase::postgres("cli_pooler");
    let bouncer = PgBouncer::start();
    let url = bouncer.url(&db);
    let server = server_settings(&db);
    // 2,000 events of 20 orders, written through the pooler.
    let mut conn = writer(&url);
    for amount in 0..100 {
        conn.transaction_with_outbox(|tx| {
            for order_id in 0..20 {
                tx.publish(&OrderEvent::Paid { order_id, amount })?;
            }
            Ok::<_, AppError>(())
        })
        .unwrap();
    }
    drop(conn);
    let prefix = unique_prefix("pooler");
    let mut relays: Vec<RelayProcess> = (0..2)
        .map(|_| {
            RelayProcess::spawn(
                &url,
                &noida(),
                "sharded",
                &prefix,
                &["--transaction-pooler", "--batch-size", "100"],
            )
        })
        .collect();
    wait_drained(|| pending_pg(&db.url), Duration::from_secs(60));
    let messages = consume(
        &noida(),
        &format!("{prefix}order-lifecycle"),
        2_000,
        Duration::from_secs(60),
    );
    for relay in &mut relays {
        relay.terminate();
    }
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(ids.len(), 2_000, "every event published");
    assert_per_key_order(&messages);
    for relay in &relays {
        let log = relay.log_text();
        assert!(
            log.contains("behind a transaction pooler"),
            "the relay says so at start-up: {log}"
        );
        assert!(
            !log.contains("outbox store unavailable") && !log.contains("settling a batch failed"),
            "no statement failed behind the pooler: {log}"
        );
    }
    for seen in pool_settings(&url) {
        assert_eq!(
            seen, server,
            "a writer through PgBouncer sees the server's settings, not the relays'"
        );
    }
    drop(bouncer);
}
