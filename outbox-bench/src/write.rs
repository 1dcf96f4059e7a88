//! The write path: business-only, + a hand-written outbox INSERT, and `transaction_with_outbox`
//! with 1 and 10 events, at 1, 4 and 16 writers (the quick run: 1 and 16), on PostgreSQL,
//! MariaDB and SQLite.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::partitions::{DEFAULT_SLOT_XIDS, DEFAULT_SLOTS};

use crate::common::schema::bench_orders;
use crate::common::*;

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

fn order(id: i64) -> OrderCreated {
    OrderCreated {
        order_id: id,
        customer: id % 1000,
        total_cents: 1250,
    }
}

/// A connection type the write path runs on: what differs between the backends.
trait Backend: OutboxConnection {
    /// Run by every writer's connection after it connects.
    const SESSION: &'static str;
    /// Empties the bench's tables between runs.
    const RESET: &'static str;

    /// A writer's connection.
    fn open(url: &str) -> Self {
        let mut conn = Self::establish(url).unwrap_or_else(|e| panic!("connect {url}: {e}"));
        if !Self::SESSION.is_empty() {
            conn.batch_execute(Self::SESSION).expect("session settings");
        }
        conn
    }
    /// One `bench_orders` row; returns its id.
    fn insert_order(&mut self) -> QueryResult<i64>;
    /// The outbox row of order `id`, written with Diesel's query builder the way an
    /// application would without the library: the columns the backend's schema requires.
    fn insert_outbox_row(&mut self, id: i64) -> QueryResult<()>;
    /// The text value of the single-row, single-column query `sql` (column named `v`).
    fn text(&mut self, sql: &str) -> String;
}

/// Implements [`Backend`] for `$conn` with `outbox_events` from `schema::$schema` (aliased `o`):
/// `$id` turns a UUID into that schema's id; `$extra` are the columns beyond the common ones
/// that the schema has no default for, and may use `$now`, the time of the row.
macro_rules! backend {
    ($conn:ty, $schema:ident, session: $session:literal, reset: $reset:literal,
     id: $id:expr, extra($now:ident = $at:expr): [$($extra:expr),*]) => {
        impl Backend for $conn {
            const SESSION: &'static str = $session;
            const RESET: &'static str = $reset;

            fn insert_order(&mut self) -> QueryResult<i64> {
                let id = next_id();
                diesel::insert_into(bench_orders::table)
                    .values((
                        bench_orders::id.eq(id),
                        bench_orders::customer.eq(id % 1000),
                        bench_orders::total_cents.eq(1250),
                    ))
                    .execute(self)?;
                Ok(id)
            }

            fn insert_outbox_row(&mut self, id: i64) -> QueryResult<()> {
                use crate::common::schema::$schema::outbox_events as o;
                let payload = serde_json::to_value(order(id)).expect("serialise");
                let key = id.to_string();
                let $now = $at;
                diesel::insert_into(o::table)
                    .values((
                        o::id.eq(($id)(uuid::Uuid::now_v7())),
                        o::aggregate_type.eq("order"),
                        o::shard.eq(outbox::shard_of("order", &key)),
                        o::aggregate_id.eq(key),
                        o::event_type.eq("OrderCreated"),
                        o::event_version.eq(1),
                        o::payload.eq(payload),
                        $($extra,)*
                    ))
                    .execute(self)
                    .map(|_| ())
            }

            fn text(&mut self, sql: &str) -> String {
                diesel::sql_query(sql)
                    .get_result::<V>(self)
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
                    .v
            }
        }
    };
}

fn hyphenated(id: uuid::Uuid) -> String {
    id.hyphenated().to_string()
}

/// SQLite's outbox times: UTC text with six fraction digits (see the migration).
fn sqlite_now() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%d %H:%M:%S%.6f")
        .to_string()
}

