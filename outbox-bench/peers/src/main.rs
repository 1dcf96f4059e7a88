//! `outbox-bench-peers`: drives a Rust peer outbox library through its public API on the same
//! PostgreSQL server, Kafka-protocol broker, event and backlog as `outbox-bench` drives ours, and
//! prints one JSON line with what it measured (or the exact error that stopped it).
//!
//! - `oxide`: oxide-outbox (`outbox-core` 0.6, `outbox-postgres` 0.3, `outbox-kafka` 0.2).
//!   Events are written with `OutboxService::add_event` through `PostgresWriter`, relayed by
//!   `OutboxManager` (storage `PostgresOutbox`, transport `KafkaTransport`).
//! - `ruststream`: ruststream-sqlx 0.7 with ruststream-rdkafka 0.7, in the shape of its Relay
//!   guide: events are written with `Insert::insert` into an inbox table in the writer's
//!   transaction, and a batch subscription to that table replies each batch to a Kafka topic; the
//!   acknowledgement deletes the rows.

mod peer_oxide;
mod peer_ruststream;

use std::time::{Duration, Instant};

use clap::Parser;
use serde::{Deserialize, Serialize};
use sqlx::Connection;

/// The options.
#[derive(Parser, Debug, Clone)]
#[command(about = "Drives a Rust peer outbox library for outbox-bench")]
pub struct Args {
    /// The peer: `oxide` or `ruststream`.
    #[arg(long)]
    pub peer: String,
    /// PostgreSQL server (without database); the run creates and drops its own database.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub pg: String,
    /// Kafka-protocol broker.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub kafka: String,
    /// The backlog: events written before the relay starts.
    #[arg(long, default_value_t = 20_000)]
    pub events: i64,
    /// The relay's batch size, where the peer has one.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// The drain is stopped after this many seconds and reported as capped.
    #[arg(long, default_value_t = 120)]
    pub cap_secs: u64,
    /// The relay's concurrency, as the peer offers it: oxide runs this many `OutboxManager`s
    /// on the table (its README: `FOR UPDATE SKIP LOCKED` lets several workers share it);
    /// ruststream mounts the subscription with `workers(n)` (batches in flight at once). 1:
    /// each peer's default (one manager; sequential dispatch).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// ruststream only: single deliveries with `workers_by_key(workers)`, the Relay guide's
    /// own mounting (per-key order across the workers), instead of batches.
    #[arg(long)]
    pub by_key: bool,
}

/// The event, as ours: `{"order_id":…, "customer":…, "total_cents":1250}`, over 1,000 aggregates.
#[derive(Debug, Clone, Serialize, Deserialize, ruststream::Outgoing)]
#[outgoing(name = "bench.peer.ruststream")]
pub struct OrderCreated {
    /// The aggregate: `i % 1000`.
    pub order_id: i64,
    /// `i`.
    pub customer: i64,
    /// Always 1250.
    pub total_cents: i64,
}

impl OrderCreated {
    /// The `i`-th event of the backlog (from 1).
    pub fn nth(i: i64) -> Self {
        Self {
            order_id: i % 1000,
            customer: i,
            total_cents: 1250,
        }
    }
}

/// What a run measured.
#[derive(Default)]
pub struct Outcome {
    /// Seconds from the relay's start until the table said all events were published (or the cap).
    pub secs: f64,
    /// Events published per second over `secs`.
    pub rate: f64,
    /// Events the table says were published.
    pub published: i64,
    /// Stopped at the cap.
    pub capped: bool,
    /// Events written per second through the peer's write API (transactions of 1,000).
    pub write_rate: f64,
    /// The configuration and anything worth knowing.
    pub notes: String,
}

/// Writes the backlog in transactions of 1,000 events: `write(tx_events)` writes one transaction.
pub const TX_EVENTS: i64 = 1000;

/// Polls `count` (events published so far) until it reaches `n` or the cap passes; also stops
/// when `failed` reports the relay's end. Returns (seconds, published, capped).
pub async fn watch<C, F>(
    start: Instant,
    n: i64,
    cap: Duration,
    mut count: C,
    mut failed: impl FnMut() -> Option<String>,
) -> Result<(f64, i64, bool), String>
where
    C: FnMut() -> F,
    F: Future<Output = Result<i64, String>>,
{
    loop {
        let published = count().await?;
        let secs = start.elapsed().as_secs_f64();
        if published >= n {
            return Ok((secs, published, false));
        }
        if secs >= cap.as_secs_f64() {
            return Ok((secs, published, true));
        }
        if let Some(e) = failed() {
            return Err(format!(
                "the relay stopped with {published} of {n} published: {e}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates database `db` on the server `pg`, returning its URL.
async fn create_db(pg: &str, db: &str) -> Result<String, String> {
    let mut admin = sqlx::PgConnection::connect(&format!("{pg}/postgres"))
        .await
        .map_err(|e| format!("connect {pg}/postgres: {e}"))?;
    for sql in [
        format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
        format!("CREATE DATABASE {db}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&mut admin)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    Ok(format!("{pg}/{db}"))
}

/// Drops database `db` on the server `pg`.
async fn drop_db(pg: &str, db: &str) {
    if let Ok(mut admin) = sqlx::PgConnection::connect(&format!("{pg}/postgres")).await {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await;
    }
}

fn main() {
    let args = Args::parse();
    // The peers log their failures through `tracing`: to stderr, warnings and up by default.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx::query=error")),
        )
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let db = format!("outbox_peer_{}_{}", args.peer, std::process::id());
    let (version, result) = rt.block_on(async {
        let url = match create_db(&args.pg, &db).await {
            Ok(url) => url,
            Err(e) => return (String::new(), Err(e)),
        };
        let out = match args.peer.as_str() {
            "oxide" => (peer_oxide::version(), peer_oxide::run(&args, &url).await),
            "ruststream" => (
                peer_ruststream::version(),
                peer_ruststream::run(&args, &url).await,
            ),
            other => (
                String::new(),
                Err(format!("unknown peer {other:?} (oxide | ruststream)")),
            ),
        };
        drop_db(&args.pg, &db).await;
        out
    });
    let line = match result {
        Ok(o) => serde_json::json!({
            "peer": args.peer,
            "version": version,
            "events": args.events,
            "batch": args.batch,
            "secs": o.secs,
            "rate": o.rate,
            "published": o.published,
            "capped": o.capped,
            "write_rate": o.write_rate,
            "workers": args.workers,
            "by_key": args.by_key,
            "notes": o.notes,
            "error": null,
        }),
        Err(e) => serde_json::json!({
            "peer": args.peer,
            "version": version,
            "events": args.events,
            "batch": args.batch,
            "secs": null,
            "rate": null,
            "published": null,
            "capped": null,
            "write_rate": null,
            "notes": "",
            "error": e,
        }),
    };
    println!("{line}");
    // The peers' background tasks (listeners, producers) are not all joinable: leave at once.
    rt.shutdown_timeout(Duration::from_secs(2));
}
