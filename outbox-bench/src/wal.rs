//! WAL and disk per event: what a claim and a mark write, and what a drain leaves behind, on
//! the schema of the migrations before `hot_claims` ("before") and on the current one
//! ("after"), side by side in one run.
//!
//! Both run in a PostgreSQL cluster of the bench's own (`initdb` into a temporary directory,
//! the server's defaults: autovacuum on, `full_page_writes` on), one database per schema, so
//! that `pg_stat_wal` counts nothing but this section's statements (and autovacuum's work on
//! them, which is part of the cost). Without `initdb` it falls back to the given server and
//! says so. Each drain is the real `PgRelayStore`, claim then mark (`Completion::MarkPublished`)
//! in a loop until a claim comes back empty (a null publisher); the variants and sizes run
//! interleaved.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{Double, Text};
use outbox::relay::{Claim, ClaimOrder, Completion, PgRelayStore, RelayStore};

use crate::common::*;

/// The migration this section compares against its absence.
const HOT_CLAIMS: &str = "20261201000001";
const RELAY: &str = "wal-bench";
const BATCH: usize = 1000;

#[derive(Clone, Copy, PartialEq)]
enum Schema {
    Before,
    After,
}

impl Schema {
    fn name(self) -> &'static str {
        match self {
            Schema::Before => "before (migrations up to insert_defaults)",
            Schema::After => "after (+ hot_claims)",
        }
    }
    fn db(self) -> String {
        let which = match self {
            Schema::Before => "before",
            Schema::After => "after",
        };
        format!("outbox_bench_wal_{which}_{}", std::process::id())
    }
}

#[derive(QueryableByName)]
struct F {
    #[diesel(sql_type = Double)]
    f: f64,
}

#[derive(QueryableByName)]
struct Wal {
    #[diesel(sql_type = Double)]
    records: f64,
    #[diesel(sql_type = Double)]
    fpi: f64,
    #[diesel(sql_type = Double)]
    bytes: f64,
}

#[derive(QueryableByName)]
struct Size {
    #[diesel(sql_type = Double)]
    heap: f64,
    #[diesel(sql_type = Double)]
    indexes: f64,
    #[diesel(sql_type = Double)]
    dead: f64,
    #[diesel(sql_type = Double)]
    hot: f64,
    #[diesel(sql_type = Double)]
    updated: f64,
}

fn f(conn: &mut PgConnection, sql: &str) -> f64 {
    diesel::sql_query(sql).get_result::<F>(conn).expect(sql).f
}

/// The cluster's WAL totals (all databases, all backends, autovacuum included).
fn wal(conn: &mut PgConnection) -> Wal {
    diesel::sql_query(
        "SELECT wal_records::float8 AS records, wal_fpi::float8 AS fpi, \
         wal_bytes::float8 AS bytes FROM pg_stat_wal",
    )
    .get_result(conn)
    .expect("pg_stat_wal")
}

fn size(conn: &mut PgConnection) -> Size {
    // The drain's backends report their counters when they end or within a second.
    std::thread::sleep(Duration::from_millis(1100));
    diesel::sql_query(
        "SELECT pg_relation_size('outbox_events')::float8 AS heap, \
         pg_indexes_size('outbox_events')::float8 AS indexes, n_dead_tup::float8 AS dead, \
         n_tup_hot_upd::float8 AS hot, n_tup_upd::float8 AS updated \
         FROM pg_stat_user_tables WHERE relname = 'outbox_events'",
    )
    .get_result(conn)
    .expect("sizes")
}

/// Creates the database of `schema` and applies its migrations.
fn create(server: &str, schema: Schema) -> String {
    let mut admin = PgConnection::establish(&format!("{server}/postgres")).expect("connect");
    exec(
        &mut admin,
        &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", schema.db()),
    );
    exec(&mut admin, &format!("CREATE DATABASE {}", schema.db()));
    let url = format!("{server}/{}", schema.db());
    let mut conn = PgConnection::establish(&url).expect("connect");
    for m in outbox::migrations::list::<diesel::pg::Pg>() {
        if schema == Schema::Before && m.version >= HOT_CLAIMS {
            continue;
        }
        conn.transaction(|c| diesel::connection::SimpleConnection::batch_execute(c, m.up))
            .expect("migrate");
    }
    url
}

