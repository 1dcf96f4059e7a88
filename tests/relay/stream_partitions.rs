//! Stream mode on a table partitioned into a ring (`Admin::partition_events`): the conversion
//! keeps every row as it was, retention empties whole partitions with `TRUNCATE` (no row
//! deleted, so no dead tuple) and only those every position passed, and relays killed at
//! random while partitions are emptied under them lose nothing and keep each aggregate's
//! order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::{Connection, PgConnection, RunQueryDsl};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox::relay::admin::{Admin, AdminError};
use outbox::relay::*;

use crate::backends::{Backend, Contract, Postgres};
use crate::stream::{
    aggregates_left, delivered, exec, insert, out_of_order, random_kills, start_with,
    stream_config, wait_for,
};
use crate::support::TestDatabase;

async fn admin(db: &TestDatabase) -> Admin<AsyncPgConnection> {
    Admin::new(AsyncPgConnection::establish(&db.url).await.unwrap())
}

fn count(db: &TestDatabase, sql: &str) -> i64 {
    Postgres::count(db, sql)
}

/// A digest of every row's identity and state (seq, id, xid, aggregate, payload, lease and
/// publication columns), in seq order.
fn digest(db: &TestDatabase) -> String {
    #[derive(diesel::QueryableByName)]
    struct D {
        #[diesel(sql_type = diesel::sql_types::Text)]
        d: String,
    }
    let mut conn = PgConnection::establish(&db.url).unwrap();
    diesel::sql_query(
        "SELECT md5(string_agg(concat_ws('|', seq, id, xid, aggregate_type, aggregate_id, \
         event_type, event_version, payload, headers, topic, shard, created_at, available_at, \
         attempts, locked_by, locked_until, published_at, dead_at, last_error), ',' \
         ORDER BY seq)) AS d FROM outbox_events",
    )
    .get_result::<D>(&mut conn)
    .unwrap()
    .d
}

/// The conversion copies every row as it was (seq, id, xid, states: a lease-mode published
/// row, a dead row, pending stream rows half of which a relay already published), the identity
/// goes on from where it was, the stream relay then publishes exactly the rest, in order,
/// and a new write lands in a partition (the write API's suites run on this layout too:
/// `tests/integration`, `postgres_partitioned`). A second conversion
/// and arguments out of range are refused with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_partitioning_keeps_every_row_and_position() {
    let db = Postgres::database("stream_partition_convert");
    let broker = Arc::new(MemoryBroker::new());
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for i in 0..100 {
        insert(&mut conn, &format!("a{}", i % 10), i / 10 + 1);
    }
    let (stop, relay, _) = start_with(&db, &broker, stream_config());
    let ok = wait_for(30, || delivered(&broker).len() >= 100).await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    assert!(ok, "{} of 100 published", delivered(&broker).len());
    for i in 100..150 {
        insert(&mut conn, &format!("a{}", i % 10), i / 10 + 1);
    }
    exec(
        &mut conn,
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, \
         payload, published_at) VALUES ('order', 'leased', 'E', 1, '{}', now())",
    );
    exec(
        &mut conn,
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, \
         payload, dead_at, last_error) VALUES ('order', 'dead', 'E', 1, '{}', now(), 'refused')",
    );
    // A rolled-back insert moves the identity past the rows: the new table goes on from it.
    exec(&mut conn, "BEGIN");
    insert(&mut conn, "rolled-back", 1);
    exec(&mut conn, "ROLLBACK");
    let before = digest(&db);

    let mut admin = admin(&db).await;
    // A ring whose turn (slots × slot_xids) overflows bigint was accepted, and every later
    // cleanup and status failed.
    let overflowing = i64::MAX as u64 / 2;
    for (slots, xids, named) in [
        (1, 10, "slots"),
        (65, 10, "slots"),
        (4, 0, "slot_xids"),
        (4, overflowing, "slot_xids"),
    ] {
        match admin.partition_events(slots, xids).await {
            Err(AdminError::InvalidArgument(e)) => assert!(e.contains(named), "{e}"),
            other => panic!("partition_events({slots}, {xids}): {other:?}"),
        }
    }
    assert_eq!(admin.partition_events(4, 1_000).await.unwrap(), 152);
    assert_eq!(digest(&db), before, "every row copied as it was");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) AS n FROM pg_inherits WHERE inhparent = 'outbox_events'::regclass"
        ),
        4
    );
    let err = admin.partition_events(4, 1_000).await.unwrap_err();
    assert!(err.to_string().contains("already partitioned"), "{err}");
    assert_eq!(digest(&db), before, "a refused conversion changes nothing");
    assert_eq!(
        count(
            &db,
            "SELECT max(seq) AS n FROM outbox_events WHERE aggregate_id = 'dead'"
        ),
        152
    );

    // The lease mode's dead letter is purged, as an operator must before a stream relay that
    // keeps dead letters blocking runs (it would not hold its aggregate back).
    exec(
        &mut conn,
        "DELETE FROM outbox_events WHERE aggregate_id = 'dead'",
    );
    // A new write lands in a partition, and the relay goes on from its positions.
    insert(&mut conn, "a0", 16);
    let (stop, relay, _) = start_with(&db, &broker, stream_config());
    let ok = wait_for(30, || delivered(&broker).len() >= 151).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    let records = delivered(&broker);
    assert!(ok, "{} of 151 published", records.len());
    assert_eq!(records.len(), 151, "published once each: {records:?}");
    assert!(out_of_order(&records).is_empty());
    assert_eq!(
        count(
            &db,
            "SELECT max(seq) AS n FROM outbox_events WHERE aggregate_id = 'a0'"
        ),
        154,
        "the identity goes on past the rolled-back insert"
    );
}

