//! Quickstart: write business rows and their events in one transaction.
//!
//! Run it with `cargo run --example quickstart`. It needs no services: it creates an SQLite
//! database in a temporary directory, applies the outbox migrations, and then
//!
//! 1. places two orders, each with its `OrderCreated` event, atomically;
//! 2. tries a third order whose transaction fails after publishing its event, and shows that
//!    neither the order nor the event was stored;
//! 3. prints what the outbox table holds: the events a relay publishes next;
//! 4. runs a relay that publishes them to an in-memory broker (the same relay publishes to
//!    Kafka in production: see `examples/orders_kafka.rs`), and prints what the broker got;
//! 5. consumes every event **twice** (brokers deliver at least once) with an `#[idempotent]`
//!    handler that writes an invoice, and shows each invoice written once.
//!
//! The point of the outbox: the event is a row in the same local transaction as the order, so
//! there is never an order without its event, nor an event about an order that does not exist.
//! The relay then publishes committed rows only, outside any transaction, at least once.

#![allow(missing_docs)] // `diesel::table!` generates undocumented items

use diesel::prelude::*;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

diesel::table! {
    orders (id) {
        id -> BigInt,
        customer -> Text,
        total_cents -> BigInt,
    }
}

/// The event, declared once. The derive checks the declaration at compile time: the aggregate
/// name, exactly one `aggregate_id` field, a valid version.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
    customer: String,
    total_cents: i64,
}

/// The application's error type: it only needs `From<diesel::result::Error>` (for the
/// transaction) and, to use `?` on `publish`, `From<outbox::Error>`.
#[derive(Debug)]
enum AppError {
    Db(diesel::result::Error),
    Outbox(outbox::Error),
    OutOfStock,
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

impl From<outbox::Error> for AppError {
    fn from(e: outbox::Error) -> Self {
        AppError::Outbox(e)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Db(e) => write!(f, "database: {e}"),
            AppError::Outbox(e) => write!(f, "outbox: {e}"),
            AppError::OutOfStock => f.write_str("out of stock"),
        }
    }
}

impl std::error::Error for AppError {}

/// Places an order: the row and its event commit together, or neither does.
fn place_order(
    conn: &mut SqliteConnection,
    order_id: i64,
    customer: &str,
    total_cents: i64,
    in_stock: bool,
) -> Result<(), AppError> {
    conn.transaction_with_outbox(|tx| {
        diesel::insert_into(orders::table)
            .values((
                orders::id.eq(order_id),
                orders::customer.eq(customer),
                orders::total_cents.eq(total_cents),
            ))
            .execute(tx.conn())?;
        tx.publish(&OrderCreated {
            order_id,
            customer: customer.to_owned(),
            total_cents,
        })?;
        // A business rule checked after the event was published: failing here rolls back
        // the order *and* its event.
        if !in_stock {
            return Err(AppError::OutOfStock);
        }
        Ok(())
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("quickstart.db");
    let mut conn = SqliteConnection::establish(path.to_str().ok_or("non-UTF-8 temp path")?)?;
    let applied = outbox::migrations::run(&mut conn)?;
    diesel::sql_query(
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, customer TEXT NOT NULL, total_cents BIGINT NOT NULL)",
    )
    .execute(&mut conn)?;
    println!(
        "Created {} with the outbox tables (migrations applied: {applied:?}).",
        path.display()
    );

    println!("\n1. Placing two orders, each with its OrderCreated event, in one transaction each.");
    place_order(&mut conn, 1, "ada", 1250, true)?;
    place_order(&mut conn, 2, "grace", 4200, true)?;
    println!("   Both committed.");

    println!("\n2. Placing order 3, which fails after publishing its event (out of stock).");
    match place_order(&mut conn, 3, "linus", 999, false) {
        Err(e) => println!("   The transaction failed ({e}) and was rolled back."),
        Ok(()) => return Err("order 3 should have failed".into()),
    }

    let order_count: i64 = orders::table.count().get_result(&mut conn)?;
    let event_count: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "(SELECT COUNT(*) FROM outbox_events)",
    ))
    .get_result(&mut conn)?;
    println!("\n3. The database now holds {order_count} orders and {event_count} events:");
    let rows: Vec<EventRow> = diesel::sql_query(
        "SELECT seq, event_type, aggregate_id, payload, created_at FROM outbox_events ORDER BY seq",
    )
    .load(&mut conn)?;
    for r in &rows {
        println!(
            "   #{} {} for order {} at {}: {}",
            r.seq, r.event_type, r.aggregate_id, r.created_at, r.payload
        );
    }
    if order_count != 2 || event_count != 2 {
        return Err("expected exactly the two committed orders and their two events".into());
    }
    println!(
        "\nOrder 3 left no trace: no order row and no event. Every stored order has its event,\n\
         waiting in the outbox for a relay to publish it."
    );

    let broker = relay_to_memory_broker(path.to_str().ok_or("non-UTF-8 temp path")?)?;
    consume_twice(&mut conn, &broker)?;
    Ok(())
}

