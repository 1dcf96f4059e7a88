//! Relay drains: ours in every mode beside the textbook relay and the SQL ceiling.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt};
use outbox::prelude::*;
use outbox::relay::{
    Delivery, MemoryBroker, Mode, OutboxMessage, PgRelayStore, Publisher, Relay, RelayConfig,
};

use crate::common::*;

/// A publisher that acknowledges everything at once: the database side alone.
pub struct Null;

impl Publisher for Null {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        vec![Delivery::Published; batch.len()]
    }
}

/// Where a drain publishes.
#[derive(Clone, Copy, Debug)]
pub enum Sink {
    /// [`Null`].
    Null,
    /// The in-memory broker.
    Memory,
    /// The Kafka-protocol broker.
    Kafka,
}

/// One drain's figures.
pub struct Drain {
    /// Events per second.
    pub rate: f64,
    /// Events published, if the drain was stopped at the time cap before the end.
    pub capped: Option<u64>,
    /// CPU seconds of all `postgres` processes during the drain.
    pub pg_cpu: f64,
    /// CPU seconds of this process during the drain.
    pub bench_cpu: f64,
    /// (seconds since the start, events published so far), every 100 ms (ours only).
    #[allow(dead_code)]
    pub series: Vec<(f64, u64)>,
}

/// Empties the outbox and the relay coordination tables, then copies the template back in.
pub fn reset_outbox(conn: &mut PgConnection) {
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

/// Pending events.
pub fn pending(conn: &mut PgConnection) -> i64 {
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
pub fn fill_template(conn: &mut PgConnection, n: usize) {
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
/// Drains the backlog with `relays` relays of ours; stops at `cap`.
pub async fn drain_ours(
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
    let mut series = vec![(0.0, 0)];
    loop {
        published = all_stats
            .iter()
            .map(|s| s.published.load(Ordering::Relaxed))
            .sum();
        let t = start.elapsed().as_secs_f64();
        if t >= series.last().map_or(0.0, |s| s.0) + 0.1 {
            series.push((t, published));
        }
        if published >= n as u64 || Instant::now() > timeout {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    series.push((start.elapsed().as_secs_f64(), published));
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
        series,
    }
}

/// The textbook relay: one transaction per batch of 100 that selects `FOR UPDATE SKIP LOCKED`,
/// publishes each row inside it (to the null publisher) and UPDATEs each row one by one.
pub fn drain_textbook(url: &str, relays: usize, n: i64) -> Drain {
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
        series: Vec::new(),
    }
}

/// The SQL ceiling: a set-based claim (lease UPDATE over SKIP LOCKED) and a set-based mark,
/// two autocommit statements per batch, no publishing.
pub fn drain_ceiling(url: &str, relays: usize, batch: usize, n: i64) -> Drain {
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
        series: Vec::new(),
    }
}

/// The drain section of the report.
pub fn section(ctx: &Ctx, md: &mut String) {
    let quick = ctx.quick;
    let url = &ctx.url;
    let rt = &ctx.rt;
    // A drain that has not finished by the cap is stopped and reported as such, with the rate
    // over the events it published.
    let cap = Duration::from_secs(if quick { 10 } else { 120 });
    let backlog: i64 = if quick { 20_000 } else { 100_000 };
    let mut conn = PgConnection::establish(url).expect("connect");
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
        let tb = drain_textbook(url, relays, backlog);
        row(
            md,
            "textbook relay (baseline a)",
            "SKIP LOCKED",
            relays,
            100,
            "null",
            &tb,
            None,
        );
        for &batch in &batches {
            let ceil = drain_ceiling(url, relays, batch, backlog);
            row(
                md,
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
                        url, mode, relays, batch, sink, &ctx.kafka, backlog, cap,
                    ));
                    row(
                        md,
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
    if !ctx.kafka.is_empty() {
        let _ = writeln!(md, "\n### Kafka (noida-db at {})\n", ctx.kafka);
        let _ = writeln!(
            md,
            "| mode | relays | batch | events/s | postgres CPU s | bench CPU s |\n|---|---|---|---|---|---|"
        );
        for mode in [Mode::Unordered, Mode::Sharded] {
            for relays in [1usize, 2] {
                let d = rt.block_on(drain_ours(
                    url,
                    mode,
                    relays,
                    1000,
                    Sink::Kafka,
                    &ctx.kafka,
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
}
