//! Dual write, part 2: "publish, then commit" announces an order that a failed commit never stored (a phantom event). SQLite, no services.
//!
//! The naive service sends `OrderPlaced` first and then writes the order; the write fails
//! (here a duplicate order id, in production a deadlock, a constraint, a lost connection at
//! `COMMIT`), and the rest of the system now acts on an order that does not exist. The outbox
//! way publishes into the same transaction, so the failure rolls the event back with the order.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{OrderPlaced, SqliteDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, SqliteRelayStore};

fn setup() -> (SqliteDb, SqliteConnection) {
    let db = SqliteDb::new();
    let mut conn = db.conn();
    diesel::sql_query(common::ORDERS_DDL)
        .execute(&mut conn)
        .unwrap();
    // Order 7 exists already: the next attempt to insert it fails inside the transaction.
    diesel::sql_query("INSERT INTO orders VALUES (7, 100)")
        .execute(&mut conn)
        .unwrap();
    (db, conn)
}

fn main() {
    println!("1. The naive way: publish the event, then commit the order.");
    let (_db, mut conn) = setup();
    let broker = MemoryBroker::new();
    let result = conn.transaction::<_, diesel::result::Error, _>(|c| {
        common::send_direct(
            &broker,
            &OrderPlaced {
                order_id: 7,
                total_cents: 990,
            },
        );
        diesel::sql_query("INSERT INTO orders VALUES (7, 990)").execute(c)?;
        Ok(())
    });
    let stored = count!(&mut conn, "orders WHERE total_cents = 990");
    let announced = broker.records("order").len();
    println!(
        "   The transaction failed ({}); orders stored: {stored}; events on the broker: {announced}.",
        result.unwrap_err()
    );
    expect(
        stored == 0 && announced == 1,
        "a phantom event: announced, never stored",
    );

    println!("\n2. The outbox way: the event is written in the order's transaction.");
    let (db, mut conn) = setup();
    let result = conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderPlaced {
            order_id: 7,
            total_cents: 990,
        })?;
        diesel::sql_query("INSERT INTO orders VALUES (7, 990)").execute(tx.conn())?;
        Ok::<_, outbox::Error>(())
    });
    let rows = count!(&mut conn, "outbox_events");
    println!(
        "   The transaction failed ({}); outbox rows: {rows}.",
        result.unwrap_err()
    );
    expect(rows == 0, "the failed transaction to roll its event back");

    let broker = Arc::new(MemoryBroker::new());
    let seen = broker.clone();
    // Give the relay 500 ms to find something to publish: there must be nothing.
    let (published, _) = common::relay_until(
        SqliteRelayStore::new(db.path.clone()),
        broker.clone(),
        common::quick_config(),
        Duration::from_millis(500),
        move || !seen.all_records().is_empty(),
    );
    println!(
        "   A relay ran for 500 ms and published {} events.",
        broker.all_records().len()
    );
    expect(!published, "no phantom event from the outbox");
    println!(
        "\nThe relay publishes committed rows only, so a transaction that fails announces nothing."
    );
}