/// The consumer's effect: one invoice per order. `#[idempotent]` runs the body in a
/// transaction that first records `("invoicing", event id)` in the inbox table; a message seen
/// before returns `Outcome::Duplicate` without running the body, so redeliveries are harmless.
#[idempotent(consumer = "invoicing")]
fn invoice(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> Result<(), AppError> {
    diesel::sql_query("INSERT INTO invoices (order_id, total_cents) VALUES (?, ?)")
        .bind::<diesel::sql_types::BigInt, _>(event.order_id)
        .bind::<diesel::sql_types::BigInt, _>(event.total_cents)
        .execute(conn)?;
    Ok(())
}

/// Step 5: every event delivered twice, each invoice written once.
fn consume_twice(
    conn: &mut SqliteConnection,
    broker: &outbox::relay::MemoryBroker,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n5. Consuming every event twice, as an at-least-once broker may deliver them.");
    diesel::sql_query(
        "CREATE TABLE invoices (order_id BIGINT NOT NULL, total_cents BIGINT NOT NULL)",
    )
    .execute(conn)?;
    let records = broker.records("order");
    for record in records.iter().chain(records.iter()) {
        let event = Envelope::<OrderCreated>::from_record(record)?;
        let order_id = event.order_id;
        let outcome = invoice(conn, event)?;
        println!("   event {} (order {order_id}) -> {outcome:?}", record.id);
    }
    let invoices: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "(SELECT COUNT(*) FROM invoices)",
    ))
    .get_result(conn)?;
    println!(
        "   {} deliveries, {invoices} invoices: each effect applied exactly once.",
        records.len() * 2
    );
    if invoices != records.len() as i64 {
        return Err("expected one invoice per order".into());
    }
    Ok(())
}

/// Step 4: a relay claims the committed events, publishes them (here to the in-memory broker),
/// and marks them published. It runs until the outbox is drained, then shuts down gracefully.
fn relay_to_memory_broker(
    database: &str,
) -> Result<std::sync::Arc<outbox::relay::MemoryBroker>, Box<dyn std::error::Error>> {
    use outbox::relay::{MemoryBroker, Relay, RelayConfig, SqliteRelayStore};
    use std::sync::Arc;
    use std::time::Duration;

    println!("\n4. Running a relay: it publishes the committed events to an in-memory broker.");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let broker = Arc::new(MemoryBroker::new());
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        ..RelayConfig::default()
    };
    let relay = Relay::new(SqliteRelayStore::new(database), broker.clone(), config)?;
    let stats = relay.stats();
    runtime.block_on(relay.run(async {
        // Stop once both events are out; a real relay runs until SIGTERM.
        while broker.all_records().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }));
    for r in broker.records("order") {
        println!(
            "   topic `{}` key {} {} (event id {}): {}",
            r.topic,
            r.key,
            r.header("event_type").unwrap_or("?"),
            r.id,
            r.payload
        );
    }
    let published = stats.published.load(std::sync::atomic::Ordering::Relaxed);
    println!("   The relay published and marked {published} events; order 3's never existed.");
    if published != 2 {
        return Err("expected the relay to publish exactly the two committed events".into());
    }
    Ok(broker)
}

#[derive(QueryableByName)]
struct EventRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_type: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    aggregate_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    payload: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    created_at: String,
}