backend! {
    PgConnection, pg, session: "", reset: "TRUNCATE bench_orders, outbox_events",
    id: std::convert::identity, extra(_now = ()): []
}
backend! {
    MysqlConnection, mysql, session: "",
    reset: "TRUNCATE TABLE bench_orders; TRUNCATE TABLE outbox_events",
    id: hyphenated, extra(now = chrono::Utc::now().naive_utc()): [
        o::headers.eq(serde_json::json!({})),
        o::created_at.eq(now),
        o::available_at.eq(now)
    ]
}
backend! {
    SqliteConnection, sqlite, session: "PRAGMA busy_timeout = 250",
    reset: "DELETE FROM bench_orders; DELETE FROM outbox_events",
    id: hyphenated, extra(now = sqlite_now()): [
        o::created_at.eq(now.clone()),
        o::available_at.eq(now)
    ]
}

fn one_write<C: Backend>(conn: &mut C, w: Write) -> Result<(), outbox::Error> {
    match w {
        Write::Business => conn.transaction(|c| c.insert_order().map(|_| ()))?,
        Write::HandWritten => conn.transaction(|c| {
            let id = c.insert_order()?;
            c.insert_outbox_row(id)
        })?,
        Write::Ours1 | Write::Ours10 => conn.transaction_with_outbox(|tx| {
            let id = tx.conn().insert_order()?;
            for _ in 0..w.events() {
                tx.publish(&order(id))?;
            }
            Ok::<_, outbox::Error>(())
        })?,
    }
    Ok(())
}

/// Whether `e` is SQLite's "database is locked": the busy timeout ran out.
fn busy(e: &outbox::Error) -> bool {
    let mut cause: Option<&dyn std::error::Error> = Some(e);
    while let Some(c) = cause {
        if c.to_string().contains("database is locked") {
            return true;
        }
        cause = c.source();
    }
    false
}

/// What one run measured: commits within the run, busy-timeout retries and the longest
/// transaction (from its first attempt to its commit).
#[derive(Clone, Copy, Default)]
struct Stats {
    commits: u64,
    retries: u64,
    longest: Duration,
}

impl Stats {
    fn merge(self, o: Stats) -> Stats {
        Stats {
            commits: self.commits + o.commits,
            retries: self.retries + o.retries,
            longest: self.longest.max(o.longest),
        }
    }
}

/// One writer until `deadline`. A transaction that fails on the busy timeout is retried at
/// once, until the deadline; one that commits after the deadline is not counted.
fn writer<C: Backend>(c: &mut C, w: Write, deadline: Instant) -> Stats {
    let mut st = Stats::default();
    while Instant::now() < deadline {
        let t0 = Instant::now();
        let committed = loop {
            match one_write(c, w) {
                Ok(()) => break true,
                Err(e) if busy(&e) => st.retries += 1,
                Err(e) => panic!("write: {e}"),
            }
            if Instant::now() >= deadline {
                break false;
            }
        };
        let end = Instant::now();
        st.longest = st.longest.max(end - t0);
        st.commits += u64::from(committed && end <= deadline);
    }
    st
}

