//! The inbox's contract, once, for every connection type: a claim is new once, it commits and
//! rolls back with its transaction, racing claims are serialised, and retention deletes only
//! old rows, in batches.

use std::sync::mpsc;
use std::time::Duration;

use outbox::inbox;

use crate::conns::*;
use crate::support::*;

const KEY: &str = "0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a";

pub fn a_claim_is_new_once<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    let claim = |conn: &mut C, consumer: &str, key: &str| {
        conn.transaction(|c| inbox::claim(c, consumer, key))
            .unwrap()
    };
    assert!(claim(&mut conn, "billing", KEY));
    assert!(!claim(&mut conn, "billing", KEY));
    assert!(claim(&mut conn, "shipping", KEY), "consumers are apart");
    assert!(
        claim(&mut conn, "billing", "order-7"),
        "any key, not only ids"
    );
    let long = "é".repeat(inbox::MAX_KEY_CHARS);
    assert!(claim(&mut conn, "billing", &long));
    assert!(!claim(&mut conn, "billing", &long));
    assert_eq!(conn.count(COUNT_INBOX), 4);

    // A claim rolled back with its transaction leaves nothing: the next one is new.
    let rolled_back = conn.transaction(|c| {
        assert!(inbox::claim(c, "billing", "k2")?);
        Err::<(), _>(diesel::result::Error::RollbackTransaction)
    });
    assert!(rolled_back.is_err());
    assert!(claim(&mut conn, "billing", "k2"));

    // Keys the inbox refuses fail the claim and write nothing.
    for (consumer, key) in [
        ("billing", ""),
        ("", "k"),
        ("billing", "k "),
        ("billing", &*"k".repeat(256)),
    ] {
        let err = conn
            .transaction(|c| inbox::claim(c, consumer, key))
            .unwrap_err();
        let diesel::result::Error::QueryBuilderError(source) = err else {
            panic!("{err:?}")
        };
        assert!(source.is::<inbox::InvalidInboxKey>(), "{source}");
    }
    assert_eq!(conn.count(COUNT_INBOX), 5);
}

/// A second transaction claiming a key that an open transaction claimed waits for it, then
/// sees a duplicate if it committed, or claims the key if it rolled back.
pub fn racing_claims_are_serialised<C: SyncConn>(db: TestDatabase) {
    for first_commits in [true, false] {
        let key = format!("race-{first_commits}");
        let (claimed_tx, claimed_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let (db, key) = (&db, &key);
            let first = s.spawn(move || {
                let mut conn = C::open(db);
                conn.transaction(|c| {
                    assert!(inbox::claim(c, "billing", key)?);
                    claimed_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    if first_commits {
                        Ok(())
                    } else {
                        Err(diesel::result::Error::RollbackTransaction)
                    }
                })
            });
            claimed_rx.recv().unwrap();
            let second = s.spawn(move || {
                let mut conn = C::open(db);
                conn.transaction(|c| inbox::claim(c, "billing", key))
                    .unwrap()
            });
            std::thread::sleep(Duration::from_millis(300));
            assert!(
                !second.is_finished(),
                "the second claim waits for the first transaction"
            );
            go_tx.send(()).unwrap();
            let _ = first.join().unwrap();
            assert_eq!(second.join().unwrap(), !first_commits);
        });
    }
    assert_eq!(C::open(&db).count(COUNT_INBOX), 2);
}

pub fn cleanup_deletes_old_rows_in_batches<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    for i in 0..25 {
        inbox::claim(&mut conn, "old", &format!("k{i}")).unwrap();
        inbox::claim(&mut conn, "new", &format!("k{i}")).unwrap();
    }
    assert_eq!(conn.exec(<C::Backend as BackendSql>::AGE_INBOX), 25);
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(inbox::cleanup(&mut conn, 3 * day, 10).unwrap(), 0);
    assert_eq!(inbox::cleanup(&mut conn, day, 10).unwrap(), 25);
    assert_eq!(conn.count(COUNT_INBOX), 25);
    assert_eq!(
        conn.count("SELECT COUNT(*) AS n FROM outbox_inbox WHERE consumer = 'new'"),
        25
    );
    // A deleted claim is new again: the window must outlast redeliveries.
    assert!(inbox::claim(&mut conn, "old", "k0").unwrap());
    assert!(!inbox::claim(&mut conn, "new", "k0").unwrap());
    // An absurd window is clamped, not an error; a zero batch is one.
    assert_eq!(inbox::cleanup(&mut conn, Duration::MAX, 0).unwrap(), 0);
}

