//! One trace from the writer's span to the handler's span: a `tracing` subscriber with the
//! OpenTelemetry layer and OpenTelemetry's in-memory exporter; an order written with
//! `transaction_with_outbox` on SQLite inside the writer's span; the relay (in process,
//! `SqliteRelayStore` + `KafkaPublisher`) publishing it to the broker; the consumer runtime's
//! handler opening its own span. The exported spans must form one trace, the handler's span a
//! descendant of the writer's (handler → `outbox.consume` → writer), and the relay's batch span
//! must have recorded what it published.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use diesel::Connection;
use opentelemetry::trace::{SpanId, TraceContextExt, TracerProvider as _};
use opentelemetry::{Key, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox::kafka::{KafkaConsumer, KafkaPublisher};
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig, SqliteRelayStore};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{OrderCreated, TestDatabase};
use crate::{bootstrap, topic};

fn attribute(span: &SpanData, key: &'static str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == Key::from_static_str(key))
        .map(|kv| kv.value.clone())
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_span_continues_the_writer_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-test")));
    tracing::subscriber::set_global_default(subscriber)
        .expect("the only subscriber of this test binary");

    let db = TestDatabase::sqlite("otel");
    let topic = topic("otel", 1).await;

    // The writer: a span (say, an HTTP request's), and the order written inside it.
    let writer = tracing::info_span!("place_order");
    let writer_trace = writer.context().span().span_context().trace_id();
    let order_id = {
        let _entered = writer.enter();
        let mut conn = diesel::SqliteConnection::establish(&db.url).unwrap();
        conn.transaction_with_outbox(|tx| {
            tx.publish(&OrderCreated {
                order_id: 7,
                total_cents: 700,
            })?;
            Ok::<_, outbox::Error>(7)
        })
        .unwrap()
    };
    drop(writer);

    let route = topic.clone();
    let publisher = KafkaPublisher::builder()
        .brokers(bootstrap())
        .topic_for(move |_| route.clone())
        .build()
        .unwrap();
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        ..RelayConfig::default()
    };
    let relay = Relay::new(SqliteRelayStore::new(&db.url), publisher, config).unwrap();
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relaying = tokio::spawn(relay.run(async move {
        relay_stopped.await.ok();
    }));

    let consumer = KafkaConsumer::builder()
        .brokers(bootstrap())
        .group(format!("otel-{topic}"))
        .assign(&topic, 0..1)
        .set("fetch.wait.max.ms", "100")
        .handler(|event: Envelope<OrderCreated>| async move {
            // The application's own span, inside the runtime's span of the message.
            let span = tracing::info_span!("charge", order_id = event.order_id);
            span.in_scope(|| tracing::info!("charged"));
            Ok::<_, std::io::Error>(Outcome::Applied(()))
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));
    let deadline = Instant::now() + Duration::from_secs(60);
    while stats.applied.load(Ordering::Relaxed) < 1 {
        assert!(Instant::now() < deadline, "gave up waiting: {stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(()).unwrap();
    consuming.await.unwrap();
    stop_relay.send(()).unwrap();
    relaying.await.unwrap();
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    let [writer] = named(&spans, "place_order")[..] else {
        panic!("one writer span: {names:?}")
    };
    // Other tests of this binary consume other topics meanwhile.
    let ours: Vec<&SpanData> = named(&spans, "outbox.consume")
        .into_iter()
        .filter(|s| attribute(s, "topic") == Some(Value::from(topic.clone())))
        .collect();
    let [consume] = ours[..] else {
        panic!("one consumer span: {names:?}")
    };
    let [charge] = named(&spans, "charge")[..] else {
        panic!("one handler span: {names:?}")
    };
    assert_eq!(writer.span_context.trace_id(), writer_trace);
    assert_eq!(
        writer.parent_span_id,
        SpanId::INVALID,
        "the writer's span is a root"
    );
    for span in [consume, charge] {
        assert_eq!(
            span.span_context.trace_id(),
            writer_trace,
            "`{}` is in the writer's trace",
            span.name
        );
    }
    assert_eq!(
        consume.parent_span_id,
        writer.span_context.span_id(),
        "the consumer's span is a child of the writer's (a parent, not a link)"
    );
    assert_eq!(
        charge.parent_span_id,
        consume.span_context.span_id(),
        "the handler's span nests under the consumer's"
    );
    assert_eq!(
        attribute(consume, "outcome"),
        Some(Value::from("applied")),
        "{consume:?}"
    );
    assert_eq!(
        attribute(consume, "aggregate_id"),
        Some(Value::from(order_id.to_string()))
    );

    // The relay's batch: a span of its own (it carries events of many traces), with counts.
    let batches = named(&spans, "outbox.relay.batch");
    assert!(
        batches
            .iter()
            // tracing-opentelemetry records a `u64` as text when it could exceed an `i64`.
            .any(|b| attribute(b, "published").is_some_and(|v| v.as_str() == "1")),
        "a batch span that published the event: {batches:?}"
    );
    assert!(
        batches
            .iter()
            .all(|b| b.span_context.trace_id() != writer_trace),
        "relay batches are not part of the events' traces"
    );
}
