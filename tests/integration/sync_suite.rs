//! The write-path contract, once, for every synchronous connection type.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;

use diesel::Connection;
use outbox::prelude::*;
use outbox::{Headers, OutboxBackend};

use crate::support::*;

/// What the generic tests need of a connection type; implemented per type by `impl_sync!`,
/// where the backend is concrete and Diesel's bounds hold.
pub trait SyncConn: Connection<Backend: OutboxBackend> + Sized + 'static {
    fn open(db: &TestDatabase) -> Self;
    fn insert_order(&mut self, id: i64, total_cents: i64) -> diesel::QueryResult<usize>;
    fn events(&mut self) -> Vec<StoredEvent>;
    fn count(&mut self, sql: &str) -> i64;
}

macro_rules! impl_sync {
    ($conn:ty $(, $setup:literal)?) => {
        impl SyncConn for $conn {
            fn open(db: &TestDatabase) -> Self {
                #[allow(unused_mut)]
                let mut conn = <$conn>::establish(&db.url).unwrap();
                $(diesel::connection::SimpleConnection::batch_execute(&mut conn, $setup).unwrap();)?
                conn
            }
            fn insert_order(&mut self, id: i64, total_cents: i64) -> diesel::QueryResult<usize> {
                use diesel::prelude::*;
                diesel::insert_into(crate::orders::table)
                    .values((crate::orders::id.eq(id), crate::orders::total_cents.eq(total_cents)))
                    .execute(self)
            }
            fn events(&mut self) -> Vec<StoredEvent> {
                use diesel::RunQueryDsl;
                diesel::sql_query(<<$conn as Connection>::Backend as ReadBack>::SELECT_EVENTS)
                    .load(self)
                    .unwrap()
            }
            fn count(&mut self, sql: &str) -> i64 {
                use diesel::RunQueryDsl;
                diesel::sql_query(sql).get_result::<Count>(self).unwrap().n
            }
        }
    };
}

#[cfg(feature = "postgres")]
impl_sync!(diesel::PgConnection);
#[cfg(feature = "mysql")]
impl_sync!(diesel::MysqlConnection);
#[cfg(feature = "sqlite")]
impl_sync!(diesel::SqliteConnection, "PRAGMA busy_timeout = 30000");

pub fn commit_stores_rows_and_events<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    let before = outbox::NewMessage::from_event(
        &OrderCreated {
            order_id: 0,
            total_cents: 0,
        },
        Headers::new(),
    )
    .unwrap()
    .created_at;
    let id = conn
        .transaction_with_outbox(|tx| {
            tx.conn().insert_order(42, 1250)?;
            tx.publish(&OrderCreated {
                order_id: 42,
                total_cents: 1250,
            })?;
            tx.publish(&OrderEvent::Cancelled {
                order_id: 42,
                reason: "changed mind".into(),
            })?;
            assert_eq!(tx.pending().len(), 2);
            Ok::<_, AppError>(42)
        })
        .unwrap();
    let after = outbox::NewMessage::from_event(
        &OrderCreated {
            order_id: 0,
            total_cents: 0,
        },
        Headers::new(),
    )
    .unwrap()
    .created_at;
    assert_eq!(id, 42);
    assert_eq!(conn.count(COUNT_ORDERS), 1);

    let events = conn.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let (a, b) = (&events[0], &events[1]);
    assert!(a.seq < b.seq, "events keep their publish order");

    assert_eq!(a.aggregate_type, "order");
    assert_eq!(a.aggregate_id, "42");
    assert_eq!(a.event_type, "OrderCreated");
    assert_eq!(a.event_version, 3);
    assert_eq!(
        a.payload_json(),
        serde_json::json!({"order_id": 42, "total_cents": 1250})
    );
    assert_eq!(a.headers_json(), serde_json::json!({}));
    assert_eq!(a.topic, None);
    assert_eq!(a.shard, i32::from(outbox::shard_of("order", "42")));
    let id_a = uuid::Uuid::parse_str(&a.id).unwrap();
    assert_eq!(id_a.get_version_num(), 7, "event ids are UUIDv7");
    assert!(
        a.created_at() >= before && a.created_at() <= after,
        "{} not in [{before}, {after}]",
        a.created_at
    );
    assert_eq!(a.available_at, a.created_at, "available at once");
    assert_eq!(a.attempts, 0);
    assert_eq!(a.published_at, None);

    assert_eq!(b.event_type, "OrderCancelled");
    assert_eq!(b.event_version, 2);
    assert_eq!(b.topic.as_deref(), Some("order-lifecycle"));
    assert_eq!(b.aggregate_id, "42");
    assert_eq!(b.shard, a.shard, "one aggregate, one shard");
    assert_eq!(
        b.payload_json(),
        // The variant's own fields: no wrapper naming it (the event type says it).
        serde_json::json!({"order_id": 42, "reason": "changed mind"})
    );
    assert!(
        uuid::Uuid::parse_str(&b.id).unwrap() > id_a,
        "UUIDv7 ids grow"
    );
}

