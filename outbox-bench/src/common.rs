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
    pub pg_server: String,
    /// The MariaDB server, without a database; empty to skip.
    pub mysql_server: String,
    /// The Kafka-protocol broker; empty to skip.
    pub kafka: String,
    /// The bench's own broker at `kafka`, if it started one.
    pub broker: Option<crate::broker::PrivateBroker>,
    /// The NATS server (JetStream); empty to skip.
    pub nats: String,
    /// The RabbitMQ broker's URI; empty to skip.
    pub amqp: String,
    /// Where the report goes (PNGs go next to it).
    pub out_dir: std::path::PathBuf,
    /// What the plots' file names start with: the report's name, lowercased
    /// (`docs/BENCHMARKS.md` → `benchmarks-latency.png`), so that reports side by side keep
    /// their own pictures.
    pub plot_prefix: String,
    /// A runtime for the relays.
    pub rt: tokio::runtime::Runtime,
    /// The soak section's settings.
    pub soak: crate::soak::Settings,
}

impl Ctx {
    /// Empties the bench's own broker before a run that publishes (see `broker.rs`); a broker
    /// given with `--kafka` is left as it is.
    pub fn fresh_broker(&self) {
        if let Some(broker) = &self.broker {
            broker.reset();
        }
    }
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

    /// `outbox_events` as each backend's migration types it, in the columns a hand-written
    /// INSERT writes: the id (UUID or hyphenated text), the JSON columns and the times.
    macro_rules! outbox_events {
        ($($backend:ident: $id:ident, $json:ident, $time:ident;)*) => {$(
            pub mod $backend {
                diesel::table! {
                    use diesel::sql_types::*;
                    outbox_events (seq) {
                        seq -> BigInt,
                        id -> $id,
                        aggregate_type -> Text,
                        aggregate_id -> Text,
                        event_type -> Text,
                        event_version -> Integer,
                        payload -> $json,
                        headers -> $json,
                        shard -> SmallInt,
                        created_at -> $time,
                        available_at -> $time,
                    }
                }
            }
        )*};
    }

    outbox_events! {
        pg: Uuid, Jsonb, Timestamptz;
        mysql: Text, Json, Datetime;
        sqlite: Text, Json, Text;
    }
}

/// A row of one text column named `v`: a version or a setting read back.
#[derive(QueryableByName)]
pub struct V {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub v: String,
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

/// CPU seconds (user + system) so far of each `postgres` process, of the brokers (the
/// Kafka-protocol ones, `nats-server`, RabbitMQ's `beam.smp`) and of this process, from
/// /proc. Compare two with [`Cpu::since`].
pub struct Cpu {
    pg: std::collections::HashMap<u32, f64>,
    /// Per broker process: its command name and CPU seconds.
    broker: std::collections::HashMap<u32, (String, f64)>,
    me: f64,
}

/// The command names of the broker processes.
const BROKERS: [&str; 4] = ["noida", "tansu", "nats-server", "beam.smp"];

impl Cpu {
    /// A snapshot now.
    pub fn now() -> Cpu {
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
        let mut pg = std::collections::HashMap::new();
        let mut broker = std::collections::HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                match read(&e.path().join("stat")) {
                    Some((comm, t)) if comm.starts_with("postgres") => {
                        pg.insert(pid, t);
                    }
                    Some((comm, t)) if BROKERS.iter().any(|b| comm.starts_with(b)) => {
                        broker.insert(pid, (comm, t));
                    }
                    _ => {}
                }
            }
        }
        let me = read(std::path::Path::new("/proc/self/stat")).map_or(0.0, |x| x.1);
        Cpu { pg, broker, me }
    }

    /// (postgres, this process) CPU seconds used between `earlier` and this snapshot.
    /// Processes that started in between count in full; ones that ended in between are lost
    /// (an undercount, never a negative figure).
    pub fn since(&self, earlier: &Cpu) -> (f64, f64) {
        (delta(&self.pg, &earlier.pg), self.me - earlier.me)
    }

    /// CPU seconds since `earlier` of the broker processes whose command name starts with
    /// one of `names` (e.g. `["noida", "tansu"]` for the Kafka-protocol brokers).
    pub fn broker_since(&self, earlier: &Cpu, names: &[&str]) -> f64 {
        let of = |m: &std::collections::HashMap<u32, (String, f64)>| {
            m.iter()
                .filter(|(_, (comm, _))| names.iter().any(|n| comm.starts_with(n)))
                .map(|(pid, (_, t))| (*pid, *t))
                .collect::<std::collections::HashMap<u32, f64>>()
        };
        delta(&of(&self.broker), &of(&earlier.broker))
    }
}

fn delta(
    now: &std::collections::HashMap<u32, f64>,
    then: &std::collections::HashMap<u32, f64>,
) -> f64 {
    now.iter()
        .map(|(pid, t)| t - then.get(pid).copied().unwrap_or(0.0))
        .sum()
}

/// Formats a figure with thousands separators.
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
