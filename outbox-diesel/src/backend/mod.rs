//! What differs between PostgreSQL, MySQL/MariaDB and SQLite: the insert statement, the column
//! types and the migrations. The trait is here; each backend's implementation is in a module of
//! its own, and the multi-row `INSERT` they share in [`insert`].

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};
use std::time::Duration;

use outbox_core::NewMessage;

use crate::migrations::Migration;

/// The outbox table. Fixed, so that no SQL is ever built from a configurable string.
pub(crate) const OUTBOX_TABLE: &str = "outbox_events";

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
/// Rows per `INSERT`: 11 binds each keeps a statement far below every backend's bind limit
/// (SQLite's 32,766 is the lowest).
pub(crate) const ROWS_PER_INSERT: usize = 1_000;

/// A Diesel backend the outbox can write to: PostgreSQL, MySQL/MariaDB or SQLite.
///
/// Sealed: implemented for `diesel::pg::Pg`, `diesel::mysql::Mysql` and `diesel::sqlite::Sqlite`
/// behind the features of the same names.
#[diagnostic::on_unimplemented(
    message = "the outbox does not support the Diesel backend `{Self}`",
    note = "supported backends: PostgreSQL (feature `postgres`), MySQL/MariaDB (feature `mysql`), SQLite (feature `sqlite`)"
)]
pub trait OutboxBackend: Backend + private::Sealed {
    /// A name for messages: `"postgres"`, `"mysql"` or `"sqlite"`.
    #[doc(hidden)]
    const NAME: &'static str;

    /// The migrations of this backend, oldest first.
    #[doc(hidden)]
    const MIGRATIONS: &'static [Migration];

    /// A statement that wakes relays, run (throttled, see [`crate::notify`]) in writing
    /// transactions; `None` where the backend has no notifications.
    #[doc(hidden)]
    const NOTIFY_SQL: Option<&'static str> = None;

    /// What this backend computes from the messages of one `INSERT` before binding them (kept
    /// alive for the statement's binds).
    #[doc(hidden)]
    type Rows<'a>: Send;

    /// Computes the [`OutboxBackend::Rows`] of `messages`.
    #[doc(hidden)]
    fn rows(messages: &[NewMessage]) -> Self::Rows<'_>;

    /// Writes the `INSERT` of `messages` (with their `rows`), binding its values; with
    /// `keep_existing` it ends with [`OutboxBackend::KEEP_EXISTING`].
    #[doc(hidden)]
    fn walk_insert<'a, 'b>(
        messages: &'b [NewMessage],
        rows: &'b Self::Rows<'a>,
        keep_existing: bool,
        out: AstPass<'_, 'b, Self>,
    ) -> diesel::QueryResult<()>;

    /// Writes `messages` with as few `INSERT`s as the bind limits allow.
    #[doc(hidden)]
    fn write<C: diesel::Connection<Backend = Self>>(
        conn: &mut C,
        messages: &[NewMessage],
    ) -> diesel::QueryResult<()> {
        Self::write_as(conn, messages, false)
    }

    /// [`OutboxBackend::write`]; with `keep_existing`, rows whose id is already stored are
    /// left as they are (see [`crate::order`]).
    #[doc(hidden)]
    fn write_as<C: diesel::Connection<Backend = Self>>(
        conn: &mut C,
        messages: &[NewMessage],
        keep_existing: bool,
    ) -> diesel::QueryResult<()>;

    /// The end of an `INSERT` that skips rows whose id is already stored.
    #[doc(hidden)]
    const KEEP_EXISTING: &'static str;

    /// Applies the pending migrations (see [`crate::migrations::run`]).
    #[doc(hidden)]
    fn migrate<C: diesel::connection::LoadConnection<Backend = Self>>(
        conn: &mut C,
    ) -> diesel::QueryResult<Vec<&'static str>>;

    /// Inserts `(consumer, key)` into the inbox unless it is there: one row changed if it was
    /// new, none if it was a duplicate.
    #[doc(hidden)]
    fn inbox_claim<'a>(consumer: &'a str, key: &'a str) -> BoxedSqlQuery<'a, Self, SqlQuery>;

