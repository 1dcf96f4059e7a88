//! The soak (`--only soak`, never part of the default run): steady writing and relaying for
//! half an hour, stream mode on its partition ring beside sharded lease mode on the plain
//! table, each in its own database of one private cluster with PostgreSQL's defaults
//! (autovacuum on). What it shows is the event table over time: dead tuples and size, which
//! stream mode keeps bounded by emptying whole partitions, and which the lease modes leave to
//! autovacuum.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use outbox::prelude::*;
use outbox::relay::{
    Delivery, Mode, OutboxMessage, PgRelayStore, Publisher, Relay, RelayConfig, Retention,
};

use crate::common::*;
use crate::plot;

/// The soak's settings (`--soak-secs`, `--soak-rate`, `--soak-ring`).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// How long the writers write.
    pub secs: u64,
    /// Events per second written to each database (one event per transaction).
    pub rate: u64,
    /// The ring: partitions and transaction ids per partition.
    pub slots: u16,
    pub slot_xids: u64,
}

impl Settings {
    /// Parses `--soak-ring`'s `<slots>,<slot_xids>`.
    pub fn ring(s: &str) -> Result<(u16, u64), String> {
        s.split_once(',')
            .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
            .ok_or_else(|| format!("--soak-ring must be <slots>,<slot_xids>, got {s:?}"))
    }
}

/// Writer connections per database, sharing its schedule (as in the latency section: one
/// connection alone cannot hold 1,000 commits/s when each COMMIT waits for its WAL flush).
const WRITERS: usize = 8;
/// A sample every this often.
const SAMPLE: Duration = Duration::from_secs(10);
/// Retention of both relays: published rows are kept this long, the cleanup runs this often.
const KEEP: Duration = Duration::from_secs(60);
const EVERY: Duration = Duration::from_secs(10);

/// A publisher that takes everything at once and counts it.
struct Counting(Arc<AtomicU64>);

impl Publisher for Counting {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        vec![Delivery::Published; batch.len()]
    }
}

/// One layout: its database, what was written and published.
struct Side {
    name: &'static str,
    url: String,
    mode: Mode,
    written: Arc<AtomicU64>,
    published: Arc<AtomicU64>,
}

/// One partition's (or the plain table's) statistics at a sample.
#[derive(QueryableByName, Clone, Debug)]
struct Part {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = BigInt)]
    live: i64,
    #[diesel(sql_type = BigInt)]
    dead: i64,
    #[diesel(sql_type = BigInt)]
    bytes: i64,
    #[diesel(sql_type = BigInt)]
    autovacuums: i64,
    #[diesel(sql_type = BigInt)]
    db_bytes: i64,
    #[diesel(sql_type = BigInt)]
    xid: i64,
}

/// The event table's statistics (every partition, or the table itself), from
/// `pg_stat_user_tables` (which the server updates within a second or so of each transaction).
fn parts(conn: &mut PgConnection) -> QueryResult<Vec<Part>> {
    diesel::sql_query(
        "SELECT s.relname::text AS name, s.n_live_tup AS live, s.n_dead_tup AS dead, \
         pg_total_relation_size(s.relid) AS bytes, s.autovacuum_count AS autovacuums, \
         pg_database_size(current_database()) AS db_bytes, \
         pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid \
         FROM pg_stat_user_tables s \
         WHERE s.relid = 'outbox_events'::regclass \
            OR s.relid IN (SELECT relid FROM pg_partition_tree('outbox_events') WHERE isleaf) \
         ORDER BY s.relname",
    )
    .load(conn)
}

/// One sample of one side.
#[derive(Clone, Debug)]
struct Sample {
    t: f64,
    live: i64,
    dead: i64,
    bytes: i64,
    autovacuums: i64,
    db_bytes: i64,
    backlog: i64,
    /// Per partition (name, bytes), to count the partitions emptied.
    parts: Vec<(String, i64)>,
}