/// The partitions' rows, by slot: `(slot, rows)` for each slot holding any.
fn rows_by_slot(db: &TestDatabase) -> Vec<(i32, i64)> {
    #[derive(diesel::QueryableByName)]
    struct S {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        slot: i32,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = PgConnection::establish(&db.url).unwrap();
    diesel::sql_query(
        "SELECT slot::int4 AS slot, count(*) AS n FROM outbox_events GROUP BY slot ORDER BY slot",
    )
    .load::<S>(&mut conn)
    .unwrap()
    .into_iter()
    .map(|s| (s.slot, s.n))
    .collect()
}

/// Retention on a ring of 16 slots of 1,000 transaction ids (the rows are put in several slots
/// by using up transaction ids between them; a turn is far longer than the first part of the
/// test, even with the server's other databases using the same xid counter: the cleanup's
/// `DELETE` takes only rows older than a turn): whole partitions are emptied once the
/// positions passed every row in them, and no row is deleted (the cleanup's `DELETE` reports
/// 0 and the partitions hold no dead tuple); a partition holding a row of a transaction still
/// open is not emptied (nor are those of rows committed later than the relay ran), its rows
/// stay until they are published; `keep` holds everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_rotation_empties_only_passed_partitions() {
    let db = Postgres::database("stream_rotation");
    Postgres::exec(&db, "SELECT outbox_partition_events(16, 1000)");
    let broker = Arc::new(MemoryBroker::new());
    let mut conn = PgConnection::establish(&db.url).unwrap();
    let mut late = PgConnection::establish(&db.url).unwrap();
    // 100 one-row transactions, 1,000 transaction ids used up after every 25 (one each):
    // over 4 or 5 slots.
    let burn = |conn: &mut PgConnection| {
        for _ in 0..1000 {
            exec(conn, "SELECT pg_current_xact_id()");
        }
    };
    for i in 0..50 {
        insert(&mut conn, &format!("a{}", i % 5), i / 5 + 1);
        if i % 25 == 24 {
            burn(&mut conn);
        }
    }
    exec(&mut late, "BEGIN");
    insert(&mut late, "late", 1);
    for i in 50..100 {
        insert(&mut conn, &format!("a{}", i % 5), i / 5 + 1);
        if i % 25 == 24 {
            burn(&mut conn);
        }
    }
    let (stop, relay, _) = start_with(&db, &broker, stream_config());
    let ok = wait_for(30, || delivered(&broker).len() >= 100).await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    assert!(ok, "{} of 100 published", delivered(&broker).len());
    for i in 0..3 {
        insert(&mut conn, "after", i + 1);
    }
    // The slot of the late transaction's xid (the server's other databases' transactions
    // share the xid counter: ask the transaction itself).
    #[derive(diesel::QueryableByName)]
    struct Slot {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        slot: i32,
    }
    let late_slot =
        diesel::sql_query("SELECT (pg_current_xact_id()::text::bigint / 1000 % 16)::int4 AS slot")
            .get_result::<Slot>(&mut late)
            .unwrap()
            .slot;
    let slots_before = rows_by_slot(&db);
    assert!(
        slots_before.len() >= 3,
        "the rows span the ring: {slots_before:?}"
    );

    let mut store = PgRelayStore::new(&db.url);
    // Kept for an hour: nothing goes.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        store
            .cleanup(Duration::from_secs(3600), 1000)
            .await
            .unwrap(),
        0
    );
    assert_eq!(rows_by_slot(&db), slots_before);
    // Kept for nothing: the partitions behind the positions are emptied, the late
    // transaction's (its row in progress, uncommitted: the lock waits for it) and those of
    // the rows written after the relay stopped are not.
    assert_eq!(store.cleanup(Duration::ZERO, 1000).await.unwrap(), 0);
    let mut expected: Vec<i32> = diesel::sql_query(
        "SELECT DISTINCT slot::int4 AS slot FROM outbox_events WHERE aggregate_id = 'after'",
    )
    .load::<Slot>(&mut conn)
    .unwrap()
    .into_iter()
    .map(|s| s.slot)
    .collect();
    let left = rows_by_slot(&db);
    let kept: Vec<i32> = left.iter().map(|(s, _)| *s).collect();
    expected.push(late_slot);
    expected.sort();
    expected.dedup();
    assert_eq!(
        kept, expected,
        "rows left by slot: {left:?} (before: {slots_before:?})"
    );
    assert!(
        aggregates_left(&mut conn).len() < 103,
        "partitions were emptied: {left:?}"
    );
    assert_eq!(
        count(
            &db,
            "SELECT coalesce(sum(n_dead_tup), 0)::int8 AS n FROM pg_stat_user_tables \
             WHERE relname LIKE 'outbox_events_slot_%'"
        ),
        0
    );

    // The late transaction commits: published with the rows after it, then its partition
    // and theirs go too.
    exec(&mut late, "COMMIT");
    let (stop, relay, _) = start_with(&db, &broker, stream_config());
    let ok = wait_for(30, || delivered(&broker).len() >= 104).await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    assert!(ok, "{} of 104 published", delivered(&broker).len());
    let started = Instant::now();
    while !aggregates_left(&mut conn).is_empty() && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        store.cleanup(Duration::ZERO, 1000).await.unwrap();
    }
    assert!(
        aggregates_left(&mut conn).is_empty(),
        "left: {:?}",
        rows_by_slot(&db)
    );
    assert!(out_of_order(&delivered(&broker)).is_empty());
}

