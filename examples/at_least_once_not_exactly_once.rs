//! Why the outbox delivers at least once, not exactly once: a relay that dies between the broker's ack and marking the row publishes it again. SQLite, no services.
//!
//! Relay A publishes the event, the broker stores it, and A is killed (injected) before it can
//! mark the row published. No relay can close this window: the broker's write and the
//! database's mark are two systems with no shared commit. Once A's lease on the row runs out,
//! relay B publishes it again. A consumer that counts deliveries applies the event twice; an
//! `#[idempotent]` consumer (inbox keyed by the event id) applies it once. Promising
//! "exactly once" from the relay is the pitfall; "exactly once in effect" is what consumers
//! build on at-least-once delivery.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{OrderPlaced, SqliteDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{Delivery, MemoryBroker, OutboxMessage, Publisher, Relay, SqliteRelayStore};

/// Forwards to the broker, then never returns: the relay process dies right after the ack.
struct DiesAfterAck(Arc<MemoryBroker>);

impl Publisher for DiesAfterAck {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        self.0.publish(batch).await;
        std::future::pending().await
    }
}

#[idempotent(consumer = "shipping")]
fn ship(conn: &mut SqliteConnection, event: Envelope<OrderPlaced>) -> QueryResult<()> {
    diesel::sql_query(format!("INSERT INTO shipments VALUES ({})", event.order_id))
        .execute(conn)?;
    Ok(())
}

fn main() {
    let db = SqliteDb::new();
    let mut conn = db.conn();
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderPlaced {
            order_id: 1,
            total_cents: 700,
        })
    })
    .unwrap();
    let broker = Arc::new(MemoryBroker::new());
    let config = common::quick_config(); // lease 2 s

    println!("1. Relay A publishes the event and is killed before marking it.");
    // Multi-threaded: relay A is killed by dropping its future, possibly while a statement of
    // its SQLite store is in flight (the relay works on the database while publishes run),
    // and dropping that waits for it in place, which a current-thread runtime cannot do.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config_a = outbox::relay::RelayConfig {
        relay_id: "relay-a".into(),
        ..config.clone()
    };
    let relay_a = Relay::new(
        SqliteRelayStore::new(db.path.clone()),
        DiesAfterAck(broker.clone()),
        config_a,
    )
    .unwrap();
    let watched = broker.clone();
    runtime.block_on(async {
        tokio::select! {
            _ = relay_a.run(std::future::pending()) => unreachable!("relay A runs until killed"),
            _ = async { while watched.all_records().is_empty() { tokio::time::sleep(Duration::from_millis(5)).await } } => {}
        }
    }); // dropping relay A's future here is the kill: no mark, no release
    let killed_at = Instant::now();
    let unmarked = count!(&mut conn, "outbox_events WHERE published_at IS NULL");
    println!(
        "   The broker holds {} message; the outbox still has {unmarked} unpublished row.",
        broker.all_records().len()
    );
    expect(unmarked == 1, "the row to stay unpublished after the ack");

    println!("\n2. Relay B takes the row over once A's lease ends, and publishes it again.");
    let seen = broker.clone();
    let (done, _) = common::relay_until(
        SqliteRelayStore::new(db.path.clone()),
        broker.clone(),
        outbox::relay::RelayConfig {
            relay_id: "relay-b".into(),
            ..config
        },
        Duration::from_secs(10),
        move || seen.all_records().len() == 2,
    );
    let records = broker.all_records();
    println!(
        "   After {:?}: {} messages on the broker, ids equal: {}.",
        killed_at.elapsed(),
        records.len(),
        records[0].id == records[records.len() - 1].id
    );
    expect(
        done && records.len() == 2 && records[0].id == records[1].id,
        "the same event delivered twice",
    );

    println!("\n3. Consumers: counting deliveries versus deduplicating on the event id.");
    diesel::sql_query("CREATE TABLE shipments (order_id BIGINT)")
        .execute(&mut conn)
        .unwrap();
    let naive = records.len(); // a consumer that ships on every delivery
    for record in &records {
        let outcome = ship(
            &mut conn,
            Envelope::<OrderPlaced>::from_record(record).unwrap(),
        )
        .unwrap();
        println!("   delivery of {} -> {outcome:?}", record.id);
    }
    let shipped = count!(&mut conn, "shipments");
    println!("   A naive consumer ships {naive} times; the idempotent one ships {shipped} time.");
    expect(shipped == 1, "one shipment from two deliveries");
    println!(
        "\nAt least once from the relay, exactly once in effect at the consumer: that is the\nwhole promise. Anyone promising exactly-once delivery is hiding this window."
    );
}
