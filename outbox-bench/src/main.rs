//! `outbox-bench`: the write path's overhead (PostgreSQL, MariaDB, SQLite) and the relay's drain
//! rate on PostgreSQL, each side by side with baselines measured in the same run. See
//! docs/BENCHMARKS.md.

mod broker;
mod brokers;
mod cluster;
mod common;
mod drain;
mod latency;
mod peers;
mod plot;
mod scale;
mod soak;
mod wal;
mod write;

use std::fmt::Write as _;

use clap::Parser;
use diesel::prelude::*;

use common::{Ctx, exec};

/// Where the report's hand-written notes start; the program keeps what follows it.
const NOTES_MARKER: &str = "<!-- Notes below are written by hand; outbox-bench keeps them when it rewrites the tables above. -->";

/// The benchmark's options.
#[derive(Parser, Debug)]
#[command(
    about = "Benchmarks of the outbox: write path (PostgreSQL, MariaDB, SQLite) and relay drain (PostgreSQL)"
)]
struct Args {
    /// The short run (about 2 minutes) instead of the full one.
    #[arg(long)]
    quick: bool,
    /// PostgreSQL server (without database); the bench creates and drops its own database.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pg: String,
    /// MariaDB/MySQL server (without database); empty to skip its write path.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    mysql: String,
    /// Kafka-protocol broker: `private` starts a noida-db of the bench's own (see
    /// `broker.rs`), emptied before each run that publishes; `host:port` uses that broker as
    /// it is; empty skips the Kafka sections.
    #[arg(long, default_value = "private")]
    kafka: String,
    /// NATS server with JetStream for the drains to NATS; empty (or unreachable) skips them.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// RabbitMQ URI for the drains to RabbitMQ; empty (or unreachable) skips them.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp: String,
    /// Where to write the report (the PNG plots go next to it).
    #[arg(long, default_value = "docs/BENCHMARKS.md")]
    out: String,
    /// Run only these sections (comma-separated: write, drain, scale, peers, latency, wal,
    /// soak); all but soak when empty.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Soak (`--only soak`): seconds of steady writing.
    #[arg(long, default_value_t = 1800)]
    soak_secs: u64,
    /// Soak: events per second written to each of its two databases.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    soak_rate: u64,
    /// Soak: stream mode's ring, `<slots>,<slot_xids>` (as `outbox partition`).
    #[arg(long, default_value = "4,100000", value_parser = soak::Settings::ring)]
    soak_ring: (u16, u64),
    /// Internal: run one relay against this database URL until `--events` are published and
    /// print its figures (the scale section runs each relay in its own process).
    #[arg(long, hide = true)]
    relay_child: Option<String>,
    /// Internal (`--relay-child`): the relay mode.
    #[arg(long, hide = true, default_value = "sharded")]
    mode: outbox::relay::Mode,
    /// Internal (`--relay-child`): rows per claim.
    #[arg(long, hide = true, default_value_t = 1000)]
    batch: usize,
    /// Internal (`--relay-child`): stop once this many events are published.
    #[arg(long, hide = true, default_value_t = 0)]
    events: u64,
    /// Internal (`--relay-child`): stop after this many seconds in any case.
    #[arg(long, hide = true, default_value_t = 600)]
    cap: u64,
}

/// A section of the report: writes its part of the Markdown.
type Section = fn(&Ctx, &mut String);

/// Migrates the bench's database and creates the business table the write path inserts into.
/// With `OUTBOX_BENCH_PARTITION=<slots>,<slot_xids>` the event table is then turned into
/// stream mode's partition ring (`outbox partition`), for an A/B of that layout against the
/// plain table: every PostgreSQL section then runs on it.
pub fn prepare(conn: &mut PgConnection) {
    let ring = std::env::var("OUTBOX_BENCH_PARTITION").ok().map(|ring| {
        ring.split_once(',')
            .and_then(|(s, x)| Some((s.trim().parse::<u16>().ok()?, x.trim().parse::<u64>().ok()?)))
            .unwrap_or_else(|| {
                panic!("OUTBOX_BENCH_PARTITION must be <slots>,<slot_xids>, got {ring:?}")
            })
    });
    prepare_layout(conn, ring);
}

