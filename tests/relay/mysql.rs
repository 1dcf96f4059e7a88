//! MySQL/MariaDB: the store suite.

use crate::backends::Mysql;

crate::store_suite!(Mysql);
crate::admin_suite!(Mysql);

#[tokio::test]
async fn malformed_id_is_dead_lettered() {
    crate::text_ids::malformed_id_is_dead_lettered::<Mysql>().await;
}

/// An ordered claim that waits for a row lock (InnoDB's locking reads wait where
/// PostgreSQL's claim would not) past the end of its shard lease, while another relay takes
/// the shards over, claims nothing: the fencing is checked again when the rows are leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_that_waited_past_its_lease_claims_nothing() {
    use std::time::Duration;

    use outbox::relay::*;

    use crate::backends::Contract;

    let db = Mysql::database("fenced_wait");
    Mysql::fill(&db, 4, 1); // seq 1..4, one per aggregate
    let (mut a, mut b) = (Mysql::store(&db), Mysql::store(&db));
    let short = Duration::from_millis(1000);
    assert_eq!(
        a.rebalance_shards("a", short).await.unwrap().owned.len(),
        256
    );

    // Someone holds row 2 for a while: a's claim reads row 1, then waits.
    let url = db.url.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let blocker = std::thread::spawn(move || {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::MysqlConnection::establish(&url).unwrap();
        conn.transaction(|conn| {
            diesel::sql_query("SELECT seq FROM outbox_events WHERE seq = 2 FOR UPDATE")
                .execute(conn)?;
            locked_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(2500));
            Ok::<_, diesel::result::Error>(())
        })
        .unwrap();
    });
    locked_rx.recv().unwrap();
    let order = ClaimOrder::Ordered {
        owned_shards_only: true,
        leader_only: false,
        dead_letters_block: true,
    };
    let waiting = tokio::spawn(async move {
        let claim = Claim {
            relay: "a",
            limit: 10,
            lease: Duration::from_secs(30),
            look_ahead: None,
            settling: &[],
            order,
        };
        a.claim(&claim).await.unwrap()
    });

    // a's shard leases run out while it waits; b takes every shard.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let taken = b
        .rebalance_shards("b", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(taken.owned.len(), 256);

    blocker.join().unwrap();
    assert!(
        waiting.await.unwrap().is_empty(),
        "a lost its shards while waiting"
    );
    let claim = Claim {
        relay: "b",
        limit: 10,
        lease: Duration::from_secs(30),
        look_ahead: None,
        settling: &[],
        order,
    };
    assert_eq!(b.claim(&claim).await.unwrap().len(), 4);
}

/// A unit of work that InnoDB aborts to break a deadlock is run again by the store, not
/// returned as an error: here a mark deadlocks with a bigger transaction (so the mark is the
/// victim) and still marks both rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_victim_is_run_again() {
    use std::time::Duration;

    use outbox::relay::*;

    use crate::backends::Contract;

    let db = Mysql::database("deadlock");
    Mysql::fill(&db, 2, 1); // seq 1 and 2
    let mut store = Mysql::store(&db);
    let claim = Claim {
        relay: "a",
        limit: 10,
        lease: Duration::from_secs(30),
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Unordered,
    };
    assert_eq!(store.claim(&claim).await.unwrap().len(), 2);

    let url = db.url.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let other = std::thread::spawn(move || {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::MysqlConnection::establish(&url).unwrap();
        conn.transaction(|conn| {
            // Enough changes that InnoDB picks the mark as the victim.
            for i in 0..50 {
                diesel::sql_query(format!(
                    "INSERT INTO orders (id, total_cents) VALUES ({i}, 1)"
                ))
                .execute(conn)?;
            }
            diesel::sql_query("SELECT seq FROM outbox_events WHERE seq = 2 FOR UPDATE")
                .execute(conn)?;
            locked_tx.send(()).unwrap();
            // The mark holds row 1 and waits for row 2; taking row 1 closes the cycle.
            std::thread::sleep(Duration::from_millis(500));
            diesel::sql_query("SELECT seq FROM outbox_events WHERE seq = 1 FOR UPDATE")
                .execute(conn)?;
            std::thread::sleep(Duration::from_millis(200));
            Ok::<_, diesel::result::Error>(())
        })
        .unwrap();
    });
    locked_rx.recv().unwrap();
    let marked = store
        .complete("a", &[1, 2], Completion::MarkPublished)
        .await
        .unwrap();
    other.join().unwrap();
    // Without the retry, `complete` fails with "Deadlock found when trying to get lock".
    assert_eq!(marked, 2);
}

#[tokio::test]
async fn cleanup_timing_1m() {
    crate::admin_suite::cleanup_timing::<Mysql>("INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload, headers, shard, created_at, available_at, published_at) SELECT UUID(), 'order', CAST(seq % 1000 AS CHAR), 'Paid', 1, '{\"amount\": 1}', '{}', seq % 256, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL 2 DAY + INTERVAL seq MICROSECOND FROM seq_1_to_1000000").await;
}