fn sample(conn: &mut PgConnection, side: &Side, t: f64) -> QueryResult<(Sample, i64)> {
    // Published before written: an event written and published between the two reads then
    // counts as backlog, not as less than none.
    let published = side.published.load(Ordering::Relaxed) as i64;
    let written = side.written.load(Ordering::Relaxed) as i64;
    let p = parts(conn)?;
    let xid = p.first().map_or(0, |p| p.xid);
    Ok((
        Sample {
            t,
            live: p.iter().map(|p| p.live).sum(),
            dead: p.iter().map(|p| p.dead).sum(),
            bytes: p.iter().map(|p| p.bytes).sum(),
            autovacuums: p.iter().map(|p| p.autovacuums).sum(),
            db_bytes: p.first().map_or(0, |p| p.db_bytes),
            backlog: written - published,
            parts: p.iter().map(|p| (p.name.clone(), p.bytes)).collect(),
        },
        xid,
    ))
}

/// Times a partition's size fell to under a tenth between two samples: the partitions a
/// rotation emptied.
fn emptied(samples: &[Sample]) -> usize {
    samples
        .windows(2)
        .map(|w| {
            w[1].parts
                .iter()
                .filter(|(name, bytes)| {
                    w[0].parts
                        .iter()
                        .any(|(n, b)| n == name && *bytes * 10 < *b && *b > 1 << 20)
                })
                .count()
        })
        .sum()
}

/// A database of the private cluster with the outbox's migrations, for one side (the plain
/// table whatever `OUTBOX_BENCH_PARTITION` says: the soak converts the stream side itself).
fn database(ctx: &Ctx, name: &str) -> String {
    let mut admin =
        PgConnection::establish(&format!("{}/postgres", ctx.pg_server)).expect("connect");
    exec(&mut admin, &format!("DROP DATABASE IF EXISTS {name}"));
    exec(&mut admin, &format!("CREATE DATABASE {name}"));
    let url = format!("{}/{name}", ctx.pg_server);
    let mut conn = PgConnection::establish(&url).expect("connect");
    outbox::migrations::run(&mut conn).expect("migrate");
    url
}

fn drop_database(ctx: &Ctx, name: &str) {
    if let Ok(mut admin) = PgConnection::establish(&format!("{}/postgres", ctx.pg_server)) {
        exec(
            &mut admin,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        );
    }
}

/// The paced writers of one side: event i is due at `start + i / rate`, whichever writer takes
/// it; a late writer commits at once. Returns (transactions more than 10 ms late, the most
/// late) when `stop` is set or the end is reached.
fn write(
    side: &Side,
    rate: u64,
    start: Instant,
    end: Instant,
    stop: &AtomicBool,
) -> (u64, Duration) {
    let next = AtomicU64::new(0);
    let period = Duration::from_nanos(1_000_000_000 / rate);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                let next = &next;
                s.spawn(move || {
                    let mut conn = PgConnection::establish(&side.url).expect("connect");
                    let (mut late, mut max_lag) = (0u64, Duration::ZERO);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let due = start + period * i as u32;
                        if due >= end || stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let now = Instant::now();
                        if now < due {
                            std::thread::sleep(due - now);
                        } else if now - due > Duration::from_millis(10) {
                            late += 1;
                            max_lag = max_lag.max(now - due);
                        }
                        conn.transaction_with_outbox(|tx| {
                            tx.publish(&OrderCreated {
                                order_id: (i % 1000) as i64,
                                customer: i as i64,
                                total_cents: 1250,
                            })
                        })
                        .expect("write");
                        side.written.fetch_add(1, Ordering::Relaxed);
                    }
                    (late, max_lag)
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|w| w.join().expect("writer"))
            .fold((0, Duration::ZERO), |(l, m), (l2, m2)| (l + l2, m.max(m2)))
    })
}

