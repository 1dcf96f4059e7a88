//! The write-path contract, once, for every diesel-async connection type.

use std::collections::HashSet;

use diesel_async::AsyncConnection;
use outbox::OutboxBackend;
use outbox::prelude::*;

use crate::support::*;

/// What the generic tests need of an async connection type; implemented per type by
/// `impl_async!`.
pub trait AsyncConn: AsyncConnection<Backend: OutboxBackend> + Sized + Send + 'static {
    fn open(db: &TestDatabase) -> impl Future<Output = Self> + Send;
    fn insert_order(
        &mut self,
        id: i64,
        total_cents: i64,
    ) -> impl Future<Output = diesel::QueryResult<usize>> + Send;
    fn events(&mut self) -> impl Future<Output = Vec<StoredEvent>> + Send;
    fn count(&mut self, sql: &'static str) -> impl Future<Output = i64> + Send;
}

macro_rules! impl_async {
    ($conn:ty $(, $setup:literal)?) => {
        impl AsyncConn for $conn {
            async fn open(db: &TestDatabase) -> Self {
                #[allow(unused_mut)]
                let mut conn = <$conn>::establish(&db.url).await.unwrap();
                $(diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, $setup).await.unwrap();)?
                conn
            }
            async fn insert_order(&mut self, id: i64, total_cents: i64) -> diesel::QueryResult<usize> {
                use diesel::ExpressionMethods;
                use diesel_async::RunQueryDsl;
                diesel::insert_into(crate::orders::table)
                    .values((crate::orders::id.eq(id), crate::orders::total_cents.eq(total_cents)))
                    .execute(self)
                    .await
            }
            async fn events(&mut self) -> Vec<StoredEvent> {
                use diesel_async::RunQueryDsl;
                diesel::sql_query(<<$conn as diesel_async::AsyncConnectionCore>::Backend as ReadBack>::SELECT_EVENTS)
                    .load(self)
                    .await
                    .unwrap()
            }
            async fn count(&mut self, sql: &'static str) -> i64 {
                use diesel_async::RunQueryDsl;
                diesel::sql_query(sql).get_result::<Count>(self).await.unwrap().n
            }
        }
    };
}

#[cfg(feature = "postgres")]
impl_async!(diesel_async::AsyncPgConnection);
#[cfg(feature = "mysql")]
impl_async!(diesel_async::AsyncMysqlConnection);
#[cfg(feature = "sqlite")]
impl_async!(
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    "PRAGMA busy_timeout = 30000"
);

pub async fn commit_stores_rows_and_events<C: AsyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db).await;
    let total_cents = 1250; // borrowed by the closure, not moved
    let id = conn
        .transaction_with_outbox(async |tx| {
            tx.conn().insert_order(42, total_cents).await?;
            tx.publish(&OrderCreated {
                order_id: 42,
                total_cents,
            })?;
            tx.set_header("correlation-id", "c-42");
            tx.publish(&OrderEvent::Paid {
                order_id: 42,
                amount: total_cents,
            })?;
            Ok::<_, AppError>(42)
        })
        .await
        .unwrap();
    assert_eq!(id, 42);
    assert_eq!(conn.count(COUNT_ORDERS).await, 1);
    let events = conn.events().await;
    assert_eq!(events.len(), 2);
    let (a, b) = (&events[0], &events[1]);
    assert_eq!(
        (a.aggregate_type.as_str(), a.aggregate_id.as_str()),
        ("order", "42")
    );
    assert_eq!(
        (a.event_type.as_str(), a.event_version),
        ("OrderCreated", 3)
    );
    assert_eq!(
        a.payload_json(),
        serde_json::json!({"order_id": 42, "total_cents": 1250})
    );
    assert_eq!(a.headers_json(), serde_json::json!({}));
    assert_eq!(a.shard, i32::from(outbox::shard_of("order", "42")));
    assert_eq!(uuid::Uuid::parse_str(&a.id).unwrap().get_version_num(), 7);
    let age = chrono::Utc::now() - a.created_at();
    assert!(
        age >= chrono::TimeDelta::zero() && age < chrono::TimeDelta::seconds(60),
        "{age}"
    );
    assert_eq!((b.event_type.as_str(), b.event_version), ("Paid", 1));
    assert_eq!(b.topic.as_deref(), Some("order-lifecycle"));
    assert_eq!(
        b.headers_json(),
        serde_json::json!({"correlation-id": "c-42"})
    );
}

pub async fn err_rolls_back_rows_and_events<C: AsyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db).await;
    let result = conn
        .transaction_with_outbox(async |tx| {
            tx.conn().insert_order(1, 100).await?;
            tx.publish(&OrderCreated {
                order_id: 1,
                total_cents: 100,
            })?;
            Err::<(), _>(AppError::Business("payment declined"))
        })
        .await;
    assert!(matches!(
        result,
        Err(AppError::Business("payment declined"))
    ));
    assert_eq!(conn.count(COUNT_ORDERS).await, 0);
    assert_eq!(conn.count(COUNT_EVENTS).await, 0);

    // A payload that does not serialise fails the transaction too, naming the event type.
    let result = conn
        .transaction_with_outbox(async |tx| {
            tx.conn().insert_order(2, 100).await?;
            tx.publish(&Unserialisable::new())?;
            Ok::<_, AppError>(())
        })
        .await;
    match result {
        Err(AppError::Outbox(e)) => assert!(e.to_string().contains("`Unserialisable`"), "{e}"),
        other => panic!("expected a serialize error, got {other:?}"),
    }
    assert_eq!(conn.count(COUNT_ORDERS).await, 0);
    assert_eq!(conn.count(COUNT_EVENTS).await, 0);
}

