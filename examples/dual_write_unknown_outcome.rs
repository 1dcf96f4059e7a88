//! Dual write, part 3: a publish that times out has an unknown outcome, and retrying it duplicates the event. SQLite, no services.
//!
//! The broker stores the message but the ack is lost (injected). The naive service cannot
//! know whether the event went out; it retries, and the broker now holds two messages with
//! two different ids, so a consumer that deduplicates on the event id charges twice. The
//! outbox relay retries too (at least once), but the event id was fixed when the event was
//! written to the outbox: both copies carry the same id and an `#[idempotent]` consumer
//! applies it once.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use common::{LostAcks, OrderPlaced, SqliteDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, SqliteRelayStore};

#[idempotent(consumer = "billing")]
fn charge(conn: &mut SqliteConnection, event: Envelope<OrderPlaced>) -> QueryResult<()> {
    diesel::sql_query(format!("INSERT INTO charges VALUES ({})", event.order_id)).execute(conn)?;
    Ok(())
}

fn consume_all(conn: &mut SqliteConnection, broker: &MemoryBroker) -> i64 {
    diesel::sql_query("CREATE TABLE charges (order_id BIGINT)")
        .execute(conn)
        .unwrap();
    for record in broker.records("order") {
        let event = Envelope::<OrderPlaced>::from_record(&record).expect("decode");
        let _ = charge(conn, event).expect("charge");
    }
    count!(conn, "charges")
}

fn main() {
    println!("1. The naive way: send, time out, retry.");
    let db = SqliteDb::new();
    let broker = Arc::new(MemoryBroker::new());
    let lossy = LostAcks {
        broker: broker.clone(),
        lose: AtomicUsize::new(1),
    };
    let mut sends = 0;
    loop {
        sends += 1;
        let delivery = common::send_direct(
            &lossy,
            &OrderPlaced {
                order_id: 1,
                total_cents: 500,
            },
        );
        if delivery.is_failure() || delivery.is_outage() {
            println!("   send {sends}: {}", delivery.error().unwrap_or("?"));
            continue;
        }
        println!("   send {sends}: acknowledged");
        break;
    }
    let ids: HashSet<_> = broker.records("order").iter().map(|r| r.id).collect();
    let charges = consume_all(&mut db.conn(), &broker);
    println!(
        "   The broker holds {} messages with {} distinct ids; the consumer charged {charges} times.",
        broker.records("order").len(),
        ids.len()
    );
    expect(
        ids.len() == 2 && charges == 2,
        "the retry to duplicate the event under a new id",
    );

    println!("\n2. The outbox way: the relay retries the same row, with the same event id.");
    let db = SqliteDb::new();
    let mut conn = db.conn();
    diesel::sql_query(common::ORDERS_DDL)
        .execute(&mut conn)
        .unwrap();
    conn.transaction_with_outbox(|tx| {
        diesel::sql_query("INSERT INTO orders VALUES (1, 500)").execute(tx.conn())?;
        tx.publish(&OrderPlaced {
            order_id: 1,
            total_cents: 500,
        })
    })
    .unwrap();
    let broker = Arc::new(MemoryBroker::new());
    let lossy = Arc::new(LostAcks {
        broker: broker.clone(),
        lose: AtomicUsize::new(1),
    });
    let seen = broker.clone();
    let (done, stats) = common::relay_until(
        SqliteRelayStore::new(db.path.clone()),
        lossy.clone(),
        common::quick_config(),
        Duration::from_secs(10),
        move || seen.records("order").len() == 2,
    );
    expect(done, "the relay to publish again after the lost ack");
    let ids: HashSet<_> = broker.records("order").iter().map(|r| r.id).collect();
    let unavailable = stats.unavailable.load(std::sync::atomic::Ordering::Relaxed);
    let charges = consume_all(&mut conn, &broker);
    println!(
        "   The relay saw {unavailable} unknown outcome(s) and retried: {} messages, {} distinct id; {charges} charge.",
        broker.records("order").len(),
        ids.len()
    );
    expect(
        ids.len() == 1 && charges == 1,
        "one id on both copies and one charge",
    );
    println!(
        "\nRetries are unavoidable when an outcome is unknown; the fix is a stable event id and a\nconsumer that deduplicates on it (see inbox_vs_business_key)."
    );
}