fn mb(bytes: i64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The soak section of the report, and its two plots.
pub fn section(ctx: &Ctx, md: &mut String) {
    let s = ctx.soak;
    let _ = writeln!(
        md,
        "\n## Soak: {} min of steady writing and relaying (stream on its ring, sharded on the plain table)\n",
        s.secs / 60
    );
    let stream_url = database(ctx, "soak_stream");
    let sharded_url = database(ctx, "soak_sharded");
    {
        let mut conn = PgConnection::establish(&stream_url).expect("connect");
        exec(
            &mut conn,
            &format!(
                "SELECT outbox_partition_events({}, {})",
                s.slots, s.slot_xids
            ),
        );
    }
    let side = |name, url: &str, mode| Side {
        name,
        url: url.to_string(),
        mode,
        written: Arc::new(AtomicU64::new(0)),
        published: Arc::new(AtomicU64::new(0)),
    };
    let sides = [
        side("stream (ring)", &stream_url, Mode::Stream),
        side("sharded (plain table)", &sharded_url, Mode::Sharded),
    ];
    let retention = Retention {
        keep: KEEP,
        batch: 10_000,
        every: EVERY,
    };
    let mut stops = Vec::new();
    let mut handles = Vec::new();
    for side in &sides {
        let config = RelayConfig {
            relay_id: format!("soak-{}", side.name.split(' ').next().unwrap_or("relay")),
            mode: side.mode,
            retention: Some(retention),
            ..RelayConfig::default()
        };
        let relay = Relay::new(
            PgRelayStore::new(&side.url),
            Counting(side.published.clone()),
            config,
        )
        .expect("relay config");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop);
        handles.push(ctx.rt.spawn(relay.run(async move {
            let _ = stopped.await;
        })));
    }

    eprintln!(
        "soak: {} s at {} events/s per database, ring {} x {}",
        s.secs, s.rate, s.slots, s.slot_xids
    );
    let start = Instant::now() + Duration::from_millis(100);
    let end = start + Duration::from_secs(s.secs);
    let stop = AtomicBool::new(false);
    let mut samples: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
    let mut xids: Vec<(f64, i64)> = Vec::new();
    let mut failed: Option<String> = None;
    let lateness = std::thread::scope(|sc| {
        let writers: Vec<_> = sides
            .iter()
            .map(|side| {
                let stop = &stop;
                sc.spawn(move || write(side, s.rate, start, end, stop))
            })
            .collect();
        let mut conns: Vec<PgConnection> = sides
            .iter()
            .map(|side| PgConnection::establish(&side.url).expect("connect"))
            .collect();
        let mut next = start;
        // Sample until the writers end, then a minute more while the relays catch up and
        // the last rotations run.
        while Instant::now() < end + Duration::from_secs(60) && failed.is_none() {
            let now = Instant::now();
            if now < next {
                std::thread::sleep(next - now);
            }
            next += SAMPLE;
            let t = start.elapsed().as_secs_f64();
            for (i, side) in sides.iter().enumerate() {
                match sample(&mut conns[i], side, t) {
                    Ok((smp, xid)) => {
                        if i == 0 {
                            xids.push((t, xid));
                        }
                        samples[i].push(smp);
                    }
                    Err(e) => failed = Some(format!("sampling {}: {e}", side.name)),
                }
            }
            if let (Some(a), Some(b)) = (samples[0].last(), samples[1].last()) {
                eprintln!(
                    "soak {t:>6.0} s: stream dead {} {:.0} MB backlog {}; sharded dead {} {:.0} MB backlog {}",
                    a.dead,
                    mb(a.bytes),
                    a.backlog,
                    b.dead,
                    mb(b.bytes),
                    b.backlog
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        writers
            .into_iter()
            .map(|w| w.join().expect("writers"))
            .collect::<Vec<_>>()
    });
    for stop in stops {
        let _ = stop.send(());
    }
    for h in handles {
        let _ = ctx.rt.block_on(h);
    }

    let xid_rate = match (xids.first(), xids.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) as f64 / (b.0 - a.0),
        _ => f64::NAN,
    };
    let _ = writeln!(
        md,
        "A private cluster (PostgreSQL's defaults, autovacuum on) holds two databases, written \
         at the same time at {} events/s each (one event per `transaction_with_outbox`, {WRITERS} \
         writer connections on one schedule per database, over 1,000 aggregates) for {} s, then \
         watched {} s more. Each has one relay with the default `RelayConfig` and retention \
         (keep {} s, every {} s), publishing to a publisher that takes every batch at once: \
         the database side alone. *stream* runs on the partition ring (`outbox partition \
         --slots {} --slot-xids {}`); *sharded* on the plain table, as lease mode runs. The \
         server used {} transaction ids a second (both databases and both relays: they share \
         the counter), so one partition held {:.0} s of writes and the ring turned every \
         {:.0} s. Every {} s the event table's statistics are read from \
         `pg_stat_user_tables` (summed over the partitions) and its size with \
         `pg_total_relation_size` (indexes and TOAST included); backlog is events written and \
         not yet published.\n",
        fmt_n(s.rate as f64),
        s.secs,
        60,
        KEEP.as_secs(),
        EVERY.as_secs(),
        s.slots,
        s.slot_xids,
        fmt_n(xid_rate),
        s.slot_xids as f64 / xid_rate,
        s.slot_xids as f64 * s.slots as f64 / xid_rate,
        SAMPLE.as_secs(),
    );
    if let Some(e) = &failed {
        let _ = writeln!(md, "The soak stopped early: {e}.\n");
    }
    let _ = writeln!(
        md,
        "| minute | stream: live rows | dead rows | table MB | backlog | sharded: live rows | dead rows | table MB | autovacuums | backlog |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    // A row every tenth of the run (and the last sample).
    let n = samples[0].len().min(samples[1].len());
    let step = (n / 10).max(1);
    for k in (0..n).filter(|k| k % step == 0 || *k + 1 == n) {
        let (a, b) = (&samples[0][k], &samples[1][k]);
        let line = format!(
            "| {:.1} | {} | {} | {:.1} | {} | {} | {} | {:.1} | {} | {} |",
            a.t / 60.0,
            fmt_n(a.live as f64),
            fmt_n(a.dead as f64),
            mb(a.bytes),
            fmt_n(a.backlog as f64),
            fmt_n(b.live as f64),
            fmt_n(b.dead as f64),
            mb(b.bytes),
            b.autovacuums,
            fmt_n(b.backlog as f64),
        );
        println!("{line}");
        let _ = writeln!(md, "{line}");
    }
    let _ = writeln!(md);
    for (i, side) in sides.iter().enumerate() {
        let v = &samples[i];
        let max = |f: fn(&Sample) -> i64| v.iter().map(f).max().unwrap_or(0);
        let half = &v[v.len() / 2..];
        let (late, lag) = lateness.get(i).copied().unwrap_or_default();
        let _ = writeln!(
            md,
            "- {}: {} written ({} events/s on average), {} published; dead rows at most {} (second half of the run: at \
             most {}); table at most {:.1} MB (second half: {:.1}–{:.1} MB), database at the \
             end {:.1} MB; {}; {} autovacuums of the event table; writers: {} transactions \
             more than 10 ms behind schedule (at worst {:.2} s).",
            side.name,
            fmt_n(side.written.load(Ordering::Relaxed) as f64),
            fmt_n(side.written.load(Ordering::Relaxed) as f64 / s.secs as f64),
            fmt_n(side.published.load(Ordering::Relaxed) as f64),
            fmt_n(max(|s| s.dead) as f64),
            fmt_n(half.iter().map(|s| s.dead).max().unwrap_or(0) as f64),
            mb(max(|s| s.bytes)),
            mb(half.iter().map(|s| s.bytes).min().unwrap_or(0)),
            mb(half.iter().map(|s| s.bytes).max().unwrap_or(0)),
            mb(v.last().map_or(0, |s| s.db_bytes)),
            if side.mode == Mode::Stream {
                format!("partitions emptied: {}", emptied(v))
            } else {
                "no partitions".to_string()
            },
            v.last().map_or(0, |s| s.autovacuums),
            fmt_n(late as f64),
            lag.as_secs_f64(),
        );
    }
    let plots = [
        (
            "dead-rows",
            "Dead rows in the event table (n_dead_tup)",
            "dead rows",
            (|s: &Sample| s.dead as f64) as fn(&Sample) -> f64,
        ),
        (
            "table-size",
            "Event table size (heap, indexes, TOAST)",
            "MB",
            |s: &Sample| mb(s.bytes),
        ),
    ];
    let mut shown = Vec::new();
    for (file, title, y, f) in plots {
        let series: Vec<(String, Vec<(f64, f64)>)> = sides
            .iter()
            .zip(&samples)
            .map(|(side, v)| {
                (
                    side.name.to_string(),
                    v.iter().map(|s| (s.t / 60.0, f(s))).collect(),
                )
            })
            .collect();
        let name = format!("{}-{file}.png", ctx.plot_prefix);
        match plot::lines(&ctx.out_dir.join(&name), title, "minutes", y, &series) {
            Ok(()) => shown.push(format!("![{title}]({name})")),
            Err(e) => shown.push(format!("({title}: not drawn: {e})")),
        }
    }
    let _ = writeln!(md, "\n{}\n", shown.join("\n"));
    drop_database(ctx, "soak_stream");
    drop_database(ctx, "soak_sharded");
}
