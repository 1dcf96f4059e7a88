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
