//! Scale: the drain rate and the relay's peak memory with 10,000 to 5,000,000 pending rows,
//! and the outbox's size on disk through a drain, a cleanup and a `VACUUM`.
//!
//! Each drain runs one relay in a child process (this binary, re-executed with the hidden
//! `--relay-child` flag) so that its peak resident memory is the relay's own.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, SmallInt, Text};
use outbox::prelude::*;
use outbox::relay::{Mode, PgRelayStore, Relay, RelayConfig, RelayStore};

use crate::common::*;
use crate::drain::{Null, pending};

/// What the relay child reports, one JSON line on stdout.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub struct ChildReport {
    /// Seconds from the relay's start until `events` were published (or the cap).
    pub secs: f64,
    /// Events published.
    pub published: u64,
    /// Seconds to publish the first and the last fifth of the events (if it got there).
    pub first_fifth_secs: Option<f64>,
    pub last_fifth_secs: Option<f64>,
    /// Resident memory before the relay started, and the process's peak (VmHWM), in KiB.
    pub rss_start_kib: u64,
    pub hwm_kib: u64,
    /// CPU seconds of all `postgres` processes while the relay drained.
    pub pg_cpu: f64,
}

/// A field of /proc/self/status in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// The child process: one relay (null publisher) until `events` are published or `cap`
/// passes, then one JSON line with the figures.
pub fn relay_child(url: &str, mode: Mode, batch: usize, events: u64, cap: Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let rss_start_kib = status_kib("VmRSS");
    let (secs, published, first_fifth_secs, last_fifth_secs, pg_cpu) = rt.block_on(async {
        let config = RelayConfig {
            relay_id: format!("scale-{}", std::process::id()),
            mode,
            batch_size: batch,
            poll_interval: Duration::from_millis(50),
            ..RelayConfig::default()
        };
        let relay = Relay::new(PgRelayStore::new(url), Null, config).expect("config");
        let stats = relay.stats();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let cpu0 = Cpu::now();
        let start = Instant::now();
        let handle = tokio::spawn(relay.run(async move {
            let _ = stopped.await;
        }));
        let fifth = events.div_ceil(5);
        let (mut first, mut last_start) = (None, None);
        let published = loop {
            let p = stats.published.load(Ordering::Relaxed);
            let t = start.elapsed().as_secs_f64();
            if first.is_none() && p >= fifth {
                first = Some(t);
            }
            if last_start.is_none() && p >= events.saturating_sub(fifth) {
                last_start = Some(t);
            }
            if p >= events || start.elapsed() > cap {
                break p;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let secs = start.elapsed().as_secs_f64();
        // Read while the relay's connection (and its server process) is still there.
        let (pg_cpu, _) = Cpu::now().since(&cpu0);
        let _ = stop.send(());
        let _ = handle.await;
        let last = (published >= events).then(|| last_start.map(|l| secs - l));
        (secs, published, first, last.flatten(), pg_cpu)
    });
    let report = ChildReport {
        secs,
        published,
        first_fifth_secs,
        last_fifth_secs,
        rss_start_kib,
        hwm_kib: status_kib("VmHWM"),
        pg_cpu,
    };
    println!("{}", serde_json::to_string(&report).expect("json"));
}

/// Runs one relay in a child process; returns its report and the CPU seconds of all
/// `postgres` processes meanwhile (as the child measured them: after it exits, its server
/// process is gone from /proc).
fn run_child(
    url: &str,
    mode: Mode,
    batch: usize,
    events: i64,
    cap: Duration,
) -> (ChildReport, f64) {
    let exe = std::env::current_exe().expect("current_exe");
    let out = std::process::Command::new(exe)
        .args(["--relay-child", url])
        .args(["--mode", &format!("{mode:?}").to_lowercase()])
        .args(["--batch", &batch.to_string()])
        .args(["--events", &events.to_string()])
        .args(["--cap", &cap.as_secs().to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run the relay child");
    assert!(out.status.success(), "relay child failed: {}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let report: ChildReport =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("relay child said {line:?}: {e}"));
    let pg_cpu = report.pg_cpu;
    (report, pg_cpu)
}

/// Empties the outbox and the relay tables, then inserts `n` pending events over 1,000
/// aggregates in one set-based statement (same columns and payload as [`OrderCreated`],
/// time-ordered UUIDv7-shaped ids, the shard from [`outbox::shard_of`]), then `ANALYZE` and
/// `CHECKPOINT` so the drain does not pay for the fill's writes. Returns the seconds taken.
pub(crate) fn fill(conn: &mut PgConnection, n: i64) -> f64 {
    crate::drain::clear_outbox(conn);
    exec(conn, "CHECKPOINT");
    let shards: Vec<i16> = (0..1000)
        .map(|a: i32| outbox::shard_of("order", &a.to_string()))
        .collect();
    let start = Instant::now();
    diesel::sql_query(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, \
         payload, shard) \
         SELECT (lpad(to_hex(m.ms + g.i / 1000), 12, '0') || '7' || lpad(to_hex(g.i % 4096), 3, '0') \
                 || '8' || lpad(to_hex(g.i), 15, '0'))::uuid, \
                'order', (g.i % 1000)::text, 'OrderCreated', 1, \
                jsonb_build_object('order_id', g.i % 1000, 'customer', g.i, 'total_cents', 1250), \
                ($1::int2[])[g.i % 1000 + 1] \
         FROM (SELECT (extract(epoch FROM now()) * 1000)::bigint AS ms) m, \
              generate_series(1::bigint, $2) g(i)",
    )
    .bind::<Array<SmallInt>, _>(&shards)
    .bind::<BigInt, _>(n)
    .execute(conn)
    .expect("fill");
    exec(conn, "ANALYZE outbox_events");
    exec(conn, "CHECKPOINT");
    start.elapsed().as_secs_f64()
}

/// Blocks of this database found in shared buffers and read from outside them so far.
fn blocks(conn: &mut PgConnection) -> (i64, i64) {
    #[derive(QueryableByName)]
    struct B {
        #[diesel(sql_type = BigInt)]
        hit: i64,
        #[diesel(sql_type = BigInt)]
        read: i64,
    }
    let b = diesel::sql_query(
        "SELECT blks_hit AS hit, blks_read AS read FROM pg_stat_database \
         WHERE datname = current_database()",
    )
    .get_result::<B>(conn)
    .expect("pg_stat_database");
    (b.hit, b.read)
}

/// The outbox's relations: (name, bytes).
fn sizes(conn: &mut PgConnection) -> Vec<(String, i64)> {
    #[derive(QueryableByName)]
    struct S {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = BigInt)]
        bytes: i64,
    }
    diesel::sql_query(
        "SELECT 'table (heap, TOAST, maps)' AS name, pg_table_size('outbox_events') AS bytes \
         UNION ALL SELECT * FROM (SELECT 'index ' || c.relname, pg_relation_size(c.oid) \
           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
           WHERE i.indrelid = 'outbox_events'::regclass ORDER BY c.relname) ix \
         UNION ALL SELECT 'all indexes', pg_indexes_size('outbox_events') \
         UNION ALL SELECT 'total', pg_total_relation_size('outbox_events')",
    )
    .load::<S>(conn)
    .expect("sizes")
    .into_iter()
    .map(|s| (s.name, s.bytes))
    .collect()
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the relay's claim of `batch` rows as relay `explain`,
/// in a transaction rolled back: (execution ms, shared buffers hit + read).
fn explain_claim(conn: &mut PgConnection, mode: Mode, batch: usize) -> (f64, i64) {
    #[derive(QueryableByName)]
    struct P {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        plan: String,
    }
    let sql = match mode {
        Mode::Unordered => format!(
            "{} RETURNING o.seq",
            outbox::relay::__sql::PG_CLAIM_UNORDERED
                .replace("$1", "'explain'")
                .replace("$2", "30")
                .replace("$3", &batch.to_string())
        ),
        _ => format!(
            "{} RETURNING o.seq",
            outbox::relay::__sql::PG_CLAIM_ORDERED
                .replace("$1", "'explain'")
                .replace("$2", "30")
                .replace("$3", &batch.to_string())
                .replace("$4", "true")
                .replace("$5", "false")
                .replace("$6", "true")
                .replace("$7", "NULL")
                .replace("$8", "'{}'::bigint[]")
        ),
    };
    // Rolled back: the claim and the shard leases it needs are not kept.
    exec(conn, "BEGIN");
    exec(conn, "SET LOCAL jit = off");
    exec(
        conn,
        "UPDATE outbox_shard_leases SET owner = 'explain', \
         lease_until = now() + interval '1 minute'",
    );
    let plan = diesel::sql_query(format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"))
        .get_result::<P>(conn)
        .expect("explain")
        .plan;
    exec(conn, "ROLLBACK");
    let v: serde_json::Value = serde_json::from_str(&plan).expect("plan json");
    let ms = v[0]["Execution Time"].as_f64().unwrap_or(0.0);
    let p = &v[0]["Plan"];
    let bufs = p["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + p["Shared Read Blocks"].as_i64().unwrap_or(0);
    (ms, bufs)
}

/// Checks that the set-based fill gives an event the shard that publishing it does.
fn check_shard(conn: &mut PgConnection) {
    #[derive(QueryableByName)]
    struct S {
        #[diesel(sql_type = SmallInt)]
        shard: i16,
    }
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderCreated {
            order_id: 7,
            customer: 7,
            total_cents: 1250,
        })
    })
    .expect("publish");
    let published = diesel::sql_query(
        "SELECT shard FROM outbox_events WHERE aggregate_type = 'order' AND aggregate_id = '7'",
    )
    .get_result::<S>(conn)
    .expect("shard")
    .shard;
    assert_eq!(published, outbox::shard_of("order", "7"));
}

/// Deletes every published row through the store's retention cleanup, in batches of
/// `limit`; returns the rows deleted.
fn cleanup_all(ctx: &Ctx, limit: usize) -> u64 {
    ctx.rt.block_on(async {
        let mut store = PgRelayStore::new(ctx.url.as_str());
        let mut total = 0;
        loop {
            let n = store.cleanup(Duration::ZERO, limit).await.expect("cleanup");
            if n == 0 {
                break total;
            }
            total += n;
        }
    })
}

fn mib(bytes: i64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

/// The scale section of the report.
pub fn section(ctx: &Ctx, md: &mut String) {
    let quick = ctx.quick;
    let counts: Vec<i64> = if quick {
        vec![10_000, 1_000_000]
    } else {
        vec![10_000, 1_000_000, 5_000_000]
    };
    let modes = [Mode::Unordered, Mode::Sharded];
    let batch = 1000;
    let cleanup_batch = 10_000;
    // Drains that run to the end: every unordered drain up to `sized` rows (the size table is
    // measured after the one of `sized` rows). The others stop at a time cap and their rate is
    // over the events published with the rest still pending: whole ordered drains of 1,000,000
    // and drains of 5,000,000 rows would take far more than the run's budget (see the text).
    let sized: i64 = 1_000_000;
    let cap = |mode: Mode, n: i64| {
        Duration::from_secs(match (quick, mode) {
            (true, Mode::Unordered) => 60,
            (true, _) => 30,
            (false, _) if n > sized => 60,
            (false, Mode::Unordered) => 900,
            (false, _) => 90,
        })
    };
    let mut conn = PgConnection::establish(&ctx.url).expect("connect");
    check_shard(&mut conn);
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = Text)]
        v: String,
    }
    let setting = |conn: &mut PgConnection, name: &str| {
        diesel::sql_query(format!("SELECT current_setting('{name}') AS v"))
            .get_result::<Setting>(conn)
            .map_or_else(|_| "?".into(), |s| s.v)
    };
    let autovacuum = setting(&mut conn, "autovacuum");
    let shared_buffers = setting(&mut conn, "shared_buffers");

    let mut table = Vec::new();
    let mut table_rss = Vec::new();
    let mut base: Vec<(Mode, f64)> = Vec::new();
    let mut stages: Vec<(&str, Vec<(String, i64)>)> = Vec::new();
    let (mut cleanup_s, mut cleaned, mut vacuum_s) = (0.0, 0, 0.0);
    for &n in &counts {
        for mode in modes {
            let name = format!("{mode:?}").to_lowercase();
            eprintln!("scale: filling {n} events ({name})");
            let fill_s = fill(&mut conn, n);
            let measure = n == sized && mode == Mode::Unordered;
            if measure {
                stages.push(("after the fill", sizes(&mut conn)));
            }
            let (start_ms, start_bufs) = explain_claim(&mut conn, mode, batch);
            eprintln!("scale: draining {n} events ({name})");
            let blocks0 = blocks(&mut conn);
            let (r, pg_cpu) = run_child(&ctx.url, mode, batch, n, cap(mode, n));
            let blocks1 = blocks(&mut conn);
            let per_event = |d: i64| d as f64 / r.published.max(1) as f64;
            let (hit, read) = (
                per_event(blocks1.0 - blocks0.0),
                per_event(blocks1.1 - blocks0.1),
            );
            let left = pending(&mut conn);
            let capped = r.published < n as u64;
            assert!(capped || left == 0, "{name} {n}: {left} rows left");
            // The first claim after a drain also marks the dead index entries it meets (when
            // it may); the second shows what every later claim pays.
            explain_claim(&mut conn, mode, batch);
            let (end_ms, end_bufs) = explain_claim(&mut conn, mode, batch);
            let rate = r.published.min(n as u64) as f64 / r.secs;
            if n == counts[0] {
                base.push((mode, rate));
            }
            let vs = base
                .iter()
                .find(|b| b.0 == mode)
                .map_or("–".into(), |b| format!("{:.2}", rate / b.1));
            let fifth = (n as u64).div_ceil(5) as f64;
            let line = format!(
                "| {} | {name} | {fill_s:.1} | {}{} | {vs} | {} / {} | {:.1} ({:.1}) | {pg_cpu:.1} | \
                 {hit:.1} / {read:.2} | \
                 {start_ms:.1} ms, {} buffers | {end_ms:.1} ms, {} buffers |",
                fmt_n(n as f64),
                fmt_n(rate),
                if capped {
                    format!(
                        " (stopped after {:.0} s: {} published)",
                        r.secs,
                        fmt_n(r.published as f64)
                    )
                } else {
                    String::new()
                },
                r.first_fifth_secs.map_or("–".into(), |t| fmt_n(fifth / t)),
                r.last_fifth_secs.map_or("–".into(), |t| fmt_n(fifth / t)),
                r.hwm_kib as f64 / 1024.0,
                r.rss_start_kib as f64 / 1024.0,
                fmt_n(start_bufs as f64),
                fmt_n(end_bufs as f64),
            );
            println!("{line}");
            table.push(line);
            table_rss.push(r.hwm_kib as f64 / 1024.0);
            if measure {
                stages.push(("after the drain", sizes(&mut conn)));
                let t = Instant::now();
                cleaned = cleanup_all(ctx, cleanup_batch);
                cleanup_s = t.elapsed().as_secs_f64();
                stages.push(("after cleanup", sizes(&mut conn)));
                let t = Instant::now();
                exec(&mut conn, "VACUUM outbox_events");
                vacuum_s = t.elapsed().as_secs_f64();
                stages.push(("after VACUUM", sizes(&mut conn)));
            }
        }
    }

    let _ = writeln!(md, "\n## Scale (PostgreSQL, null publisher)\n");
    let _ = writeln!(
        md,
        "Pending rows: {} ({}). Each size is filled with one set-based `INSERT … SELECT \
         generate_series` (the columns and payload of `OrderCreated`, 1,000 aggregates, \
         time-ordered UUIDv7-shaped ids, the shard of `outbox::shard_of`) with every index in \
         place, then `ANALYZE` and `CHECKPOINT`; *fill s* is that time, not part of the drain. \
         Then one relay (batch {batch}, null publisher) drains it in a child process (this \
         binary re-executed with a hidden flag) so that its peak resident memory (VmHWM) is its \
         own; the RSS the process had before the relay started is in brackets. events/s runs \
         from the relay's start until the last event is marked published; *first / last fifth* \
         is the rate over the first and the last 20 % of the events. *vs 10,000 rows*: the rate \
         over the rate of the same mode with 10,000 rows (1.00 = flat). {}Postgres CPU: seconds \
         of all `postgres` processes during the drain. *Buffers per event*: blocks found in \
         shared_buffers / blocks read from outside it (the OS cache or the disk) by this \
         database during the drain (`pg_stat_database`), per event published. The claim columns are `EXPLAIN (ANALYZE, \
         BUFFERS)` of one claim of {batch} rows (rolled back) on the filled table, and after \
         the drain (the second of two, so that the first has marked what it could; after a \
         whole drain it finds nothing): execution time and shared buffers touched. The \
         server ran with autovacuum = {autovacuum}, shared_buffers = {shared_buffers}. Leader \
         mode is left out to keep the run short: its claim is the sharded one without the shard \
         filter.\n",
        counts
            .iter()
            .map(|&n| fmt_n(n as f64))
            .collect::<Vec<_>>()
            .join(" / "),
        if quick {
            "quick run; the full run has 10,000 / 1,000,000 / 5,000,000"
        } else {
            "full run"
        },
        if quick {
            "Unordered drains stop after 60 s and sharded ones after 30 s; a drain stopped \
             there is reported over the events published by then, with the rest still pending. "
                .to_string()
        } else {
            format!(
                "Unordered drains of up to {} rows run to the end; sharded drains stop after 90 s \
                 and drains of more rows after 60 s, and their rate is over the events published \
                 by then with the rest still pending (a whole drain of those would take far longer \
                 than this run's budget: see below why it slows down). ",
                fmt_n(sized as f64)
            )
        },
    );
    let _ = writeln!(
        md,
        "| pending rows | mode | fill s | drain events/s | vs 10,000 rows | first / last fifth events/s | relay peak RSS MiB (at start) | postgres CPU s | buffers per event: hit / read | claim before the drain | claim after the drain |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for line in &table {
        let _ = writeln!(md, "{line}");
    }

    let (lo, hi) = table_rss
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let _ = writeln!(
        md,
        "\nThe relay's peak RSS stayed between {lo:.1} and {hi:.1} MiB whatever the backlog: it \
         holds at most `max_in_flight` batches (4 by default).\n\n\
         **Why the drain slows down as it goes.** The cost of a claim grows with the rows \
         drained since the table was last vacuumed, not with the rows pending, because every \
         claim walks over index entries of rows already published. Measured by hand with \
         `EXPLAIN (ANALYZE, BUFFERS)`, before migration `hot_claims`, on 1,000,000 rows of which \
         500,000 had been drained \
         (unordered relay, autovacuum off): the unordered claim's scan of the partial index \
         `outbox_events_pending` read 4,747 pages to find the first 1,000 pending rows (29 on \
         the fresh table) and took 18.6 ms instead of 0.5 ms. A published row's entry, and the \
         entry of its claimed version (a claim was not a HOT update then: the partial indexes' \
         predicates read `locked_by` and `attempts`), stay in the index until `VACUUM` removes \
         them; a scan skips entries it knows to be dead without visiting the heap, but still \
         reads their pages. The ordered claim (sharded, leader) is hit harder: its head-of-line \
         check probed `outbox_events_inflight_aggregate` (dropped by `hot_claims`) once per \
         candidate, and every row ever claimed left an entry there, so the 1,000 probes read 47,776 pages and the claim took \
         185 ms; after a plain `VACUUM` (4.3 s) the probes read 1,000 pages and the claim took \
         39 ms. Dead entries are skipped without visiting the heap only once a scan has marked \
         them, and a scan can mark them only when no transaction older than their deletion is \
         open anywhere on the server: with 10,000 rows drained, a claim that finds nothing read 20,056 buffers \
         (a heap visit per dead entry) for as long as an idle transaction stayed open in another \
         database, and 56 buffers once it had ended. That is also why the *claim after the \
         drain* column varies between runs on a shared server (this section now runs on a cluster of its own). It is not the table \
         outgrowing shared_buffers: in the full runs made while writing this section, blocks \
         read from outside shared buffers stayed under 0.2 per event at every size, while the \
         blocks hit per event grew with the rows drained (about 40 at 10,000 rows, 51 at \
         1,000,000), and the 5,000,000-row drains ran over their first 1,000,000 events at the \
         rate of the whole 1,000,000-row drain: what counts is the rows drained since the last \
         `VACUUM`, not the rows pending. With \
         autovacuum on (the PostgreSQL default) the table is vacuumed once its dead rows pass \
         `autovacuum_vacuum_scale_factor` (20 %) of it, which bounds this cost; a server without \
         autovacuum, or a backlog drained faster than autovacuum runs, needs a `VACUUM` of \
         `outbox_events` now and then during a long drain."
    );

    let _ = writeln!(md, "\n### Table and index size\n");
    let _ = writeln!(
        md,
        "`outbox_events` with {} rows (the unordered drain), in MiB: after the fill; after the \
         drain (every row marked published); after deleting the published rows with the store's \
         retention cleanup (`RelayStore::cleanup(Duration::ZERO, {})` until it returns 0: {} \
         rows in {cleanup_s:.1} s); after a plain `VACUUM` (not `FULL`, {vacuum_s:.1} s). \
         `pg_table_size` is the heap with its TOAST table and free-space and visibility maps; \
         `pg_indexes_size` all indexes; `pg_total_relation_size` both.\n",
        fmt_n(sized as f64),
        fmt_n(cleanup_batch as f64),
        fmt_n(cleaned as f64),
    );
    let mut head = String::from("| relation |");
    let mut rule = String::from("|---|");
    for (stage, _) in &stages {
        let _ = write!(head, " {stage} |");
        rule.push_str("---|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    if let Some((_, first)) = stages.first() {
        for (i, (name, _)) in first.iter().enumerate() {
            let mut line = format!("| {name} |");
            for (_, s) in &stages {
                let _ = write!(line, " {} |", s.get(i).map_or("–".into(), |x| mib(x.1)));
            }
            let _ = writeln!(md, "{line}");
        }
    }
    let find = |stage: usize, name: &str| {
        stages
            .get(stage)
            .and_then(|(_, s)| s.iter().find(|x| x.0.starts_with(name)).map(|x| x.1 as f64))
    };
    if let (Some(h0), Some(h1), Some(i0), Some(i1)) = (
        find(0, "table"),
        find(1, "table"),
        find(0, "all indexes"),
        find(1, "all indexes"),
    ) {
        let _ = writeln!(
            md,
            "\nThe drain left the heap at {:.1}× and the indexes at {:.1}× their size after the \
             fill: a row is written three times (insert, claim, mark published); the claim is a HOT \
             update (migration `hot_claims`: no index reads the lease columns, fillfactor 50), \
             the mark is not (the partial indexes' predicates read `published_at`), and the dead \
             versions wait for a `VACUUM`.",
            h1 / h0.max(1.0),
            i1 / i0.max(1.0)
        );
    }
    let _ = writeln!(
        md,
        "\nDeleting rows frees no disk: the cleanup leaves dead tuples that only `VACUUM` \
         (or autovacuum) makes reusable. `VACUUM` marks the space free for later inserts and \
         updates of the same table but keeps the files, except that it truncates empty pages at \
         the very end of the heap (here the whole heap is empty, so it can; in a live outbox with \
         recent rows at the end it mostly cannot). Index pages emptied by `VACUUM` are recycled \
         inside the index, never returned. Only `VACUUM FULL` (or `pg_repack`) rewrites the \
         table and its indexes to their live size, under an exclusive lock."
    );
}
