//! `outbox_consumer_lag_messages{topic, partition}`: a consumer that starts behind (messages
//! produced before it runs, handled slowly) shows a lag above 0, and 0 once it has drained.
//! The gauge is read from a Prometheus recorder installed for this process.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use outbox::kafka::{KafkaConsumer, KafkaPublisher};
use outbox::relay::{Delivery, Publisher};
use outbox::{Envelope, Outcome};

use crate::support::{OrderCreated, claimed};
use crate::{bootstrap, topic};

const MESSAGES: i64 = 40;

/// The gauge's value for `topic` partition 0 in a Prometheus text page.
fn lag(page: &str, topic: &str) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with("outbox_consumer_lag_messages{"))
        .filter(|l| l.contains(&format!("topic=\"{topic}\"")) && l.contains("partition=\"0\""))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_lag_rises_while_behind_and_returns_to_zero_once_drained() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");

    let topic = topic("lag", 1).await;
    let route = topic.clone();
    let publisher = KafkaPublisher::builder()
        .brokers(bootstrap())
        .topic_for(move |_| route.clone())
        .build()
        .unwrap();
    let batch: Vec<_> = (1..=MESSAGES)
        .map(|order_id| {
            claimed(&OrderCreated {
                order_id,
                total_cents: 1,
            })
        })
        .collect();
    let outcomes = publisher.publish(&batch).await;
    assert!(
        outcomes.iter().all(|o| *o == Delivery::Published),
        "{outcomes:?}"
    );

    // Behind by MESSAGES, handled at 50 ms each: about 2 s to drain, while librdkafka's
    // statistics come every 100 ms.
    let consumer = KafkaConsumer::builder()
        .brokers(bootstrap())
        .group(format!("lag-{topic}"))
        .assign(&topic, 0..1)
        .set("fetch.wait.max.ms", "100")
        .set("statistics.interval.ms", "100")
        .handler(|_: Envelope<OrderCreated>| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, std::io::Error>(Outcome::Applied(()))
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));

    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while stats.applied.load(Ordering::Relaxed) < MESSAGES as u64 {
        assert!(Instant::now() < deadline, "gave up draining: {stats:?}");
        if let Some(lag) = lag(&metrics.render(), &topic) {
            seen.push(lag);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let max = seen.iter().copied().fold(0.0, f64::max);
    assert!(
        max >= 10.0,
        "the lag while behind by {MESSAGES} messages: samples {seen:?}"
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = lag(&metrics.render(), &topic);
        if now == Some(0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lag never returned to 0 after draining: {now:?} (samples while behind: \
             {seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(()).unwrap();
    consuming.await.unwrap();
}
