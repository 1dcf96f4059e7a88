//! `#[outbox::test]`: a fresh database per test on every backend, handed over as the
//! connection or pool the test asks for, and dropped afterwards, also after a panic.

use std::sync::Mutex;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel_async::pooled_connection::{bb8, deadpool};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};
use outbox::testing::{assert_written, written_async};

use crate::{OrderPlaced, place_order};

#[outbox::test(migrations = "tests/testing/migrations")]
fn a_sqlite_connection(conn: &mut SqliteConnection) {
    place_order(conn, 7, 1250).unwrap();
    assert_written!(conn, OrderPlaced { order_id: 7, .. });
}

#[outbox::test(migrations = "tests/testing/migrations")]
fn a_postgres_connection(conn: &mut PgConnection) -> Result<(), crate::ShopError> {
    place_order(conn, 7, 1250)?;
    assert_written!(conn, OrderPlaced { order_id: 7, .. });
    Ok(())
}

#[outbox::test(migrations = "tests/testing/migrations")]
fn an_r2d2_pool_on_mysql(pool: Pool<ConnectionManager<MysqlConnection>>) {
    let mut conn = pool.get().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    assert_written!(conn, OrderPlaced { order_id: 7, .. });
}

#[outbox::test]
fn no_application_migrations_means_only_the_outbox(conn: &mut MysqlConnection) {
    assert!(outbox::testing::written_events(conn).unwrap().is_empty());
    assert!(place_order(conn, 7, 1250).is_err(), "no orders table");
}

#[outbox::test(migrations = "tests/testing/migrations")]
async fn an_async_postgres_connection(conn: &mut AsyncPgConnection) {
    use outbox::AsyncOutboxConnection;
    conn.transaction_with_outbox(async |tx| {
        tx.publish(&OrderPlaced {
            order_id: 3,
            total_cents: 5,
            customer: "c".into(),
        })?;
        Ok::<_, crate::ShopError>(())
    })
    .await
    .unwrap();
    let placed = written_async::<OrderPlaced, _>(conn).await.unwrap();
    assert_eq!(placed[0].order_id, 3);
}

#[outbox::test]
async fn a_deadpool_pool_on_postgres(pool: deadpool::Pool<AsyncPgConnection>) {
    let mut conn = pool.get().await.unwrap();
    assert!(
        written_async::<OrderPlaced, _>(&mut *conn)
            .await
            .unwrap()
            .is_empty()
    );
}

#[outbox::test]
async fn a_bb8_pool_on_mysql(pool: bb8::Pool<AsyncMysqlConnection>) {
    let mut conn = pool.get().await.unwrap();
    assert!(
        written_async::<OrderPlaced, _>(&mut *conn)
            .await
            .unwrap()
            .is_empty()
    );
}

#[outbox::test]
async fn an_async_sqlite_connection(conn: &mut SyncConnectionWrapper<SqliteConnection>) {
    assert!(
        written_async::<OrderPlaced, _>(conn)
            .await
            .unwrap()
            .is_empty()
    );
}

#[outbox::test]
async fn a_sync_connection_in_an_async_test(conn: &mut SqliteConnection) {
    tokio::task::yield_now().await;
    assert!(outbox::testing::written_events(conn).unwrap().is_empty());
}

#[outbox::test(env = "OUTBOX_TEST_NO_SUCH_SERVER_URL")]
#[should_panic(expected = "set OUTBOX_TEST_NO_SUCH_SERVER_URL to the URL of a database server")]
fn a_missing_server_url_says_which_variable(_conn: &mut PgConnection) {}

/// The databases the panicking tests below were given, per backend.
static GIVEN: Mutex<Vec<(&str, String)>> = Mutex::new(Vec::new());

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
}

#[outbox::test]
#[should_panic(expected = "the test failed")]
fn panics_on_postgres(conn: &mut PgConnection) {
    let db = diesel::sql_query("SELECT current_database() AS name")
        .get_result::<Name>(conn)
        .unwrap();
    GIVEN.lock().unwrap().push(("postgres", db.name));
    // A transaction left open by the panic must not keep the database alive.
    conn.batch_execute("BEGIN; SELECT 1").unwrap();
    panic!("the test failed");
}

#[outbox::test]
#[should_panic(expected = "the test failed")]
async fn panics_on_mysql(conn: &mut AsyncMysqlConnection) {
    let query = diesel::sql_query("SELECT DATABASE() AS name");
    let db = diesel_async::RunQueryDsl::get_result::<Name>(query, conn)
        .await
        .unwrap();
    GIVEN.lock().unwrap().push(("mysql", db.name));
    panic!("the test failed");
}

#[outbox::test]
#[should_panic(expected = "the test failed")]
fn panics_on_sqlite(conn: &mut SqliteConnection) {
    let db = diesel::sql_query("SELECT file AS name FROM pragma_database_list WHERE name = 'main'")
        .get_result::<Name>(conn)
        .unwrap();
    GIVEN.lock().unwrap().push(("sqlite", db.name));
    panic!("the test failed");
}

#[test]
fn a_panicking_test_leaves_no_database_behind() {
    for test in [panics_on_postgres, panics_on_mysql, panics_on_sqlite] {
        assert!(std::panic::catch_unwind(test).is_err());
    }
    let given = std::mem::take(&mut *GIVEN.lock().unwrap());
    assert_eq!(given.len(), 3, "{given:?}");
    for (backend, name) in given {
        let left = match backend {
            "postgres" => {
                let mut admin = PgConnection::establish(&crate::postgres_url()).unwrap();
                diesel::sql_query(format!(
                    "SELECT datname AS name FROM pg_database WHERE datname = '{name}'"
                ))
                .load::<Name>(&mut admin)
                .unwrap()
                .len()
            }
            "mysql" => {
                let mut admin = MysqlConnection::establish(&crate::mysql_url()).unwrap();
                diesel::sql_query(format!(
                    "SELECT schema_name AS name FROM information_schema.schemata WHERE schema_name = '{name}'"
                ))
                .load::<Name>(&mut admin)
                .unwrap()
                .len()
            }
            _ => usize::from(std::path::Path::new(&name).exists()),
        };
        assert!(
            name.starts_with("outbox_t_kit_") || name.contains("outbox_t_kit_"),
            "{name}"
        );
        assert_eq!(left, 0, "{backend} database {name} was left behind");
    }
}
