//! Consumer idempotency: an inbox keyed by the event id versus a natural business key (`#[idempotent(key = …)]`). SQLite, no services.
//!
//! Three deliveries reach the billing consumer for order 1: a message, the broker's redelivery
//! of the same message (same event id), and the same fact published again as a new event (new
//! id: an upstream retry, a replay). A naive consumer charges three times; an inbox keyed by the
//! event id charges twice (it stops redeliveries, not re-publications); a business key, the
//! order id, charges once. The price of a business key: a genuinely new event with the same
//! key is dropped too, so the key must name what has to happen once.

mod common;

use common::{OrderPlaced, SqliteDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;

fn charge_row(
    conn: &mut SqliteConnection,
    table: &str,
    event: &Envelope<OrderPlaced>,
) -> QueryResult<()> {
    diesel::sql_query(format!(
        "INSERT INTO {table} VALUES ({}, {})",
        event.order_id, event.total_cents
    ))
    .execute(conn)?;
    Ok(())
}

fn naive(conn: &mut SqliteConnection, event: Envelope<OrderPlaced>) -> QueryResult<()> {
    charge_row(conn, "naive_charges", &event)
}

/// The inbox remembers ("billing-by-id", event id) in the same transaction as the charge.
#[idempotent(consumer = "billing-by-id")]
fn by_event_id(conn: &mut SqliteConnection, event: Envelope<OrderPlaced>) -> QueryResult<()> {
    charge_row(conn, "charges_by_id", &event)
}

/// The inbox remembers ("billing-by-order", order id): each order is charged once.
#[idempotent(consumer = "billing-by-order", key = |e| e.order_id)]
fn by_order(conn: &mut SqliteConnection, event: Envelope<OrderPlaced>) -> QueryResult<()> {
    charge_row(conn, "charges_by_order", &event)
}

fn main() {
    let db = SqliteDb::new();
    let mut conn = db.conn();
    for t in ["naive_charges", "charges_by_id", "charges_by_order"] {
        diesel::sql_query(format!("CREATE TABLE {t} (order_id BIGINT, cents BIGINT)"))
            .execute(&mut conn)
            .unwrap();
    }
    let first = Envelope::new(OrderPlaced {
        order_id: 1,
        total_cents: 4200,
    });
    let redelivered = first.clone(); // same event id
    let republished = Envelope::new(OrderPlaced {
        order_id: 1,
        total_cents: 4200,
    }); // new id
    let deliveries = [
        ("message", first),
        ("redelivery", redelivered),
        ("re-publication", republished),
    ];

    println!("Three deliveries about order 1: a message, its redelivery, its re-publication.");
    for (what, event) in deliveries {
        naive(&mut conn, event.clone()).unwrap();
        let a = by_event_id(&mut conn, event.clone()).unwrap();
        let b = by_order(&mut conn, event).unwrap();
        println!(
            "   {what:<15} inbox by event id: {:<12} business key: {b:?}",
            format!("{a:?}")
        );
    }
    let (n, i, k) = (
        count!(&mut conn, "naive_charges"),
        count!(&mut conn, "charges_by_id"),
        count!(&mut conn, "charges_by_order"),
    );
    println!("\nCharges: naive {n}, inbox by event id {i}, business key {k}.");
    expect(n == 3, "the naive consumer to charge every delivery");
    expect(
        i == 2,
        "the event-id inbox to stop the redelivery but not the re-publication",
    );
    expect(k == 1, "the business key to charge order 1 once");

    // The trade-off: a second, legitimate event about order 1 (a later top-up) is also dropped.
    let top_up = Envelope::new(OrderPlaced {
        order_id: 1,
        total_cents: 100,
    });
    let outcome = by_order(&mut conn, top_up).unwrap();
    println!("A later, different event about order 1 under the business key: {outcome:?}.");
    expect(
        outcome.is_duplicate(),
        "the business key to drop a new event with the same key",
    );
    println!(
        "\nUse the event id (the default) to absorb redeliveries; use a business key when the same\nfact may arrive as different events and must take effect once."
    );
}
