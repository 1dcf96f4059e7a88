//! End to end through RabbitMQ (`OUTBOX_TEST_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`): 20,000 events of 1,000 aggregates written with
//! `transaction_with_outbox` to PostgreSQL, relayed by two sharded relays, consumed by
//! `RabbitMqConsumer` with an `#[idempotent]` handler writing to another database, and read
//! back from a second queue by lapin's own client. Every event is applied once, each
//! aggregate's in order.
//!
//! ```text
//! cargo nextest run --features rabbitmq,postgres --test consumer rabbitmq
//! ```

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{ConnectionProperties, ExchangeKind};
use outbox::Envelope;
use outbox::rabbitmq::{RabbitMqConsumer, RabbitMqPublisher};

use crate::conns::*;
use crate::pipeline::*;
use crate::support::*;

fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// Declares `name` as `durable`, with `args`, bound to `exchange` with `#`.
async fn bound_queue(channel: &lapin::Channel, name: &str, exchange: &str, args: FieldTable) {
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(name.into(), durable, args)
        .await
        .unwrap();
    let bind = QueueBindOptions::default();
    channel
        .queue_bind(
            name.into(),
            exchange.into(),
            "#".into(),
            bind,
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// Deletes the test's queues and exchanges when dropped, also when the test fails.
struct Cleanup {
    queues: Vec<String>,
    exchanges: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (queues, exchanges) = (self.queues.clone(), self.exchanges.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let Ok(rabbit) =
                    lapin::Connection::connect(&amqp_url(), ConnectionProperties::default()).await
                else {
                    return;
                };
                let Ok(channel) = rabbit.create_channel().await else {
                    return;
                };
                for q in &queues {
                    let _ = channel
                        .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                for e in &exchanges {
                    let _ = channel
                        .exchange_delete(e.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = rabbit.close(200, "done".into()).await;
            });
        });
        let _ = cleanup.join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_events_through_rabbitmq_applied_once_in_order() {
    let started = Instant::now();
    let source = TestDatabase::postgres("rmq_source");
    let sink = with_effects_async::<AsyncPgConnection>(TestDatabase::postgres("rmq_sink")).await;
    let suffix = uuid::Uuid::now_v7().simple().to_string();
    let (topic, group, audit) = (
        format!("outbox-e2e-{suffix}"),
        format!("billing-{suffix}"),
        format!("outbox-e2e-audit-{suffix}"),
    );
    let queue = format!("{group}.{topic}");
    let _cleanup = Cleanup {
        queues: vec![queue.clone(), audit.clone(), format!("{topic}.dlt")],
        exchanges: vec![topic.clone(), format!("{topic}.dlt")],
    };

    // The exchange, the consumer's queue (as the consumer declares it) and lapin's own queue,
    // bound before anything is published.
    let rabbit = lapin::Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ is not reachable: start it or set OUTBOX_TEST_AMQP_URL");
    let channel = rabbit.create_channel().await.unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let kind = ExchangeKind::Topic;
    channel
        .exchange_declare(topic.as_str().into(), kind, durable, FieldTable::default())
        .await
        .unwrap();
    let mut single_active = FieldTable::default();
    single_active.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    bound_queue(&channel, &queue, &topic, single_active).await;
    bound_queue(&channel, &audit, &topic, FieldTable::default()).await;

    // The consumer, one connection to the sink (no fsync per message: the test is about
    // order and duplicates, not the sink's durability).
    let mut conn = <AsyncPgConnection as AsyncConn>::open(&sink).await;
    conn.batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let conn = Arc::new(tokio::sync::Mutex::new(conn));
    let consumer = RabbitMqConsumer::builder()
        .uri(amqp_url())
        .group(&group)
        .topic(&topic)
        .handler(move |event: Envelope<OrderCreated>| {
            let conn = conn.clone();
            async move {
                let mut conn = conn.lock().await;
                apply(&mut conn, event).await.map_err(|e| format!("{e:?}"))
            }
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop_consumer, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));

    // Two sharded relays, each with its own publisher.
    let publishers = [(); 2].map(|()| {
        let target = topic.clone();
        RabbitMqPublisher::builder()
            .uri(amqp_url())
            .exchange_for(move |_| target.clone())
            .build()
            .unwrap()
    });
    let consumer = (stop_consumer, consuming);
    let (total, elapsed) =
        relay_write_and_check(&source, &sink, publishers, stats, consumer, started).await;

    // lapin's own reading of the second queue: every event (at least once), in order.
    let (mut seen, mut positions) = (HashSet::new(), Vec::new());
    let get = BasicGetOptions { no_ack: true };
    while let Some(got) = channel.basic_get(audit.as_str().into(), get).await.unwrap() {
        let delivery = got.delivery;
        let id = delivery
            .properties
            .message_id()
            .clone()
            .unwrap()
            .to_string();
        if seen.insert(id) {
            let event: OrderCreated = serde_json::from_slice(&delivery.data).unwrap();
            assert_eq!(delivery.routing_key.as_str(), event.order_id.to_string());
            positions.push((event.order_id, event.total_cents));
        }
    }
    assert_each_aggregate_in_order("the audit queue", &positions);

    println!("{total} events through RabbitMQ in {elapsed:?}");
}