pub fn err_rolls_back_rows_and_events<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    let result = conn.transaction_with_outbox(|tx| {
        tx.conn().insert_order(1, 100)?;
        tx.publish(&OrderCreated {
            order_id: 1,
            total_cents: 100,
        })?;
        Err::<(), _>(AppError::Business("payment declined"))
    });
    assert!(matches!(
        result,
        Err(AppError::Business("payment declined"))
    ));
    assert_eq!(conn.count(COUNT_ORDERS), 0);
    assert_eq!(conn.count(COUNT_EVENTS), 0);
}

pub fn panic_rolls_back_rows_and_events<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let _ = conn.transaction_with_outbox(|tx| {
            tx.conn().insert_order(1, 100)?;
            tx.publish(&OrderCreated {
                order_id: 1,
                total_cents: 100,
            })?;
            if tx.pending().len() == 1 {
                panic!("boom inside the transaction");
            }
            Ok::<_, AppError>(())
        });
    }));
    assert!(result.is_err());
    drop(conn); // closing the connection rolls the open transaction back
    let mut conn = C::open(&db);
    assert_eq!(conn.count(COUNT_ORDERS), 0);
    assert_eq!(conn.count(COUNT_EVENTS), 0);
}

pub fn nested_transactions_are_savepoints<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    conn.transaction_with_outbox(|tx| {
        tx.conn().insert_order(1, 100)?;
        tx.publish(&OrderCreated {
            order_id: 1,
            total_cents: 100,
        })?;

        // An inner transaction that fails: its row and event go, the outer ones stay.
        let inner = tx.conn().transaction_with_outbox(|inner| {
            inner.conn().insert_order(2, 200)?;
            inner.publish(&OrderCreated {
                order_id: 2,
                total_cents: 200,
            })?;
            Err::<(), _>(AppError::Business("inner fails"))
        });
        assert!(matches!(inner, Err(AppError::Business(_))));

        // An inner transaction that succeeds: kept with the outer one.
        tx.conn().transaction_with_outbox(|inner| {
            inner.conn().insert_order(3, 300)?;
            inner.publish(&OrderCreated {
                order_id: 3,
                total_cents: 300,
            })?;
            Ok::<_, AppError>(())
        })?;

        // Plain Diesel savepoint with the free `publish`, rolled back.
        let plain = tx.conn().transaction(|c| {
            c.insert_order(4, 400)?;
            outbox::publish(
                c,
                &OrderCreated {
                    order_id: 4,
                    total_cents: 400,
                },
            )?;
            Err::<(), _>(diesel::result::Error::RollbackTransaction)
        });
        assert!(plain.is_err());
        Ok::<_, AppError>(())
    })
    .unwrap();

    let ids: Vec<String> = conn.events().into_iter().map(|e| e.aggregate_id).collect();
    // Publish order: the outer's event was written before the inner savepoint opened.
    assert_eq!(ids, ["1", "3"]);
    assert_eq!(conn.count(COUNT_ORDERS), 2);

    // An outer failure discards everything, inner savepoints included.
    let outer = conn.transaction_with_outbox(|tx| {
        tx.conn().transaction_with_outbox(|inner| {
            inner.conn().insert_order(5, 500)?;
            inner.publish(&OrderCreated {
                order_id: 5,
                total_cents: 500,
            })?;
            Ok::<_, AppError>(())
        })?;
        Err::<(), _>(AppError::Business("outer fails"))
    });
    assert!(outer.is_err());
    assert_eq!(conn.count(COUNT_EVENTS), 2);
    assert_eq!(conn.count(COUNT_ORDERS), 2);

    // Plain Diesel savepoints the outbox does not open: the outer's earlier events are written
    // inside them before the free `publish`, and written again (skipping ids already there)
    // when the savepoint rolled back.
    let event = |order_id| OrderCreated {
        order_id,
        total_cents: 1,
    };
    conn.transaction_with_outbox(|tx| {
        tx.publish(&event(6))?;
        let rolled_back = tx.conn().transaction(|c| {
            outbox::publish(c, &event(7))?;
            Err::<(), _>(diesel::result::Error::RollbackTransaction)
        });
        assert!(rolled_back.is_err());
        tx.publish(&event(8))?;
        tx.conn()
            .transaction(|c| outbox::publish(c, &event(9)))
            .map_err(AppError::from)?;
        tx.publish(&event(10))?;
        Ok::<_, AppError>(())
    })
    .unwrap();
    let ids: Vec<String> = conn.events().into_iter().map(|e| e.aggregate_id).collect();
    assert_eq!(
        ids,
        ["1", "3", "6", "8", "9", "10"],
        "publish order, each once"
    );
}

