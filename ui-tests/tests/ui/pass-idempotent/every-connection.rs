// Every supported connection type, sync and async; the generated async functions are `Send`
// whenever their body is, so they can be spawned.
use diesel::{MysqlConnection, PgConnection, SqliteConnection};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

macro_rules! handlers {
    ($($name:ident: $conn:ty),*) => {$(
        #[idempotent(consumer = "billing")]
        fn $name(conn: &mut $conn, event: Envelope<OrderCreated>) -> diesel::QueryResult<i64> {
            let _ = conn;
            Ok(event.order_id)
        }
    )*};
}

macro_rules! async_handlers {
    ($($name:ident: $conn:ty),*) => {$(
        #[idempotent(consumer = "billing")]
        async fn $name(conn: &mut $conn, event: Envelope<OrderCreated>) -> diesel::QueryResult<i64> {
            let _ = conn;
            tokio::task::yield_now().await;
            Ok(event.order_id)
        }
    )*};
}

handlers!(pg: PgConnection, mysql: MysqlConnection, sqlite: SqliteConnection);
handlers!(pooled: diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<PgConnection>>);
async_handlers!(
    async_pg: AsyncPgConnection,
    async_mysql: AsyncMysqlConnection,
    async_sqlite: SyncConnectionWrapper<SqliteConnection>
);

fn assert_send<T: Send>(_: &T) {}

fn spawnable(conn: &mut AsyncPgConnection, event: Envelope<OrderCreated>) {
    let future = async_pg(conn, event);
    assert_send(&future);
}

fn main() {
    let _ = (pg, mysql, sqlite, pooled, async_mysql, async_sqlite, spawnable);
}
