//! Orders through RabbitMQ: PostgreSQL, `transaction_with_outbox`, a relay publishing to
//! RabbitMQ with publisher confirms, and an `#[idempotent]` consumer applying each order once.
//!
//! Run it with a PostgreSQL and a RabbitMQ at hand:
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/test AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f \
//!     cargo run --example orders_rabbitmq --features postgres,rabbitmq
//! ```
//!
//! First the pitfall: a publisher that waits for the broker's confirm but does not set
//! `mandatory` publishes to an exchange no queue is bound to yet (the consumer has not started,
//! a binding was deleted). The broker confirms the message and drops it: the confirm means
//! "the broker took responsibility", and with no queue to route to, it is done with it. The
//! outbox publisher sets `mandatory`, so the broker returns such a message, and the relay keeps
//! the event as an outage until a queue is there.
//!
//! What each step guarantees:
//!
//! 1. **Write.** `transaction_with_outbox` inserts the order and its `OrderPlaced` event in one
//!    local transaction: both commit or neither does.
//! 2. **Relay.** The relay publishes each event to the exchange `order` (here a name of the
//!    run's own) with the order id as routing key, persistent and `mandatory`, and counts it
//!    published only once the broker confirmed it. An order's next event is sent only once the
//!    previous one was confirmed: each order's events reach the queue in order. RabbitMQ keeps
//!    no duplicate window: a relay that publishes again after a crash stores the event twice,
//!    with the same `message_id`.
//! 3. **Consume.** The consumer declares the queue `billing.<exchange>` (single active
//!    consumer: one process reads it at a time, the others stand by) and hands each delivery
//!    to the handler; the handler's transaction records the event id in the inbox with its
//!    effect, and the delivery is acknowledged only after that commit. A delivery that comes
//!    again (a repeat of the relay, or the process died before its acknowledgement) finds its
//!    id in the inbox and is a `Duplicate`: the effect happens once.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_async::AsyncPgConnection;
use outbox::prelude::*;
use outbox::rabbitmq::{RabbitMqConsumer, RabbitMqPublisher};
use outbox::relay::{Mode, PgRelayStore, Relay, RelayConfig};
use outbox::{Envelope, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderPlaced", version = 1)]
struct OrderPlaced {
    #[outbox(aggregate_id)]
    order_id: uuid::Uuid,
    customer: String,
    total_cents: i64,
}

/// The consumer's effect: an invoice per order, in the same transaction as the inbox row.
#[idempotent(consumer = "billing")]
async fn invoice(
    conn: &mut AsyncPgConnection,
    event: Envelope<OrderPlaced>,
) -> Result<(), diesel::result::Error> {
    let insert =
        diesel::sql_query("INSERT INTO example_invoices (order_id, total_cents) VALUES ($1, $2)")
            .bind::<diesel::sql_types::Uuid, _>(event.order_id)
            .bind::<diesel::sql_types::BigInt, _>(event.total_cents);
    diesel_async::RunQueryDsl::execute(insert, conn).await?;
    Ok(())
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// How many of `orders` have their invoice.
fn invoiced(database_url: &str, orders: &[uuid::Uuid]) -> Result<i64, Box<dyn std::error::Error>> {
    let mut conn = PgConnection::establish(database_url)?;
    let count =
        diesel::sql_query("SELECT COUNT(*) AS n FROM example_invoices WHERE order_id = ANY($1)")
            .bind::<diesel::sql_types::Array<diesel::sql_types::Uuid>, _>(orders)
            .get_result::<Count>(&mut conn)?;
    Ok(count.n)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".to_owned());
    let amqp_url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    // The example's own exchange for orders, so that a run's queue holds only its own.
    let topic = format!("example-orders-{}", uuid::Uuid::now_v7().simple());

    let mut conn = PgConnection::establish(&database_url)?;
    outbox::migrations::run(&mut conn)?;
    diesel::sql_query(
        "CREATE TABLE IF NOT EXISTS example_invoices (order_id UUID PRIMARY KEY, \
         total_cents BIGINT NOT NULL)",
    )
    .execute(&mut conn)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // 0. The pitfall: confirmed, yet dropped, because no queue is bound and the message
        // was not `mandatory`.
        let connection =
            lapin::Connection::connect(&amqp_url, lapin::ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                topic.as_str().into(),
                lapin::ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await?;
        let confirm = channel
            .basic_publish(
                topic.as_str().into(),
                "naive".into(),
                BasicPublishOptions::default(),
                b"{}",
                lapin::BasicProperties::default(),
            )
            .await?
            .await?;
        if !matches!(confirm, Confirmation::Ack(None)) {
            return Err(format!("expected a plain confirm, got {confirm:?}").into());
        }
        println!(
            "0. naive: the broker confirmed a message to an exchange without a queue; it is gone"
        );
        connection.close(200, "done".into()).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;

    // 1. Write: each order's event in one transaction with the order (here: the event alone).
    let mut orders = Vec::new();
    for (customer, total_cents) in [("ada", 1250), ("grace", 4200), ("linus", 999)] {
        let order_id = uuid::Uuid::now_v7();
        conn.transaction_with_outbox(|tx| {
            tx.publish(&OrderPlaced {
                order_id,
                customer: customer.to_owned(),
                total_cents,
            })
        })?;
        orders.push(order_id);
    }
    println!(
        "1. placed {} orders, each committed with its event",
        orders.len()
    );

    runtime.block_on(async {
        // 2. Relay to RabbitMQ. No queue is bound yet: every message comes back (`mandatory`),
        // and the relay keeps the events as an outage.
        let ours = topic.clone();
        let publisher = RabbitMqPublisher::builder()
            .uri(&amqp_url)
            .exchange_for(move |msg| match msg.aggregate_type.as_str() {
                "order" => ours.clone(),
                _ => msg.topic().to_owned(),
            })
            .build()?;
        let config = RelayConfig {
            mode: Mode::Sharded,
            publish_timeout: publisher.publish_timeout(),
            ..RelayConfig::default()
        };
        let relay = Relay::new(PgRelayStore::new(database_url.clone()), publisher, config)?;
        let relay_stats = relay.stats();
        let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
        let relaying = tokio::spawn(relay.run(async move {
            relay_stopped.await.ok();
        }));
        let start = Instant::now();
        while relay_stats.unavailable.load(Ordering::Relaxed) == 0
            && start.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let returned = relay_stats.unavailable.load(Ordering::Relaxed);
        if returned == 0 || relay_stats.published.load(Ordering::Relaxed) > 0 {
            return Err("the relay should have kept the events while no queue was bound".into());
        }
        println!("2. outbox: {returned} events came back (no queue bound); the relay keeps them");

        // 3. The consumer declares its queue; the relay's next attempt delivers. The inbox
        // and the invoice commit in one transaction, then the delivery is acknowledged.
        let conn = Arc::new(tokio::sync::Mutex::new(
            outbox::connect::postgres(&database_url).await?,
        ));
        let consumer = RabbitMqConsumer::builder()
            .uri(&amqp_url)
            .group("billing")
            .topic(&topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                let conn = conn.clone();
                async move { invoice(&mut *conn.lock().await, event).await }
            })
            .build()?;
        let stats = consumer.stats();
        let (stop_consumer, consumer_stopped) = tokio::sync::oneshot::channel::<()>();
        let consuming = tokio::spawn(consumer.run(async move {
            consumer_stopped.await.ok();
        }));
        let start = Instant::now();
        while invoiced(&database_url, &orders)? < orders.len() as i64
            && start.elapsed() < Duration::from_secs(60)
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop_relay.send(()).ok();
        stop_consumer.send(()).ok();
        relaying.await?;
        consuming.await?;
        let published = relay_stats.published.load(Ordering::Relaxed);
        println!("   then the relay published {published} events to the exchange `{topic}`");
        println!(
            "3. the consumer applied {} and recognised {} as duplicates",
            stats.get(&stats.applied),
            stats.get(&stats.duplicates)
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;

    let invoiced = invoiced(&database_url, &orders)?;
    println!(
        "   {invoiced} invoices for {} orders: each order once",
        orders.len()
    );
    if invoiced != orders.len() as i64 {
        return Err("not every order was invoiced once: is RabbitMQ up?".into());
    }
    // The example's exchanges and queues: removed so that runs do not pile up.
    runtime.block_on(async {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        let connection =
            lapin::Connection::connect(&amqp_url, lapin::ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        let dead_letters = format!("{topic}.dlt");
        for queue in [format!("billing.{topic}"), dead_letters.clone()] {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        for exchange in [topic.as_str(), dead_letters.as_str()] {
            channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}