pub fn free_publish_needs_a_transaction<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    let outside = outbox::publish(
        &mut conn,
        &OrderCreated {
            order_id: 9,
            total_cents: 9,
        },
    );
    assert!(
        matches!(outside, Err(outbox::Error::NotInTransaction)),
        "{outside:?}"
    );
    assert!(
        outside
            .unwrap_err()
            .to_string()
            .contains("outside a transaction")
    );
    assert_eq!(conn.count(COUNT_EVENTS), 0);

    conn.transaction(|c| {
        c.insert_order(9, 9)?;
        outbox::publish(
            c,
            &OrderCreated {
                order_id: 9,
                total_cents: 9,
            },
        )?;
        let mut headers = Headers::new();
        headers.insert(
            "traceparent".into(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        );
        outbox::publish_with_headers(
            c,
            &OrderEvent::Paid {
                order_id: 9,
                amount: 9,
            },
            headers,
        )?;
        Ok::<_, diesel::result::Error>(())
    })
    .unwrap();
    let events = conn.events();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].event_type, "Paid");
    assert_eq!(
        events[1].headers_json()["traceparent"],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );

    // Rolled back with the caller's transaction.
    let _ = conn.transaction(|c| {
        outbox::publish(
            c,
            &OrderCreated {
                order_id: 10,
                total_cents: 1,
            },
        )?;
        Err::<(), _>(diesel::result::Error::RollbackTransaction)
    });
    assert_eq!(conn.count(COUNT_EVENTS), 2);
}

pub fn unserialisable_payload_rolls_back<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    let result = conn.transaction_with_outbox(|tx| {
        tx.conn().insert_order(1, 100)?;
        tx.publish(&OrderCreated {
            order_id: 1,
            total_cents: 100,
        })?;
        tx.publish(&Unserialisable::new())?;
        Ok::<_, AppError>(())
    });
    match result {
        Err(AppError::Outbox(e @ outbox::Error::Event(outbox::EventError::Serialize { .. }))) => {
            assert!(e.to_string().contains("`Unserialisable`"), "{e}");
        }
        other => panic!("expected a serialize error, got {other:?}"),
    }
    assert_eq!(conn.count(COUNT_ORDERS), 0);
    assert_eq!(conn.count(COUNT_EVENTS), 0);
}