/// One run of one writer thread per connection in `conns` for `dur`.
fn write_run<C: Backend>(conns: &mut [C], w: Write, dur: Duration) -> Stats {
    let deadline = Instant::now() + dur;
    std::thread::scope(|s| {
        let hs: Vec<_> = conns
            .iter_mut()
            .map(|c| s.spawn(move || writer(c, w, deadline)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("writer"))
            .fold(Stats::default(), Stats::merge)
    })
}

/// How long each variant runs: `runs` interleaved runs of `dur`; the tables are emptied
/// before every run, or only before each writer count's runs when `reset_each_run` is off.
#[derive(Clone, Copy)]
struct Timing {
    runs: usize,
    dur: Duration,
    reset_each_run: bool,
    /// The writer counts, each a block of rows.
    writers: &'static [usize],
}

/// A variant: what a transaction writes, on PostgreSQL whether NOTIFY is on, and into which
/// database of the table's (0: the plain event table of the lease modes; 1, on PostgreSQL:
/// stream mode's partition ring).
#[derive(Clone, Copy)]
struct Variant {
    w: Write,
    notify: Option<bool>,
    ring: bool,
}

impl Variant {
    const fn plain(w: Write, notify: Option<bool>) -> Variant {
        Variant {
            w,
            notify,
            ring: false,
        }
    }
}

const PLAIN: [Variant; 4] = [
    Variant::plain(Write::Business, None),
    Variant::plain(Write::HandWritten, None),
    Variant::plain(Write::Ours1, None),
    Variant::plain(Write::Ours10, None),
];

/// The table of `variants` at `t.writers` writers, on database `urls[0]` (and `urls[1]` for the
/// variants on the ring). The first two variants must be (a) and (b) on `urls[0]`: the ratios
/// are taken against them. A NOTIFY column is shown when a variant sets it; a ring variant
/// adds a column comparing it with the same variant on the plain table.
fn table<C: Backend>(urls: &[&str], variants: &[Variant], t: Timing, md: &mut String) {
    let notify_col = variants.iter().any(|v| v.notify.is_some());
    let ring_col = variants.iter().any(|v| v.ring);
    let mut head = vec!["writers", "variant"];
    if ring_col {
        head.push("event table");
    }
    if notify_col {
        head.push("NOTIFY");
    }
    head.extend([
        "tx/s",
        "events/s",
        "ours / hand-written",
        "ours / business-only",
    ]);
    if ring_col {
        head.push("ring / plain table");
    }
    let _ = writeln!(
        md,
        "| {} |\n|{}",
        head.join(" | "),
        "---|".repeat(head.len())
    );
    let mut per_writers = Vec::new();
    for &writers in t.writers {
        // The writers' connections to each database, kept for all the runs at this writer count.
        let mut conns: Vec<Vec<C>> = urls
            .iter()
            .map(|url| (0..writers).map(|_| C::open(url)).collect())
            .collect();
        let mut samples = vec![Vec::new(); variants.len()];
        let mut all = Stats::default();
        for run in 0..t.runs {
            for (i, v) in variants.iter().enumerate() {
                let db = usize::from(v.ring);
                let first_on_db = variants.iter().position(|o| o.ring == v.ring) == Some(i);
                if t.reset_each_run || (run == 0 && first_on_db) {
                    conns[db][0].batch_execute(C::RESET).expect("reset");
                }
                outbox::notify::set_interval(match v.notify {
                    Some(true) => Some(Duration::from_millis(100)),
                    _ => None,
                });
                let st = write_run(&mut conns[db], v.w, t.dur);
                samples[i].push(st.commits as f64 / t.dur.as_secs_f64());
                all = all.merge(st);
            }
        }
        let med: Vec<f64> = samples.into_iter().map(median).collect();
        for (i, v) in variants.iter().enumerate() {
            let tps = med[i];
            let ratio = |base: f64| format!("{:.2}", tps / base);
            let vs_hand = match v.w {
                Write::Ours1 => ratio(med[1]),
                _ => "–".into(),
            };
            let mut cells = vec![writers.to_string(), v.w.label().to_string()];
            if ring_col {
                cells.push(if v.ring { "ring" } else { "plain" }.to_string());
            }
            if notify_col {
                let n = match v.notify {
                    None => "–",
                    Some(true) => "on",
                    Some(false) => "off",
                };
                cells.push(n.to_string());
            }
            cells.extend([
                fmt_n(tps),
                fmt_n(tps * v.w.events() as f64),
                vs_hand,
                ratio(med[0]),
            ]);
            if ring_col {
                let plain = variants
                    .iter()
                    .position(|o| !o.ring && o.w == v.w && o.notify == v.notify);
                cells.push(match (v.ring, plain) {
                    (true, Some(p)) => ratio(med[p]),
                    _ => "–".into(),
                });
            }
            let line = format!("| {} |", cells.join(" | "));
            println!("{line}");
            let _ = writeln!(md, "{line}");
        }
        per_writers.push((writers, all));
    }
    let retried = per_writers.iter().any(|(_, st)| st.retries > 0);
    let longest: Vec<String> = per_writers
        .iter()
        .map(|(writers, st)| {
            let retries = if retried {
                format!(", {} busy retries", fmt_n(st.retries as f64))
            } else {
                String::new()
            };
            format!(
                "{} ms at {writers} writer{}{retries}",
                fmt_n(st.longest.as_secs_f64() * 1e3),
                if *writers == 1 { "" } else { "s" }
            )
        })
        .collect();
    let _ = writeln!(
        md,
        "\nThe longest transaction over all variants and runs, from its first attempt to its \
         commit: {}.",
        longest.join("; ")
    );
    outbox::notify::set_interval(Some(Duration::from_millis(100)));
}

/// Runs `f` when dropped, also when a run panics: drops the bench's database or file.
struct Cleanup<F: FnMut()>(F);

impl<F: FnMut()> Drop for Cleanup<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// The heading of a backend's table and how its figures were taken.
fn heading(md: &mut String, backend: &str, t: Timing) {
    let _ = writeln!(
        md,
        "## Write path ({backend})\n\n\
         Each figure is the median of {} runs of {} s each; the variants run interleaved \
         (a, b, c, d, a, b, …) so they share the machine's noise; tx/s counts the commits that \
         finished within the run. The tables are emptied {}. ours / hand-written compares (c) \
         with (b), ours / business-only each row with (a).",
        t.runs,
        t.dur.as_secs_f64(),
        if t.reset_each_run {
            "before every run"
        } else {
            "before each writer count's runs, not before every run (quick run: emptying takes \
             up to a few tenths of a second here, as long as a run)"
        }
    );
}

fn postgres(ctx: &Ctx, t: Timing, md: &mut String) {
    let url = &ctx.url;
    let mut conn = PgConnection::open(url);
    let settings = conn.text(
        "SELECT 'fsync = ' || current_setting('fsync') || ', synchronous_commit = ' \
         || current_setting('synchronous_commit') AS v",
    );
    heading(md, "PostgreSQL", t);
    let _ = writeln!(
        md,
        "NOTIFY off: `outbox::notify::set_interval(None)`; on: the default (at most one \
         `pg_notify` per 100 ms per process). (a) and (b) never notify. Durability: {settings}.\n"
    );
    let mut variants = PLAIN[..2].to_vec();
    for w in [Write::Ours1, Write::Ours10] {
        variants.extend([
            Variant::plain(w, Some(false)),
            Variant::plain(w, Some(true)),
        ]);
    }
    if std::env::var_os("OUTBOX_BENCH_PARTITION").is_some() {
        // The bench's database is a ring already: there is no plain table to compare with.
        let _ = writeln!(
            md,
            "The event table is stream mode's partition ring (`OUTBOX_BENCH_PARTITION`).\n"
        );
        table::<PgConnection>(&[url], &variants, t, md);
        return;
    }
    // Stream mode's write path: the same (c) and (d) into an event table turned into the
    // partition ring (`outbox partition` with its defaults), in a database of its own on the
    // same server, interleaved with the others.
    let ring_db = format!(
        "{}_ring",
        url.rsplit('/').next().expect("a database in the URL")
    );
    let mut admin = PgConnection::open(&format!("{}/postgres", ctx.pg_server));
    exec(&mut admin, &format!("CREATE DATABASE {ring_db}"));
    // Not `exec`: a panic in a drop that runs while a failed run unwinds would abort.
    let _drop = Cleanup(|| {
        let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {ring_db}"));
    });
    let ring_url = format!("{}/{ring_db}", ctx.pg_server);
    crate::prepare_layout(
        &mut PgConnection::open(&ring_url),
        Some((DEFAULT_SLOTS, DEFAULT_SLOT_XIDS)),
    );
    let _ = writeln!(
        md,
        "*ring*: the same transactions into stream mode's event table, turned into its \
         partition ring (`outbox partition`: {DEFAULT_SLOTS} partitions of {} transaction ids; \
         the rows go to the partition of their transaction's id, with the plain table's \
         indexes but fillfactor 100), in a database of its own on the same server; *ring / \
         plain table* compares a ring row with the same variant on the plain table (the lease \
         modes' layout).\n",
        fmt_n(DEFAULT_SLOT_XIDS as f64)
    );
    for w in [Write::Ours1, Write::Ours10] {
        variants.push(Variant {
            w,
            notify: Some(true),
            ring: true,
        });
    }
    table::<PgConnection>(&[url, &ring_url], &variants, t, md);
}

fn mariadb(ctx: &Ctx, t: Timing, md: &mut String) {
    md.push('\n');
    heading(md, "MariaDB", t);
    let server = &ctx.mysql_server;
    if server.is_empty() {
        let _ = writeln!(md, "Skipped: no MariaDB server given (`--mysql ''`).");
        return;
    }
    let mut admin = match MysqlConnection::establish(server) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(md, "Skipped: cannot connect to {server}: {e}.");
            return;
        }
    };
    let db = format!("outbox_bench_{}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .expect("create database");
    let _drop = Cleanup(|| {
        let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db}"));
    });
    let url = format!("{server}/{db}");
    let mut conn = MysqlConnection::open(&url);
    outbox::migrations::run(&mut conn).expect("migrate");
    conn.batch_execute(
        "CREATE TABLE bench_orders (id BIGINT PRIMARY KEY, customer BIGINT NOT NULL, \
         total_cents BIGINT NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) \
         ENGINE = InnoDB",
    )
    .expect("bench_orders");
    let about = conn.text(
        "SELECT CONCAT(VERSION(), '; innodb_flush_log_at_trx_commit = ', \
         @@innodb_flush_log_at_trx_commit, ', sync_binlog = ', @@sync_binlog, ', log_bin = ', \
         @@log_bin) AS v",
    );
    drop(conn);
    let _ = writeln!(
        md,
        "MariaDB {about}. Its own database, migrated with `outbox::migrations::run`; one \
         connection per writer.\n"
    );
    table::<MysqlConnection>(&[&url], &PLAIN, t, md);
}