/// [`prepare`] with the event table on the plain layout (`None`) or turned into a ring of
/// `slots` partitions of `slot_xids` transaction ids each (`Some((slots, slot_xids))`).
pub fn prepare_layout(conn: &mut PgConnection, ring: Option<(u16, u64)>) {
    outbox::migrations::run(conn).expect("migrate");
    if let Some((slots, xids)) = ring {
        exec(
            conn,
            &format!("SELECT outbox_partition_events({slots}, {xids})"),
        );
    }
    exec(
        conn,
        "CREATE TABLE bench_orders (id BIGINT PRIMARY KEY, customer BIGINT NOT NULL, \
         total_cents BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    );
}

fn main() {
    let args = Args::parse();
    if let Some(url) = &args.relay_child {
        scale::relay_child(
            url,
            args.mode,
            args.batch,
            args.events,
            std::time::Duration::from_secs(args.cap),
        );
        return;
    }
    let quick = args.quick;
    let db = format!("outbox_bench_{}", std::process::id());
    let mut admin = PgConnection::establish(&format!("{}/postgres", args.pg)).expect("connect");
    exec(&mut admin, &format!("CREATE DATABASE {db}"));
    let url = format!("{}/{db}", args.pg);
    let mut conn = PgConnection::establish(&url).expect("connect");
    prepare(&mut conn);
    drop(conn);
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
    // The command as it was given, so that a report made with `--only` or `--out` says so.
    let given: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| if a.is_empty() { "\"\"".into() } else { a })
        .collect();
    let cmd = format!("cargo run --release -p outbox-bench -- {}", given.join(" "));
    let cmd = cmd.trim_end();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let out_dir = std::path::Path::new(&args.out)
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let _ = std::fs::create_dir_all(&out_dir);
    let plot_prefix = std::path::Path::new(&args.out)
        .file_stem()
        .map_or("benchmarks".into(), |s| s.to_string_lossy().to_lowercase());
    // The broker: one of the bench's own unless one is given.
    let (broker, kafka, broker_text) = match args.kafka.as_str() {
        "private" => match broker::PrivateBroker::start() {
            Ok(b) => {
                let text = format!(
                    "a private {} on {} (an empty data directory, emptied again before each run \
                     that publishes: see outbox-bench/src/broker.rs)",
                    b.version(),
                    b.addr
                );
                let addr = b.addr.clone();
                (Some(b), addr, text)
            }
            Err(e) => {
                eprintln!("private broker: {e}; using 127.0.0.1:9092");
                let text =
                    format!("127.0.0.1:9092 as it was (a private broker could not start: {e})");
                (None, "127.0.0.1:9092".to_string(), text)
            }
        },
        "" => (None, String::new(), "none (`--kafka \"\"`)".to_string()),
        given => (None, given.to_string(), format!("{given}, as it was")),
    };
    // The other brokers: the machine's own, skipped (and said so) when nothing answers.
    let other = |url: &str, what: &str| {
        if url.is_empty() || brokers::reachable(url) {
            url.to_owned()
        } else {
            eprintln!(
                "{what}: nothing answers at {}; skipping its drains",
                brokers::shown(url)
            );
            String::new()
        }
    };
    let (nats, amqp) = (other(&args.nats, "NATS"), other(&args.amqp, "RabbitMQ"));
    let mut ctx = Ctx {
        quick,
        url: url.clone(),
        pg_server: args.pg.clone(),
        mysql_server: args.mysql.clone(),
        kafka,
        broker,
        nats,
        amqp,
        out_dir,
        plot_prefix,
        rt,
        soak: soak::Settings {
            secs: args.soak_secs,
            rate: args.soak_rate,
            slots: args.soak_ring.0,
            slot_xids: args.soak_ring.1,
        },
    };
    let shared = format!("{} ({})", args.pg, cluster::describe(&url));
    // Which PostgreSQL server each section ran on, for the header.
    let mut servers: Vec<(&str, String)> = Vec::new();
    let mut body = String::new();
    // `wal` starts a cluster of its own, with its checkpoints pushed out of the drains.
    let sections: [(&str, Section, bool); 7] = [
        ("write", write::section, false),
        ("drain", drain::section, true),
        ("scale", scale::section, true),
        ("peers", peers::section, false),
        ("latency", latency::section, true),
        ("wal", wal::section, false),
        ("soak", soak::section, true),
    ];
    // How long each section took (the last one is timed when the loop ends).
    let started = std::time::Instant::now();
    let mut took: Vec<(&str, std::time::Instant)> = Vec::new();
    for (name, section, private) in sections {
        // The soak takes half an hour: it runs only when named.
        let named = args.only.iter().any(|o| o == name);
        if !(named || args.only.is_empty() && name != "soak") {
            continue;
        }
        took.push((name, std::time::Instant::now()));
        if name == "wal" {
            servers.push((
                name,
                "a private cluster of its own (said in its section)".into(),
            ));
            section(&ctx, &mut body);
            continue;
        }
        if !private {
            servers.push((name, format!("the shared server {shared}")));
            section(&ctx, &mut body);
            continue;
        }
        // A cluster of the section's own, with PostgreSQL's defaults: its figures do not
        // depend on how the shared server is configured, nor on what the sections before it
        // left in its tables.
        match cluster::PrivatePg::start() {
            Ok(pg) => {
                ctx.url = pg.database(&db);
                ctx.pg_server = pg.server.clone();
                servers.push((
                    name,
                    format!(
                        "a private cluster of its own (initdb in a temporary directory, \
                         PostgreSQL's defaults; {})",
                        cluster::describe(&ctx.url)
                    ),
                ));
                section(&ctx, &mut body);
                ctx.url.clone_from(&url);
                ctx.pg_server.clone_from(&args.pg);
                drop(pg);
            }
            Err(e) => {
                eprintln!("private cluster for {name}: {e}; using the shared server");
                servers.push((
                    name,
                    format!("the shared server {shared} (a private cluster could not start: {e})"),
                ));
                section(&ctx, &mut body);
            }
        }
    }
    let ended = std::time::Instant::now();
    let timing: Vec<String> = took
        .iter()
        .enumerate()
        .map(|(i, (name, at))| {
            let end = took.get(i + 1).map_or(ended, |next| next.1);
            let build = match (*name, peers::BUILD_SECS.get()) {
                ("peers", Some(b)) => format!(" (of which {b:.0} s building outbox-bench/peers)"),
                _ => String::new(),
            };
            format!("{name} {:.0} s{build}", (end - *at).as_secs_f64())
        })
        .collect();
    drop(ctx);
    exec(&mut admin, &format!("DROP DATABASE {db} WITH (FORCE)"));
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Command: `{cmd}`  \nDate: {date}  \nMachine: {cores} cores, {mem}  \n\
         The machine is shared and noisy: figures are medians of repeated runs where stated, and \
         every comparison is made side by side in the same run.\n\nPostgreSQL server of each \
         section:\n"
    );
    for (name, server) in &servers {
        let _ = writeln!(md, "- {name}: {server}");
    }
    let _ = writeln!(md, "\nKafka-protocol broker: {broker_text}.");
    let _ = writeln!(
        md,
        "\nThe run took {:.1} min: {}.",
        (ended - started).as_secs_f64() / 60.0,
        timing.join(", ")
    );
    md.push('\n');
    md.push_str(body.trim_start_matches('\n'));
    // The hand-written analysis below the marker survives a re-run.
    if let Ok(old) = std::fs::read_to_string(&args.out)
        && let Some(at) = old.find(NOTES_MARKER)
    {
        md.push('\n');
        md.push_str(&old[at..]);
    } else {
        let _ = write!(md, "\n{NOTES_MARKER}\n");
    }
    std::fs::write(&args.out, &md).expect("write report");
    eprintln!("wrote {}", args.out);
}
