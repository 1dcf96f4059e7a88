//! NATS JetStream and RabbitMQ for the drains: the machine's own servers (`--nats`,
//! `--amqp`), each drain's publishers built and warmed up before the clock starts, and what
//! the drains leave on them emptied before each run.
//!
//! - NATS: the publisher creates the stream `bench_order` (subjects `bench.order.>`) on its
//!   first publish; it is purged before each drain and deleted at the end.
//! - RabbitMQ: a message no queue takes is refused (an outage to the relay), so the bench
//!   binds a queue of its own, `bench.order.sink`, to the exchange `bench.order` before the
//!   first publish; it is purged before each drain and deleted at the end.

use std::time::Duration;

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox::nats::NatsPublisher;
use outbox::rabbitmq::RabbitMqPublisher;
use outbox::relay::Publisher;

use crate::drain::warm_up_message;

/// The drains' topic, with their prefix: the exchange, the subjects' first tokens.
const TOPIC: &str = "bench.order";
const QUEUE: &str = "bench.order.sink";

/// `url` without its password, for the report.
pub fn shown(url: &str) -> String {
    outbox::redact::url(url).into_owned()
}

/// Whether something listens at `url`'s `host:port`.
pub fn reachable(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let host_port = rest.split('/').next().unwrap_or(rest);
    std::net::ToSocketAddrs::to_socket_addrs(host_port)
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
}

/// The NATS publisher a drain uses (subjects `bench.order.<id>`), after one message that no
/// drain counts.
pub async fn warm_nats_publisher(url: &str) -> NatsPublisher {
    let publisher = NatsPublisher::builder()
        .servers(url)
        .subject_prefix("bench.")
        .build()
        .await
        .expect("nats");
    let outcome = publisher.publish(&[warm_up_message()]).await;
    assert!(
        outcome.iter().all(|d| d.error().is_none()),
        "warm-up publish to {url} failed: {outcome:?}"
    );
    publisher
}

/// The RabbitMQ publisher a drain uses (exchange `bench.order`), after one message that no
/// drain counts; the sink queue must be bound ([`reset_rabbitmq`]).
pub async fn warm_rabbitmq_publisher(url: &str) -> RabbitMqPublisher {
    let publisher = RabbitMqPublisher::builder()
        .uri(url)
        .exchange_prefix("bench.")
        .build()
        .expect("rabbitmq");
    let outcome = publisher.publish(&[warm_up_message()]).await;
    assert!(
        outcome.iter().all(|d| d.error().is_none()),
        "warm-up publish to {url} failed: {outcome:?}"
    );
    publisher
}

/// Empties the drains' stream (it is created by the first publish).
pub async fn reset_nats(url: &str) {
    let client = async_nats::connect(url).await.expect("nats");
    let js = async_nats::jetstream::new(client);
    if let Ok(mut stream) = js.get_stream(outbox::nats::stream_name(TOPIC)).await {
        let _ = stream.purge().await;
        let _ = stream.info().await;
    }
}

/// Declares the exchange and the sink queue bound to it, and empties the queue.
pub async fn reset_rabbitmq(url: &str) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("rabbitmq");
    let channel = connection.create_channel().await.expect("channel");
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            TOPIC.into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .expect("exchange");
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(QUEUE.into(), durable, FieldTable::default())
        .await
        .expect("queue");
    channel
        .queue_bind(
            QUEUE.into(),
            TOPIC.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("binding");
    channel
        .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
        .await
        .expect("purge");
    let _ = connection.close(200, "reset".into()).await;
}

/// Deletes what the drains left: the stream, the exchange and the queue.
pub async fn forget(nats: &str, amqp: &str) {
    if !nats.is_empty()
        && let Ok(client) = async_nats::connect(nats).await
    {
        let js = async_nats::jetstream::new(client);
        let _ = js.delete_stream(outbox::nats::stream_name(TOPIC)).await;
    }
    if !amqp.is_empty()
        && let Ok(connection) = Connection::connect(amqp, ConnectionProperties::default()).await
        && let Ok(channel) = connection.create_channel().await
    {
        let _ = channel
            .queue_delete(QUEUE.into(), QueueDeleteOptions::default())
            .await;
        let _ = channel
            .exchange_delete(TOPIC.into(), ExchangeDeleteOptions::default())
            .await;
        let _ = connection.close(200, "done".into()).await;
    }
}
