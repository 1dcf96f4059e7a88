//! Rust peers: oxide-outbox and ruststream-sqlx, driven through their public APIs by the
//! standalone `outbox-bench/peers` binary, side by side with ours on the same PostgreSQL server,
//! Kafka-protocol broker, event and backlog.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use diesel::prelude::*;
use outbox::relay::Mode;

use crate::common::*;
use crate::drain::{Sink, drain_ours, fill_template};

/// The concurrency the peers are also run with, beside their defaults (the figure their docs'
/// examples use: ruststream's `workers(nonzero!(4))` and Relay guide's `workers_by_key(4)`).
const WORKERS: usize = 4;

/// One configuration of a peer the binary drives, with what its relay promises about order.
struct Peer {
    /// `--peer`.
    peer: &'static str,
    /// The library, for the table.
    name: &'static str,
    /// `--workers`.
    workers: usize,
    /// `--by-key`.
    by_key: bool,
    /// The configuration and its ordering guarantee, for the table.
    guarantee: &'static str,
}

/// Each peer at its defaults, then with the concurrency its docs offer.
const PEERS: [Peer; 5] = [
    Peer {
        peer: "oxide",
        name: "oxide-outbox",
        workers: 1,
        by_key: false,
        guarantee: "default: one OutboxManager; claims `FOR UPDATE SKIP LOCKED` ordered by \
                    locked_until, which is equal (-infinity) for every pending event: no \
                    ordering promise",
    },
    Peer {
        peer: "oxide",
        name: "oxide-outbox",
        workers: WORKERS,
        by_key: false,
        guarantee: "concurrent: 4 OutboxManagers on the table (outbox-postgres's README: \
                    `FOR UPDATE SKIP LOCKED` lets several workers share it): no ordering promise",
    },
    Peer {
        peer: "ruststream",
        name: "ruststream-sqlx + ruststream-rdkafka",
        workers: 1,
        by_key: false,
        guarantee: "default: one batch subscription, row lock form (`FOR UPDATE SKIP LOCKED`, \
                    claims in id order), sequential dispatch: write order while one instance \
                    runs, no per-aggregate order across instances",
    },
    Peer {
        peer: "ruststream",
        name: "ruststream-sqlx + ruststream-rdkafka",
        workers: WORKERS,
        by_key: false,
        guarantee: "concurrent: the batch subscription with `workers(4)`, 4 batches in flight: \
                    no ordering promise",
    },
    Peer {
        peer: "ruststream",
        name: "ruststream-sqlx + ruststream-rdkafka",
        workers: WORKERS,
        by_key: true,
        guarantee: "per key: single deliveries with `workers_by_key(4)`, the Relay guide's own \
                    mounting: per-aggregate order within one instance (4 lanes by \
                    partition_key; `fifo` groups, which keep a group's order across instances \
                    by holding one row of it in work, would be slower still)",
    },
];

/// One peer run, as the binary reports it (or why there is none).
struct PeerRun {
    version: String,
    rate: Option<f64>,
    write_rate: Option<f64>,
    capped: Option<i64>,
    notes: String,
    error: Option<String>,
}

/// How long the peers' build took in this run, in seconds (the report's run time says it
/// apart: a first build compiles two SQL stacks and librdkafka, minutes the benchmark does not
/// spend measuring).
pub static BUILD_SECS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// Builds the peers binary; its path, or the first lines of the build's errors.
fn build() -> Result<PathBuf, String> {
    let started = std::time::Instant::now();
    let built = build_once();
    let _ = BUILD_SECS.set(started.elapsed().as_secs_f64());
    built
}

