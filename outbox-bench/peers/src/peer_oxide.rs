//! oxide-outbox: `outbox-core` (as `oxide_core`), `outbox-postgres`, `outbox-kafka`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_kafka::{KafkaKeyExtractable, KafkaTransport};
use outbox_postgres::{PostgresOutbox, PostgresWriter};
use oxide_core::prelude::*;
use sqlx08::postgres::PgPoolOptions;

use crate::{Args, OrderCreated, Outcome, TX_EVENTS, watch};

/// The schema, as `outbox-postgres` 0.3.0 ships it in `migrations/20260213152819_init.sql` (the
/// crate exposes no migrator; its README has the application run the migrations).
const INIT_SQL: &str = r"
create type status as enum ('Pending', 'Processing', 'Sent');
create table outbox_events
(
    id                uuid primary key     default gen_random_uuid(),
    idempotency_token text                 default null,
    event_type        text        not null,
    payload           jsonb       not null,
    status            status      not null default 'Pending',
    created_at        timestamptz not null default now(),
    locked_until      timestamptz not null default '-infinity'
);
CREATE INDEX idx_outbox_processing_queue
    ON outbox_events (locked_until ASC, status)
    WHERE status IN ('Pending', 'Processing');
CREATE UNIQUE INDEX idx_outbox_idempotency
    ON outbox_events (idempotency_token);
create or replace function notify_outbox_event() returns trigger as
$$
begin
    perform pg_notify('outbox_event', 'ping');
    return new;
end;
$$ language plpgsql;
create trigger outbox_events_notify_trigger
    after insert or update
    on outbox_events
    for each row
execute function notify_outbox_event();
";

/// The Kafka key: the aggregate, as ours.
impl KafkaKeyExtractable for OrderCreated {
    fn kafka_key(&self) -> Vec<u8> {
        self.order_id.to_string().into_bytes()
    }
}

/// The versions resolved.
pub fn version() -> String {
    format!(
        "outbox-core {}, outbox-postgres {}, outbox-kafka {}",
        env!("PEER_OXIDE_CORE"),
        env!("PEER_OXIDE_POSTGRES"),
        env!("PEER_OXIDE_KAFKA")
    )
}

/// Sets up, writes the backlog, drains it to Kafka and measures.
pub async fn run(args: &Args, url: &str) -> Result<Outcome, String> {
    let n = args.events;
    let topic = "bench.peer.oxide";
    let pool = PgPoolOptions::new()
        .connect(url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    sqlx08::raw_sql(INIT_SQL)
        .execute(&pool)
        .await
        .map_err(|e| format!("schema: {e}"))?;

    let mut config = OutboxConfig::<OrderCreated>::default();
    config.batch_size = u32::try_from(args.batch).map_err(|e| e.to_string())?;
    let config = Arc::new(config);

    // The write path: `add_event` on the caller's transaction, 1,000 events per transaction.
    let service = OutboxService::new(Arc::new(PostgresWriter), config.clone());
    let t0 = Instant::now();
    let mut i = 0i64;
    while i < n {
        let mut tx = pool.begin().await.map_err(|e| format!("begin: {e}"))?;
        for _ in 0..TX_EVENTS.min(n - i) {
            i += 1;
            service
                .add_event("OrderCreated", OrderCreated::nth(i), None, &mut *tx)
                .await
                .map_err(|e| format!("add_event: {e}"))?;
        }
        tx.commit().await.map_err(|e| format!("commit: {e}"))?;
    }
    let write_rate = n as f64 / t0.elapsed().as_secs_f64();

    // The relay: `OutboxManager` with `PostgresOutbox` and `KafkaTransport` (its defaults: the
    // idempotent producer, a 10 s send timeout).
    let mut kafka = rdkafka::ClientConfig::new();
    kafka.set("bootstrap.servers", &args.kafka);
    let transport =
        KafkaTransport::new(topic, &kafka).map_err(|e| format!("KafkaTransport::new: {e}"))?;
    let transport = Arc::new(transport);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // `--workers n`: n managers on the same table, as outbox-postgres's README offers
    // (`FOR UPDATE SKIP LOCKED` keeps them from claiming the same rows), each with a storage
    // of its own (the storage holds one LISTEN connection), as separate workers would have.
    let workers = args.workers.max(1);
    let mut managers = Vec::with_capacity(workers);
    for _ in 0..workers {
        managers.push(
            OutboxManagerBuilder::new()
                .storage(Arc::new(PostgresOutbox::new(pool.clone(), config.clone())))
                .publisher(transport.clone())
                .config(config.clone())
                .shutdown_rx(stop_rx.clone())
                .build()
                .map_err(|e| format!("OutboxManagerBuilder::build: {e}"))?,
        );
    }
    let start = Instant::now();
    let handles: Vec<_> = managers
        .into_iter()
        .map(|m| tokio::spawn(m.run()))
        .collect();
    let counter = pool.clone();
    let watched = watch(
        start,
        n,
        Duration::from_secs(args.cap_secs),
        || {
            let pool = counter.clone();
            async move {
                sqlx08::query_scalar::<_, i64>(
                    "SELECT count(*) FROM outbox_events WHERE status = 'Sent'",
                )
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("count: {e}"))
            }
        },
        || {
            handles
                .iter()
                .any(tokio::task::JoinHandle::is_finished)
                .then(|| "OutboxManager::run returned".to_string())
        },
    )
    .await;
    let _ = stop_tx.send(true);
    for handle in handles {
        let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
    }
    pool.close().await;
    let (secs, published, capped) = watched?;
    Ok(Outcome {
        secs,
        rate: published.min(n) as f64 / secs,
        published,
        capped,
        write_rate,
        notes: format!(
            "OutboxConfig defaults but batch_size = {} (poll_interval_secs 10, lock_timeout_mins 5, \
             IdempotencyStrategy::None); {}; each event is published and its \
             delivery awaited one after another (Transport::publish), the batch is marked Sent \
             in one UPDATE; KafkaTransport defaults (enable.idempotence = true, send timeout \
             10 s, librdkafka's other defaults such as linger.ms 5), key = order_id, topic {topic}; the schema's trigger NOTIFYs on every insert \
             and update",
            args.batch,
            if workers == 1 {
                "one OutboxManager".to_string()
            } else {
                format!(
                    "{workers} OutboxManagers on the table (FOR UPDATE SKIP LOCKED, as the \
                     outbox-postgres README offers for several workers), one pool"
                )
            }
        ),
    })
}
