//! The consumer: retries, dead letters and parking, redelivery, the single active consumer,
//! a connection closed under it.

use std::sync::Mutex;

use outbox_core::fault::Transient;
use outbox_core::{BoxError, Envelope, Outcome};

use super::*;

/// Order 1 is applied; order 2 always fails and is dead-lettered after 2 attempts, its next
/// event parked behind it; order 3 fails with an outage three times and is then applied,
/// never dead-lettered. Everything is acknowledged.
#[tokio::test]
async fn handled_retried_dead_lettered_and_parked() {
    let mut rabbit = Rabbit::new().await;
    let (topic, group) = (unique("order"), unique("billing"));
    let (queue, dlt) = (format!("{group}.{topic}"), format!("{topic}.dlt"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit.queue(&queue, &topic, true).await;
    rabbit.owns(&[&dlt], &[&dlt]);
    let batch = [
        placed(&topic, 1, 0),
        placed(&topic, 2, 0),
        placed(&topic, 2, 1),
        placed(&topic, 3, 0),
    ];
    publish_all(&publisher(), &batch).await;

    let outages = Arc::new(Mutex::new(0));
    let seen = outages.clone();
    let running = start(
        consumer(&group, &topic)
            .max_attempts(2)
            .handler(move |event: Envelope<OrderPlaced>| {
                let seen = seen.clone();
                async move {
                    match event.order_id {
                        2 => Err::<Outcome<()>, BoxError>("card declined".into()),
                        3 => {
                            let mut seen = seen.lock().unwrap();
                            *seen += 1;
                            if *seen <= 3 {
                                return Err(
                                    Box::new(Transient::new("database restarting")) as BoxError
                                );
                            }
                            Ok(Outcome::Applied(()))
                        }
                        _ => Ok(Outcome::Applied(())),
                    }
                }
            })
            .build()
            .unwrap(),
    );
    running.until("handled", |s| n(&s.done) == 4).await;
    let stats = running.stop().await;
    assert_eq!(
        (n(&stats.applied), n(&stats.dead_lettered), n(&stats.parked)),
        (2, 2, 1),
        "{stats:?}"
    );
    assert_eq!(
        (n(&stats.transient_errors), n(&stats.handler_errors)),
        (3, 2),
        "{stats:?}"
    );

    let dead = rabbit.drain(&dlt).await;
    assert_eq!(dead.len(), 2);
    assert_eq!(header(&dead[0], "outbox.error"), "card declined");
    assert_eq!(header(&dead[0], "outbox.error.kind"), "handler");
    assert_eq!(header(&dead[0], "outbox.attempts"), "2");
    assert_eq!(header(&dead[0], "outbox.original.topic"), topic);
    assert_eq!(header(&dead[0], "outbox.consumer.group"), group);
    assert_eq!(header(&dead[0], "id"), batch[1].id.hyphenated().to_string());
    assert_eq!(dead[0].routing_key.as_str(), "2");
    assert_eq!(dead[0].data, batch[1].payload.as_bytes());
    assert_eq!(header(&dead[1], "outbox.error.kind"), "parked");
    assert_eq!(header(&dead[1], "id"), batch[2].id.hyphenated().to_string());
    assert!(
        rabbit.drain(&queue).await.is_empty(),
        "every delivery was acknowledged"
    );
    rabbit.clean().await;
}

/// A consumer that dies with a delivery in its handler never acknowledged it: the next
/// consumer of the group gets it again, and the one after it.
#[tokio::test]
async fn a_delivery_not_acknowledged_comes_again_to_the_next_consumer() {
    let mut rabbit = Rabbit::new().await;
    let (topic, group) = (unique("order"), unique("billing"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit
        .queue(&format!("{group}.{topic}"), &topic, true)
        .await;
    rabbit.owns(&[&format!("{topic}.dlt")], &[&format!("{topic}.dlt")]);
    let msg = placed(&topic, 5, 0);
    publish_all(&publisher(), std::slice::from_ref(&msg)).await;

    let (called, mut called_rx) = tokio::sync::mpsc::unbounded_channel();
    let stuck = start(
        consumer(&group, &topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                called.send(event.id).ok();
                async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok::<_, String>(Outcome::Applied(()))
                }
            })
            .build()
            .unwrap(),
    );
    let first = tokio::time::timeout(DEADLINE, called_rx.recv())
        .await
        .unwrap()
        .unwrap();
    stuck.task.abort(); // a crash: the connection goes, the delivery was never acknowledged

    let ids: Arc<Mutex<Vec<uuid::Uuid>>> = Arc::default();
    let got = ids.clone();
    let next = start(
        consumer(&group, &topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                got.lock().unwrap().push(event.id);
                async { Ok::<_, String>(Outcome::Applied(())) }
            })
            .build()
            .unwrap(),
    );
    next.until("redelivered", |s| n(&s.done) == 1).await;
    next.stop().await;
    assert_eq!((first, ids.lock().unwrap().clone()), (msg.id, vec![msg.id]));
    rabbit.clean().await;
}

/// Two consumers of one group: one is active and gets everything; when it stops, the other
/// takes over.
#[tokio::test]
async fn a_single_active_consumer_and_its_standby() {
    let mut rabbit = Rabbit::new().await;
    let (topic, group) = (unique("order"), unique("billing"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit
        .queue(&format!("{group}.{topic}"), &topic, true)
        .await;
    rabbit.owns(&[&format!("{topic}.dlt")], &[&format!("{topic}.dlt")]);
    let handled: Arc<Mutex<Vec<(&str, u64)>>> = Arc::default();
    let member = |name: &'static str| {
        let handled = handled.clone();
        consumer(&group, &topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                handled.lock().unwrap().push((name, event.n));
                async { Ok::<_, String>(Outcome::Applied(())) }
            })
            .build()
            .unwrap()
    };
    let publisher = publisher();
    let active = start(member("a"));
    publish_all(
        &publisher,
        &(0..10).map(|i| placed(&topic, i, i)).collect::<Vec<_>>(),
    )
    .await;
    active.until("a", |s| n(&s.done) == 10).await;
    let standby = start(member("b"));
    publish_all(
        &publisher,
        &(10..20).map(|i| placed(&topic, i, i)).collect::<Vec<_>>(),
    )
    .await;
    active.until("a again", |s| n(&s.done) == 20).await;
    active.stop().await;
    publish_all(
        &publisher,
        &(20..30).map(|i| placed(&topic, i, i)).collect::<Vec<_>>(),
    )
    .await;
    standby.until("b", |s| n(&s.done) == 10).await;
    standby.stop().await;
    let handled = handled.lock().unwrap().clone();
    let by = |who: &str| -> Vec<u64> {
        // Each event is a key of its own: keys are published side by side, in any order.
        let mut mine: Vec<u64> = handled
            .iter()
            .filter(|(w, _)| *w == who)
            .map(|(_, n)| *n)
            .collect();
        mine.sort_unstable();
        mine
    };
    assert_eq!(by("a"), (0..20).collect::<Vec<_>>());
    assert_eq!(by("b"), (20..30).collect::<Vec<_>>());
    rabbit.clean().await;
}

/// The broker closes the consumer's connection while a handler runs: the handler's
/// acknowledgement fails, the consumer reconnects, and the delivery comes again.
#[tokio::test]
async fn a_closed_connection_is_reopened_and_the_delivery_comes_again() {
    let mut rabbit = Rabbit::new().await;
    let (topic, group) = (unique("order"), unique("billing"));
    rabbit.exchange(&topic, ExchangeKind::Topic).await;
    rabbit
        .queue(&format!("{group}.{topic}"), &topic, true)
        .await;
    rabbit.owns(&[&format!("{topic}.dlt")], &[&format!("{topic}.dlt")]);
    let publisher = publisher();
    publish_all(&publisher, &[placed(&topic, 1, 0)]).await;

    let calls: Arc<Mutex<Vec<u64>>> = Arc::default();
    let (started, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let proceed = Arc::new(tokio::sync::Notify::new());
    let (seen, go) = (calls.clone(), proceed.clone());
    let running = start(
        consumer(&group, &topic)
            .handler(move |event: Envelope<OrderPlaced>| {
                let first = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(event.order_id);
                    seen.len() == 1
                };
                started.send(()).ok();
                let go = go.clone();
                async move {
                    if first {
                        go.notified().await;
                    }
                    Ok::<_, String>(Outcome::Applied(()))
                }
            })
            .build()
            .unwrap(),
    );
    tokio::time::timeout(DEADLINE, started_rx.recv())
        .await
        .unwrap();
    assert_eq!(close_connections(&group), 1);
    proceed.notify_one();
    running.until("redelivered", |s| n(&s.applied) == 2).await;
    publish_all(&publisher, &[placed(&topic, 2, 0)]).await;
    running
        .until("after the reconnect", |s| n(&s.applied) == 3)
        .await;
    let stats = running.stop().await;
    // The first acknowledgement may have left before the client saw the close (basic.ack
    // has no answer): counted done or not, the broker had requeued the delivery.
    assert!((2..=3).contains(&n(&stats.done)), "{stats:?}");
    assert_eq!(*calls.lock().unwrap(), [1, 1, 2]);
    rabbit.clean().await;
}
