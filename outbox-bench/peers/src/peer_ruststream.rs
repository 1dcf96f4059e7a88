//! ruststream-sqlx with ruststream-rdkafka, as its Relay guide builds a relay: the event is
//! written into an inbox table in the writer's transaction, and a subscription to that table
//! publishes it to another broker (here Kafka); the acknowledgement deletes the row.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use ruststream_rdkafka::{KafkaBroker, KafkaPublish};
use ruststream_sqlx::prelude::*;
use sqlx::postgres::PgPoolOptions;

use crate::{Args, OrderCreated, Outcome, TX_EVENTS, watch};

/// The inbox table the relay reads, as the Relay guide's `order_events` (without its
/// `locked_until` column: on Postgres the default form is the row lock, `FOR UPDATE SKIP LOCKED`
/// held for the handler).
const SCHEMA: &str = "CREATE TABLE bench_events (
    id BIGSERIAL PRIMARY KEY,
    aggregate TEXT NOT NULL,
    payload BYTEA NOT NULL
)";

/// One row of `bench_events`: an event waiting for the relay, keyed by its aggregate.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "bench_events")]
struct BenchEvent {
    #[field(id, generated)]
    id: i64,
    #[field(partition_key)]
    aggregate: String,
    #[field(payload)]
    payload: Vec<u8>,
}

/// Each claimed batch goes out on Kafka as it was written; the acknowledgement deletes its rows.
#[subscriber(InboxQueue::<BenchEvent>::new("bench-events"), reply)]
async fn relay(events: &[OrderCreated]) -> Vec<OrderCreated> {
    events.to_vec()
}

/// One event at a time, as the Relay guide's relay: mounted with `workers_by_key(n)` for
/// `--by-key`.
#[subscriber(InboxQueue::<BenchEvent>::new("bench-events"), reply)]
async fn relay_one(event: &OrderCreated) -> OrderCreated {
    event.clone()
}

/// The versions resolved.
pub fn version() -> String {
    format!(
        "ruststream-sqlx {}, ruststream-rdkafka {}, ruststream {}",
        env!("PEER_RUSTSTREAM_SQLX"),
        env!("PEER_RUSTSTREAM_RDKAFKA"),
        env!("PEER_RUSTSTREAM")
    )
}

/// Sets up, writes the backlog, drains it to Kafka and measures.
pub async fn run(args: &Args, url: &str) -> Result<Outcome, String> {
    let n = args.events;
    let pool = PgPoolOptions::new()
        .connect(url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    sqlx::raw_sql(SCHEMA)
        .execute(&pool)
        .await
        .map_err(|e| format!("schema: {e}"))?;

    // The write path: `Insert::insert` on the caller's transaction, 1,000 events per transaction.
    let t0 = Instant::now();
    let mut i = 0i64;
    while i < n {
        let mut tx = pool.begin().await.map_err(|e| format!("begin: {e}"))?;
        for _ in 0..TX_EVENTS.min(n - i) {
            i += 1;
            let event = OrderCreated::nth(i);
            let row = BenchEvent {
                id: 0,
                aggregate: event.order_id.to_string(),
                payload: serde_json::to_vec(&event).map_err(|e| e.to_string())?,
            };
            row.insert(&mut *tx)
                .await
                .map_err(|e| format!("insert: {e}"))?;
        }
        tx.commit().await.map_err(|e| format!("commit: {e}"))?;
    }
    let write_rate = n as f64 / t0.elapsed().as_secs_f64();

    // The relay: the inbox broker over the pool, a batch subscription replying to Kafka.
    let batch = NonZeroUsize::new(args.batch).ok_or("--batch must be at least 1")?;
    let kafka = KafkaBroker::new([args.kafka.clone()]).bindable();
    let to_kafka = kafka.bind(KafkaPublish::default());
    let workers = NonZeroUsize::new(args.workers).ok_or("--workers must be at least 1")?;
    let (by_key, many) = (args.by_key, workers.get() > 1);
    let app = RustStream::new(AppInfo::new("outbox-bench-peer", "0.1.0"))
        .with_broker(SqlxBroker::new(pool.clone()), move |b| {
            if by_key {
                b.include(relay_one.workers_by_key(workers))
                    .out_reply(to_kafka);
            } else if many {
                b.include(relay.batch(batch).workers(workers))
                    .out_reply(to_kafka);
            } else {
                b.include(relay.batch(batch)).out_reply(to_kafka);
            }
        })
        .with_broker(kafka, |_b| {});
    let start = Instant::now();
    let running = app
        .start()
        .await
        .map_err(|e| format!("RustStream::start: {e}"))?;
    let counter = pool.clone();
    let watched = watch(
        start,
        n,
        Duration::from_secs(args.cap_secs),
        || {
            let pool = counter.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM bench_events")
                    .fetch_one(&pool)
                    .await
                    .map(|left| n - left)
                    .map_err(|e| format!("count: {e}"))
            }
        },
        || None,
    )
    .await;
    let stopped = tokio::time::timeout(Duration::from_secs(10), running.shutdown()).await;
    pool.close().await;
    let (secs, published, capped) = watched?;
    let dispatch = if by_key {
        format!(
            "single deliveries with .workers_by_key({workers}) (the Relay guide's mounting: \
             per-key order, {workers} lanes)"
        )
    } else if many {
        format!(
            ".batch({}) with .workers({workers}) ({workers} batches in flight)",
            args.batch
        )
    } else {
        format!(".batch({}) and the default sequential dispatch", args.batch)
    };
    let mut notes = format!(
        "Relay guide's shape: inbox table (id BIGSERIAL, aggregate TEXT as partition_key, payload \
         BYTEA), row lock form (the Postgres default: FOR UPDATE SKIP LOCKED held for the claim), \
         one subscription, {dispatch}, reply through \
         KafkaPublish::default() (each reply's delivery report awaited before \
         the next; librdkafka defaults such as linger.ms 5), ack deletes the rows; \
         the records carry no Kafka key (a batch reply is built from the reply alone; the \
         row's partition_key does not reach it); the write path is Insert::insert in the \
         writer's transaction; topic bench.peer.ruststream, broker defaults otherwise \
         (poll_interval 1 s, no LISTEN/NOTIFY)"
    );
    match stopped {
        Ok(Ok(())) => {}
        Ok(Err(e)) => notes.push_str(&format!("; shutdown: {e}")),
        Err(_) => notes.push_str("; shutdown did not finish within 10 s"),
    }
    Ok(Outcome {
        secs,
        rate: published.min(n) as f64 / secs,
        published,
        capped,
        write_rate,
        notes,
    })
}