pub async fn async_a_claim_is_new_once<C: AsyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db).await;
    for (consumer, key, new) in [
        ("billing", KEY, true),
        ("billing", KEY, false),
        ("shipping", KEY, true),
    ] {
        let got = conn
            .transaction(async |c| inbox::claim_async(c, consumer, key).await)
            .await
            .unwrap();
        assert_eq!(got, new, "{consumer} {key}");
    }
    let rolled_back = conn
        .transaction(async |c| {
            assert!(inbox::claim_async(c, "billing", "k2").await?);
            Err::<(), _>(diesel::result::Error::RollbackTransaction)
        })
        .await;
    assert!(rolled_back.is_err());
    assert!(
        inbox::claim_async(&mut conn, "billing", "k2")
            .await
            .unwrap()
    );
    assert!(inbox::claim_async(&mut conn, "billing", "").await.is_err());
    assert_eq!(conn.count(COUNT_INBOX).await, 3);
}

pub async fn async_racing_claims_are_serialised<C: AsyncConn>(db: TestDatabase) {
    let db = std::sync::Arc::new(db);
    for first_commits in [true, false] {
        let key: &'static str = if first_commits { "race-a" } else { "race-b" };
        let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn({
            let db = db.clone();
            async move {
                let mut conn = C::open(&db).await;
                conn.transaction(async |c| {
                    assert!(inbox::claim_async(c, "billing", key).await?);
                    claimed_tx.send(()).unwrap();
                    go_rx.await.unwrap();
                    if first_commits {
                        Ok(())
                    } else {
                        Err(diesel::result::Error::RollbackTransaction)
                    }
                })
                .await
            }
        });
        claimed_rx.await.unwrap();
        let second = tokio::spawn({
            let db = db.clone();
            async move {
                let mut conn = C::open(&db).await;
                conn.transaction(async |c| inbox::claim_async(c, "billing", key).await)
                    .await
                    .unwrap()
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "the second claim waits");
        go_tx.send(()).unwrap();
        let _ = first.await.unwrap();
        assert_eq!(second.await.unwrap(), !first_commits);
    }
    assert_eq!(C::open(&db).await.count(COUNT_INBOX).await, 2);
}

pub async fn async_cleanup_deletes_old_rows_in_batches<C: AsyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db).await;
    for i in 0..12 {
        inbox::claim_async(&mut conn, "old", &format!("k{i}"))
            .await
            .unwrap();
        inbox::claim_async(&mut conn, "new", &format!("k{i}"))
            .await
            .unwrap();
    }
    assert_eq!(conn.exec(<C::Backend as BackendSql>::AGE_INBOX).await, 12);
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(inbox::cleanup_async(&mut conn, day, 5).await.unwrap(), 12);
    assert_eq!(conn.count(COUNT_INBOX).await, 12);
}

/// Instantiates the sync tests above for one connection type.
#[macro_export]
macro_rules! inbox_suite {
    ($module:ident, $conn:ty, $db:path) => {
        mod $module {
            use $crate::inbox_suite as s;
            #[test]
            fn a_claim_is_new_once() {
                s::a_claim_is_new_once::<$conn>($db("inbox_once"));
            }
            #[test]
            fn racing_claims_are_serialised() {
                s::racing_claims_are_serialised::<$conn>($db("inbox_race"));
            }
            #[test]
            fn cleanup_deletes_old_rows_in_batches() {
                s::cleanup_deletes_old_rows_in_batches::<$conn>($db("inbox_cleanup"));
            }
        }
    };
}

/// Instantiates the async tests above for one connection type.
#[macro_export]
macro_rules! async_inbox_suite {
    ($module:ident, $conn:ty, $db:path) => {
        mod $module {
            use $crate::inbox_suite as s;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_claim_is_new_once() {
                s::async_a_claim_is_new_once::<$conn>($db("ainbox_once")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn racing_claims_are_serialised() {
                s::async_racing_claims_are_serialised::<$conn>($db("ainbox_race")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cleanup_deletes_old_rows_in_batches() {
                s::async_cleanup_deletes_old_rows_in_batches::<$conn>($db("ainbox_cleanup")).await;
            }
        }
    };
}
