//! Orders through NATS JetStream: PostgreSQL, `transaction_with_outbox`, a relay publishing to
//! JetStream, and an `#[idempotent]` consumer applying each order once.
//!
//! Run it with a PostgreSQL and a NATS server with JetStream (`nats-server -js`) at hand:
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/test NATS_URL=nats://127.0.0.1:4222 \
//!     cargo run --example orders_nats --features postgres,nats
//! ```
//!
//! First the pitfall: a relay that publishes, loses the acknowledgement (a timeout, a dropped
//! connection) and publishes again stores the event twice, unless the message carries an id
//! the stream deduplicates on. The outbox publisher sends the event id as `Nats-Msg-Id`, so
//! the repeat is dropped within the stream's duplicate window.
//!
//! What each step guarantees:
//!
//! 1. **Write.** `transaction_with_outbox` inserts the order and its `OrderPlaced` event in one
//!    local transaction: both commit or neither does.
//! 2. **Relay.** The relay publishes each event to the subject `order.<order id>` and counts it
//!    published only once JetStream acknowledged it (stored in the stream). The event id is
//!    the `Nats-Msg-Id`, so a relay that publishes again after a crash within the stream's
//!    duplicate window (2 minutes) stores nothing twice. An order's next event is sent only
//!    once the previous one was acknowledged: each order's events are stored in order.
//! 3. **Consume.** A durable pull consumer hands each message to the handler; the handler's
//!    transaction records the event id in the inbox with its effect, and the message is
//!    acknowledged only after that commit. A message delivered again (the process died before
//!    its acknowledgement, or the relay published it again after the window) finds its id in
//!    the inbox and is a `Duplicate`: the effect happens once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_async::AsyncPgConnection;
use outbox::nats::{NatsConsumer, NatsPublisher};
use outbox::prelude::*;
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
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    // The example's own topic for orders, so that a run's stream holds only its own.
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
        // 0. The pitfall: the same event published twice, once without and once with an id.
        let pitfall = format!("{topic}-pitfall");
        let js = async_nats::jetstream::new(async_nats::connect(&nats_url).await?);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: outbox::nats::stream_name(&pitfall),
            subjects: vec![format!("{pitfall}.>")],
            ..Default::default()
        })
        .await?;
        let subject = format!("{pitfall}.1");
        for _ in 0..2 {
            js.publish(subject.clone(), "{}".into()).await?.await?;
        }
        for _ in 0..2 {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", "0193f1d2-0000-7000-8000-000000000001");
            js.publish_with_headers(subject.clone(), headers, "{}".into())
                .await?
                .await?;
        }
        let mut stream = js.get_stream(outbox::nats::stream_name(&pitfall)).await?;
        let stored = stream.info().await?.state.messages;
        js.delete_stream(outbox::nats::stream_name(&pitfall))
            .await?;
        if stored != 3 {
            return Err(format!("expected 2 copies without an id and 1 with: {stored}").into());
        }
        println!("0. a publish repeated after a lost ack: 2 copies without Nats-Msg-Id, 1 with it");
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
        // 2. Relay to JetStream until our events are out.
        let ours = topic.clone();
        let publisher = NatsPublisher::builder()
            .servers(&nats_url)
            .topic_for(move |msg| match msg.aggregate_type.as_str() {
                "order" => ours.clone(),
                _ => msg.topic().to_owned(),
            })
            .build()
            .await?;
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

        // 3. Consume: the inbox and the invoice in one transaction, then the acknowledgement.
        let conn = Arc::new(tokio::sync::Mutex::new(
            outbox::connect::postgres(&database_url).await?,
        ));
        let consumer = NatsConsumer::builder()
            .servers(&nats_url)
            .group("billing")
            .topic(&topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                let conn = conn.clone();
                async move { invoice(&mut *conn.lock().await, event).await }
            })
            .build()
            .await?;
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
        println!("2. the relay published {published} events to `{topic}.<order id>`");
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
        return Err("not every order was invoiced once: are NATS and JetStream up?".into());
    }
    // The example's stream and its consumer: removed so that runs do not pile up.
    runtime.block_on(async {
        let client = async_nats::connect(&nats_url).await?;
        async_nats::jetstream::new(client)
            .delete_stream(outbox::nats::stream_name(&topic))
            .await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}
