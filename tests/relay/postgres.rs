//! PostgreSQL: the store suite, plus what only PostgreSQL shows: LISTEN/NOTIFY wake-ups,
//! claim plans, and `pg_stat_activity` proving no transaction is held across a publish.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, RunQueryDsl};
use outbox::prelude::*;
use outbox::relay::*;

use crate::backends::{Backend, Contract, Postgres};
use crate::support::*;

crate::store_suite!(Postgres);
crate::admin_suite!(Postgres);

fn config(poll: Duration) -> RelayConfig {
    RelayConfig {
        poll_interval: poll,
        lease: Duration::from_secs(10),
        publish_timeout: Duration::from_secs(5),
        ..RelayConfig::default()
    }
}

fn write_one(db: &TestDatabase, order_id: i64) {
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderCreated {
            order_id,
            total_cents: 1,
        })
    })
    .unwrap();
}

/// A sample that cannot finish in time (here: the table locked by a migration-like
/// statement) is cancelled by its statement timeout and reported, instead of waiting with
/// the lock; the same connection samples again once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_stuck_behind_a_lock_times_out() {
    use diesel_async::AsyncConnection;
    let db = Postgres::database("sample_timeout");
    write_one(&db, 1);
    let mut locker = diesel::PgConnection::establish(&db.url).unwrap();
    locker
        .batch_execute("BEGIN; LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let conn = diesel_async::AsyncPgConnection::establish(&db.url)
        .await
        .unwrap();
    let mut admin = outbox::relay::admin::Admin::new(conn);
    let start = std::time::Instant::now();
    let sampled = tokio::time::timeout(
        Duration::from_secs(20),
        admin.sample(Duration::from_millis(300)),
    )
    .await
    .expect("the statement timeout ends the sample");
    let err = sampled.expect_err("a locked table cannot be sampled");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert!(
        format!("{err} {err:?}").contains("statement timeout"),
        "{err:?}"
    );
    locker.batch_execute("ROLLBACK").unwrap();
    let sample = admin.sample(Duration::from_secs(5)).await.unwrap();
    assert_eq!(sample.pending, 1);
    // No session state is left: the timeout was local to the sample's transaction.
    #[derive(diesel::QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        statement_timeout: String,
    }
    let mut conn = admin.into_inner();
    let t: Setting = diesel_async::RunQueryDsl::get_result(
        diesel::sql_query("SHOW statement_timeout"),
        &mut conn,
    )
    .await
    .unwrap();
    assert_eq!(t.statement_timeout, "0");
}

/// Notifications that arrive while the relay is busy fold into one wake-up: the first wait
/// after them returns at once, the next waits its whole timeout. They used to queue (without
/// bound) and each cost a wake-up and an empty claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_while_busy_wake_the_relay_once() {
    let db = Postgres::database("notify_coalesce");
    let mut store = outbox::relay::PgRelayStore::new(&db.url);
    // The first wait opens the LISTEN connection.
    store.wait_for_work(Duration::from_millis(50)).await;
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    for _ in 0..50 {
        conn.batch_execute("NOTIFY outbox_events").unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // the relay is busy meanwhile
    let start = std::time::Instant::now();
    store.wait_for_work(Duration::from_secs(10)).await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the notifications wake the relay"
    );
    for _ in 0..3 {
        let start = std::time::Instant::now();
        store.wait_for_work(Duration::from_millis(300)).await;
        assert!(
            start.elapsed() >= Duration::from_millis(250),
            "50 notifications are one wake-up, not 50: woken after {:?}",
            start.elapsed()
        );
    }
}

/// With a 30 s poll interval, a writer's NOTIFY wakes the relay at once; without LISTEN the
/// same event waits for the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_the_relay() {
    outbox::notify::set_interval(Some(Duration::ZERO));
    for listen in [true, false] {
        let db = Postgres::database("notify");
        let broker = Arc::new(MemoryBroker::new());
        let store = outbox::relay::PgRelayStore::new(&db.url).listen(listen);
        let relay = Relay::new(store, broker.clone(), config(Duration::from_secs(30))).unwrap();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(relay.run(async move {
            let _ = rx.await;
        }));
        tokio::time::sleep(Duration::from_millis(700)).await; // the relay is now waiting
        let start = std::time::Instant::now();
        write_one(&db, 1);
        while broker.records("order").is_empty() && start.elapsed() < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let delivered = !broker.records("order").is_empty();
        assert_eq!(
            delivered, listen,
            "listen = {listen}: delivered within 3 s = {delivered}"
        );
        if listen {
            eprintln!("NOTIFY wake-up: commit to publish in {:?}", start.elapsed());
        }
        stop.send(()).unwrap();
        handle.await.unwrap();
    }
}

