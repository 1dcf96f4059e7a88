#![allow(missing_docs)]
//! Integration tests of the write path against real PostgreSQL, MariaDB/MySQL and SQLite.
//!
//! Every test creates its own database (see `support::TestDatabase`) and drops it at the end,
//! so the tests run in parallel and leave nothing behind. Run them with all features:
//! `cargo test --all-features --test integration` (the README's test command does).

#[cfg(feature = "async")]
mod async_suite;
mod migrations;
mod pools;
mod row_checks;
mod support;
mod sync_suite;

diesel::table! {
    orders (id) {
        id -> BigInt,
        total_cents -> BigInt,
    }
}

#[cfg(feature = "postgres")]
sync_suite!(
    postgres,
    diesel::PgConnection,
    crate::support::TestDatabase::postgres
);
#[cfg(feature = "mysql")]
sync_suite!(
    mysql,
    diesel::MysqlConnection,
    crate::support::TestDatabase::mysql
);
#[cfg(feature = "sqlite")]
sync_suite!(
    sqlite,
    diesel::SqliteConnection,
    crate::support::TestDatabase::sqlite
);

#[cfg(all(feature = "async", feature = "postgres"))]
async_suite!(
    async_postgres,
    diesel_async::AsyncPgConnection,
    crate::support::TestDatabase::postgres
);
#[cfg(all(feature = "async", feature = "mysql"))]
async_suite!(
    async_mysql,
    diesel_async::AsyncMysqlConnection,
    crate::support::TestDatabase::mysql
);
#[cfg(all(feature = "async", feature = "sqlite"))]
async_suite!(
    async_sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    crate::support::TestDatabase::sqlite
);

/// The event `INSERT` keeps its prepared statement per connection (Diesel caches it by its
/// SQL) for small row counts: a transaction's insert is not parsed and planned again each
/// time. Larger ones are prepared each time, so the cache stays bounded.
#[cfg(feature = "postgres")]
#[test]
fn postgres_event_inserts_are_prepared_once_per_shape() {
    use diesel::{Connection, RunQueryDsl};
    use outbox::prelude::*;
    use support::{Count, OrderCreated, TestDatabase};

    let db = TestDatabase::postgres("prepared");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    for events in [1, 1, 1, 3, 3, 40] {
        conn.transaction_with_outbox(|tx| {
            for order_id in 0..events {
                tx.publish(&OrderCreated {
                    order_id,
                    total_cents: 1,
                })?;
            }
            Ok::<_, outbox::Error>(())
        })
        .unwrap();
    }
    let count = |conn: &mut diesel::PgConnection, sql: &str| {
        diesel::sql_query(sql).get_result::<Count>(conn).unwrap().n
    };
    assert_eq!(count(&mut conn, support::COUNT_EVENTS), 49);
    // One statement for the 1-row shape, one for the 3-row shape, none for 40 rows.
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM pg_prepared_statements \
             WHERE statement LIKE 'INSERT INTO outbox_events %'"
        ),
        2
    );
}
