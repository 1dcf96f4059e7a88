//! Pooled connections work unchanged: r2d2 for sync, deadpool and bb8 for diesel-async.

#![allow(unused_imports)]

use outbox::prelude::*;

use crate::support::*;

#[cfg(all(feature = "r2d2", feature = "postgres"))]
#[test]
fn r2d2_postgres_pool() {
    use diesel::r2d2::{ConnectionManager, Pool};
    let db = TestDatabase::postgres("r2d2");
    let pool = Pool::builder()
        .max_size(4)
        .build(ConnectionManager::<diesel::PgConnection>::new(&db.url))
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..4i64 {
            let pool = &pool;
            s.spawn(move || {
                for i in 0..50 {
                    let mut conn = pool.get().unwrap();
                    conn.transaction_with_outbox(|tx| {
                        outbox::publish(
                            tx.conn(),
                            &OrderCreated {
                                order_id: t * 100 + i,
                                total_cents: 1,
                            },
                        )
                        .map_err(AppError::from)?;
                        tx.publish(&OrderEvent::Paid {
                            order_id: t * 100 + i,
                            amount: 1,
                        })?;
                        Ok::<_, AppError>(())
                    })
                    .unwrap();
                }
            });
        }
    });
    let mut conn = pool.get().unwrap();
    assert_eq!(count(&mut *conn), 400);
    drop(conn);
    drop(pool);
}

#[cfg(all(feature = "r2d2", feature = "mysql"))]
#[test]
fn r2d2_mysql_pool() {
    use diesel::r2d2::{ConnectionManager, Pool};
    let db = TestDatabase::mysql("r2d2");
    let pool = Pool::builder()
        .max_size(2)
        .build(ConnectionManager::<diesel::MysqlConnection>::new(&db.url))
        .unwrap();
    let mut conn = pool.get().unwrap();
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderCreated {
            order_id: 1,
            total_cents: 1,
        })
    })
    .unwrap();
    assert_eq!(count(&mut *conn), 1);
    drop(conn);
    drop(pool);
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn count<C>(conn: &mut C) -> i64
where
    C: diesel::connection::LoadConnection<Backend: outbox::OutboxBackend + 'static>,
    Count: diesel::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    use diesel::RunQueryDsl;
    diesel::sql_query(COUNT_EVENTS)
        .get_result::<Count>(conn)
        .unwrap()
        .n
}

#[cfg(all(feature = "async", feature = "postgres"))]
#[tokio::test]
async fn deadpool_async_postgres_pool() {
    use diesel_async::AsyncPgConnection;
    use diesel_async::RunQueryDsl;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::deadpool::Pool;
    let db = TestDatabase::postgres("deadpool");
    let pool: Pool<AsyncPgConnection> = Pool::builder(AsyncDieselConnectionManager::<
        AsyncPgConnection,
    >::new(&db.url))
    .max_size(4)
    .build()
    .unwrap();
    let mut tasks = Vec::new();
    for t in 0..4i64 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..50 {
                let mut conn = pool.get().await.unwrap();
                conn.transaction_with_outbox(async |tx| {
                    // `tx` itself runs diesel-async queries: it is an async connection too.
                    diesel::sql_query(format!(
                        "INSERT INTO orders (id, total_cents) VALUES ({}, 1)",
                        t * 100 + i
                    ))
                    .execute(tx)
                    .await?;
                    Ok::<_, AppError>(())
                })
                .await
                .unwrap();
                conn.transaction_with_outbox(async |tx| {
                    tx.publish(&OrderCreated {
                        order_id: t * 100 + i,
                        total_cents: 1,
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
    let mut conn = pool.get().await.unwrap();
    let n = diesel::sql_query(COUNT_EVENTS)
        .get_result::<Count>(&mut conn)
        .await
        .unwrap()
        .n;
    assert_eq!(n, 200);
    let n = diesel::sql_query(COUNT_ORDERS)
        .get_result::<Count>(&mut conn)
        .await
        .unwrap()
        .n;
    assert_eq!(n, 200);
    drop(conn);
    pool.close();
}

#[cfg(all(feature = "async", feature = "mysql"))]
#[tokio::test]
async fn bb8_async_mysql_pool() {
    use diesel_async::AsyncMysqlConnection;
    use diesel_async::RunQueryDsl;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::bb8::Pool;
    let db = TestDatabase::mysql("bb8");
    let pool = Pool::builder()
        .max_size(2)
        .build(AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(
            &db.url,
        ))
        .await
        .unwrap();
    {
        let mut conn = pool.get().await.unwrap();
        conn.transaction_with_outbox(async |tx| {
            tx.publish(&OrderCreated {
                order_id: 1,
                total_cents: 1,
            })?;
            Ok::<_, AppError>(())
        })
        .await
        .unwrap();
        let n = diesel::sql_query(COUNT_EVENTS)
            .get_result::<Count>(&mut conn)
            .await
            .unwrap()
            .n;
        assert_eq!(n, 1);
    }
    drop(pool);
}