fn sqlite(t: Timing, md: &mut String) {
    md.push('\n');
    heading(md, "SQLite", t);
    let dir = std::env::temp_dir().join(format!("outbox_bench_{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let _remove = Cleanup(|| {
        let _ = std::fs::remove_dir_all(&dir);
    });
    let url = dir
        .join("bench.db")
        .to_str()
        .expect("utf-8 path")
        .to_owned();
    let mut conn = SqliteConnection::open(&url);
    conn.batch_execute("PRAGMA journal_mode = WAL")
        .expect("WAL");
    outbox::migrations::run(&mut conn).expect("migrate");
    conn.batch_execute(
        "CREATE TABLE bench_orders (id INTEGER PRIMARY KEY, customer INTEGER NOT NULL, \
         total_cents INTEGER NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)",
    )
    .expect("bench_orders");
    let about = conn.text(
        "SELECT sqlite_version() || '; journal_mode = ' || j.journal_mode || ', synchronous = ' \
         || s.synchronous || ', busy_timeout = ' || b.timeout || ' ms' AS v \
         FROM pragma_journal_mode() j, pragma_synchronous() s, pragma_busy_timeout() b",
    );
    drop(conn);
    let _ = writeln!(
        md,
        "SQLite {about} (synchronous: 0 OFF, 1 NORMAL, 2 FULL), a file in the temp directory, \
         migrated with `outbox::migrations::run`. SQLite has one writer at a time: the 4 and \
         16 writers are threads with a connection each that queue on the database's write \
         lock, so they show the cost of contention, not parallel writes. A transaction that \
         waits longer than the busy timeout fails with \"database is locked\" and is retried at \
         once (a busy retry, counted below the table) until the run ends. The timeout is short \
         so that a run ends on time: with 16 writers and a 5 s timeout, SQLite's busy handler \
         (its waits grow to 100 ms polls, which the waiting writers make in step) left writers \
         queued for up to 2.5 s after the end of a 0.5 s run.\n"
    );
    table::<SqliteConnection>(&[&url], &PLAIN, t, md);
}

/// The write-path sections of the report: PostgreSQL, MariaDB and SQLite.
pub fn section(ctx: &Ctx, md: &mut String) {
    let t = Timing {
        runs: 3,
        dur: Duration::from_millis(if ctx.quick { 500 } else { 10_000 }),
        reset_each_run: !ctx.quick,
        // The quick run leaves out the middle count: a third of the section's time.
        writers: if ctx.quick { &[1, 16] } else { &[1, 4, 16] },
    };
    postgres(ctx, t, md);
    mariadb(ctx, t, md);
    sqlite(t, md);
}
