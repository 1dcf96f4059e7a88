//! `outbox-bench`: the write path's overhead and the relay's drain rate on PostgreSQL, each
//! side by side with baselines measured in the same run. See docs/BENCHMARKS.md.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt};
use outbox::prelude::*;
use outbox::relay::{
    Delivery, MemoryBroker, Mode, OutboxMessage, PgRelayStore, Publisher, Relay, RelayConfig,
};
use serde::{Deserialize, Serialize};

/// The benchmark's options.
#[derive(Parser, Debug)]
#[command(about = "Benchmarks of the outbox (write path and relay drain) on PostgreSQL")]
struct Args {
    /// The short run (about 2 minutes) instead of the full one.
    #[arg(long)]
    quick: bool,
    /// PostgreSQL server (without database); the bench creates and drops its own database.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pg: String,
    /// Kafka-protocol broker; empty to skip the Kafka drains.
    #[arg(long, default_value = "127.0.0.1:9092")]
    kafka: String,
    /// Where to write the report.
    #[arg(long, default_value = "docs/BENCHMARKS.md")]
    out: String,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
    customer: i64,
    total_cents: i64,
}

#[allow(missing_docs)]
mod schema {
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
use schema::{bench_orders, outbox_events};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> i64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed) as i64
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Write {
    Business,
    HandWritten,
    Ours1,
    Ours10,
}

impl Write {
    fn label(self) -> &'static str {
        match self {
            Write::Business => "(a) business only",
            Write::HandWritten => "(b) + hand-written outbox INSERT",
            Write::Ours1 => "(c) transaction_with_outbox, 1 event",
            Write::Ours10 => "(d) transaction_with_outbox, 10 events",
        }
    }
    fn events(self) -> u64 {
        match self {
            Write::Business => 0,
            Write::HandWritten | Write::Ours1 => 1,
            Write::Ours10 => 10,
        }
    }
}

fn insert_order(conn: &mut PgConnection) -> QueryResult<i64> {
    let id = next_id();
    diesel::insert_into(bench_orders::table)
        .values((
            bench_orders::id.eq(id),
            bench_orders::customer.eq(id % 1000),
            bench_orders::total_cents.eq(1250),
        ))
        .execute(conn)?;
    Ok(id)
}

fn one_write(conn: &mut PgConnection, w: Write) -> Result<(), outbox::Error> {
    match w {
        Write::Business => conn.transaction(|c| insert_order(c).map(|_| ()))?,
        Write::HandWritten => conn.transaction(|c| {
            let id = insert_order(c)?;
            let ev = OrderCreated {
                order_id: id,
                customer: id % 1000,
                total_cents: 1250,
            };
            let payload = serde_json::to_value(&ev).expect("serialise");
            let key = id.to_string();
            diesel::insert_into(outbox_events::table)
                .values((
                    outbox_events::id.eq(uuid::Uuid::now_v7()),
                    outbox_events::aggregate_type.eq("order"),
                    outbox_events::shard.eq(outbox::shard_of("order", &key)),
                    outbox_events::aggregate_id.eq(key),
                    outbox_events::event_type.eq("OrderCreated"),
                    outbox_events::event_version.eq(1),
                    outbox_events::payload.eq(payload),
                ))
                .execute(c)
                .map(|_| ())
        })?,
        Write::Ours1 | Write::Ours10 => conn.transaction_with_outbox(|tx| {
            let id = insert_order(tx.conn())?;
            for _ in 0..w.events() {
                tx.publish(&OrderCreated {
                    order_id: id,
                    customer: id % 1000,
                    total_cents: 1250,
                })?;
            }
            Ok::<_, outbox::Error>(())
        })?,
    }
    Ok(())
}

