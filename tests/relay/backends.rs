//! Per-backend test plumbing: a relay store on a test database, and filling its outbox.

use outbox::relay::RelayStore;

use crate::support::*;

/// What the generic store tests need of a backend.
pub trait Backend: 'static {
    type Store: RelayStore;
    /// Whether the store sees relays' database sessions (and so reaps dead relays).
    const SESSIONS: bool;
    /// A fresh database with the migrations applied.
    fn database(label: &str) -> TestDatabase;
    /// A relay store on it.
    fn store(db: &TestDatabase) -> Self::Store;
    /// Writes `per_aggregate` events for each of `aggregates` aggregates, interleaved
    /// (E0 of every aggregate, then E1, ...), through `transaction_with_outbox`.
    fn fill(db: &TestDatabase, aggregates: usize, per_aggregate: usize);
    /// Runs a statement.
    fn exec(db: &TestDatabase, sql: &str);
    /// `SELECT COUNT(*) AS n ...`.
    fn count(db: &TestDatabase, sql: &str) -> i64;
    /// Reverts (with their `down.sql`) the migrations newer than `version`, so a test can
    /// write rows that later constraints would refuse.
    fn revert_after(db: &TestDatabase, version: &str);
    /// The connection the admin API runs on.
    type AdminConn: outbox::relay::admin::AdminConnection;
    /// An admin connection to the database.
    #[allow(async_fn_in_trait)]
    async fn admin(db: &TestDatabase) -> Self::AdminConn;
}

macro_rules! revert_after {
    ($conn:ty, $db:expr, $version:expr) => {{
        use diesel::Connection;
        use diesel::connection::SimpleConnection;
        let mut conn = <$conn>::establish(&$db.url).unwrap();
        let all = outbox::migrations::list::<<$conn as Connection>::Backend>();
        for m in all.iter().rev().filter(|m| m.version > $version) {
            conn.batch_execute(m.down).unwrap();
        }
    }};
}

macro_rules! fill_with {
    ($conn:ty, $db:expr, $aggregates:expr, $per:expr) => {{
        use diesel::Connection;
        use outbox::prelude::*;
        let mut conn = <$conn>::establish(&$db.url).unwrap();
        let mut all = Vec::new();
        for i in 0..$per {
            for a in 0..$aggregates {
                all.push(OrderEvent::Paid {
                    order_id: a as i64,
                    amount: i as i64,
                });
            }
        }
        for chunk in all.chunks(2000) {
            conn.transaction_with_outbox(|tx| {
                for e in chunk {
                    tx.publish(e)?;
                }
                Ok::<_, AppError>(())
            })
            .unwrap();
        }
    }};
}

#[cfg(feature = "postgres")]
pub struct Postgres;

#[cfg(feature = "postgres")]
impl Backend for Postgres {
    type AdminConn = diesel_async::AsyncPgConnection;
    async fn admin(db: &TestDatabase) -> Self::AdminConn {
        use diesel_async::AsyncConnection;
        <diesel_async::AsyncPgConnection>::establish(&db.url)
            .await
            .unwrap()
    }
    type Store = outbox::relay::PgRelayStore;
    const SESSIONS: bool = true;
    fn database(label: &str) -> TestDatabase {
        TestDatabase::postgres(label)
    }
    fn store(db: &TestDatabase) -> Self::Store {
        outbox::relay::PgRelayStore::new(&db.url)
    }
    fn fill(db: &TestDatabase, aggregates: usize, per_aggregate: usize) {
        fill_with!(diesel::PgConnection, db, aggregates, per_aggregate)
    }
    fn exec(db: &TestDatabase, sql: &str) {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
        diesel::sql_query(sql).execute(&mut conn).unwrap();
    }
    fn count(db: &TestDatabase, sql: &str) -> i64 {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
        diesel::sql_query(sql)
            .get_result::<Count>(&mut conn)
            .unwrap()
            .n
    }
    fn revert_after(db: &TestDatabase, version: &str) {
        revert_after!(diesel::PgConnection, db, version);
    }
}

#[cfg(feature = "mysql")]
pub struct Mysql;

#[cfg(feature = "mysql")]
impl Backend for Mysql {
    type AdminConn = diesel_async::AsyncMysqlConnection;
    async fn admin(db: &TestDatabase) -> Self::AdminConn {
        use diesel_async::AsyncConnection;
        <diesel_async::AsyncMysqlConnection>::establish(&db.url)
            .await
            .unwrap()
    }
    type Store = outbox::relay::MysqlRelayStore;
    const SESSIONS: bool = true;
    fn database(label: &str) -> TestDatabase {
        TestDatabase::mysql(label)
    }
    fn store(db: &TestDatabase) -> Self::Store {
        outbox::relay::MysqlRelayStore::new(&db.url)
    }
    fn fill(db: &TestDatabase, aggregates: usize, per_aggregate: usize) {
        fill_with!(diesel::MysqlConnection, db, aggregates, per_aggregate)
    }
    fn exec(db: &TestDatabase, sql: &str) {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
        diesel::sql_query(sql).execute(&mut conn).unwrap();
    }
    fn count(db: &TestDatabase, sql: &str) -> i64 {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
        diesel::sql_query(sql)
            .get_result::<Count>(&mut conn)
            .unwrap()
            .n
    }
    fn revert_after(db: &TestDatabase, version: &str) {
        revert_after!(diesel::MysqlConnection, db, version);
    }
}

#[cfg(feature = "sqlite")]
pub struct Sqlite;

/// A test's own SQLite connection: it waits for the relays' write lock like they do.
#[cfg(feature = "sqlite")]
fn sqlite_conn(db: &TestDatabase) -> diesel::SqliteConnection {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let mut conn = diesel::SqliteConnection::establish(&db.url).unwrap();
    conn.batch_execute("PRAGMA busy_timeout = 5000").unwrap();
    conn
}

#[cfg(feature = "sqlite")]
impl Backend for Sqlite {
    type AdminConn =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    async fn admin(db: &TestDatabase) -> Self::AdminConn {
        use diesel_async::AsyncConnection;
        <diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>>::establish(&db.url).await.unwrap()
    }
    type Store = outbox::relay::SqliteRelayStore;
    const SESSIONS: bool = false;
    fn database(label: &str) -> TestDatabase {
        TestDatabase::sqlite(label)
    }
    fn store(db: &TestDatabase) -> Self::Store {
        outbox::relay::SqliteRelayStore::new(&db.url)
    }
    fn fill(db: &TestDatabase, aggregates: usize, per_aggregate: usize) {
        fill_with!(diesel::SqliteConnection, db, aggregates, per_aggregate)
    }
    fn exec(db: &TestDatabase, sql: &str) {
        use diesel::RunQueryDsl;
        diesel::sql_query(sql)
            .execute(&mut sqlite_conn(db))
            .unwrap();
    }
    fn count(db: &TestDatabase, sql: &str) -> i64 {
        use diesel::RunQueryDsl;
        diesel::sql_query(sql)
            .get_result::<Count>(&mut sqlite_conn(db))
            .unwrap()
            .n
    }
    fn revert_after(db: &TestDatabase, version: &str) {
        revert_after!(diesel::SqliteConnection, db, version);
    }
}