/// The randomized test (writers with random transaction lengths and rollbacks, 2–4 stream
/// relays killed and started at random) on a ring of 4 slots of 400 transaction ids, every
/// relay running retention (rows kept 1 s, the shortest it takes) every 100 ms: partitions are emptied under the
/// relays' reads and the writers' inserts, and still 0 lost, 0 phantom, order kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_relays_killed_at_random_over_rotating_partitions() {
    let db = Postgres::database("stream_random_ring");
    Postgres::exec(&db, "SELECT outbox_partition_events(4, 400)");
    let xid0 = count(&db, "SELECT pg_current_xact_id()::text::int8 AS n");
    let config = || RelayConfig {
        retention: Some(Retention {
            keep: Duration::from_secs(1),
            batch: 1000,
            every: Duration::from_millis(100),
        }),
        ..stream_config()
    };
    // The ring turns by transaction ids, which the writers alone use too few of on a quiet
    // server (657 in a run with the test alone on it: not half a turn past the first slots,
    // so it kept 366 of 643 rows): a connection takes one about every millisecond besides,
    // so the ring turns a few times while the relays run.
    let burning = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let burner = {
        let burning = burning.clone();
        let url = db.url.clone();
        std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            while burning.load(std::sync::atomic::Ordering::Relaxed) {
                exec(&mut conn, "SELECT pg_current_xact_id()");
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let committed = random_kills(&db, config, None).await;
    burning.store(false, std::sync::atomic::Ordering::Relaxed);
    burner.join().unwrap();
    let left = count(&db, "SELECT count(*) AS n FROM outbox_events");
    eprintln!(
        "{} committed, {} transaction ids, {left} rows left, {} dead tuples in the partitions",
        committed.len(),
        count(&db, "SELECT pg_current_xact_id()::text::int8 AS n") - xid0,
        count(
            &db,
            "SELECT coalesce(sum(n_dead_tup), 0)::int8 AS n FROM pg_stat_user_tables \
             WHERE relname LIKE 'outbox_events_slot_%'"
        )
    );
    assert!(
        left < committed.len() as i64 / 2,
        "partitions were emptied while the relays ran: {left} of {} left",
        committed.len()
    );
}

/// Partitions holding rows that have no statistics (empty when the table was converted, so
/// its `ANALYZE` sampled nothing) are analysed by the stream relay within seconds, not when
/// autovacuum comes: until then PostgreSQL plans the stream claims as if they were empty, and
/// each took seconds (migration `20261203000001_stream_partition_stats`). The function skips
/// a partition whose lock it cannot take within its wait, analyses each partition once, and
/// does nothing on a table that is not partitioned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_relay_analyses_partitions_without_statistics() {
    let plain = Postgres::database("stream_stats_plain");
    assert_eq!(
        count(
            &plain,
            "SELECT outbox_analyze_partitions('200 ms')::bigint AS n"
        ),
        0
    );
    let db = Postgres::database("stream_stats_ring");
    Postgres::exec(&db, "SELECT outbox_partition_events(4, 10000000)");
    let mut conn = PgConnection::establish(&db.url).unwrap();
    // 2,000 rows in 20 transactions: one or two partitions (the xid counter may cross a slot).
    for t in 0..20 {
        exec(
            &mut conn,
            &format!(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, \
                 event_version, payload) SELECT 'order', 'a' || (i % 10), 'E', 1, \
                 jsonb_build_object('agg', 'a' || (i % 10), 'n', {t} * 10 + i / 10 + 1) \
                 FROM generate_series(0, 99) i"
            ),
        );
    }
    let filled = "SELECT count(*) AS n FROM pg_class \
                  WHERE relname LIKE 'outbox_events_slot_%' AND relkind = 'r' \
                    AND pg_relation_size(oid) >= 8 * 8192";
    let analysed = "SELECT count(*) AS n FROM pg_stats \
                    WHERE tablename LIKE 'outbox_events_slot_%' AND attname = 'published_at'";
    let parts = count(&db, filled);
    assert!((1..=2).contains(&parts), "{parts} partitions hold the rows");
    assert_eq!(
        count(&db, analysed),
        0,
        "the conversion analysed empty partitions"
    );

    // A partition locked by another transaction (as by autovacuum) is skipped, not waited for.
    let mut holder = PgConnection::establish(&db.url).unwrap();
    exec(&mut holder, "BEGIN");
    exec(
        &mut holder,
        "LOCK TABLE outbox_events_slot_0, outbox_events_slot_1, outbox_events_slot_2, \
         outbox_events_slot_3 IN SHARE UPDATE EXCLUSIVE MODE",
    );
    let started = Instant::now();
    assert_eq!(
        count(
            &db,
            "SELECT outbox_analyze_partitions('100 ms')::bigint AS n"
        ),
        0
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    exec(&mut holder, "ROLLBACK");
    assert_eq!(count(&db, analysed), 0);

    // The relay analyses them at its first claims, and publishes everything in order.
    let broker = Arc::new(MemoryBroker::new());
    let (stop, relay, _) = start_with(&db, &broker, stream_config());
    let ok = wait_for(20, || {
        delivered(&broker).len() >= 2000 && count(&db, analysed) == parts
    })
    .await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    assert!(
        ok,
        "{} of 2,000 published, {} of {parts} partitions analysed",
        delivered(&broker).len(),
        count(&db, analysed)
    );
    assert!(out_of_order(&delivered(&broker)).is_empty());
    // Once analysed, a partition is not analysed again.
    assert_eq!(
        count(
            &db,
            "SELECT outbox_analyze_partitions('200 ms')::bigint AS n"
        ),
        0
    );

    // The status shows the ring: where writers are, what holds rows, and the headroom (the
    // ids before the next partition that holds rows round the ring, at most a turn).
    let status = admin(&db).await.status().await.unwrap();
    let ring = status.stream.and_then(|s| s.ring).expect("ring status");
    assert_eq!((ring.slots, ring.slot_xids), (4, 10_000_000));
    assert!((0..4).contains(&ring.current_slot), "{ring:?}");
    let holding = count(
        &db,
        "SELECT count(*) AS n FROM pg_class WHERE relname LIKE 'outbox_events_slot_%' \
         AND relkind = 'r' AND pg_relation_size(oid) > 0",
    );
    assert_eq!(ring.filled, holding, "{ring:?}");
    assert!(ring.bytes >= parts * 8 * 8192, "{ring:?}");
    assert!(
        ring.headroom_xids > 0 && ring.headroom_xids <= 4 * 10_000_000,
        "{ring:?}"
    );
    let plain_status = admin(&plain).await.status().await.unwrap();
    assert!(plain_status.stream.and_then(|s| s.ring).is_none());
}

