//! Orders to Kafka: PostgreSQL, `transaction_with_outbox`, and a relay publishing to Kafka.
//!
//! Run it with a PostgreSQL and a Kafka (or Kafka-protocol) broker at hand:
//!
//! ```text
//! ./scripts/kafka.sh start        # a local Kafka-protocol broker on 127.0.0.1:9092
//! DATABASE_URL=postgres://postgres@127.0.0.1/test KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run --example orders_kafka --features postgres,kafka
//! ```
//!
//! What each step guarantees:
//!
//! 1. **Write.** `transaction_with_outbox` inserts the order and its `OrderPlaced` event in one
//!    local transaction. Both commit or neither does: no lost event if the process dies after
//!    the commit (the event is already a row), no phantom event if the commit fails (the row
//!    rolls back with the order).
//! 2. **Relay.** The relay claims committed rows in one short statement (a lease), publishes
//!    them to Kafka with no transaction open, then marks them published where it still holds
//!    the lease. Kafka's idempotent producer with `acks=all` acknowledges a message once every
//!    in-sync replica has it. If the relay dies between publishing and marking, the lease
//!    expires and the events are published again: delivery is **at least once**, so consumers
//!    deduplicate on the `id` header (the inbox pattern).
//! 3. **Order.** In `sharded` mode every aggregate (here: every order) belongs to one of 256
//!    shards, each leased by one relay at a time; the key is the order id, so an order's events
//!    land on one partition in the order they were written.

use std::sync::atomic::Ordering;
use std::time::Duration;

use diesel::prelude::*;
use outbox::kafka::KafkaPublisher;
use outbox::prelude::*;
use outbox::relay::{Mode, PgRelayStore, Relay, RelayConfig};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderPlaced", version = 1)]
struct OrderPlaced {
    #[outbox(aggregate_id)]
    order_id: uuid::Uuid,
    customer: String,
    total_cents: i64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".to_owned());
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());

    // The outbox tables, and the example's own.
    let mut conn = PgConnection::establish(&database_url)?;
    outbox::migrations::run(&mut conn)?;
    diesel::sql_query(
        "CREATE TABLE IF NOT EXISTS example_orders (id UUID PRIMARY KEY, customer TEXT NOT NULL, \
         total_cents BIGINT NOT NULL)",
    )
    .execute(&mut conn)?;

    // 1. Write: each order and its event in one transaction.
    let mut placed = Vec::new();
    for (customer, total_cents) in [("ada", 1250), ("grace", 4200), ("linus", 999)] {
        let order_id = uuid::Uuid::now_v7();
        conn.transaction_with_outbox(|tx| {
            diesel::sql_query(
                "INSERT INTO example_orders (id, customer, total_cents) VALUES ($1, $2, $3)",
            )
            .bind::<diesel::sql_types::Uuid, _>(order_id)
            .bind::<diesel::sql_types::Text, _>(customer)
            .bind::<diesel::sql_types::BigInt, _>(total_cents)
            .execute(tx.conn())?;
            tx.publish(&OrderPlaced {
                order_id,
                customer: customer.to_owned(),
                total_cents,
            })?;
            Ok::<_, outbox::Error>(())
        })?;
        placed.push(order_id.to_string()); // the aggregate id, as the outbox stores it
    }
    println!(
        "1. placed {} orders, each committed with its OrderPlaced event",
        placed.len()
    );

    // 2. Relay: publish to Kafka until our events are out.
    let publisher = KafkaPublisher::builder()
        .brokers(brokers.clone())
        .message_timeout(Duration::from_secs(10))
        .build()?;
    let config = RelayConfig {
        mode: Mode::Sharded,
        publish_timeout: publisher.publish_timeout(),
        ..RelayConfig::default()
    };
    let relay = Relay::new(PgRelayStore::new(database_url.clone()), publisher, config)?;
    let stats = relay.stats();
    let pending = move || -> Result<i64, String> {
        let mut c = PgConnection::establish(&database_url).map_err(|e| e.to_string())?;
        diesel::sql_query(
            "SELECT COUNT(*) AS n FROM outbox_events \
             WHERE published_at IS NULL AND aggregate_type = 'order' AND aggregate_id = ANY($1)",
        )
        .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(&placed)
        .get_result::<Count>(&mut c)
        .map(|c| c.n)
        .map_err(|e| e.to_string())
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(relay.run(async move {
        // A real relay runs until SIGTERM (see `outbox relay`); this one stops when our three
        // events are published, or after a minute.
        let start = std::time::Instant::now();
        while !matches!(pending(), Ok(0)) && start.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }));
    let published = stats.published.load(Ordering::Relaxed);
    println!("2. the relay published {published} events to Kafka at {brokers} (topic `order`)");
    if published < 3 {
        return Err("the events were not all published within a minute: is Kafka up?".into());
    }
    println!("3. each event's key is its order id, so an order's events stay in order");
    Ok(())
}
