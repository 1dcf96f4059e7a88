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
// The write API on a table partitioned for stream mode's retention (`outbox partition`).
#[cfg(feature = "postgres")]
sync_suite!(
    postgres_partitioned,
    diesel::PgConnection,
    crate::support::TestDatabase::postgres_partitioned
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
#[cfg(all(feature = "async", feature = "postgres"))]
async_suite!(
    async_postgres_partitioned,
    diesel_async::AsyncPgConnection,
    crate::support::TestDatabase::postgres_partitioned
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
/// SQL): a transaction's insert is not parsed and planned again each time. Up to 16 rows it is
/// a `VALUES` statement per row count; above, one statement of arrays (`unnest`) for any row
/// count, so the cache stays bounded.
#[cfg(feature = "postgres")]
#[test]
fn postgres_event_inserts_are_prepared_once_per_shape() {
    use diesel::{Connection, RunQueryDsl};
    use outbox::prelude::*;
    use support::{Count, OrderCreated, TestDatabase};

    let db = TestDatabase::postgres("prepared");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    for events in [1, 1, 1, 3, 3, 40, 40, 1500] {
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
    assert_eq!(count(&mut conn, support::COUNT_EVENTS), 1589);
    // One statement for the 1-row shape, one for the 3-row shape, one for 40 and 1,500 rows
    // (the arrays; 1,500 rows are written as 1,000 + 500, the same statement).
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM pg_prepared_statements \
             WHERE statement LIKE 'INSERT INTO outbox_events %'"
        ),
        3
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM pg_prepared_statements \
             WHERE statement LIKE 'INSERT INTO outbox_events %unnest(%'"
        ),
        1
    );
    // The arrays keep the order of the events: `seq` follows the publish order within the
    // 1,500-event transaction (aggregate ids 0, 1, 2, …).
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM (SELECT aggregate_id::bigint AS a, \
             lag(aggregate_id::bigint) OVER (ORDER BY seq) AS before FROM outbox_events \
             WHERE seq > (SELECT max(seq) - 1500 FROM outbox_events)) t \
             WHERE t.a <> coalesce(t.before + 1, 0)"
        ),
        0
    );
}

/// Above 16 rows (the arrays), a write that keeps existing rows skips the ids already stored
/// and writes the others, every column as given.
#[cfg(feature = "postgres")]
#[test]
fn postgres_array_insert_keeps_existing_rows() {
    use diesel::{Connection, RunQueryDsl};
    use outbox::{NewMessage, OutboxBackend};
    use support::{Count, OrderCreated, TestDatabase};

    let db = TestDatabase::postgres("arrays_keep");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    let messages: Vec<NewMessage> = (0..60)
        .map(|order_id| {
            let mut m = NewMessage::from_event(
                &OrderCreated {
                    order_id,
                    total_cents: 1,
                },
                Default::default(),
            )
            .unwrap();
            if order_id % 2 == 0 {
                m.topic = Some("even".into());
            }
            m
        })
        .collect();
    let count = |conn: &mut diesel::PgConnection, sql: &str| {
        diesel::sql_query(sql).get_result::<Count>(conn).unwrap().n
    };
    diesel::pg::Pg::write_as(&mut conn, &messages[..30], false).unwrap();
    // 30 already stored, 30 new: only the new ones are written.
    diesel::pg::Pg::write_as(&mut conn, &messages, true).unwrap();
    assert_eq!(count(&mut conn, support::COUNT_EVENTS), 60);
    // Without keeping existing rows, a stored id is a unique violation.
    assert!(diesel::pg::Pg::write_as(&mut conn, &messages[..20], false).is_err());
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE topic = 'even'"
        ),
        30
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE topic IS NULL \
             AND available_at = created_at AND headers = '{}'::jsonb \
             AND payload ->> 'total_cents' = '1' AND event_version = 3"
        ),
        30
    );
}