fn build_once() -> Result<PathBuf, String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/Cargo.toml");
    eprintln!("building {}", manifest.display());
    let out = Command::new("cargo")
        .args([
            "build",
            "--release",
            "--message-format=json",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut exe = None;
    let mut errors = Vec::new();
    for line in stdout.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        match msg["reason"].as_str() {
            Some("compiler-artifact") => {
                if let Some(path) = msg["executable"].as_str()
                    && msg["target"]["name"] == "outbox-bench-peers"
                {
                    exe = Some(PathBuf::from(path));
                }
            }
            Some("compiler-message") if msg["message"]["level"] == "error" => {
                if let Some(text) = msg["message"]["rendered"].as_str() {
                    errors.push(text.trim().to_string());
                }
            }
            _ => {}
        }
    }
    if out.status.success()
        && let Some(exe) = exe
    {
        return Ok(exe);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    errors.extend(
        stderr
            .lines()
            .filter(|l| l.starts_with("error"))
            .map(str::to_string),
    );
    let text = errors.join("\n");
    Err(text.lines().take(6).collect::<Vec<_>>().join(" / "))
}

/// Runs the binary for `peer`.
fn run(exe: &Path, ctx: &Ctx, p: &Peer, n: i64, batch: usize, cap: Duration) -> PeerRun {
    let peer = p.peer;
    eprintln!(
        "peer {peer}: {n} events, batch {batch}, workers {}{}",
        p.workers,
        if p.by_key { " by key" } else { "" }
    );
    ctx.fresh_broker();
    let mut cmd = Command::new(exe);
    if p.by_key {
        cmd.arg("--by-key");
    }
    let out = cmd
        .args(["--workers", &p.workers.to_string()])
        .args([
            "--peer",
            peer,
            "--pg",
            &ctx.pg_server,
            "--kafka",
            &ctx.kafka,
        ])
        .args(["--events", &n.to_string(), "--batch", &batch.to_string()])
        .args(["--cap-secs", &cap.as_secs().to_string()])
        .output();
    let failed = |error: String| PeerRun {
        version: String::new(),
        rate: None,
        write_rate: None,
        capped: None,
        notes: String::new(),
        error: Some(error),
    };
    let out = match out {
        Ok(out) => out,
        Err(e) => return failed(format!("{}: {e}", exe.display())),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let Some(v) = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    else {
        let tail: Vec<&str> = stderr.lines().rev().take(4).collect();
        return failed(format!(
            "exited with {} and no result: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ));
    };
    println!("{}", v);
    PeerRun {
        version: v["version"].as_str().unwrap_or_default().to_string(),
        rate: v["rate"].as_f64(),
        write_rate: v["write_rate"].as_f64(),
        capped: (v["capped"] == true).then(|| v["published"].as_i64().unwrap_or(0)),
        notes: v["notes"].as_str().unwrap_or_default().to_string(),
        error: v["error"].as_str().map(str::to_string),
    }
}

/// Markdown table cells cannot hold `|` or newlines.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The Rust peers section of the report.
pub fn section(ctx: &Ctx, md: &mut String) {
    let _ = writeln!(md, "\n## Rust peers (PostgreSQL → Kafka)\n");
    if ctx.kafka.is_empty() {
        let _ = writeln!(md, "Skipped: no Kafka broker (`--kafka` is empty).");
        return;
    }
    let quick = ctx.quick;
    let backlog: i64 = if quick { 20_000 } else { 100_000 };
    let runs = if quick { 1 } else { 3 };
    let batch = 100usize;
    // The peers publish at a steady rate far below the backlog's size; a drain stopped at the
    // cap reports its rate over what it published.
    let cap = Duration::from_secs(if quick { 5 } else { 60 });
    let built = build();

    let mut conn = PgConnection::establish(&ctx.url).expect("connect");
    let mut our_writes = Vec::new();
    let our_modes = [Mode::Unordered, Mode::Sharded];
    let mut ours: Vec<Vec<f64>> = vec![Vec::new(); our_modes.len()];
    let mut ours_capped: Vec<Option<u64>> = vec![None; our_modes.len()];
    let mut peers: Vec<Vec<PeerRun>> = PEERS.iter().map(|_| Vec::new()).collect();
    // Interleaved, so that every library shares the machine's noise: ours, then each peer, again.
    for _ in 0..runs {
        // Our write rate is taken at each run, beside the peers' (each writes its backlog at
        // each run): the backlog's template is written anew through `transaction_with_outbox`.
        eprintln!("filling {backlog} events");
        our_writes.push(backlog as f64 / fill_template(&mut conn, backlog as usize));
        for (i, &mode) in our_modes.iter().enumerate() {
            ctx.fresh_broker();
            let d = ctx.rt.block_on(drain_ours(
                &ctx.url,
                mode,
                1,
                batch,
                Sink::Kafka,
                &ctx.kafka,
                backlog,
                cap,
            ));
            println!("ours {mode:?}: {} events/s", fmt_n(d.rate));
            ours[i].push(d.rate);
            if d.capped.is_some() {
                ours_capped[i] = d.capped;
            }
        }
        if let Ok(exe) = &built {
            for (i, peer) in PEERS.iter().enumerate() {
                peers[i].push(run(exe, ctx, peer, backlog, batch, cap));
            }
        }
    }

    let _ = writeln!(
        md,
        "{} pending events over 1,000 aggregates (our event, ~60 bytes of JSON), batch {batch}, \
         one relay each, all publishing to the same Kafka-protocol broker ({}). events/s from the \
         relay's start until the library's own table says every event is published (the peers' \
         tables polled by SQL every 20 ms); {}; a drain still running after {} s is stopped and \
         its rate is over the events it published. write events/s: the backlog written through \
         the library's own write API, 1,000 events per transaction (ours: the backlog's \
         template, written anew at each run; the peers: at each run). The peers run in their own \
         process (`outbox-bench/peers`, built with `cargo build --release`), each on a database \
         of its own created for the run; the runs are interleaved (ours, then each peer \
         configuration, again) so that they share the machine's noise. Each peer runs twice or \
         more: at its defaults, and with the concurrency its documentation offers ({WORKERS} \
         workers), so that neither comparison rests on a configuration the peer would not \
         recommend.\n",
        fmt_n(backlog as f64),
        ctx.kafka,
        if runs > 1 {
            format!("median of {runs} runs")
        } else {
            "one run (quick)".to_string()
        },
        cap.as_secs()
    );
    let _ = writeln!(
        md,
        "| library | version | mode / ordering guarantee | batch | events/s | vs ours (unordered, same batch) | write events/s | notes |\n|---|---|---|---|---|---|---|---|"
    );
    drop(conn);
    let our_write = median(our_writes);
    let our_version = env!("CARGO_PKG_VERSION");
    let base = median(ours[0].clone());
    for (i, mode) in our_modes.iter().enumerate() {
        let rate = median(ours[i].clone());
        let guarantee = match mode {
            Mode::Unordered => "unordered: SKIP LOCKED claims, no ordering promise",
            _ => "sharded: per-aggregate order (256 shards leased to relays)",
        };
        let line = format!(
            "| outbox (ours) | {our_version} | {guarantee} | {batch} | {}{} | {:.2}× | {} | Kafka publisher `outbox::kafka::KafkaPublisher` (topic `bench.order`, key = aggregate id); write: `transaction_with_outbox` |",
            fmt_n(rate),
            ours_capped[i].map_or(String::new(), |p| format!(
                " (stopped at the cap: {} published)",
                fmt_n(p as f64)
            )),
            rate / base,
            fmt_n(our_write)
        );
        println!("{line}");
        let _ = writeln!(md, "{line}");
    }
    for (
        i,
        Peer {
            name, guarantee, ..
        },
    ) in PEERS.iter().enumerate()
    {
        let line = match &built {
            Err(e) => format!(
                "| {name} | – | {guarantee} | {batch} | – | – | – | could not be built: {} |",
                cell(e)
            ),
            Ok(_) => {
                let ok: Vec<&PeerRun> = peers[i].iter().filter(|r| r.error.is_none()).collect();
                let version = peers[i]
                    .iter()
                    .map(|r| r.version.as_str())
                    .find(|v| !v.is_empty())
                    .unwrap_or("–");
                let errors: Vec<&str> =
                    peers[i].iter().filter_map(|r| r.error.as_deref()).collect();
                if ok.is_empty() {
                    format!(
                        "| {name} | {} | {guarantee} | {batch} | – | – | – | failed: {} |",
                        cell(version),
                        cell(errors.first().copied().unwrap_or("no run"))
                    )
                } else {
                    let rate = median(ok.iter().filter_map(|r| r.rate).collect());
                    let write = median(ok.iter().filter_map(|r| r.write_rate).collect());
                    let capped = ok.iter().find_map(|r| r.capped);
                    let mut notes = ok[0].notes.clone();
                    if !errors.is_empty() {
                        notes.push_str(&format!(
                            "; {} of {runs} runs failed: {}",
                            errors.len(),
                            errors[0]
                        ));
                    }
                    format!(
                        "| {name} | {} | {guarantee} | {batch} | {}{} | {:.2}× | {} | {} |",
                        cell(version),
                        fmt_n(rate),
                        capped.map_or(String::new(), |p| format!(
                            " (stopped at the cap: {} published)",
                            fmt_n(p as f64)
                        )),
                        rate / base,
                        fmt_n(write),
                        cell(&notes)
                    )
                }
            }
        };
        println!("{line}");
        let _ = writeln!(md, "{line}");
    }
}