    /// Deletes at most `limit` inbox rows processed more than `older_than` ago, oldest first.
    #[doc(hidden)]
    fn inbox_cleanup(older_than: Duration, limit: usize) -> BoxedSqlQuery<'static, Self, SqlQuery>;

    /// Runs one statement built by this trait; returns the rows it changed.
    #[doc(hidden)]
    fn execute<C: diesel::Connection<Backend = Self>>(
        conn: &mut C,
        query: BoxedSqlQuery<'_, Self, SqlQuery>,
    ) -> diesel::QueryResult<usize>;

    /// The async twin of [`OutboxBackend::execute`].
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn execute_async<C: diesel_async::AsyncConnection<Backend = Self>>(
        conn: &mut C,
        query: BoxedSqlQuery<'_, Self, SqlQuery>,
    ) -> impl Future<Output = diesel::QueryResult<usize>> + Send;

    /// The async twin of [`OutboxBackend::write`].
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn write_async<C: diesel_async::AsyncConnection<Backend = Self>>(
        conn: &mut C,
        messages: &[NewMessage],
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send {
        Self::write_as_async(conn, messages, false)
    }

    /// The async twin of [`OutboxBackend::write_as`].
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn write_as_async<C: diesel_async::AsyncConnection<Backend = Self>>(
        conn: &mut C,
        messages: &[NewMessage],
        keep_existing: bool,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;

    /// The async twin of [`OutboxBackend::migrate`].
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn migrate_async<C: diesel_async::AsyncConnection<Backend = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = diesel::QueryResult<Vec<&'static str>>> + Send;

    /// The versions of the outbox migrations not applied on `conn`'s database (see
    /// [`crate::migrations::unapplied_async`]).
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn unapplied_async<C: diesel_async::AsyncConnection<Backend = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = diesel::QueryResult<Vec<&'static str>>> + Send;

    /// Loads outbox rows with `sql` (a `SELECT` of [`crate::testing`]'s columns).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    fn testing_load<C: diesel::connection::LoadConnection<Backend = Self>>(
        conn: &mut C,
        sql: String,
    ) -> diesel::QueryResult<Vec<crate::testing::Row>>;

    /// The async twin of [`OutboxBackend::testing_load`].
    #[cfg(all(feature = "testing", feature = "async"))]
    #[doc(hidden)]
    fn testing_load_async<C: diesel_async::AsyncConnection<Backend = Self>>(
        conn: &mut C,
        sql: String,
    ) -> impl Future<Output = diesel::QueryResult<Vec<crate::testing::Row>>> + Send;
}

/// The parts of [`OutboxBackend`] whose code is the same for every backend, but which need a
/// concrete backend for Diesel's bounds to hold.
#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
macro_rules! backend_ops {
    () => {
        fn write_as<C: diesel::Connection<Backend = Self>>(
            conn: &mut C,
            messages: &[NewMessage],
            keep_existing: bool,
        ) -> diesel::QueryResult<()> {
            use diesel::RunQueryDsl;
            for insert in $crate::backend::insert::inserts::<Self>(messages, keep_existing) {
                insert.execute(conn)?;
            }
            if let Some(notify) = $crate::backend::insert::notify::<Self>() {
                notify.execute(conn)?;
            }
            Ok(())
        }

        fn execute<C: diesel::Connection<Backend = Self>>(
            conn: &mut C,
            query: BoxedSqlQuery<'_, Self, SqlQuery>,
        ) -> diesel::QueryResult<usize> {
            diesel::RunQueryDsl::execute(query, conn)
        }

        #[cfg(feature = "async")]
        async fn execute_async<C: diesel_async::AsyncConnection<Backend = Self>>(
            conn: &mut C,
            query: BoxedSqlQuery<'_, Self, SqlQuery>,
        ) -> diesel::QueryResult<usize> {
            diesel_async::RunQueryDsl::execute(query, conn).await
        }

        fn migrate<C: diesel::connection::LoadConnection<Backend = Self>>(
            conn: &mut C,
        ) -> diesel::QueryResult<Vec<&'static str>> {
            crate::migrations::run_sync::<C>(conn, Self::MIGRATIONS)
        }

        #[cfg(feature = "async")]
        async fn write_as_async<C: diesel_async::AsyncConnection<Backend = Self>>(
            conn: &mut C,
            messages: &[NewMessage],
            keep_existing: bool,
        ) -> diesel::QueryResult<()> {
            use diesel_async::RunQueryDsl;
            for insert in $crate::backend::insert::inserts::<Self>(messages, keep_existing) {
                insert.execute(conn).await?;
            }
            if let Some(notify) = $crate::backend::insert::notify::<Self>() {
                notify.execute(conn).await?;
            }
            Ok(())
        }

        #[cfg(feature = "async")]
        async fn migrate_async<C: diesel_async::AsyncConnection<Backend = Self>>(
            conn: &mut C,
        ) -> diesel::QueryResult<Vec<&'static str>> {
            crate::migrations::run_async_impl::<C>(conn, Self::MIGRATIONS).await
        }

