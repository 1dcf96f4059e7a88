//! Upcasting through a real Kafka-protocol broker (noida-db at `KAFKA_BROKERS` or
//! 127.0.0.1:9092): version-1 events written with `transaction_with_outbox` on SQLite and
//! published by the relay (in process, `SqliteRelayStore` + `KafkaPublisher`), then, after the
//! code moved to version 3, consumed by an `#[idempotent]` handler that only sees version 3.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::Connection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use outbox::kafka::{KafkaConsumer, KafkaPublisher};
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig, SqliteRelayStore};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::conns::*;
use crate::support::*;

type Conn = SyncConnectionWrapper<diesel::SqliteConnection>;

/// What the old code wrote: the total in `total`.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderPlaced", version = 1)]
pub struct OrderPlacedV1 {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub total: i64,
}

/// Version 2 renamed the field.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderPlaced", version = 2, upcast_from = OrderPlacedV1)]
pub struct OrderPlacedV2 {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub total_cents: i64,
}

/// Version 3, the current one, added a required currency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderPlaced", version = 3, upcast_from = OrderPlacedV2)]
pub struct OrderPlaced {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub total_cents: i64,
    pub currency: String,
}

impl From<OrderPlacedV1> for OrderPlacedV2 {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlacedV2 {
            order_id: v1.order_id,
            total_cents: v1.total,
        }
    }
}

impl From<OrderPlacedV2> for OrderPlaced {
    fn from(v2: OrderPlacedV2) -> Self {
        OrderPlaced {
            order_id: v2.order_id,
            total_cents: v2.total_cents,
            currency: "EUR".into(),
        }
    }
}

#[idempotent(consumer = "shipping")]
async fn ship(
    conn: &mut Conn,
    event: Envelope<OrderPlaced>,
    seen: &Mutex<Vec<(u32, OrderPlaced)>>,
) -> Result<(), AppError> {
    conn.effect(
        "shipping",
        &event.inbox_key(),
        event.order_id,
        event.total_cents,
    )
    .await?;
    seen.lock()
        .unwrap()
        .push((event.version, event.payload.clone()));
    Ok(())
}

fn bootstrap() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_1_events_relayed_through_kafka_are_consumed_as_version_3() {
    const OLD: i64 = 10;
    let source = TestDatabase::sqlite("upcast_source");
    let sink = Arc::new(with_effects_async::<Conn>(TestDatabase::sqlite("upcast_sink")).await);
    let topic = format!("outbox-upcast-{}", Uuid::now_v7().simple());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .expect("a Kafka-protocol broker: run `scripts/kafka.sh start` or set KAFKA_BROKERS")
    {
        result.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }

    // The old code writes version 1; after the upgrade the new code writes version 3.
    let mut conn = diesel::SqliteConnection::establish(&source.url).unwrap();
    for order_id in 1..=OLD {
        conn.transaction_with_outbox(|tx| {
            tx.publish(&OrderPlacedV1 {
                order_id,
                total: order_id * 100,
            })?;
            Ok::<_, outbox::Error>(())
        })
        .unwrap();
    }
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderPlaced {
            order_id: OLD + 1,
            total_cents: 5,
            currency: "CHF".into(),
        })?;
        Ok::<_, outbox::Error>(())
    })
    .unwrap();

    let relay_topic = topic.clone();
    let publisher = KafkaPublisher::builder()
        .brokers(bootstrap())
        .topic_for(move |_| relay_topic.clone())
        .build()
        .unwrap();
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        ..RelayConfig::default()
    };
    let relay = Relay::new(SqliteRelayStore::new(&source.url), publisher, config).unwrap();
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relaying = tokio::spawn(relay.run(async move {
        relay_stopped.await.ok();
    }));

    let seen: Arc<Mutex<Vec<(u32, OrderPlaced)>>> = Arc::default();
    let (handler_sink, handler_seen) = (sink.clone(), seen.clone());
    let consumer = KafkaConsumer::builder()
        .brokers(bootstrap())
        .group(format!("upcast-{}", Uuid::now_v7().simple()))
        .assign(&topic, 0..1)
        .set("fetch.wait.max.ms", "100")
        .handler(move |event: Envelope<OrderPlaced>| {
            let (sink, seen) = (handler_sink.clone(), handler_seen.clone());
            async move {
                let mut conn = Conn::open(&sink).await;
                ship(&mut conn, event, &seen)
                    .await
                    .map_err(|e| format!("{e:?}"))
            }
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));
    let deadline = Instant::now() + Duration::from_secs(120);
    while stats.applied.load(std::sync::atomic::Ordering::Relaxed) < OLD as u64 + 1 {
        assert!(Instant::now() < deadline, "gave up waiting: {stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(()).unwrap();
    consuming.await.unwrap();
    stop_relay.send(()).unwrap();
    relaying.await.unwrap();

    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|(_, e)| e.order_id);
    let expected: Vec<(u32, OrderPlaced)> = (1..=OLD)
        .map(|id| {
            (
                1,
                OrderPlaced {
                    order_id: id,
                    total_cents: id * 100,
                    currency: "EUR".into(),
                },
            )
        })
        .chain([(
            3,
            OrderPlaced {
                order_id: OLD + 1,
                total_cents: 5,
                currency: "CHF".into(),
            },
        )])
        .collect();
    assert_eq!(
        seen, expected,
        "each event once, as version 3, written as version 1 or 3"
    );
    let mut conn = Conn::open(&sink).await;
    assert_eq!(conn.count(COUNT_EFFECTS).await, OLD + 1);
    assert_eq!(conn.count(COUNT_INBOX).await, OLD + 1);
}