/// A payload over the limit fails its `publish` (naming the event type, size and limit) and
/// the transaction writes nothing, through `OutboxTx::publish` and the free `publish` alike; a
/// transaction may raise the limit, and then the large payload is stored whole.
pub fn oversized_payload_is_refused_at_publish<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    let big = DocumentStored {
        id: 1,
        body: "x".repeat(outbox::DEFAULT_MAX_PAYLOAD_BYTES),
    };
    let size = serde_json::to_string(&big).unwrap().len();
    let result = conn.transaction_with_outbox(|tx| {
        tx.conn().insert_order(1, 100)?;
        tx.publish(&OrderCreated {
            order_id: 1,
            total_cents: 100,
        })?;
        tx.publish(&big)?;
        Ok::<_, AppError>(())
    });
    match result {
        Err(AppError::Outbox(outbox::Error::Event(outbox::EventError::PayloadTooLarge {
            event_type,
            size: s,
            limit,
        }))) => {
            assert_eq!(event_type, "DocumentStored");
            // The payload, its key, its headers and the record's framing.
            assert!(s > size, "{s} <= {size}");
            assert_eq!(limit, outbox::DEFAULT_MAX_PAYLOAD_BYTES);
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    assert_eq!(conn.count(COUNT_ORDERS), 0);
    assert_eq!(conn.count(COUNT_EVENTS), 0);

    let free = conn.transaction(|c| outbox::publish(c, &big));
    assert!(
        matches!(
            free,
            Err(outbox::Error::Event(
                outbox::EventError::PayloadTooLarge { .. }
            ))
        ),
        "{free:?}"
    );
    assert_eq!(conn.count(COUNT_EVENTS), 0);

    conn.transaction_with_outbox(|tx| {
        tx.set_max_payload_bytes(2 * outbox::DEFAULT_MAX_PAYLOAD_BYTES);
        tx.publish(&big)
    })
    .unwrap();
    assert_eq!(conn.count(COUNT_EVENTS), 1);
}

pub fn headers_and_large_batches<C: SyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db);
    conn.transaction_with_outbox(|tx| {
        tx.set_header("correlation-id", "c-1");
        for i in 0..2_500 {
            let mut h = Headers::new();
            h.insert("n".into(), i.to_string());
            tx.publish_with_headers(
                &OrderEvent::Paid {
                    order_id: i % 7,
                    amount: i,
                },
                h,
            )?;
        }
        Ok::<_, AppError>(())
    })
    .unwrap();
    let events = conn.events();
    assert_eq!(events.len(), 2_500);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.headers_json(),
            serde_json::json!({"correlation-id": "c-1", "n": i.to_string()})
        );
        assert_eq!(e.payload_json()["amount"], i as i64);
    }
    // No events: the transaction commits its rows and writes nothing to the outbox.
    conn.transaction_with_outbox(|tx| tx.conn().insert_order(1, 1).map(|_| ()))
        .unwrap();
    assert_eq!(conn.count(COUNT_ORDERS), 1);
    assert_eq!(conn.count(COUNT_EVENTS), 2_500);
}

/// 8 threads × 500 transactions, one order and one event each.
pub fn concurrent_writers<C: SyncConn>(db: TestDatabase) {
    const THREADS: i64 = 8;
    const PER_THREAD: i64 = 500;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let db = &db;
            s.spawn(move || {
                let mut conn = C::open(db);
                for i in 0..PER_THREAD {
                    let order_id = t * PER_THREAD + i;
                    conn.transaction_with_outbox(|tx| {
                        tx.conn().insert_order(order_id, i)?;
                        tx.publish(&OrderCreated {
                            order_id,
                            total_cents: i,
                        })?;
                        Ok::<_, AppError>(())
                    })
                    .unwrap();
                }
            });
        }
    });
    let mut conn = C::open(&db);
    let events = conn.events();
    assert_eq!(events.len(), (THREADS * PER_THREAD) as usize);
    let ids: HashSet<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), events.len(), "duplicate event ids");
    let aggregates: HashSet<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
    assert_eq!(
        aggregates.len(),
        events.len(),
        "every order has exactly one event"
    );
    assert_eq!(conn.count(COUNT_ORDERS), THREADS * PER_THREAD);
}

/// Instantiates every test above for one connection type.
#[macro_export]
macro_rules! sync_suite {
    ($module:ident, $conn:ty, $db:path) => {
        mod $module {
            use $crate::sync_suite as s;
            #[test]
            fn commit_stores_rows_and_events() {
                s::commit_stores_rows_and_events::<$conn>($db("commit"));
            }
            #[test]
            fn err_rolls_back_rows_and_events() {
                s::err_rolls_back_rows_and_events::<$conn>($db("err"));
            }
            #[test]
            fn panic_rolls_back_rows_and_events() {
                s::panic_rolls_back_rows_and_events::<$conn>($db("panic"));
            }
            #[test]
            fn nested_transactions_are_savepoints() {
                s::nested_transactions_are_savepoints::<$conn>($db("nested"));
            }
            #[test]
            fn free_publish_needs_a_transaction() {
                s::free_publish_needs_a_transaction::<$conn>($db("free"));
            }
            #[test]
            fn unserialisable_payload_rolls_back() {
                s::unserialisable_payload_rolls_back::<$conn>($db("serialize"));
            }
            #[test]
            fn oversized_payload_is_refused_at_publish() {
                s::oversized_payload_is_refused_at_publish::<$conn>($db("oversized"));
            }
            #[test]
            fn headers_and_large_batches() {
                s::headers_and_large_batches::<$conn>($db("batch"));
            }
            #[test]
            fn concurrent_writers() {
                s::concurrent_writers::<$conn>($db("concurrent"));
            }
        }
    };
}
