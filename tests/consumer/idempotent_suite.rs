//! `#[idempotent]`'s contract, once, for every connection type: a message delivered twice is
//! applied once, consumers racing on one message apply it once without an error, and a body
//! that fails commits nothing so that a retry applies the message.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox::{Envelope, Outcome, idempotent};

use crate::conns::*;
use crate::support::*;

/// How many of the next calls of a handler fail after writing their effect.
#[derive(Default)]
pub struct Faults(AtomicUsize);

impl Faults {
    pub fn fail_next(&self, n: usize) {
        self.0.store(n, Ordering::SeqCst);
    }
    fn take(&self) -> bool {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Records the charge; fails after writing it when `faults` says so; lingers for `linger`
/// before committing, so that a concurrent delivery of the same message waits on its claim.
#[idempotent(consumer = "billing")]
pub fn charge<C: SyncConn>(
    conn: &mut C,
    event: Envelope<OrderCreated>,
    faults: &Faults,
    linger: Duration,
) -> Result<i64, AppError> {
    conn.effect(
        "billing",
        &event.inbox_key(),
        event.order_id,
        event.total_cents,
    )?;
    if faults.take() {
        return Err(AppError::Business("card declined"));
    }
    std::thread::sleep(linger);
    Ok(event.total_cents)
}

/// One effect per order, whichever event announced it.
#[idempotent(consumer = "shipping", key = |e| format!("order-{}", e.order_id))]
pub fn ship<C: SyncConn>(
    mut conn: &mut C,
    event: Envelope<OrderCreated>,
) -> diesel::QueryResult<()> {
    let conn = &mut conn;
    conn.effect("shipping", &event.inbox_key(), event.order_id, 0)
}

fn order(order_id: i64) -> Envelope<OrderCreated> {
    Envelope::new(OrderCreated {
        order_id,
        total_cents: order_id * 100,
    })
}

pub fn delivered_twice_applied_once<C: SyncConn>(db: TestDatabase) {
    let db = with_effects::<C>(db);
    let mut conn = C::open(&db);
    let faults = Faults::default();
    for order_id in 1..=20 {
        let event = order(order_id);
        let again = event.clone();
        let first = charge(&mut conn, event, &faults, Duration::ZERO).unwrap();
        assert_eq!(first, Outcome::Applied(order_id * 100));
        let second = charge(&mut conn, again, &faults, Duration::ZERO).unwrap();
        assert_eq!(second, Outcome::Duplicate);
    }
    assert_eq!(conn.count(COUNT_EFFECTS), 20);
    assert_eq!(conn.count(COUNT_INBOX), 20);
    assert_eq!(
        conn.count("SELECT COUNT(DISTINCT event_id) AS n FROM effects"),
        20
    );

    // A key of the handler's choosing: two events about one order ship once.
    assert!(ship(&mut conn, order(1)).unwrap().is_applied());
    assert!(ship(&mut conn, order(1)).unwrap().is_duplicate());
    assert_eq!(
        conn.count("SELECT COUNT(*) AS n FROM effects WHERE consumer = 'shipping'"),
        1
    );
    assert_eq!(
        conn.count("SELECT COUNT(*) AS n FROM outbox_inbox WHERE message_id = 'order-1'"),
        1
    );
}

pub fn racing_consumers_apply_once<C: SyncConn>(db: TestDatabase) {
    let db = with_effects::<C>(db);
    const MESSAGES: i64 = 10;
    let faults = Faults::default();
    for order_id in 1..=MESSAGES {
        let event = order(order_id);
        let barrier = std::sync::Barrier::new(2);
        let outcomes: Vec<Outcome<i64>> = std::thread::scope(|s| {
            let racers: Vec<_> = (0..2)
                .map(|_| {
                    let (db, event, barrier, faults) = (&db, event.clone(), &barrier, &faults);
                    s.spawn(move || {
                        let mut conn = C::open(db);
                        barrier.wait();
                        charge(&mut conn, event, faults, Duration::from_millis(50))
                            .expect("a racing consumer never sees an error")
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(
            outcomes.iter().filter(|o| o.is_applied()).count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(
            outcomes.iter().filter(|o| o.is_duplicate()).count(),
            1,
            "{outcomes:?}"
        );
    }
    let mut conn = C::open(&db);
    assert_eq!(conn.count(COUNT_EFFECTS), MESSAGES);
    assert_eq!(conn.count(COUNT_INBOX), MESSAGES);
}

pub fn a_failed_body_commits_nothing_and_a_retry_applies<C: SyncConn>(db: TestDatabase) {
    let db = with_effects::<C>(db);
    let mut conn = C::open(&db);
    let faults = Faults::default();
    let event = order(5);
    faults.fail_next(2);
    for _ in 0..2 {
        let failed = charge(&mut conn, event.clone(), &faults, Duration::ZERO);
        assert!(
            matches!(failed, Err(AppError::Business("card declined"))),
            "{failed:?}"
        );
        assert_eq!(conn.count(COUNT_EFFECTS), 0, "the effect was rolled back");
        assert_eq!(conn.count(COUNT_INBOX), 0, "so was the inbox row");
    }
    assert_eq!(
        charge(&mut conn, event.clone(), &faults, Duration::ZERO).unwrap(),
        Outcome::Applied(500)
    );
    assert_eq!(
        charge(&mut conn, event, &faults, Duration::ZERO).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(conn.count(COUNT_EFFECTS), 1);
    assert_eq!(conn.count(COUNT_INBOX), 1);

    // A claim the inbox refuses fails before the body runs, and leaves no transaction open.
    #[idempotent(consumer = "billing", key = |_| "k".repeat(300))]
    fn refused<C: SyncConn>(conn: &mut C, event: Envelope<OrderCreated>) -> Result<(), AppError> {
        conn.effect("refused", &event.inbox_key(), 0, 0)?;
        Ok(())
    }
    let err = refused(&mut conn, order(6)).unwrap_err();
    assert!(
        format!("{err:?}").contains("longer than 255 characters"),
        "{err:?}"
    );
    assert_eq!(conn.count(COUNT_EFFECTS), 1);
    assert!(
        charge(&mut conn, order(7), &faults, Duration::ZERO)
            .unwrap()
            .is_applied()
    );

    // Inside a transaction of the caller's, the handler is a savepoint: it rolls back with it.
    let outer: Result<(), AppError> = conn.transaction(|conn| {
        assert!(charge(conn, order(8), &faults, Duration::ZERO)?.is_applied());
        Err(AppError::Business("outer fails"))
    });
    assert!(outer.is_err());
    assert!(
        charge(&mut conn, order(8), &faults, Duration::ZERO)
            .unwrap()
            .is_applied()
    );
    assert_eq!(conn.count(COUNT_EFFECTS), 3);
}

// ---------------------------------------------------------------------------------------------
// diesel-async

#[idempotent(consumer = "billing")]
pub async fn charge_async<C: AsyncConn>(
    conn: &mut C,
    event: Envelope<OrderCreated>,
    faults: &Faults,
    linger: Duration,
) -> Result<i64, AppError> {
    conn.effect(
        "billing",
        &event.inbox_key(),
        event.order_id,
        event.total_cents,
    )
    .await?;
    if faults.take() {
        return Err(AppError::Business("card declined"));
    }
    tokio::time::sleep(linger).await;
    Ok(event.total_cents)
}

#[idempotent(consumer = "shipping", key = shipping_key)]
pub async fn ship_async<C: AsyncConn>(
    conn: &mut C,
    event: Envelope<OrderCreated>,
) -> diesel::QueryResult<()> {
    conn.effect("shipping", &event.inbox_key(), event.order_id, 0)
        .await
}

fn shipping_key(e: &Envelope<OrderCreated>) -> i64 {
    e.order_id
}

pub async fn async_delivered_twice_applied_once<C: AsyncConn>(db: TestDatabase) {
    let db = with_effects_async::<C>(db).await;
    let mut conn = C::open(&db).await;
    let faults = Faults::default();
    for order_id in 1..=20 {
        let event = order(order_id);
        let again = event.clone();
        let first = charge_async(&mut conn, event, &faults, Duration::ZERO).await;
        assert_eq!(first.unwrap(), Outcome::Applied(order_id * 100));
        let second = charge_async(&mut conn, again, &faults, Duration::ZERO).await;
        assert_eq!(second.unwrap(), Outcome::Duplicate);
    }
    assert_eq!(conn.count(COUNT_EFFECTS).await, 20);
    assert_eq!(conn.count(COUNT_INBOX).await, 20);
    assert!(ship_async(&mut conn, order(1)).await.unwrap().is_applied());
    assert!(
        ship_async(&mut conn, order(1))
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(conn.count(COUNT_EFFECTS).await, 21);
}

pub async fn async_racing_consumers_apply_once<C: AsyncConn>(db: TestDatabase) {
    let db = Arc::new(with_effects_async::<C>(db).await);
    const MESSAGES: i64 = 10;
    let faults = Arc::new(Faults::default());
    for order_id in 1..=MESSAGES {
        let event = order(order_id);
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let (db, event, barrier, faults) =
                    (db.clone(), event.clone(), barrier.clone(), faults.clone());
                tokio::spawn(async move {
                    let mut conn = C::open(&db).await;
                    barrier.wait().await;
                    charge_async(&mut conn, event, &faults, Duration::from_millis(50))
                        .await
                        .expect("a racing consumer never sees an error")
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for racer in racers {
            outcomes.push(racer.await.unwrap());
        }
        assert_eq!(
            outcomes.iter().filter(|o| o.is_applied()).count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(
            outcomes.iter().filter(|o| o.is_duplicate()).count(),
            1,
            "{outcomes:?}"
        );
    }
    let mut conn = C::open(&db).await;
    assert_eq!(conn.count(COUNT_EFFECTS).await, MESSAGES);
    assert_eq!(conn.count(COUNT_INBOX).await, MESSAGES);
}

pub async fn async_a_failed_body_commits_nothing_and_a_retry_applies<C: AsyncConn>(
    db: TestDatabase,
) {
    let db = with_effects_async::<C>(db).await;
    let mut conn = C::open(&db).await;
    let faults = Faults::default();
    let event = order(5);
    faults.fail_next(2);
    for _ in 0..2 {
        let failed = charge_async(&mut conn, event.clone(), &faults, Duration::ZERO).await;
        assert!(
            matches!(failed, Err(AppError::Business("card declined"))),
            "{failed:?}"
        );
        assert_eq!(conn.count(COUNT_EFFECTS).await, 0);
        assert_eq!(conn.count(COUNT_INBOX).await, 0);
    }
    let applied = charge_async(&mut conn, event.clone(), &faults, Duration::ZERO).await;
    assert_eq!(applied.unwrap(), Outcome::Applied(500));
    let again = charge_async(&mut conn, event, &faults, Duration::ZERO).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate);
    assert_eq!(conn.count(COUNT_EFFECTS).await, 1);
    assert_eq!(conn.count(COUNT_INBOX).await, 1);
}

/// Instantiates the sync tests above for one connection type.
#[macro_export]
macro_rules! idempotent_suite {
    ($module:ident, $conn:ty, $db:path) => {
        mod $module {
            use $crate::idempotent_suite as s;
            #[test]
            fn delivered_twice_applied_once() {
                s::delivered_twice_applied_once::<$conn>($db("idem_twice"));
            }
            #[test]
            fn racing_consumers_apply_once() {
                s::racing_consumers_apply_once::<$conn>($db("idem_race"));
            }
            #[test]
            fn a_failed_body_commits_nothing_and_a_retry_applies() {
                s::a_failed_body_commits_nothing_and_a_retry_applies::<$conn>($db("idem_err"));
            }
        }
    };
}

/// Instantiates the async tests above for one connection type.
#[macro_export]
macro_rules! async_idempotent_suite {
    ($module:ident, $conn:ty, $db:path) => {
        mod $module {
            use $crate::idempotent_suite as s;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivered_twice_applied_once() {
                s::async_delivered_twice_applied_once::<$conn>($db("aidem_twice")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn racing_consumers_apply_once() {
                s::async_racing_consumers_apply_once::<$conn>($db("aidem_race")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failed_body_commits_nothing_and_a_retry_applies() {
                s::async_a_failed_body_commits_nothing_and_a_retry_applies::<$conn>($db(
                    "aidem_err",
                ))
                .await;
            }
        }
    };
}
