//! Table growth: published rows pile up unless they are deleted, and deleted rows free space only once VACUUM runs. Needs PostgreSQL (`DATABASE_URL`).
//!
//! Three rounds of 10,000 events go through the relay. Without retention every published row
//! stays (marked, never deleted) and the table grows with every round. With
//! `RelayConfig::retention` the relay deletes published rows in bounded batches, and after
//! `VACUUM` (autovacuum does it on its own schedule) PostgreSQL reuses the space, so the table
//! stops growing (it settles at about two rounds: index pages emptied by one round are
//! recycled a VACUUM later). At high volume, partition the table by time and drop whole
//! partitions instead: no delete, no dead rows.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{OrderPlaced, PgDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, PgRelayStore, RelayConfig, Retention};

const ROUND: i64 = 10_000;

fn size_kib(conn: &mut PgConnection) -> i64 {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "pg_total_relation_size('outbox_events') / 1024",
    ))
    .get_result(conn)
    .unwrap()
}

/// Three rounds; returns the table's size after each.
fn rounds(label: &str, retention: Option<Retention>) -> (Vec<i64>, i64) {
    let db = PgDb::new(label);
    let mut conn = db.conn();
    let mut sizes = Vec::new();
    for round in 0..3 {
        conn.transaction_with_outbox(|tx| {
            (0..ROUND).try_for_each(|i| {
                tx.publish(&OrderPlaced {
                    order_id: round * ROUND + i,
                    total_cents: 1,
                })
            })
        })
        .unwrap();
        let url = db.url.clone();
        let config = RelayConfig {
            batch_size: 1000,
            retention,
            ..common::quick_config()
        };
        let left = if retention.is_some() {
            "outbox_events"
        } else {
            "outbox_events WHERE published_at IS NULL"
        };
        let (done, _) = common::relay_until(
            PgRelayStore::new(db.url.clone()),
            Arc::new(MemoryBroker::new()),
            config,
            Duration::from_secs(60),
            move || count!(&mut PgConnection::establish(&url).unwrap(), left) == 0,
        );
        common::ensure(done, "the relay to get through the round");
        if retention.is_some() {
            diesel::sql_query("VACUUM outbox_events")
                .execute(&mut conn)
                .unwrap();
        }
        sizes.push(size_kib(&mut conn));
    }
    let rows = count!(&mut conn, "outbox_events");
    (sizes, rows)
}

fn main() {
    println!("1. No retention: published rows stay.");
    let (sizes, rows) = rounds("growth", None);
    println!("   table size after each round of {ROUND} events: {sizes:?} KiB; {rows} rows kept.");
    expect(
        sizes[2] as f64 >= 2.5 * sizes[0] as f64 && rows == 3 * ROUND,
        "the table to grow with every round",
    );

    println!("\n2. Retention (delete published rows, 1,000 a statement) and VACUUM.");
    // One second: the shortest retention a relay accepts (`RelayConfig::validate`).
    let keep_none = Retention {
        keep: Duration::from_secs(1),
        batch: 1000,
        every: Duration::from_millis(50),
    };
    let (kept, rows) = rounds("retention", Some(keep_none));
    println!("   table size after each round: {kept:?} KiB; {rows} rows kept.");
    expect(
        rows == 0 && (kept[2] as f64) <= 1.1 * kept[1] as f64 && kept[2] * 2 < sizes[2],
        "the table to stop growing",
    );
    println!(
        "\nAfter three rounds: {} KiB without retention, {} KiB with it.",
        sizes[2], kept[2]
    );
}