/// One drain's figures.
struct Run {
    events: f64,
    /// Seconds in the store's claims and marks.
    secs: f64,
    claim_bytes: f64,
    mark_bytes: f64,
    records: f64,
    fpi: f64,
    bytes: f64,
    filled: Size,
    drained: Size,
}

/// WAL inserted since `lsn`, and the current position.
fn since(conn: &mut PgConnection, lsn: &str) -> (f64, String) {
    #[derive(QueryableByName)]
    struct D {
        #[diesel(sql_type = Double)]
        d: f64,
        #[diesel(sql_type = Text)]
        at: String,
    }
    let r: D = diesel::sql_query(
        "SELECT pg_wal_lsn_diff(l, $1::pg_lsn)::float8 AS d, l::text AS at \
         FROM pg_current_wal_insert_lsn() l",
    )
    .bind::<Text, _>(lsn)
    .get_result(conn)
    .expect("lsn");
    (r.d, r.at)
}

/// How the drain claims: the lease modes' claims and marks, or stream mode's reads and
/// position updates.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Drain {
    Unordered,
    Sharded,
    Stream,
}

impl Drain {
    fn name(self) -> &'static str {
        match self {
            Drain::Unordered => "unordered",
            Drain::Sharded => "sharded",
            Drain::Stream => "stream",
        }
    }
}

/// Fills `n` rows and drains them with the store (claim, mark, until a claim is empty).
fn run(ctx: &Ctx, url: &str, n: i64, drain: Drain) -> Run {
    let ordered = drain != Drain::Unordered;
    let mut conn = PgConnection::establish(url).expect("connect");
    // The scale section's backlog, on a truncated table (new files: nothing left of the last
    // run; stream mode's positions reset before it), ending in a `CHECKPOINT`: every page the
    // drain touches first writes a full-page image, as after any checkpoint.
    crate::scale::fill(&mut conn, n);
    if ordered {
        exec(
            &mut conn,
            &format!(
                "UPDATE outbox_shard_leases SET owner = '{RELAY}', \
                 lease_until = now() + interval '1 hour'"
            ),
        );
    }
    let filled = size(&mut conn);
    let w0 = wal(&mut conn);
    let order = match drain {
        Drain::Unordered => ClaimOrder::Unordered,
        Drain::Sharded => ClaimOrder::Ordered {
            owned_shards_only: true,
            leader_only: false,
            dead_letters_block: true,
        },
        Drain::Stream => ClaimOrder::Stream {
            dead_letters_block: true,
        },
    };
    let claim = Claim {
        relay: RELAY,
        limit: BATCH,
        // The store's statement timeout is a third of this: long claims are reported, not
        // cut short.
        lease: Duration::from_secs(3600),
        look_ahead: None,
        settling: &[],
        order,
    };
    let (mut lsn, mut claim_bytes, mut mark_bytes, mut secs, mut events) =
        (since(&mut conn, "0/0").1, 0.0, 0.0, 0.0, 0.0);
    ctx.rt.block_on(async {
        let mut store = PgRelayStore::new(url).listen(false);
        loop {
            let t = Instant::now();
            let batch = store.claim(&claim).await.expect("claim");
            let took = t.elapsed().as_secs_f64();
            secs += took;
            if took > 1.0 {
                eprintln!("wal: {url}, {n} rows, {drain:?}: a claim took {took:.1} s");
            }
            let (d, at) = since(&mut conn, &lsn);
            (claim_bytes, lsn) = (claim_bytes + d, at);
            if batch.is_empty() {
                break;
            }
            let seqs: Vec<i64> = batch.iter().map(|m| m.seq).collect();
            let t = Instant::now();
            let marked = store
                .complete(RELAY, &seqs, Completion::MarkPublished)
                .await
                .expect("mark");
            secs += t.elapsed().as_secs_f64();
            events += marked as f64;
            let (d, at) = since(&mut conn, &lsn);
            (mark_bytes, lsn) = (mark_bytes + d, at);
        }
    });
    // The store's connection is closed: its WAL counters are reported.
    let drained = size(&mut conn);
    let w1 = wal(&mut conn);
    let left = if drain == Drain::Stream {
        crate::drain::pending_stream(&mut conn) as f64
    } else {
        f(
            &mut conn,
            "SELECT COUNT(*)::float8 AS f FROM outbox_events WHERE published_at IS NULL",
        )
    };
    assert_eq!(left, 0.0, "the drain left pending rows");
    eprintln!(
        "wal: {url}, {n} rows, {drain:?}: {events} events in {secs:.1} s of claims and marks"
    );
    Run {
        events,
        secs,
        claim_bytes,
        mark_bytes,
        records: w1.records - w0.records,
        fpi: w1.fpi - w0.fpi,
        bytes: w1.bytes - w0.bytes,
        filled,
        drained,
    }
}