pub async fn panic_rolls_back_rows_and_events<C: AsyncConn>(db: TestDatabase) {
    let conn = C::open(&db).await;
    let task = tokio::spawn(async move {
        let mut conn = conn;
        let _ = conn
            .transaction_with_outbox(async |tx| {
                tx.conn().insert_order(1, 100).await?;
                tx.publish(&OrderCreated {
                    order_id: 1,
                    total_cents: 100,
                })?;
                if tx.pending().len() == 1 {
                    panic!("boom inside the transaction");
                }
                Ok::<_, AppError>(())
            })
            .await;
    });
    assert!(task.await.unwrap_err().is_panic()); // the connection was dropped mid-transaction
    let mut conn = C::open(&db).await;
    assert_eq!(conn.count(COUNT_ORDERS).await, 0);
    assert_eq!(conn.count(COUNT_EVENTS).await, 0);
}

pub async fn nested_transactions_and_free_publish<C: AsyncConn>(db: TestDatabase) {
    let mut conn = C::open(&db).await;
    let outside = outbox::publish_async(
        &mut conn,
        &OrderCreated {
            order_id: 9,
            total_cents: 9,
        },
    )
    .await;
    assert!(
        matches!(outside, Err(outbox::Error::NotInTransaction)),
        "{outside:?}"
    );

    conn.transaction_with_outbox(async |tx| {
        tx.conn().insert_order(1, 100).await?;
        tx.publish(&OrderCreated {
            order_id: 1,
            total_cents: 100,
        })?;
        let inner = tx
            .conn()
            .transaction_with_outbox(async |inner| {
                inner.conn().insert_order(2, 200).await?;
                inner.publish(&OrderCreated {
                    order_id: 2,
                    total_cents: 200,
                })?;
                Err::<(), _>(AppError::Business("inner fails"))
            })
            .await;
        assert!(inner.is_err());
        tx.conn()
            .transaction(async |c| {
                c.insert_order(3, 300).await?;
                outbox::publish_async(
                    c,
                    &OrderCreated {
                        order_id: 3,
                        total_cents: 300,
                    },
                )
                .await?;
                Ok::<_, AppError>(())
            })
            .await?;
        // A plain savepoint that rolls back: the outer's event 4, written inside it before
        // event 5, is written again at the end.
        tx.publish(&OrderCreated {
            order_id: 4,
            total_cents: 400,
        })?;
        let rolled_back = tx
            .conn()
            .transaction(async |c| {
                outbox::publish_async(
                    c,
                    &OrderCreated {
                        order_id: 5,
                        total_cents: 500,
                    },
                )
                .await?;
                Err::<(), _>(AppError::Business("savepoint fails"))
            })
            .await;
        assert!(rolled_back.is_err());
        Ok::<_, AppError>(())
    })
    .await
    .unwrap();
    let ids: Vec<String> = conn
        .events()
        .await
        .into_iter()
        .map(|e| e.aggregate_id)
        .collect();
    // Publish order: the outer's event 1 was written before the savepoint's event 3.
    assert_eq!(ids, ["1", "3", "4"]);
    assert_eq!(conn.count(COUNT_ORDERS).await, 2);
}

/// 8 tasks × 500 transactions, one order and one event each, each task on its own connection.
pub async fn concurrent_writers<C: AsyncConn>(db: TestDatabase) {
    const TASKS: i64 = 8;
    const PER_TASK: i64 = 500;
    let db = std::sync::Arc::new(db);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = C::open(&db).await;
            for i in 0..PER_TASK {
                let order_id = t * PER_TASK + i;
                conn.transaction_with_outbox(async |tx| {
                    tx.conn().insert_order(order_id, i).await?;
                    tx.publish(&OrderCreated {
                        order_id,
                        total_cents: i,
                    })?;
                    Ok::<_, AppError>(())
                })
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut conn = C::open(&db).await;
    let events = conn.events().await;
    assert_eq!(events.len(), (TASKS * PER_TASK) as usize);
    let ids: HashSet<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), events.len(), "duplicate event ids");
    assert_eq!(conn.count(COUNT_ORDERS).await, TASKS * PER_TASK);
}

/// Instantiates every test above for one async connection type.
#[macro_export]
macro_rules! async_suite {
    ($module:ident, $conn:ty, $db:path) => {
        mod $module {
            use $crate::async_suite as s;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn commit_stores_rows_and_events() {
                s::commit_stores_rows_and_events::<$conn>($db("acommit")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn err_rolls_back_rows_and_events() {
                s::err_rolls_back_rows_and_events::<$conn>($db("aerr")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn panic_rolls_back_rows_and_events() {
                s::panic_rolls_back_rows_and_events::<$conn>($db("apanic")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nested_transactions_and_free_publish() {
                s::nested_transactions_and_free_publish::<$conn>($db("anested")).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_writers() {
                s::concurrent_writers::<$conn>($db("aconcurrent")).await;
            }
        }
    };
}
