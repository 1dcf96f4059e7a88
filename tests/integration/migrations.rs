//! The embedded migrations: idempotent, the indexes the relay relies on, and `down.sql`
//! reverting them cleanly.

#![allow(unused_imports)]

use diesel::{Connection, RunQueryDsl};

use crate::support::*;

#[cfg(feature = "postgres")]
#[test]
fn postgres_schema() {
    let db = TestDatabase::postgres("schema");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    assert!(
        outbox::migrations::run(&mut conn).unwrap().is_empty(),
        "second run applies nothing"
    );
    let partial = diesel::sql_query(
        "SELECT COUNT(*) AS n FROM pg_indexes WHERE tablename = 'outbox_events' \
         AND indexdef LIKE '%WHERE ((published_at IS NULL) AND (dead_at IS NULL))'",
    )
    .get_result::<Count>(&mut conn)
    .unwrap();
    assert_eq!(
        partial.n, 3,
        "pending, pending-aggregate and pending-shard partial indexes"
    );
    // The stream index carries one more condition, so that the lease modes' statements, whose
    // conditions imply the pending predicate, are never planned on it.
    let stream = diesel::sql_query(
        "SELECT COUNT(*) AS n FROM pg_indexes WHERE indexname = 'outbox_events_stream' \
         AND indexdef LIKE '%(xid IS NOT NULL)%'",
    )
    .get_result::<Count>(&mut conn)
    .unwrap();
    assert_eq!(stream.n, 1, "the stream index, kept off the lease claims");
    let recorded = diesel::sql_query(
        "SELECT COUNT(*) AS n FROM __diesel_schema_migrations WHERE version = '20261129000001'",
    )
    .get_result::<Count>(&mut conn)
    .unwrap();
    assert_eq!(recorded.n, 1, "recorded where the Diesel CLI looks");
    revert_and_reapply(&mut conn);
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_schema() {
    let db = TestDatabase::mysql("schema");
    let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
    assert!(outbox::migrations::run(&mut conn).unwrap().is_empty());
    let idx = diesel::sql_query(
        "SELECT COUNT(DISTINCT index_name) AS n FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = 'outbox_events'",
    )
    .get_result::<Count>(&mut conn)
    .unwrap();
    assert_eq!(
        idx.n, 6,
        "primary, id unique, three pending indexes, dead-aggregate"
    );
    let shards = diesel::sql_query("SELECT COUNT(*) AS n FROM outbox_shard_leases")
        .get_result::<Count>(&mut conn)
        .unwrap();
    assert_eq!(shards.n, 256);
    revert_and_reapply(&mut conn);
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_schema() {
    let db = TestDatabase::sqlite("schema");
    let mut conn = diesel::SqliteConnection::establish(&db.url).unwrap();
    assert!(outbox::migrations::run(&mut conn).unwrap().is_empty());
    let idx = diesel::sql_query(
        "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'index' \
         AND tbl_name = 'outbox_events' AND sql LIKE '%WHERE published_at IS NULL AND dead_at IS NULL'",
    )
    .get_result::<Count>(&mut conn)
    .unwrap();
    assert_eq!(idx.n, 2);
    let shards = diesel::sql_query("SELECT COUNT(*) AS n FROM outbox_shard_leases")
        .get_result::<Count>(&mut conn)
        .unwrap();
    assert_eq!(shards.n, 256);
    // The CHECK constraints hold for rows other programs insert.
    let bad = diesel::sql_query(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, \
         payload, shard, created_at, available_at) VALUES ('x', 'a', '1', 'E', 1, 'not json', 0, '', '')",
    )
    .execute(&mut conn);
    assert!(bad.is_err());
    revert_and_reapply(&mut conn);
}

/// `down.sql` drops everything `up.sql` made; after removing the record, `run` applies again.
fn revert_and_reapply<C>(conn: &mut C)
where
    C: diesel::connection::LoadConnection<Backend: outbox::OutboxBackend>,
{
    for m in outbox::migrations::list::<C::Backend>().iter().rev() {
        conn.batch_execute(m.down).unwrap();
        conn.batch_execute(&format!(
            "DELETE FROM __diesel_schema_migrations WHERE version = '{}'",
            m.version
        ))
        .unwrap();
    }
    let all: Vec<&str> = outbox::migrations::list::<C::Backend>()
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(outbox::migrations::run(conn).unwrap(), all);
}
