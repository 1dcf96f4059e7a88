#![allow(missing_docs)]
//! The consumer side against real PostgreSQL, MariaDB/MySQL and SQLite: the inbox and
//! `#[idempotent]` on every sync and async connection type.
//!
//! With the `kafka` feature, `through_broker` runs the Kafka consumer runtime against a real
//! broker (`scripts/kafka.sh start`) with these handlers, killed processes included,
//! `outage` cuts the handler's PostgreSQL for 20 s and `db_refusing` has it refuse
//! connections for 10 s. `fault_classes` checks the fault class of real database errors.
//!
//! Every test creates its own database (see `support::TestDatabase`) and drops it at the end.
//! Run with `cargo test --all-features --test consumer`.

#[path = "../integration/private_postgres.rs"]
#[allow(dead_code)]
mod private_postgres;
#[path = "../integration/support.rs"]
mod support;

mod conns;
#[cfg(all(feature = "kafka", feature = "postgres"))]
mod db_refusing;
mod fault_classes;
mod idempotent_suite;
mod inbox_suite;
#[cfg(all(feature = "nats", feature = "postgres"))]
mod nats;
#[cfg(all(feature = "kafka", feature = "postgres"))]
mod outage;
#[cfg(all(any(feature = "nats", feature = "rabbitmq"), feature = "postgres"))]
mod pipeline;
#[cfg(all(feature = "rabbitmq", feature = "postgres"))]
mod rabbitmq;
#[cfg(feature = "kafka")]
mod through_broker;
#[cfg(all(feature = "kafka", feature = "sqlite"))]
mod upcast_through_broker;

diesel::table! {
    orders (id) {
        id -> BigInt,
        total_cents -> BigInt,
    }
}

#[cfg(feature = "postgres")]
inbox_suite!(
    postgres,
    diesel::PgConnection,
    crate::support::TestDatabase::postgres
);
#[cfg(feature = "mysql")]
inbox_suite!(
    mysql,
    diesel::MysqlConnection,
    crate::support::TestDatabase::mysql
);
#[cfg(feature = "sqlite")]
inbox_suite!(
    sqlite,
    diesel::SqliteConnection,
    crate::support::TestDatabase::sqlite
);

#[cfg(feature = "postgres")]
async_inbox_suite!(
    async_postgres,
    diesel_async::AsyncPgConnection,
    crate::support::TestDatabase::postgres
);
#[cfg(feature = "mysql")]
async_inbox_suite!(
    async_mysql,
    diesel_async::AsyncMysqlConnection,
    crate::support::TestDatabase::mysql
);
#[cfg(feature = "sqlite")]
async_inbox_suite!(
    async_sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    crate::support::TestDatabase::sqlite
);

#[cfg(feature = "postgres")]
idempotent_suite!(
    idempotent_postgres,
    diesel::PgConnection,
    crate::support::TestDatabase::postgres
);
#[cfg(feature = "mysql")]
idempotent_suite!(
    idempotent_mysql,
    diesel::MysqlConnection,
    crate::support::TestDatabase::mysql
);
#[cfg(feature = "sqlite")]
idempotent_suite!(
    idempotent_sqlite,
    diesel::SqliteConnection,
    crate::support::TestDatabase::sqlite
);

#[cfg(feature = "postgres")]
async_idempotent_suite!(
    idempotent_async_postgres,
    diesel_async::AsyncPgConnection,
    crate::support::TestDatabase::postgres
);
#[cfg(feature = "mysql")]
async_idempotent_suite!(
    idempotent_async_mysql,
    diesel_async::AsyncMysqlConnection,
    crate::support::TestDatabase::mysql
);
#[cfg(feature = "sqlite")]
async_idempotent_suite!(
    idempotent_async_sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    crate::support::TestDatabase::sqlite
);

#[cfg(all(feature = "kafka", feature = "postgres"))]
through_broker_suite!(
    broker_postgres,
    diesel_async::AsyncPgConnection,
    crate::support::TestDatabase::postgres
);
#[cfg(all(feature = "kafka", feature = "mysql"))]
through_broker_suite!(
    broker_mysql,
    diesel_async::AsyncMysqlConnection,
    crate::support::TestDatabase::mysql
);
#[cfg(all(feature = "kafka", feature = "sqlite"))]
through_broker_suite!(
    broker_sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    crate::support::TestDatabase::sqlite
);
