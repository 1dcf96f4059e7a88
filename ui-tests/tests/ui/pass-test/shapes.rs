// What `#[outbox::test]` accepts: sync and async tests, connections by `&mut` and pools by
// value, a `Result` return, options. (Compiled, not run: the tests need servers.)
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::{MysqlConnection, PgConnection, SqliteConnection};
use diesel_async::pooled_connection::{bb8, deadpool};
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};

#[outbox::test]
fn sqlite(conn: &mut SqliteConnection) {
    let _ = conn;
}

#[outbox::test(migrations = "migrations", env = "MY_POSTGRES_URL")]
fn postgres(mut conn: &mut PgConnection) -> Result<(), diesel::result::Error> {
    let _ = &mut conn;
    Ok(())
}

#[outbox::test]
fn r2d2(pool: Pool<ConnectionManager<MysqlConnection>>) {
    let _ = pool;
}

#[outbox::test]
async fn async_pg(conn: &mut AsyncPgConnection) {
    let _ = conn;
}

#[outbox::test]
async fn pools(pool: deadpool::Pool<AsyncPgConnection>) {
    let _ = pool;
}

#[outbox::test]
async fn bb8_pool(pool: bb8::Pool<AsyncMysqlConnection>) {
    let _ = pool;
}

#[outbox::test(crate = outbox)]
async fn sync_conn_in_async_test(conn: &mut SqliteConnection) {
    let _ = conn;
}

fn main() {}