/// A statistics check that fails (here made to raise, as an `ANALYZE` cut by the statement
/// timeout would) is not the claim's failure: no claim fails (without it, the claim that ran
/// the check failed, once a second, each waiting out an outage backoff), the relay goes on
/// publishing, and tries the check again later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_statistics_check_does_not_stop_the_stream_relay() {
    let db = Postgres::database("stream_stats_failing");
    Postgres::exec(&db, "SELECT outbox_partition_events(4, 10000000)");
    Postgres::exec(
        &db,
        "CREATE OR REPLACE FUNCTION outbox_analyze_partitions(lock_wait interval) \
         RETURNS integer LANGUAGE plpgsql AS $$ BEGIN \
         RAISE EXCEPTION 'canceling statement due to statement timeout'; END $$",
    );
    let mut conn = PgConnection::establish(&db.url).unwrap();
    for n in 1..=20 {
        insert(&mut conn, "a", n);
    }
    let broker = Arc::new(MemoryBroker::new());
    let (stop, relay, stats) = start_with(&db, &broker, stream_config());
    let ok = wait_for(20, || delivered(&broker).len() >= 20).await;
    // Past a second more: the check has been due again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for n in 21..=30 {
        insert(&mut conn, "a", n);
    }
    let more = wait_for(20, || delivered(&broker).len() >= 30).await;
    stop.send(()).unwrap();
    relay.await.unwrap();
    assert!(ok && more, "{} of 30 published", delivered(&broker).len());
    assert!(out_of_order(&delivered(&broker)).is_empty());
    assert_eq!(
        stats
            .store_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "a claim failed"
    );
}