        #[cfg(feature = "async")]
        async fn unapplied_async<C: diesel_async::AsyncConnection<Backend = Self>>(
            conn: &mut C,
        ) -> diesel::QueryResult<Vec<&'static str>> {
            let pending = crate::migrations::pending_async::<C>(conn, Self::MIGRATIONS).await?;
            Ok(pending.into_iter().map(|m| m.version).collect())
        }

        #[cfg(feature = "testing")]
        fn testing_load<C: diesel::connection::LoadConnection<Backend = Self>>(
            conn: &mut C,
            sql: String,
        ) -> diesel::QueryResult<Vec<crate::testing::Row>> {
            diesel::RunQueryDsl::load(diesel::sql_query(sql), conn)
        }

        #[cfg(all(feature = "testing", feature = "async"))]
        async fn testing_load_async<C: diesel_async::AsyncConnection<Backend = Self>>(
            conn: &mut C,
            sql: String,
        ) -> diesel::QueryResult<Vec<crate::testing::Row>> {
            diesel_async::RunQueryDsl::load(diesel::sql_query(sql), conn).await
        }
    };
}

/// Binds the columns every backend stores the same way, from `aggregate_type` to `shard`, each
/// after a `", "`; `$pre`/`$post` wrap the two JSON placeholders (PostgreSQL casts them).
#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
macro_rules! bind_common {
    ($out:expr, $m:expr, $headers:expr, $pre:literal, $post:literal) => {{
        use diesel::sql_types::{Integer, Nullable, SmallInt, Text};
        let out = $out;
        let m = $m;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&m.aggregate_type)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&m.aggregate_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&m.event_type)?;
        out.push_sql(", ");
        out.push_bind_param::<Integer, _>(&m.event_version)?;
        out.push_sql(concat!(", ", $pre));
        out.push_bind_param::<Text, _>(&m.payload)?;
        out.push_sql(concat!($post, ", ", $pre));
        out.push_bind_param::<Text, _>($headers)?;
        out.push_sql(concat!($post, ", "));
        out.push_bind_param::<Nullable<Text>, _>(&m.topic)?;
        out.push_sql(", ");
        out.push_bind_param::<SmallInt, _>(&m.shard)?;
    }};
}

// `text_id` first: its macro is used by the modules after it.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
#[macro_use]
pub(crate) mod text_id;

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
#[macro_use]
pub(crate) mod insert;

pub(crate) mod private {
    pub trait Sealed {}
}

/// The longest retention window the inbox cleanup computes with: a century, so that
/// `now - window` stays within every backend's date range (MySQL's `DATETIME` starts with the
/// year 1000).
#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
const MAX_WINDOW: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
pub(crate) fn clamp(window: Duration) -> Duration {
    window.min(MAX_WINDOW)
}

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
pub(crate) fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}