fn mib(b: f64) -> String {
    format!("{:.1}", b / 1_048_576.0)
}

/// The section: see the module docs.
pub fn section(ctx: &Ctx, md: &mut String) {
    // No checkpoint but the one before each drain: every drain pays one full-page image per
    // page it touches, whatever its length.
    let cluster = crate::cluster::PrivatePg::start_with(&[
        ("checkpoint_timeout", "1h"),
        ("max_wal_size", "16GB"),
    ])
    .inspect_err(|e| eprintln!("private cluster for wal: {e}; using the shared server"))
    .ok();
    let (server, where_) = match &cluster {
        Some(c) => (
            c.server.clone(),
            "a private cluster (`initdb`, the server's defaults: autovacuum on, shared_buffers \
             128MB, full_page_writes on; but checkpoint_timeout = 1h and max_wal_size = 16GB, so \
             that no checkpoint falls inside a drain)",
        ),
        None => (
            ctx.pg_server.clone(),
            "the shared server (no private cluster could start: its own settings, autovacuum as configured \
             there; `pg_stat_wal` there also counts other databases' writes)",
        ),
    };
    let small = 10_000i64;
    // The quick run measures the small drain only: the scale section shows the drain at
    // 1,000,000 rows, and the *before* schema's large drain alone took a minute.
    let large: Option<i64> = (!ctx.quick).then_some(1_000_000);
    let reps = if ctx.quick { 2 } else { 3 };
    let urls: Vec<(Schema, String)> = [Schema::Before, Schema::After]
        .into_iter()
        .map(|s| (s, create(&server, s)))
        .collect();
    let _ = writeln!(
        md,
        "## WAL and disk per event (PostgreSQL, claim + mark)\n\n\
         The same drain on two schemas, side by side in one run, in two databases of {where_}: \
         *before*, every migration up to `insert_defaults` (the in-flight index, fillfactor \
         100), and *after*, with `hot_claims` (no index reads the lease columns, fillfactor 50: \
         the claim is a HOT update). Both run the current `PgRelayStore`: claims of {BATCH} \
         (one relay, no publish) each followed by the mark of its rows, until a claim comes \
         back empty; on *before* the claim writes no more index entries than main's, which also \
         set `attempts`, a column the in-flight index's predicate reads whatever the claim \
         changes. Each drain starts on a table emptied by `TRUNCATE` and filled with \
         `INSERT … SELECT` (the scale section's rows: 1,000 aggregates), then `ANALYZE` and \
         `CHECKPOINT` (so the drain writes a full-page image of each page it touches first, as \
         after any checkpoint). WAL per event: `pg_stat_wal` over the drain (records, full-page \
         images, bytes; autovacuum's included), and the bytes inserted around each claim and \
         mark (`pg_current_wal_insert_lsn`). Heap: `pg_relation_size`, indexes: \
         `pg_indexes_size`; dead tuples and the HOT share of updates from \
         `pg_stat_user_tables`. events/s: events over the time spent in the store's claims and \
         marks. *stream*: the same rows drained by stream mode on *after* (its claims read the \
         rows committed between two snapshots and update no event row; its \"mark\" is the \
         update of the shards' positions). {small} rows: median of {reps} interleaved runs{}.\n",
        match large {
            Some(large) => format!("; {large} rows: one run"),
            None => " (the quick run; the full run adds 1,000,000 rows: the scale section has \
                     the drain at that size)"
                .to_string(),
        }
    );
    let _ = writeln!(
        md,
        "| rows | mode | schema | WAL records / event | full-page images / event | WAL bytes / event | claim / mark bytes / event | heap MiB filled → drained | indexes MiB filled → drained | dead tuples after | HOT updates | events/s | vs {small} rows |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut rates: Vec<((Drain, usize), f64)> = Vec::new();
    for (n, reps) in std::iter::once((small, reps)).chain(large.map(|l| (l, 1))) {
        for drain in [Drain::Unordered, Drain::Sharded, Drain::Stream] {
            // Stream mode needs its migration, which only *after* has.
            let schemas: Vec<usize> = (0..urls.len())
                .filter(|&i| drain != Drain::Stream || urls[i].0 == Schema::After)
                .collect();
            let mut runs: Vec<Vec<Run>> = urls.iter().map(|_| Vec::new()).collect();
            for _ in 0..reps {
                for &i in &schemas {
                    runs[i].push(run(ctx, &urls[i].1, n, drain));
                }
            }
            for &i in &schemas {
                let schema = urls[i].0;
                let rs = &runs[i];
                let med = |g: &dyn Fn(&Run) -> f64| median(rs.iter().map(g).collect());
                let rate = med(&|r| r.events / r.secs);
                let key = (drain, i);
                let vs = if n == small {
                    rates.push((key, rate));
                    "1.00".to_owned()
                } else {
                    rates
                        .iter()
                        .find(|(k, _)| *k == key)
                        .map_or("–".into(), |(_, r0)| format!("{:.2}", rate / r0))
                };
                let last = rs.last().expect("a run");
                let per = |g: &dyn Fn(&Run) -> f64| med(&|r| g(r) / r.events);
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {:.2} | {:.2} | {} | {} / {} | {} → {} ({:.2}×) | {} → {} | {} | {:.0} % | {} | {vs} |",
                    fmt_n(n as f64),
                    drain.name(),
                    schema.name(),
                    per(&|r| r.records),
                    per(&|r| r.fpi),
                    fmt_n(per(&|r| r.bytes)),
                    fmt_n(per(&|r| r.claim_bytes)),
                    fmt_n(per(&|r| r.mark_bytes)),
                    mib(last.filled.heap),
                    mib(last.drained.heap),
                    last.drained.heap / last.filled.heap.max(1.0),
                    mib(last.filled.indexes),
                    mib(last.drained.indexes),
                    fmt_n(last.drained.dead),
                    100.0 * (last.drained.hot - last.filled.hot)
                        / (last.drained.updated - last.filled.updated).max(1.0),
                    fmt_n(rate),
                );
            }
        }
    }
    let _ = writeln!(
        md,
        "\nThe sizes, dead tuples and HOT share are those of the last run of each row. \
         *before* rows are what a database that has not run `hot_claims` does with this \
         version of the store.\n"
    );
    if cluster.is_none() {
        let mut admin = PgConnection::establish(&format!("{server}/postgres")).expect("connect");
        for (schema, _) in &urls {
            exec(
                &mut admin,
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", schema.db()),
            );
        }
    }
    drop(cluster);
}
