//! What the generic consumer tests need of a connection type, per backend: opening one on a
//! test database, running SQL, counting, and the few statements that differ by backend.

#![allow(dead_code)]

use diesel::Connection;
use diesel_async::AsyncConnection;
use outbox::OutboxBackend;

use crate::support::*;

/// The SQL that differs by backend.
pub trait BackendSql {
    /// The table consumer effects go to. No unique key: a duplicate effect would show.
    const EFFECTS_DDL: &'static str;
    /// Makes every inbox row of `consumer = 'old'` two days old.
    const AGE_INBOX: &'static str;
}

#[cfg(feature = "postgres")]
impl BackendSql for diesel::pg::Pg {
    const EFFECTS_DDL: &'static str = "CREATE TABLE effects (n BIGSERIAL PRIMARY KEY, \
        consumer TEXT NOT NULL, event_id TEXT NOT NULL, order_id BIGINT NOT NULL, \
        amount BIGINT NOT NULL)";
    const AGE_INBOX: &'static str = "UPDATE outbox_inbox \
        SET processed_at = now() - interval '2 days' WHERE consumer = 'old'";
}

#[cfg(feature = "mysql")]
impl BackendSql for diesel::mysql::Mysql {
    const EFFECTS_DDL: &'static str = "CREATE TABLE effects (n BIGINT AUTO_INCREMENT PRIMARY KEY, \
        consumer VARCHAR(255) NOT NULL, event_id VARCHAR(255) NOT NULL, \
        order_id BIGINT NOT NULL, amount BIGINT NOT NULL)";
    const AGE_INBOX: &'static str = "UPDATE outbox_inbox \
        SET processed_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE consumer = 'old'";
}

#[cfg(feature = "sqlite")]
impl BackendSql for diesel::sqlite::Sqlite {
    const EFFECTS_DDL: &'static str = "CREATE TABLE effects (n INTEGER PRIMARY KEY AUTOINCREMENT, \
        consumer TEXT NOT NULL, event_id TEXT NOT NULL, order_id BIGINT NOT NULL, \
        amount BIGINT NOT NULL)";
    const AGE_INBOX: &'static str = "UPDATE outbox_inbox \
        SET processed_at = strftime('%Y-%m-%d %H:%M:%f000', 'now', '-2 days') \
        WHERE consumer = 'old'";
}

diesel::table! {
    effects (n) {
        n -> BigInt,
        consumer -> Text,
        event_id -> Text,
        order_id -> BigInt,
        amount -> BigInt,
    }
}

/// A synchronous connection type under test.
pub trait SyncConn:
    Connection<Backend: OutboxBackend + BackendSql> + Sized + Send + 'static
{
    fn open(db: &TestDatabase) -> Self;
    fn exec(&mut self, sql: &str) -> usize;
    fn count(&mut self, sql: &str) -> i64;
    /// Records an effect of `consumer` for `order_id`.
    fn effect(
        &mut self,
        consumer: &str,
        event_id: &str,
        order_id: i64,
        amount: i64,
    ) -> diesel::QueryResult<()>;
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
            fn exec(&mut self, sql: &str) -> usize {
                diesel::RunQueryDsl::execute(diesel::sql_query(sql), self).unwrap()
            }
            fn count(&mut self, sql: &str) -> i64 {
                diesel::RunQueryDsl::get_result::<Count>(diesel::sql_query(sql), self)
                    .unwrap()
                    .n
            }
            fn effect(
                &mut self,
                consumer: &str,
                event_id: &str,
                order_id: i64,
                amount: i64,
            ) -> diesel::QueryResult<()> {
                use diesel::ExpressionMethods;
                diesel::RunQueryDsl::execute(
                    diesel::insert_into(effects::table).values((
                        effects::consumer.eq(consumer),
                        effects::event_id.eq(event_id),
                        effects::order_id.eq(order_id),
                        effects::amount.eq(amount),
                    )),
                    self,
                )
                .map(drop)
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

/// A diesel-async connection type under test.
pub trait AsyncConn:
    AsyncConnection<Backend: OutboxBackend + BackendSql> + Sized + Send + 'static
{
    fn open(db: &TestDatabase) -> impl Future<Output = Self> + Send;
    fn exec(&mut self, sql: &'static str) -> impl Future<Output = usize> + Send;
    fn count(&mut self, sql: &'static str) -> impl Future<Output = i64> + Send;
    fn effect(
        &mut self,
        consumer: &str,
        event_id: &str,
        order_id: i64,
        amount: i64,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;
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
            async fn exec(&mut self, sql: &'static str) -> usize {
                diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), self)
                    .await
                    .unwrap()
            }
            async fn count(&mut self, sql: &'static str) -> i64 {
                diesel_async::RunQueryDsl::get_result::<Count>(diesel::sql_query(sql), self)
                    .await
                    .unwrap()
                    .n
            }
            async fn effect(
                &mut self,
                consumer: &str,
                event_id: &str,
                order_id: i64,
                amount: i64,
            ) -> diesel::QueryResult<()> {
                use diesel::ExpressionMethods;
                diesel_async::RunQueryDsl::execute(
                    diesel::insert_into(effects::table).values((
                        effects::consumer.eq(consumer),
                        effects::event_id.eq(event_id),
                        effects::order_id.eq(order_id),
                        effects::amount.eq(amount),
                    )),
                    self,
                )
                .await
                .map(drop)
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

/// A test database with the effects table.
pub fn with_effects<C: SyncConn>(db: TestDatabase) -> TestDatabase {
    C::open(&db).exec(<C::Backend as BackendSql>::EFFECTS_DDL);
    db
}

pub const COUNT_INBOX: &str = "SELECT COUNT(*) AS n FROM outbox_inbox";
pub const COUNT_EFFECTS: &str = "SELECT COUNT(*) AS n FROM effects";

/// [`with_effects`] for async connection types.
pub async fn with_effects_async<C: AsyncConn>(db: TestDatabase) -> TestDatabase {
    C::open(&db)
        .await
        .exec(<C::Backend as BackendSql>::EFFECTS_DDL)
        .await;
    db
}