/// Transactions per second of `writers` threads for `secs`.
fn write_run(url: &str, w: Write, writers: usize, dur: Duration) -> f64 {
    let mut conns: Vec<PgConnection> = (0..writers)
        .map(|_| PgConnection::establish(url).expect("connect"))
        .collect();
    let start = Instant::now();
    let deadline = start + dur;
    let count = std::thread::scope(|s| {
        let hs: Vec<_> = conns
            .iter_mut()
            .map(|c| {
                s.spawn(move || {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        one_write(c, w).expect("write");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("writer"))
            .sum::<u64>()
    });
    count as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
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

fn exec(conn: &mut PgConnection, sql: &str) {
    diesel::sql_query(sql)
        .execute(conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// CPU seconds (user + system) of all `postgres` processes and of this process.
fn cpu_secs() -> (f64, f64) {
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

struct Null;

impl Publisher for Null {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        vec![Delivery::Published; batch.len()]
    }
}

#[derive(Clone, Copy, Debug)]
enum Sink {
    Null,
    Memory,
    Kafka,
}

struct Drain {
    rate: f64,
    /// Events published, if the drain was stopped at the time cap before the end.
    capped: Option<u64>,
    pg_cpu: f64,
    bench_cpu: f64,
}

fn reset_outbox(conn: &mut PgConnection) {
    exec(conn, "TRUNCATE outbox_events");
    exec(
        conn,
        "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL",
    );
    exec(conn, "DELETE FROM outbox_relays");
    exec(conn, "DELETE FROM outbox_leader");
    exec(
        conn,
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, \
         payload, headers, shard, created_at, available_at) SELECT gen_random_uuid(), \
         aggregate_type, aggregate_id, event_type, event_version, payload, headers, shard, \
         created_at, created_at FROM bench_template ORDER BY n",
    );
    exec(conn, "ANALYZE outbox_events");
}

fn pending(conn: &mut PgConnection) -> i64 {
    #[derive(QueryableByName)]
    struct C {
        #[diesel(sql_type = BigInt)]
        c: i64,
    }
    diesel::sql_query(
        "SELECT count(*) AS c FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .get_result::<C>(conn)
    .expect("count")
    .c
}

/// Fills the template of `n` events over 1,000 aggregates, through `transaction_with_outbox`.
fn fill_template(conn: &mut PgConnection, n: usize) {
    exec(conn, "DROP TABLE IF EXISTS bench_template");
    exec(conn, "TRUNCATE outbox_events");
    let mut left = n;
    let mut i = 0i64;
    while left > 0 {
        let k = left.min(1000);
        conn.transaction_with_outbox(|tx| {
            for _ in 0..k {
                i += 1;
                tx.publish(&OrderCreated {
                    order_id: i % 1000,
                    customer: i,
                    total_cents: 1250,
                })?;
            }
            Ok::<_, outbox::Error>(())
        })
        .expect("fill");
        left -= k;
    }
    exec(
        conn,
        "CREATE TABLE bench_template AS SELECT row_number() OVER (ORDER BY seq) AS n, \
         aggregate_type, aggregate_id, event_type, event_version, payload, headers, shard, \
         created_at FROM outbox_events",
    );
}

#[allow(clippy::too_many_arguments)]
async fn drain_ours(
    url: &str,
    mode: Mode,
    relays: usize,
    batch: usize,
    sink: Sink,
    kafka: &str,
    n: i64,
    cap: Duration,
) -> Drain {
    let mut conn = PgConnection::establish(url).expect("connect");
    reset_outbox(&mut conn);
    let done = Arc::new(AtomicU64::new(0));
    let (pg0, me0) = cpu_secs();
    let start = Instant::now();
    let mut handles = Vec::new();
    let mut all_stats = Vec::new();
    let stop = Arc::new(tokio::sync::Notify::new());
    for r in 0..relays {
        let store = PgRelayStore::new(url);
        let config = RelayConfig {
            relay_id: format!("bench-{r}"),
            mode,
            batch_size: batch,
            poll_interval: Duration::from_millis(50),
            ..RelayConfig::default()
        };
        let stop = stop.clone();
        let shutdown = async move { stop.notified().await };
        macro_rules! spawn {
            ($p:expr) => {{
                let relay = Relay::new(store, $p, config).expect("config");
                all_stats.push(relay.stats());
                handles.push(tokio::spawn(relay.run(shutdown)));
            }};
        }
        match sink {
            Sink::Null => spawn!(Null),
            Sink::Memory => spawn!(Arc::new(MemoryBroker::new())),
            Sink::Kafka => spawn!(
                outbox::kafka::KafkaPublisher::builder()
                    .brokers(kafka)
                    .topic_prefix("bench.")
                    .build()
                    .expect("kafka")
            ),
        }
    }
    let _ = &done;
    let timeout = start + cap;
    let mut published: u64;
    loop {
        published = all_stats
            .iter()
            .map(|s| s.published.load(Ordering::Relaxed))
            .sum();
        if published >= n as u64 || Instant::now() > timeout {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (pg1, me1) = cpu_secs();
    stop.notify_waiters();
    for h in handles {
        let _ = h.await;
    }
    let left = pending(&mut conn);
    let capped = (published < n as u64).then_some(published);
    assert!(
        capped.is_some() || left == 0,
        "{mode:?} x{relays} b{batch} {sink:?}: {left} rows left"
    );
    Drain {
        rate: published.min(n as u64) as f64 / elapsed,
        capped,
        pg_cpu: pg1 - pg0,
        bench_cpu: me1 - me0,
    }
}

/// The textbook relay: one transaction per batch of 100 that selects `FOR UPDATE SKIP LOCKED`,
/// publishes each row inside it (to the null publisher) and UPDATEs each row one by one.
fn drain_textbook(url: &str, relays: usize, n: i64) -> Drain {
    #[derive(QueryableByName)]
    #[allow(dead_code)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        seq: i64,
        #[diesel(sql_type = diesel::sql_types::Text)]
        aggregate_id: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        payload: String,
    }
    let mut conn = PgConnection::establish(url).expect("connect");
    reset_outbox(&mut conn);
    let (pg0, me0) = cpu_secs();
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..relays {
            s.spawn(|| {
                let mut c = PgConnection::establish(url).expect("connect");
                loop {
                    let got = c
                        .transaction(|c| {
                            let rows: Vec<Row> = diesel::sql_query(
                                "SELECT seq, aggregate_id, payload::text AS payload \
                                 FROM outbox_events WHERE published_at IS NULL \
                                 ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED",
                            )
                            .load(c)?;
                            for r in &rows {
                                std::hint::black_box(&r.payload); // "publish"
                                diesel::sql_query(
                                    "UPDATE outbox_events SET published_at = now() WHERE seq = $1",
                                )
                                .bind::<BigInt, _>(r.seq)
                                .execute(c)?;
                            }
                            QueryResult::Ok(rows.len())
                        })
                        .expect("textbook");
                    if got == 0 {
                        break;
                    }
                }
            });
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let (pg1, me1) = cpu_secs();
    assert_eq!(pending(&mut conn), 0);
    Drain {
        rate: n as f64 / elapsed,
        capped: None,
        pg_cpu: pg1 - pg0,
        bench_cpu: me1 - me0,
    }
}

/// The SQL ceiling: a set-based claim (lease UPDATE over SKIP LOCKED) and a set-based mark,
/// two autocommit statements per batch, no publishing.
fn drain_ceiling(url: &str, relays: usize, batch: usize, n: i64) -> Drain {
    #[derive(QueryableByName)]
    struct Seq {
        #[diesel(sql_type = BigInt)]
        seq: i64,
    }
    let mut conn = PgConnection::establish(url).expect("connect");
    reset_outbox(&mut conn);
    let (pg0, me0) = cpu_secs();
    let start = Instant::now();
    std::thread::scope(|s| {
        for r in 0..relays {
            s.spawn(move || {
                let mut c = PgConnection::establish(url).expect("connect");
                let claim = format!(
                    "UPDATE outbox_events o SET locked_by = 'ceiling-{r}', \
                     locked_until = now() + interval '30 seconds', attempts = o.attempts + 1 \
                     FROM (SELECT seq FROM outbox_events WHERE published_at IS NULL \
                     AND dead_at IS NULL AND (locked_until IS NULL OR locked_until < now()) \
                     ORDER BY seq LIMIT {batch} FOR UPDATE SKIP LOCKED) c \
                     WHERE o.seq = c.seq RETURNING o.seq"
                );
                loop {
                    let seqs: Vec<Seq> = diesel::sql_query(&claim).load(&mut c).expect("claim");
                    if seqs.is_empty() {
                        break;
                    }
                    let ids: Vec<i64> = seqs.iter().map(|s| s.seq).collect();
                    diesel::sql_query(
                        "UPDATE outbox_events SET published_at = now(), locked_by = NULL, \
                         locked_until = NULL WHERE seq = ANY($1) AND locked_by IS NOT NULL",
                    )
                    .bind::<Array<BigInt>, _>(ids)
                    .execute(&mut c)
                    .expect("mark");
                }
            });
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let (pg1, me1) = cpu_secs();
    assert_eq!(pending(&mut conn), 0);
    Drain {
        rate: n as f64 / elapsed,
        capped: None,
        pg_cpu: pg1 - pg0,
        bench_cpu: me1 - me0,
    }
}

fn fmt_n(x: f64) -> String {
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

fn main() {
    let args = Args::parse();
    let quick = args.quick;
    let runs = 3;
    let dur = Duration::from_secs(if quick { 2 } else { 15 });
    // A drain that has not finished by the cap is stopped and reported as such, with the rate
    // over the events it published.
    let cap = Duration::from_secs(if quick { 10 } else { 120 });
    let backlog: i64 = if quick { 20_000 } else { 100_000 };
    let db = format!("outbox_bench_{}", std::process::id());
    let mut admin = PgConnection::establish(&format!("{}/postgres", args.pg)).expect("connect");
    exec(&mut admin, &format!("CREATE DATABASE {db}"));
    let url = format!("{}/{db}", args.pg);
    let mut conn = PgConnection::establish(&url).expect("connect");
    outbox::migrations::run(&mut conn).expect("migrate");
    exec(
        &mut conn,
        "CREATE TABLE bench_orders (id BIGINT PRIMARY KEY, customer BIGINT NOT NULL, \
         total_cents BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    );

    #[derive(QueryableByName)]
    struct V {
        #[diesel(sql_type = diesel::sql_types::Text)]
        v: String,
    }
    let version = diesel::sql_query("SELECT version() AS v")
        .get_result::<V>(&mut conn)
        .expect("v")
        .v;
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(str::to_string))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = std::process::Command::new("date")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cmd = format!(
        "cargo run --release -p outbox-bench --{}",
        if quick { " --quick" } else { "" }
    );
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Command: `{cmd}`  \nDate: {date}  \nMachine: {cores} cores, {mem}  \nPostgreSQL: {version}  \n\
         Each write figure is the median of {runs} runs of {} s each; the variants run interleaved \
         (a, b, c, d, a, b, …) so they share the machine's noise. The machine is shared.\n",
        dur.as_secs()
    );

    // ---- write path ----
    let variants: Vec<(Write, Option<bool>)> = vec![
        (Write::Business, None),
        (Write::HandWritten, None),
        (Write::Ours1, Some(false)),
        (Write::Ours1, Some(true)),
        (Write::Ours10, Some(false)),
        (Write::Ours10, Some(true)),
    ];
    let _ = writeln!(md, "## Write path (PostgreSQL)\n");
    let _ = writeln!(
        md,
        "NOTIFY off: `outbox::notify::set_interval(None)`; on: the default (at most one \
         `pg_notify` per 100 ms per process). (a) and (b) never notify.\n"
    );
    let _ = writeln!(
        md,
        "| writers | variant | NOTIFY | tx/s | events/s | ours / hand-written | ours / business-only |\n|---|---|---|---|---|---|---|"
    );
    for writers in [1usize, 4, 16] {
        let mut samples = vec![Vec::new(); variants.len()];
        for _ in 0..runs {
            for (i, (w, notify)) in variants.iter().enumerate() {
                exec(&mut conn, "TRUNCATE bench_orders, outbox_events");
                outbox::notify::set_interval(match notify {
                    Some(true) => Some(Duration::from_millis(100)),
                    _ => None,
                });
                samples[i].push(write_run(&url, *w, writers, dur));
            }
        }
        let med: Vec<f64> = samples.into_iter().map(median).collect();
        for (i, (w, notify)) in variants.iter().enumerate() {
            let tps = med[i];
            let (vs_hand, vs_biz) = match w {
                Write::Ours1 => (
                    format!("{:.2}", tps / med[1]),
                    format!("{:.2}", tps / med[0]),
                ),
                Write::Ours10 => ("–".into(), format!("{:.2}", tps / med[0])),
                Write::HandWritten => ("–".into(), format!("{:.2}", tps / med[0])),
                Write::Business => ("–".into(), "1.00".into()),
            };
            let line = format!(
                "| {writers} | {} | {} | {} | {} | {vs_hand} | {vs_biz} |",
                w.label(),
                match notify {
                    None => "–",
                    Some(true) => "on",
                    Some(false) => "off",
                },
                fmt_n(tps),
                fmt_n(tps * w.events() as f64),
            );
            println!("{line}");
            let _ = writeln!(md, "{line}");
        }
    }
    outbox::notify::set_interval(Some(Duration::from_millis(100)));

    // ---- relay drain ----
    eprintln!("filling {backlog} events");
    fill_template(&mut conn, backlog as usize);
    let _ = writeln!(
        md,
        "\n## Relay drain (PostgreSQL), {} pending events over 1,000 aggregates\n",
        fmt_n(backlog as f64)
    );
    let _ = writeln!(
        md,
        "events/s from the first claim until every event is marked published; one run per \
         configuration{}; a drain still running after {} s is stopped and its rate is over the \
         events it published. CPU: seconds of CPU used during the drain by all `postgres` processes \
         and by the bench process (relays, publisher), from /proc.\n",
        if quick { " (quick run)" } else { "" },
        cap.as_secs()
    );
    let _ = writeln!(
        md,
        "| drain | mode | relays | batch | publisher | events/s | vs SQL ceiling (same relays, batch) | postgres CPU s | bench CPU s |\n|---|---|---|---|---|---|---|---|---|"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let relay_counts: Vec<usize> = if quick { vec![1, 2] } else { vec![1, 2, 4] };
    let batches: Vec<usize> = if quick {
        vec![100, 1000]
    } else {
        vec![100, 500, 1000]
    };
    let row = |md: &mut String,
               what: &str,
               mode: &str,
               relays: usize,
               batch: usize,
               sink: &str,
               d: &Drain,
               ceiling: Option<f64>| {
        let line = format!(
            "| {what} | {mode} | {relays} | {batch} | {sink} | {}{} | {} | {:.1} | {:.1} |",
            fmt_n(d.rate),
            d.capped.map_or(String::new(), |p| format!(
                " (stopped at the cap: {} published)",
                fmt_n(p as f64)
            )),
            ceiling.map_or("–".into(), |c| format!("{:.0} %", 100.0 * d.rate / c)),
            d.pg_cpu,
            d.bench_cpu
        );
        println!("{line}");
        let _ = writeln!(md, "{line}");
    };
    for &relays in &relay_counts {
        let tb = drain_textbook(&url, relays, backlog);
        row(
            &mut md,
            "textbook relay (baseline a)",
            "SKIP LOCKED",
            relays,
            100,
            "null",
            &tb,
            None,
        );
        for &batch in &batches {
            let ceil = drain_ceiling(&url, relays, batch, backlog);
            row(
                &mut md,
                "SQL ceiling (baseline b)",
                "set-based",
                relays,
                batch,
                "none",
                &ceil,
                None,
            );
            for mode in [Mode::Unordered, Mode::Sharded, Mode::Leader] {
                for sink in [Sink::Null, Sink::Memory] {
                    let d = rt.block_on(drain_ours(
                        &url,
                        mode,
                        relays,
                        batch,
                        sink,
                        &args.kafka,
                        backlog,
                        cap,
                    ));
                    row(
                        &mut md,
                        "outbox relay",
                        &format!("{mode:?}").to_lowercase(),
                        relays,
                        batch,
                        &format!("{sink:?}").to_lowercase(),
                        &d,
                        Some(ceil.rate),
                    );
                }
            }
        }
    }
    if !args.kafka.is_empty() {
        let _ = writeln!(md, "\n### Kafka (noida-db at {})\n", args.kafka);
        let _ = writeln!(
            md,
            "| mode | relays | batch | events/s | postgres CPU s | bench CPU s |\n|---|---|---|---|---|---|"
        );
        for mode in [Mode::Unordered, Mode::Sharded] {
            for relays in [1usize, 2] {
                let d = rt.block_on(drain_ours(
                    &url,
                    mode,
                    relays,
                    1000,
                    Sink::Kafka,
                    &args.kafka,
                    backlog,
                    cap,
                ));
                let line = format!(
                    "| {} | {relays} | 1000 | {}{} | {:.1} | {:.1} |",
                    format!("{mode:?}").to_lowercase(),
                    fmt_n(d.rate),
                    d.capped.map_or(String::new(), |p| format!(
                        " (stopped at the cap: {} published)",
                        fmt_n(p as f64)
                    )),
                    d.pg_cpu,
                    d.bench_cpu
                );
                println!("{line}");
                let _ = writeln!(md, "{line}");
            }
        }
    }
    drop(conn);
    exec(&mut admin, &format!("DROP DATABASE {db} WITH (FORCE)"));
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&args.out, &md).expect("write report");
    eprintln!("wrote {}", args.out);
}