/// The lines of the plan `EXPLAIN …` statement `sql` prints, joined.
pub(crate) fn plan_of(conn: &mut diesel::PgConnection, sql: &str) -> String {
    #[derive(diesel::QueryableByName)]
    struct Plan {
        #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
        line: String,
    }
    diesel::sql_query(sql)
        .load::<Plan>(conn)
        .unwrap()
        .into_iter()
        .map(|p| p.line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The claims' plans stay on the partial indexes, at batch 100 and 1,000, on 20,000 and
/// 100,000 pending rows over 1,000 aggregates, analysed or with statistics that lag behind the
/// table's size, with two relays sharing the shards and the statements prepared while the
/// table was empty, under the relay's session settings (`force_custom_plan`, no JIT). (A
/// cached generic plan made on an empty table was measured to take 80–100 s per claim once the
/// backlog grew, and kept to index paths it still walked the wrong index: see `SESSION_SQL`; a
/// `NOT EXISTS` head-of-line check was planned as a per-candidate scan; JIT compiled the
/// ordered claim on every call.)
#[test]
fn claims_keep_their_indexes_while_the_table_fills() {
    let db = Postgres::database("plan");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    diesel::sql_query("ALTER TABLE outbox_events SET (autovacuum_enabled = false)")
        .execute(&mut conn)
        .unwrap();
    // The relay's own session settings (force_custom_plan, jit = off).
    conn.batch_execute(outbox::relay::__sql::PG_SESSION_SQL)
        .unwrap();
    let ordered = outbox::relay::__sql::PG_CLAIM_ORDERED;
    let unordered = outbox::relay::__sql::PG_CLAIM_UNORDERED;
    diesel::sql_query(format!(
        "PREPARE ordered(text, float8, bigint, bool, bool, bool, bigint, bigint[]) AS {ordered} \
         RETURNING o.seq"
    ))
    .execute(&mut conn)
    .unwrap();
    diesel::sql_query(format!(
        "PREPARE unordered(text, float8, bigint) AS {unordered} RETURNING o.seq"
    ))
    .execute(&mut conn)
    .unwrap();
    for _ in 0..6 {
        diesel::sql_query("EXECUTE ordered('r', 30, 1000, false, false, true, NULL, '{}')")
            .execute(&mut conn)
            .unwrap();
        diesel::sql_query("EXECUTE unordered('r', 30, 1000)")
            .execute(&mut conn)
            .unwrap();
    }
    let run = |conn: &mut diesel::PgConnection, sql: &str| {
        diesel::sql_query(sql).execute(conn).unwrap();
    };
    // Two relays share the shards: 'r' holds the even ones. The lease table's statistics are
    // those of a fresh install (every shard free), as autovacuum's analyse takes them before
    // relays start.
    run(&mut conn, "ANALYZE outbox_shard_leases");
    run(
        &mut conn,
        "UPDATE outbox_shard_leases SET owner = CASE WHEN shard % 2 = 0 THEN 'r' ELSE 'q' END, \
         lease_until = now() + interval '1 hour'",
    );
    let fill = |from: i32, to: i32| {
        format!(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, \
               event_version, payload, shard) \
             SELECT gen_random_uuid(), 'order', (g % 1000)::text, 'E', 1, '{{}}', g % 256 \
             FROM generate_series({from}, {to}) g"
        )
    };
    // The phases: 20,000 rows analysed; 100,000 rows with the statistics of 20,000; 100,000
    // analysed. With statistics, the ordered claim is estimated far above `jit_above_cost`,
    // where JIT compiled it on every call. The claims must stay a walk of the `seq`-ordered
    // pending index that stops after the batch: a fetch of the owned shards' rows through the
    // (shard, seq) index and a sort (the plan of a bare `shard IN (SELECT …)` semi-join on
    // 20,000 rows, 16 ms a claim) would grow with the backlog.
    for phase in ["20,000 analysed", "100,000 stale", "100,000 analysed"] {
        match phase {
            "20,000 analysed" => {
                run(&mut conn, &fill(1, 20_000));
                run(&mut conn, "ANALYZE outbox_events");
            }
            "100,000 stale" => run(&mut conn, &fill(20_001, 100_000)),
            _ => run(&mut conn, "ANALYZE outbox_events"),
        }
        for batch in [100, 1000] {
            for (mode, sql) in [
                (
                    "sharded",
                    format!(
                        "EXPLAIN EXECUTE ordered('r', 30, {batch}, true, false, true, NULL, '{{}}')"
                    ),
                ),
                (
                    "leader",
                    format!(
                        "EXPLAIN EXECUTE ordered('r', 30, {batch}, false, true, true, NULL, '{{}}')"
                    ),
                ),
                // Beside batches in flight: the look-ahead bounds the walk.
                (
                    "sharded, look-ahead",
                    format!(
                        "EXPLAIN EXECUTE ordered('r', 30, {batch}, true, false, true, {}, '{{}}')",
                        batch * 3
                    ),
                ),
                // Beside the last batch's mark: its rows count as published.
                (
                    "sharded, beside a mark",
                    format!(
                        "EXPLAIN EXECUTE ordered('r', 30, {batch}, true, false, true, NULL, '{{{}}}')",
                        (1..=batch)
                            .map(|s| s.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                ),
                (
                    "unordered",
                    format!("EXPLAIN EXECUTE unordered('r', 30, {batch})"),
                ),
            ] {
                let plan = plan_of(&mut conn, &sql);
                let at = format!("{mode}, batch {batch}, {phase}: {plan}");
                assert!(
                    plan.contains("Index Scan using outbox_events_pending on outbox_events"),
                    "{at}"
                );
                assert!(!plan.contains("Seq Scan on outbox_events "), "{at}");
                assert!(!plan.contains("outbox_events_pending_shard"), "{at}");
                // The stream mode's index is not for the lease claims (its predicate keeps
                // them off it; see migration stream_positions).
                assert!(!plan.contains("outbox_events_stream"), "{at}");
                // The one sort allowed is the ordered claim's window over its first batch of
                // pending rows (CTE `b`, a `Limit`): as long as the batch, whatever the backlog.
                let lines: Vec<&str> = plan.lines().collect();
                let child = |i: usize| lines[i + 1..].iter().find(|l| l.contains("->"));
                for (i, line) in lines.iter().enumerate() {
                    if line.trim() == "CTE b" {
                        assert!(child(i).is_some_and(|l| l.contains("Limit")), "{at}");
                    }
                    if line.contains("Sort") && !line.contains("Sort Key") {
                        assert!(
                            mode != "unordered"
                                && child(i).is_some_and(|l| l.contains("CTE Scan on b ")),
                            "a sort not over the batch's limit: {at}"
                        );
                    }
                }
                // Compiling the ordered claim with LLVM cost 20–25 ms of server CPU per claim.
                assert!(!plan.contains("JIT:"), "{at}");
                if mode != "unordered" {
                    // The blocked check walks the aggregate's pending rows: no index may read
                    // the lease, or the claim would not be a HOT update.
                    assert!(plan.contains("outbox_events_pending_aggregate"), "{at}");
                    assert!(plan.contains("outbox_events_dead_aggregate"), "{at}");
                }
            }
        }
    }
}

/// A publisher that takes its time, counting the publishes in flight (a relay runs several at
/// once).
struct SlowPublisher {
    inner: Arc<MemoryBroker>,
    delay: Duration,
    publishing: Arc<AtomicUsize>,
}

impl Publisher for SlowPublisher {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        self.publishing.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let out = self.inner.publish(batch).await;
        self.publishing.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

/// While the broker is slow, `pg_stat_activity` never shows a relay session inside a
/// transaction: claims and marks are short committed statements, and nothing is held open
/// across a publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_transaction_is_held_across_a_publish() {
    let db = Postgres::database("activity");
    // 20 batches of 50: with batches published side by side (`max_in_flight`), publishing
    // still lasts past the 1.5 s the sampler watches.
    Postgres::fill(&db, 100, 10);
    let broker = Arc::new(MemoryBroker::new());
    let publishing = Arc::new(AtomicUsize::new(0));
    let publisher = SlowPublisher {
        inner: broker.clone(),
        delay: Duration::from_millis(400),
        publishing: publishing.clone(),
    };
    for mode in [Mode::Unordered, Mode::Sharded, Mode::Leader] {
        let cfg = RelayConfig {
            mode,
            batch_size: 50,
            ..config(Duration::from_millis(50))
        };
        let relay = Relay::new(
            Postgres::store(&db),
            Arc::new(SlowPublisher {
                inner: publisher.inner.clone(),
                delay: publisher.delay,
                publishing: publisher.publishing.clone(),
            }),
            cfg,
        )
        .unwrap();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(relay.run(async move {
            let _ = rx.await;
        }));
        let samples_during_publish = Arc::new(AtomicU64::new(0));
        let url = db.url.clone();
        let flag = publishing.clone();
        let during = samples_during_publish.clone();
        let sampler = tokio::task::spawn_blocking(move || {
            let mut conn = diesel::PgConnection::establish(&url).unwrap();
            let mut violations = Vec::new();
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_millis(1500) {
                let in_publish = flag.load(Ordering::SeqCst) > 0;
                let open = diesel::sql_query(
                    "SELECT COUNT(*) AS n FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name = 'outbox-relay' \
                       AND (state LIKE 'idle in transaction%' \
                            OR (xact_start IS NOT NULL AND xact_start < now() - interval '200 ms'))",
                )
                .get_result::<Count>(&mut conn)
                .unwrap()
                .n;
                if in_publish && flag.load(Ordering::SeqCst) > 0 {
                    during.fetch_add(1, Ordering::SeqCst);
                    if open > 0 {
                        violations.push(open);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            violations
        });
        let violations = sampler.await.unwrap();
        stop.send(()).unwrap();
        handle.await.unwrap();
        assert!(
            samples_during_publish.load(Ordering::SeqCst) > 10,
            "{mode:?}: sampled while publishing"
        );
        assert!(
            violations.is_empty(),
            "{mode:?}: relay sessions in a transaction during a publish: {violations:?}"
        );
        // Release everything, so the next mode starts from pending rows again.
        diesel::sql_query(
            "UPDATE outbox_events SET published_at = NULL, locked_by = NULL, locked_until = NULL",
        )
        .execute(&mut diesel::PgConnection::establish(&db.url).unwrap())
        .unwrap();
    }
}

/// Reaping a dead relay expires every lease it held. No index reads `locked_by` (a claim is
/// a HOT update only if none does), so the leases are found among the pending rows: the
/// statement's time on 100,000 pending rows is printed, the finding written next to
/// `pg_sessions::REAP`.
#[test]
fn reap_finds_the_leases_of_dead_relays() {
    let db = Postgres::database("reap_plan");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.batch_execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, \
           event_version, payload, shard) \
         SELECT gen_random_uuid(), 'order', (g % 5000)::text, 'E', 1, '{}', g % 256 \
         FROM generate_series(1, 100000) g; \
         UPDATE outbox_events SET locked_by = 'dead', locked_until = now() + interval '30 s' \
           WHERE seq <= 500; \
         INSERT INTO outbox_relays (relay_id, heartbeat_until, session_pid, session_start) \
           VALUES ('dead', now() + interval '30 s', 2147483647, now()); \
         ANALYZE outbox_events",
    )
    .unwrap();
    #[derive(diesel::QueryableByName)]
    struct Plan {
        #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
        line: String,
    }
    let reap = outbox::relay::__sql::PG_REAP.replace("$1", "'me'");
    let plan = diesel::sql_query(format!("EXPLAIN (ANALYZE) {reap}"))
        .load::<Plan>(&mut conn)
        .unwrap();
    let plan: String = plan.into_iter().map(|p| p.line + "\n").collect();
    eprintln!("{plan}");
    assert!(
        plan.contains("rows=500"),
        "all 500 of its leases expired:\n{plan}"
    );
    let live =
        diesel::sql_query("SELECT COUNT(*) AS n FROM outbox_events WHERE locked_until > now()")
            .get_result::<Count>(&mut conn)
            .unwrap()
            .n;
    assert_eq!(live, 0, "no lease of the dead relay is left");
}

/// A claim is a HOT update (the measured finding next to `CLAIM_UNORDERED`): claiming every
/// row adds no index entry (the indexes keep their size; a non-HOT claim of 5,000 rows adds
/// 5,000 entries to each), and the claimed versions stay on their rows' pages.
#[tokio::test]
async fn claims_are_hot_updates() {
    let db = Postgres::database("hot");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.batch_execute(
        "ALTER TABLE outbox_events SET (autovacuum_enabled = false); \
         INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, \
           event_version, payload, shard) \
         SELECT gen_random_uuid(), 'order', (g % 100)::text, 'E', 1, \
           jsonb_build_object('order_id', g % 100, 'customer', g), g % 256 \
         FROM generate_series(1, 5000) g",
    )
    .unwrap();
    let size = |conn: &mut diesel::PgConnection, relation: &str| {
        diesel::sql_query(format!("SELECT pg_relation_size('{relation}') AS n"))
            .get_result::<Count>(conn)
            .unwrap()
            .n
    };
    let indexes = [
        "outbox_events_pkey",
        "outbox_events_id_key",
        "outbox_events_pending",
        "outbox_events_pending_aggregate",
    ];
    let before: Vec<i64> = indexes.iter().map(|i| size(&mut conn, i)).collect();
    let filled = size(&mut conn, "outbox_events");
    let mut store = PgRelayStore::new(&db.url).listen(false);
    let claim = Claim {
        relay: "r",
        limit: 1000,
        lease: Duration::from_secs(30),
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Unordered,
    };
    let mut seqs = Vec::new();
    loop {
        let batch = store.claim(&claim).await.unwrap();
        if batch.is_empty() {
            break;
        }
        seqs.extend(batch.iter().map(|m| m.seq));
    }
    assert_eq!(seqs.len(), 5000);
    let after: Vec<i64> = indexes.iter().map(|i| size(&mut conn, i)).collect();
    assert_eq!(
        after, before,
        "claiming every row left the indexes {indexes:?} as they were"
    );
    assert_eq!(
        size(&mut conn, "outbox_events"),
        filled,
        "the claimed versions are on their rows' pages"
    );
    // Not asserted here: that the marks' versions land on the same pages, so that the drained
    // table keeps its size. That needs the claims' old versions pruned first, which waits for
    // every snapshot that could see them, and on a server the test shares that depends on
    // what else runs there (the heap doubled in one run of the whole suite). The benchmark's
    // `wal` section measures it on a cluster of its own.
}

/// A lease that expired (its relay lost the database for longer than the lease) is claimed
/// again without counting an attempt: only a failed publish counts one.
#[tokio::test]
async fn an_expired_lease_costs_no_attempt() {
    let db = Postgres::database("expired");
    Postgres::fill(&db, 1, 1);
    let mut store = PgRelayStore::new(&db.url).listen(false);
    let claim = |relay| Claim {
        relay,
        limit: 10,
        lease: Duration::from_millis(200),
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Unordered,
    };
    for _ in 0..3 {
        let first = store.claim(&claim("a")).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(
            first[0].attempts, 1,
            "the lease ran out: no attempt counted"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let taken = store.claim(&claim("b")).await.unwrap();
    let failure = Failure {
        seq: taken[0].seq,
        error: "broker said no".into(),
        retry_after: Some(Duration::ZERO),
    };
    assert_eq!(store.fail("b", &[failure]).await.unwrap(), 1);
    let again = store.claim(&claim("b")).await.unwrap();
    assert_eq!(again[0].attempts, 2, "the failed publish counted one");
    let stored = diesel::sql_query("SELECT attempts::bigint AS n FROM outbox_events")
        .get_result::<Count>(&mut diesel::PgConnection::establish(&db.url).unwrap())
        .unwrap()
        .n;
    assert_eq!(stored, 1, "the row records the one failed attempt");
}

#[tokio::test]
async fn cleanup_timing_1m() {
    crate::admin_suite::cleanup_timing::<Postgres>("INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload, shard, published_at) SELECT gen_random_uuid(), 'order', (g % 1000)::text, 'Paid', 1, '{\"amount\": 1}', g % 256, now() - interval '2 days' + g * interval '1 microsecond' FROM generate_series(1, 1000000) g").await;
}

/// An ordered claim with `look_ahead` considers only the first pending rows: the relay makes
/// such a claim beside batches in flight, where a claim that finds nothing would otherwise
/// walk the whole backlog (see `Claim::look_ahead`). Without it, the same claim reaches a
/// claimable aggregate at the far end of the backlog.
#[tokio::test]
async fn a_look_ahead_bounds_the_ordered_claim() {
    let db = Postgres::database("lookahead");
    // 1,000 aggregates, three rows each, interleaved (seq 1..=3000), then ten rows of an
    // aggregate of its own at the end.
    Postgres::exec(
        &db,
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, \
         payload, shard) SELECT gen_random_uuid(), 'order', (g % 1000)::text, 'Paid', 1, '{}', \
         0 FROM generate_series(1, 3000) g ORDER BY g",
    );
    Postgres::exec(
        &db,
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, \
         payload, shard) SELECT gen_random_uuid(), 'order', 'late', 'Paid', 1, '{}', 0 \
         FROM generate_series(1, 10) g ORDER BY g",
    );
    let mut store = PgRelayStore::new(&db.url).listen(false);
    let claim = |look_ahead| Claim {
        relay: "a",
        limit: 1000,
        lease: Duration::from_secs(30),
        look_ahead,
        settling: &[],
        order: ClaimOrder::Ordered {
            owned_shards_only: false,
            leader_only: false,
            dead_letters_block: true,
        },
    };
    let heads = store.claim(&claim(None)).await.unwrap();
    assert_eq!(heads.len(), 1000, "the head of every aggregate");
    assert!(heads.iter().all(|m| m.aggregate_id != "late"));
    // Leased, the heads hold back every other row of their aggregates: within the first
    // 2,000 pending rows nothing is claimable.
    let bounded = store.claim(&claim(Some(2000))).await.unwrap();
    assert!(
        bounded.is_empty(),
        "claimed beyond the look-ahead: {:?}",
        bounded.iter().map(|m| m.seq).collect::<Vec<_>>()
    );
    let unbounded = store.claim(&claim(None)).await.unwrap();
    assert_eq!(unbounded.len(), 10);
    assert!(unbounded.iter().all(|m| m.aggregate_id == "late"));
    let seqs: Vec<i64> = unbounded.iter().map(|m| m.seq).collect();
    assert!(seqs.is_sorted(), "in order: {seqs:?}");
}

/// An ordered claim made while the relay's settler marks the last batch published
/// (`Claim::settling`) treats the rows of that batch the broker acknowledged as published:
/// they hold back nothing and are not claimed again. A row leased by another relay, or given
/// back, counts as what it is, whatever the claim is told.
#[tokio::test]
async fn rows_being_marked_count_as_published_in_an_ordered_claim() {
    let db = Postgres::database("settling");
    // Three aggregates, three rows each, interleaved: seq 1..=9, aggregate (seq - 1) % 3.
    Postgres::exec(
        &db,
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, \
         payload, shard) SELECT gen_random_uuid(), 'order', ((g - 1) % 3)::text, 'Paid', 1, \
         '{}', 0 FROM generate_series(1, 9) g ORDER BY g",
    );
    let mut store = PgRelayStore::new(&db.url).listen(false);
    let claim = |relay, settling| Claim {
        settling,
        ..ordered_claim(relay, 100)
    };
    let seqs = |batch: Vec<OutboxMessage>| batch.iter().map(|m| m.seq).collect::<Vec<_>>();
    let heads = seqs(store.claim(&ordered_claim("a", 3)).await.unwrap());
    assert_eq!(heads, [1, 2, 3]);
    // Leased and not being marked, the heads hold back their aggregates.
    assert_eq!(
        seqs(store.claim(&claim("a", &[])).await.unwrap()),
        [0i64; 0]
    );
    // Being marked, the heads of aggregates 0 and 1 count as published: their later rows are
    // claimable, aggregate 2's are not; the heads are not claimed again.
    assert_eq!(
        seqs(store.claim(&claim("a", &[1, 2])).await.unwrap()),
        [4, 5, 7, 8]
    );
    // Leased by "a", seq 3 holds back aggregate 2 for any other relay, whatever it is told.
    assert_eq!(
        seqs(store.claim(&claim("b", &[3])).await.unwrap()),
        [0i64; 0]
    );
    // Given back, seq 3 is pending: told it is being marked, the claim takes it, head first.
    assert_eq!(store.release("a", &[3]).await.unwrap(), 1);
    assert_eq!(
        seqs(store.claim(&claim("a", &[3])).await.unwrap()),
        [3, 6, 9]
    );
    // Nothing was published by being told so.
    let pending = Postgres::count(
        &db,
        "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NULL",
    );
    assert_eq!(pending, 9);
}

fn ordered_claim(relay: &str, limit: usize) -> Claim<'_> {
    Claim {
        relay,
        limit,
        lease: Duration::from_secs(30),
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Ordered {
            owned_shards_only: false,
            leader_only: false,
            dead_letters_block: true,
        },
    }
}

/// `outbox replay` makes an old, published event pending again under its old `seq`, ahead of
/// a later event of its aggregate that a relay holds: the replayed event is claimable (nothing
/// blocked is ahead of it), the events behind the held one are not. The ordered claim decides
/// the first batch's rows from a window over the pending rows, not from the aggregate's head
/// alone, which here is free while a later row is held.
#[tokio::test]
async fn a_replayed_event_ahead_of_a_held_one_keeps_the_order() {
    let db = Postgres::database("replay_order");
    Postgres::fill(&db, 1, 4);
    let mut store = PgRelayStore::new(&db.url).listen(false);
    let first = store.claim(&ordered_claim("r", 2)).await.unwrap();
    let first: Vec<i64> = first.iter().map(|m| m.seq).collect();
    assert_eq!(first.len(), 2);
    assert_eq!(
        store
            .complete("r", &first, Completion::MarkPublished)
            .await
            .unwrap(),
        2
    );
    let held = store.claim(&ordered_claim("r", 1)).await.unwrap();
    assert_eq!(held.len(), 1);
    assert!(held[0].seq > first[1]);
    // What `outbox replay` does to the first event (admin `REPLAY`).
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    diesel::sql_query(format!(
        "UPDATE outbox_events SET published_at = NULL, attempts = 0, available_at = now(), \
         locked_by = NULL, locked_until = NULL, last_error = NULL WHERE seq = {}",
        first[0]
    ))
    .execute(&mut conn)
    .unwrap();
    for relay in ["r", "q"] {
        let got: Vec<i64> = store
            .claim(&ordered_claim(relay, 10))
            .await
            .unwrap()
            .iter()
            .map(|m| m.seq)
            .collect();
        if relay == "r" {
            assert_eq!(
                got,
                vec![first[0]],
                "the replayed event, nothing behind the held one"
            );
        } else {
            assert!(got.is_empty(), "both earlier rows are held: {got:?}");
        }
    }
}

/// One aggregate's run fills the whole batch: the ordered claim's cost grows with the batch,
/// not with its square. Measured in buffers (not time, which the shared machine makes noisy):
/// the head-of-line walk per candidate over the aggregate's earlier rows read 32,000 buffers
/// for a claim of 1,000 (quadratic: 4 times the batch is about 16 times the reads); the
/// window over the first batch of pending rows reads about one buffer per row (measured: the
/// candidates' scan read 2,539 buffers for 250 rows and 22,880 for 1,000 with the walk; 271
/// and 1,111 with the window).
#[test]
fn one_aggregate_claims_in_linear_reads() {
    let db = Postgres::database("one_aggregate");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    conn.batch_execute(outbox::relay::__sql::PG_SESSION_SQL)
        .unwrap();
    conn.batch_execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, \
           event_version, payload, shard) \
         SELECT gen_random_uuid(), 'order', CASE WHEN g <= 2000 THEN 'hot' \
           ELSE (g % 1000)::text END, 'E', 1, '{}', 7 \
         FROM generate_series(1, 20000) g; ANALYZE outbox_events",
    )
    .unwrap();
    let ordered = outbox::relay::__sql::PG_CLAIM_ORDERED;
    diesel::sql_query(format!(
        "PREPARE ordered(text, float8, bigint, bool, bool, bool, bigint, bigint[]) AS {ordered} RETURNING o.seq"
    ))
    .execute(&mut conn)
    .unwrap();
    #[derive(diesel::QueryableByName)]
    struct Plan {
        #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
        line: String,
    }
    let mut reads = |batch: i64| -> i64 {
        conn.batch_execute("BEGIN").unwrap();
        let plan: Vec<String> = diesel::sql_query(format!(
            "EXPLAIN (ANALYZE, BUFFERS) EXECUTE ordered('r', 30, {batch}, false, false, true, NULL, '{{}}')"
        ))
        .load::<Plan>(&mut conn)
        .unwrap()
        .into_iter()
        .map(|p| p.line)
        .collect();
        conn.batch_execute("ROLLBACK").unwrap();
        let top = plan[0].clone();
        assert!(
            top.contains(&format!("rows={batch} ")),
            "{}",
            plan.join("\n")
        );
        // The reads of the candidates' scan with its head-of-line checks (the rows it locks
        // and the update by primary key that follows grow with the batch in any case).
        let lock = plan
            .iter()
            .position(|l| l.contains("LockRows"))
            .unwrap_or_else(|| panic!("{}", plan.join("\n")));
        let hits = plan[lock..]
            .iter()
            .find_map(|l| l.trim().strip_prefix("Buffers: shared hit="))
            .unwrap_or_else(|| panic!("{}", plan.join("\n")));
        hits.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let small = reads(250);
    let large = reads(1000);
    eprintln!("one aggregate: {small} buffers for 250 rows, {large} for 1,000");
    assert!(
        large < small * 6,
        "4 times the batch read {large} buffers against {small}: not linear"
    );
    assert!(large < 1000 * 4, "{large} buffers for a claim of 1,000");
}

/// The relay's statements are kept prepared on their connection (`Prepared`): one server-side
/// prepared statement however often it runs. Diesel never caches a `diesel::sql_query`, and
/// diesel-async then prepares, runs and closes it on every call (a round trip and a parse
/// more; the server log showed the ordered claim as a new statement each time until it was
/// wrapped).
#[tokio::test]
async fn relay_statements_stay_prepared_on_their_connection() {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let db = Postgres::database("prepared");
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let sql = "SELECT $1::int8 AS n";
    let count = "SELECT count(*) AS n FROM pg_prepared_statements \
                 WHERE statement = 'SELECT $1::int8 AS n'";
    for _ in 0..3 {
        let plain = diesel::sql_query(sql).bind::<diesel::sql_types::BigInt, _>(7i64);
        let rows = diesel_async::RunQueryDsl::load::<N>(plain, &mut conn)
            .await
            .unwrap();
        assert_eq!(rows[0].n, 7);
    }
    assert_eq!(
        count_on(&mut conn, count).await,
        0,
        "a plain sql_query is closed after each run"
    );
    for _ in 0..3 {
        let prepared = outbox::relay::__sql::PgPrepared(
            diesel::sql_query(sql).bind::<diesel::sql_types::BigInt, _>(7i64),
        );
        let rows = diesel_async::RunQueryDsl::load::<N>(prepared, &mut conn)
            .await
            .unwrap();
        assert_eq!(rows[0].n, 7);
    }
    assert_eq!(
        count_on(&mut conn, count).await,
        1,
        "one prepared statement for three runs"
    );
}

/// The count that `sql` (`SELECT count(*) AS n …`) returns on `conn`.
async fn count_on(conn: &mut diesel_async::AsyncPgConnection, sql: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel_async::RunQueryDsl::get_result::<N>(diesel::sql_query(sql), conn)
        .await
        .unwrap()
        .n
}
