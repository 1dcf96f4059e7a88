//! What every section of the benchmark shares: the event, the tables, the run context and
//! small helpers for measuring and formatting.

use std::sync::atomic::{AtomicU64, Ordering};

use diesel::prelude::*;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

/// What a section of the benchmark runs against.
pub struct Ctx {
    /// The short run.
    pub quick: bool,
    /// The bench's own PostgreSQL database (migrated, with `bench_orders`).
    pub url: String,
    /// The PostgreSQL server, without a database.
    #[allow(dead_code)]
    pub pg_server: String,
    /// The MariaDB server, without a database; empty to skip.
    #[allow(dead_code)]
    pub mysql_server: String,
    /// The Kafka-protocol broker; empty to skip.
    pub kafka: String,
    /// Where the report goes (PNGs go next to it).
    #[allow(dead_code)]
    pub out_dir: std::path::PathBuf,
    /// A runtime for the relays.
    pub rt: tokio::runtime::Runtime,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 1)]
pub struct OrderCreated {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub customer: i64,
    pub total_cents: i64,
}

pub mod schema {
    diesel::table! {
        bench_orders (id) {
            id -> BigInt,
            customer -> BigInt,
            total_cents -> BigInt,
        }
    }

    diesel::table! {
        outbox_events (seq) {
            seq -> BigInt,
            id -> Uuid,
            aggregate_type -> Text,
            aggregate_id -> Text,
            event_type -> Text,
            event_version -> Integer,
            payload -> Jsonb,
            shard -> SmallInt,
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub fn next_id() -> i64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed) as i64
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

pub fn exec(conn: &mut PgConnection, sql: &str) {
    diesel::sql_query(sql)
        .execute(conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// CPU seconds (user + system) of all `postgres` processes and of this process.
pub fn cpu_secs() -> (f64, f64) {
    let tick = 100.0; // USER_HZ on Linux
    let read = |path: &std::path::Path| -> Option<(String, f64)> {
        let s = std::fs::read_to_string(path).ok()?;
        let open = s.find('(')?;
        let close = s.rfind(')')?;
        let comm = s[open + 1..close].to_string();
        let f: Vec<&str> = s[close + 2..].split(' ').collect();
        let ut: f64 = f.get(11)?.parse().ok()?;
        let st: f64 = f.get(12)?.parse().ok()?;
        Some((comm, (ut + st) / tick))
    };
    let mut pg = 0.0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some((comm, t)) = read(&e.path().join("stat"))
                && comm.starts_with("postgres")
            {
                pg += t;
            }
        }
    }
    let me = read(std::path::Path::new("/proc/self/stat")).map_or(0.0, |x| x.1);
    (pg, me)
}

pub fn fmt_n(x: f64) -> String {
    let n = x.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 { format!("-{out}") } else { out }
}
