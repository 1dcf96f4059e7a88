#![allow(missing_docs)]
//! What an operator observes, against a real Kafka-protocol broker (noida-db at
//! `KAFKA_BROKERS` or 127.0.0.1:9092; `scripts/kafka.sh start`):
//!
//! - `otel` (feature `opentelemetry`): one trace from the writer's span, through
//!   `transaction_with_outbox` on SQLite, the relay and Kafka, to the consumer handler's span,
//!   recorded by OpenTelemetry's in-memory exporter;
//! - `lag`: the consumer's `outbox_consumer_lag_messages` gauge rising while the consumer is
//!   behind and falling to 0 once it has drained.
//!
//! A test binary of its own: each test installs a process-wide hook (the `tracing` subscriber,
//! the `metrics` recorder) that the other test binaries must not see.
//!
//! Run with `cargo test --all-features --test observe`.

#[path = "../integration/support.rs"]
mod support;

mod lag;
#[cfg(feature = "opentelemetry")]
mod otel;

diesel::table! {
    orders (id) {
        id -> BigInt,
        total_cents -> BigInt,
    }
}

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use uuid::Uuid;

pub(crate) fn bootstrap() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A fresh topic of `partitions` partitions.
pub(crate) async fn topic(what: &str, partitions: i32) -> String {
    let topic = format!("outbox-{what}-{}", Uuid::now_v7().simple());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                partitions,
                TopicReplication::Fixed(1),
            )],
            &options,
        )
        .await
        .expect("a Kafka-protocol broker: run `scripts/kafka.sh start` or set KAFKA_BROKERS")
    {
        result.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
    topic
}
