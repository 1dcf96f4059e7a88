//! The publisher: the message as lapin reads it, per-key order, unroutable messages, an
//! unreachable broker, a connection closed under it.

use std::collections::HashMap;

use super::*;

#[tokio::test]
async fn a_published_message_reads_back_with_its_event() {
    let mut rabbit = Rabbit::new().await;
    let (topic, queue) = (unique("order"), unique("read"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit.queue(&queue, &topic, false).await;
    let msg = placed(&topic, 42, 1);
    publish_all(&publisher(), std::slice::from_ref(&msg)).await;

    let got = rabbit.drain(&queue).await;
    assert_eq!(got.len(), 1);
    let d = &got[0];
    assert_eq!(
        (d.exchange.as_str(), d.routing_key.as_str()),
        (topic.as_str(), "42")
    );
    assert_eq!(d.data, msg.payload.as_bytes());
    let p = &d.properties;
    let id = msg.id.hyphenated().to_string();
    assert_eq!(
        p.message_id().as_ref().map(|s| s.as_str()),
        Some(id.as_str())
    );
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(*p.timestamp(), Some(msg.created_at.timestamp() as u64));
    assert_eq!(header(d, "id"), id);
    assert_eq!(header(d, "event_type"), "OrderPlaced");
    assert_eq!(header(d, "event_version"), "2");
    assert_eq!(header(d, "aggregate_type"), "order");
    assert_eq!(header(d, "traceparent"), "00-abc-def-01");
    rabbit.clean().await;
}

#[tokio::test]
async fn each_key_keeps_its_order_over_thousands_of_messages() {
    let mut rabbit = Rabbit::new().await;
    let (topic, queue) = (unique("order"), unique("order-read"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit.queue(&queue, &topic, false).await;
    let publisher = publisher();
    let all: Vec<OutboxMessage> = (0..3_000).map(|i| placed(&topic, i % 50, i)).collect();
    for batch in all.chunks(500) {
        publish_all(&publisher, batch).await;
    }
    let got = rabbit.drain(&queue).await;
    assert_eq!(got.len(), all.len());
    let mut last: HashMap<String, u64> = HashMap::new();
    for d in &got {
        let event: OrderPlaced = serde_json::from_slice(&d.data).unwrap();
        let before = last.insert(d.routing_key.to_string(), event.n);
        assert!(
            before.is_none_or(|b| b < event.n),
            "{before:?} then {}",
            event.n
        );
    }
    assert_eq!(last.len(), 50);
    rabbit.clean().await;
}

/// The publisher declares a missing exchange (no queue yet: unroutable, an outage naming
/// the exchange), and keeps an existing one of another kind as it is.
#[tokio::test]
async fn unroutable_messages_wait_until_a_queue_is_bound() {
    let mut rabbit = Rabbit::new().await;
    let (topic, queue) = (unique("new"), unique("late"));
    let publisher = publisher();
    let msg = placed(&topic, 7, 1);
    rabbit.owns(&[&topic], &[]);
    let outcomes = publisher.publish(std::slice::from_ref(&msg)).await;
    let why = outcomes[0].error().unwrap_or_default().to_owned();
    assert!(outcomes[0].is_outage(), "{outcomes:?}");
    assert!(
        why.contains(&topic) && why.contains("`7`") && why.contains("NO_ROUTE"),
        "{why}"
    );
    rabbit.queue(&queue, &topic, false).await;
    publish_all(&publisher, std::slice::from_ref(&msg)).await;
    let got = rabbit.drain(&queue).await;
    assert_eq!(got.len(), 1, "nothing lost, nothing twice");

    // A fanout exchange declared beforehand stays a fanout: an active declare as `topic`
    // would have been refused (PRECONDITION_FAILED).
    let (fanout, fan_queue) = (unique("fanout"), unique("fan"));
    rabbit.exchange(&fanout, ExchangeKind::Fanout).await;
    rabbit.queue(&fan_queue, &fanout, false).await;
    publish_all(&publisher, &[placed(&fanout, 8, 1)]).await;
    assert_eq!(rabbit.drain(&fan_queue).await.len(), 1);
    rabbit.clean().await;
}

#[tokio::test]
async fn an_unreachable_broker_is_an_outage_and_not_ready() {
    let publisher = RabbitMqPublisher::builder()
        .uri("amqp://relay:s3cret@127.0.0.1:1/%2f")
        .confirm_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let started = Instant::now();
    let outcomes = publisher
        .publish(&[placed("order", 1, 1), placed("order", 2, 1)])
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(outcomes.iter().all(Delivery::is_outage), "{outcomes:?}");
    let why = publisher.unavailable().expect("known down");
    let not_ready = publisher.ready(Duration::from_secs(1)).await.unwrap_err();
    for shown in [why, not_ready.to_string(), format!("{publisher:?}")] {
        assert!(
            shown.contains("127.0.0.1:1") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
    assert!(
        self::publisher()
            .ready(Duration::from_secs(5))
            .await
            .is_ok()
    );
}

/// The broker closes the publisher's connection: the next publishes reconnect, and nothing
/// is lost.
#[tokio::test]
async fn a_closed_connection_is_reopened_on_the_next_publish() {
    let mut rabbit = Rabbit::new().await;
    let (topic, queue, name) = (unique("order"), unique("read"), unique("relay"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit.queue(&queue, &topic, false).await;
    let publisher = RabbitMqPublisher::builder()
        .uri(amqp_url())
        .connection_name(&name)
        .build()
        .unwrap();
    let first = placed(&topic, 1, 0);
    publish_all(&publisher, std::slice::from_ref(&first)).await;
    assert_eq!(close_connections(&name), 1);

    let second = placed(&topic, 2, 0);
    let mut outcomes = Vec::new();
    for _ in 0..10 {
        let outcome = publisher.publish(std::slice::from_ref(&second)).await;
        outcomes.push(outcome[0].clone());
        if outcome[0] == Delivery::Published {
            break;
        }
        assert!(outcome[0].is_outage(), "{outcome:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(outcomes.last(), Some(&Delivery::Published), "{outcomes:?}");
    assert!(outcomes.len() <= 2, "one outage at most: {outcomes:?}");
    assert_eq!(publisher.unavailable(), None);
    let mut ids: Vec<String> = rabbit
        .drain(&queue)
        .await
        .iter()
        .map(|d| header(d, "id"))
        .collect();
    ids.dedup();
    let want = [first.id, second.id].map(|id| id.hyphenated().to_string());
    assert_eq!(ids, want);
    rabbit.clean().await;
}

/// A message over the broker's `max_message_size` (lowered for the test, then restored): the
/// broker closes the channel with PRECONDITION_FAILED, which reaches every message in flight;
/// sent again alone, the large one is refused again and is `Failed` (poison), the others are
/// published.
#[tokio::test]
async fn a_message_over_the_broker_s_size_limit_is_failed_and_the_others_go_on() {
    let mut rabbit = Rabbit::new().await;
    let (topic, queue) = (unique("order"), unique("read"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit.queue(&queue, &topic, false).await;
    let limit = MaxMessageSize::lowered_to(1 << 20);
    // A new publisher: the limit is read when a channel opens.
    let publisher = publisher();
    let mut large = placed(&topic, 1, 0);
    large.payload = format!("{{\"blob\":\"{}\"}}", "x".repeat(2 << 20));
    let batch: Vec<OutboxMessage> = std::iter::once(large)
        .chain((2..12).map(|i| placed(&topic, i, 0)))
        .collect();
    let outcomes = publisher.publish(&batch).await;
    drop(limit);
    match &outcomes[0] {
        Delivery::Failed(why) => assert!(why.contains("PRECONDITION_FAILED"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        outcomes[1..].iter().all(|d| *d == Delivery::Published),
        "{outcomes:?}"
    );
    let got = rabbit.drain(&queue).await;
    let mut keys: Vec<u64> = got
        .iter()
        .map(|d| d.routing_key.as_str().parse().unwrap())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys, (2..12).collect::<Vec<_>>());
    rabbit.clean().await;
}

/// The broker's `max_message_size`, lowered until dropped (then RabbitMQ's default again).
struct MaxMessageSize;

impl MaxMessageSize {
    fn lowered_to(bytes: u64) -> MaxMessageSize {
        Self::set(bytes);
        MaxMessageSize
    }

    fn set(bytes: u64) {
        let code = format!("application:set_env(rabbit, max_message_size, {bytes}).");
        let out = std::process::Command::new("rabbitmqctl")
            .args(["eval", &code])
            .output()
            .expect("this test needs `rabbitmqctl`");
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for MaxMessageSize {
    fn drop(&mut self) {
        Self::set(134_217_728);
    }
}
