//! End to end through NATS JetStream (`OUTBOX_TEST_NATS_URL`, default
//! `nats://127.0.0.1:4222`): 20,000 events of 1,000 aggregates written with
//! `transaction_with_outbox` to PostgreSQL, relayed by two sharded relays, consumed by
//! `NatsConsumer` with an `#[idempotent]` handler writing to another database, and read back
//! from the stream by async-nats' own client. Every event is applied once, each aggregate's in
//! order.
//!
//! ```text
//! cargo nextest run --features nats,postgres --test consumer nats
//! ```

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::AckPolicy, consumer::PullConsumer, consumer::pull};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures_util::StreamExt;
use outbox::Envelope;
use outbox::nats::{NatsConsumer, NatsPublisher};

use crate::conns::*;
use crate::pipeline::*;
use crate::support::*;

fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// Deletes the topic's streams (the events', the dead letters') when dropped, also when the
/// test fails.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let topic = self.0.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(nats_url()).await {
                    let js = jetstream::new(client);
                    for name in [topic.clone(), format!("{topic}-dlt")] {
                        let _ = js.delete_stream(outbox::nats::stream_name(&name)).await;
                    }
                }
            });
        });
        let _ = cleanup.join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_events_through_nats_applied_once_in_order() {
    let started = Instant::now();
    let source = TestDatabase::postgres("nats_source");
    let sink = with_effects_async::<AsyncPgConnection>(TestDatabase::postgres("nats_sink")).await;
    let suffix = uuid::Uuid::now_v7().simple().to_string();
    let (topic, group) = (format!("outbox-e2e-{suffix}"), format!("billing-{suffix}"));
    let _cleanup = Cleanup(topic.clone());

    // The consumer, one connection to the sink (no fsync per message: the test is about
    // order and duplicates, not the sink's durability). It creates the topic's stream.
    let mut conn = <AsyncPgConnection as AsyncConn>::open(&sink).await;
    conn.batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let conn = Arc::new(tokio::sync::Mutex::new(conn));
    let consumer = NatsConsumer::builder()
        .servers(nats_url())
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
        .await
        .unwrap();
    let stats = consumer.stats();
    let (stop_consumer, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));

    // Two sharded relays, each with its own publisher.
    let mut publishers = Vec::new();
    for _ in 0..2 {
        let target = topic.clone();
        let publisher = NatsPublisher::builder()
            .servers(nats_url())
            .topic_for(move |_| target.clone())
            .build()
            .await
            .unwrap();
        publishers.push(publisher);
    }
    let publishers: [NatsPublisher; 2] = publishers.try_into().ok().unwrap();
    let consumer = (stop_consumer, consuming);
    let (total, elapsed) =
        relay_write_and_check(&source, &sink, publishers, stats, consumer, started).await;

    // async-nats' own reading of the stream: every event (at least once), in order.
    let js = jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    let stream = js
        .get_stream(outbox::nats::stream_name(&topic))
        .await
        .unwrap();
    let reader: PullConsumer = stream
        .create_consumer(pull::Config {
            ack_policy: AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = reader.messages().await.unwrap();
    let (mut seen, mut positions) = (HashSet::new(), Vec::new());
    let stored = stream.cached_info().state.messages;
    for _ in 0..stored {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("the stream's messages")
            .unwrap()
            .unwrap();
        let id = message
            .headers
            .as_ref()
            .unwrap()
            .get("Nats-Msg-Id")
            .unwrap();
        if seen.insert(id.to_string()) {
            let event: OrderCreated = serde_json::from_slice(&message.payload).unwrap();
            assert_eq!(
                message.subject.as_str(),
                format!("{topic}.{}", event.order_id)
            );
            positions.push((event.order_id, event.total_cents));
        }
    }
    assert_each_aggregate_in_order("the stream", &positions);

    println!("{total} events through NATS in {elapsed:?}");
}
