//! What differs between PostgreSQL, MySQL/MariaDB and SQLite: the insert statement, the column
//! types and the migrations.

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, BoxedSqlQuery, QueryFragment, QueryId, SqlQuery};
use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Nullable, SmallInt, Text};
use outbox_core::NewMessage;

use crate::migrations::Migration;

/// The outbox table. Fixed, so that no SQL is ever built from a configurable string.
pub(crate) const OUTBOX_TABLE: &str = "outbox_events";

/// Columns written on insert, in bind order.
const INSERT_COLUMNS: &str = "id, aggregate_type, aggregate_id, event_type, event_version, \
     payload, headers, topic, shard, created_at, available_at";

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

    /// What this backend computes from a message before binding it (kept alive for the
    /// statement's binds).
    #[doc(hidden)]
    type Row: Send;

    /// Computes a message's [`OutboxBackend::Row`].
    #[doc(hidden)]
    fn row(message: &NewMessage) -> Self::Row;

    /// Writes one row of the `INSERT`, `(placeholder, …)`, binding its values.
    #[doc(hidden)]
    fn walk_row<'b>(
        message: &'b NewMessage,
        row: &'b Self::Row,
        out: &mut AstPass<'_, 'b, Self>,
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
}

/// The parts of [`OutboxBackend`] whose code is the same for every backend, but which need a
/// concrete backend for Diesel's bounds to hold.
macro_rules! backend_ops {
    () => {
        fn write_as<C: diesel::Connection<Backend = Self>>(
            conn: &mut C,
            messages: &[NewMessage],
            keep_existing: bool,
        ) -> diesel::QueryResult<()> {
            use diesel::RunQueryDsl;
            for chunk in messages.chunks(ROWS_PER_INSERT) {
                InsertMessages::<Self>::new(chunk)
                    .keep_existing(keep_existing)
                    .execute(conn)?;
            }
            if let Some(sql) = Self::NOTIFY_SQL.filter(|_| crate::notify::due()) {
                diesel::sql_query(sql).execute(conn)?;
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
            for chunk in messages.chunks(ROWS_PER_INSERT) {
                InsertMessages::<Self>::new(chunk)
                    .keep_existing(keep_existing)
                    .execute(conn)
                    .await?;
            }
            if let Some(sql) = Self::NOTIFY_SQL.filter(|_| crate::notify::due()) {
                diesel::sql_query(sql).execute(conn).await?;
            }
            Ok(())
        }

        #[cfg(feature = "async")]
        async fn migrate_async<C: diesel_async::AsyncConnection<Backend = Self>>(
            conn: &mut C,
        ) -> diesel::QueryResult<Vec<&'static str>> {
            crate::migrations::run_async_impl::<C>(conn, Self::MIGRATIONS).await
        }
    };
}

mod private {
    pub trait Sealed {}
}

/// Statements of up to this many rows keep their prepared statement in Diesel's per-connection
/// cache (one entry per row count): a transaction's `INSERT` is then parsed and planned once
/// per connection instead of once per transaction. Larger ones are prepared each time.
const CACHED_ROWS: usize = 16;

/// `INSERT INTO outbox_events (...) VALUES (row), (row), ...` as a Diesel query. The SQL holds
/// only placeholders (every value travels as a bind parameter) and depends only on the number
/// of rows, so Diesel may cache it by its SQL; `diesel::sql_query` never is.
pub(crate) struct InsertMessages<'a, DB: OutboxBackend> {
    messages: &'a [NewMessage],
    rows: Vec<DB::Row>,
    keep_existing: bool,
}

impl<'a, DB: OutboxBackend> InsertMessages<'a, DB> {
    pub(crate) fn new(messages: &'a [NewMessage]) -> Self {
        InsertMessages {
            messages,
            rows: messages.iter().map(DB::row).collect(),
            keep_existing: false,
        }
    }

    /// Skip rows whose id is already stored (`ON CONFLICT (id) DO NOTHING` or MySQL's twin).
    pub(crate) fn keep_existing(mut self, keep: bool) -> Self {
        self.keep_existing = keep;
        self
    }
}

impl<DB: OutboxBackend> QueryFragment<DB> for InsertMessages<'_, DB> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> diesel::QueryResult<()> {
        if self.messages.len() > CACHED_ROWS {
            out.unsafe_to_cache_prepared();
        }
        out.push_sql("INSERT INTO ");
        out.push_sql(OUTBOX_TABLE);
        out.push_sql(" (");
        out.push_sql(INSERT_COLUMNS);
        out.push_sql(") VALUES ");
        for (i, (message, row)) in self.messages.iter().zip(&self.rows).enumerate() {
            if i > 0 {
                out.push_sql(", ");
            }
            DB::walk_row(message, row, &mut out)?;
        }
        if self.keep_existing {
            out.push_sql(DB::KEEP_EXISTING);
        }
        Ok(())
    }
}

impl<DB: OutboxBackend> QueryId for InsertMessages<'_, DB> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: OutboxBackend, Conn> diesel::RunQueryDsl<Conn> for InsertMessages<'_, DB> {}

/// Binds the columns every backend stores the same way, from `aggregate_type` to `shard`, each
/// after a `", "`; `$pre`/`$post` wrap the two JSON placeholders (PostgreSQL casts them).
macro_rules! bind_common {
    ($out:expr, $m:expr, $headers:expr, $pre:literal, $post:literal) => {{
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

/// One row for MySQL and SQLite: the id as text, then the common columns, then `created_at`
/// and `available_at` (the same value) as `$ts`.
macro_rules! text_id_row {
    ($m:expr, $row:expr, $out:expr, $ts:ty) => {{
        let out = $out;
        out.push_sql("(");
        out.push_bind_param::<Text, _>(&$row.id)?;
        bind_common!(&mut *out, $m, &$row.headers, "", "");
        out.push_sql(", ");
        out.push_bind_param::<$ts, _>(&$row.at)?;
        out.push_sql(", ");
        out.push_bind_param::<$ts, _>(&$row.at)?;
        out.push_sql(")");
        Ok(())
    }};
}

/// The computed values of a row for MySQL and SQLite.
#[doc(hidden)]
pub struct TextIdRow<T> {
    id: String,
    headers: String,
    at: T,
}

#[cfg(feature = "postgres_backend")]
impl private::Sealed for diesel::pg::Pg {}

#[cfg(feature = "postgres_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl OutboxBackend for diesel::pg::Pg {
    const NAME: &'static str = "postgres";
    const KEEP_EXISTING: &'static str = " ON CONFLICT (id) DO NOTHING";
    const NOTIFY_SQL: Option<&'static str> = Some("SELECT pg_notify('outbox_events', '')");
    backend_ops!();
    const MIGRATIONS: &'static [Migration] = crate::migrations::POSTGRES;

    fn inbox_claim<'a>(consumer: &'a str, key: &'a str) -> BoxedSqlQuery<'a, Self, SqlQuery> {
        diesel::sql_query(
            "INSERT INTO outbox_inbox (consumer, message_id) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING",
        )
        .into_boxed()
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(key)
    }

    fn inbox_cleanup(older_than: Duration, limit: usize) -> BoxedSqlQuery<'static, Self, SqlQuery> {
        // The key columns, not `ctid`: a row updated meanwhile would move.
        diesel::sql_query(
            "DELETE FROM outbox_inbox i USING ( \
                 SELECT consumer, message_id FROM outbox_inbox \
                 WHERE processed_at < now() - make_interval(secs => $1) \
                 ORDER BY processed_at LIMIT $2) old \
             WHERE i.consumer = old.consumer AND i.message_id = old.message_id",
        )
        .into_boxed()
        .bind::<diesel::sql_types::Double, _>(clamp(older_than).as_secs_f64())
        .bind::<BigInt, _>(limit_of(limit))
    }

    type Row = String;

    fn row(message: &NewMessage) -> String {
        message.headers_json()
    }

    fn walk_row<'b>(
        m: &'b NewMessage,
        headers: &'b String,
        out: &mut AstPass<'_, 'b, Self>,
    ) -> diesel::QueryResult<()> {
        use diesel::sql_types::{Timestamptz, Uuid};
        out.push_sql("(");
        out.push_bind_param::<Uuid, _>(&m.id)?;
        bind_common!(&mut *out, m, headers, "CAST(", " AS jsonb)");
        out.push_sql(", ");
        out.push_bind_param::<Timestamptz, _>(&m.created_at)?;
        out.push_sql(", ");
        out.push_bind_param::<Timestamptz, _>(&m.created_at)?;
        out.push_sql(")");
        Ok(())
    }
}

#[cfg(feature = "mysql_backend")]
impl private::Sealed for diesel::mysql::Mysql {}

#[cfg(feature = "mysql_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
impl OutboxBackend for diesel::mysql::Mysql {
    const NAME: &'static str = "mysql";
    const KEEP_EXISTING: &'static str = " ON DUPLICATE KEY UPDATE id = id";
    backend_ops!();
    const MIGRATIONS: &'static [Migration] = crate::migrations::MYSQL;

    fn inbox_claim<'a>(consumer: &'a str, key: &'a str) -> BoxedSqlQuery<'a, Self, SqlQuery> {
        // `processed_at` is given, not defaulted: `CURRENT_TIMESTAMP` follows the session's
        // time zone, the outbox stores UTC.
        diesel::sql_query(
            "INSERT IGNORE INTO outbox_inbox (consumer, message_id, processed_at) \
             VALUES (?, ?, UTC_TIMESTAMP(6))",
        )
        .into_boxed()
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(key)
    }

    fn inbox_cleanup(older_than: Duration, limit: usize) -> BoxedSqlQuery<'static, Self, SqlQuery> {
        diesel::sql_query(
            "DELETE FROM outbox_inbox \
             WHERE processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
             ORDER BY processed_at LIMIT ?",
        )
        .into_boxed()
        .bind::<BigInt, _>(i64::try_from(clamp(older_than).as_micros()).unwrap_or(i64::MAX))
        .bind::<BigInt, _>(limit_of(limit))
    }

    type Row = TextIdRow<chrono::NaiveDateTime>;

    fn row(m: &NewMessage) -> Self::Row {
        TextIdRow {
            id: m.id.hyphenated().to_string(),
            headers: m.headers_json(),
            at: m.created_at.naive_utc(),
        }
    }

    fn walk_row<'b>(
        m: &'b NewMessage,
        row: &'b Self::Row,
        out: &mut AstPass<'_, 'b, Self>,
    ) -> diesel::QueryResult<()> {
        text_id_row!(m, row, out, diesel::sql_types::Datetime)
    }
}

#[cfg(feature = "sqlite")]
impl private::Sealed for diesel::sqlite::Sqlite {}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl OutboxBackend for diesel::sqlite::Sqlite {
    const NAME: &'static str = "sqlite";
    const KEEP_EXISTING: &'static str = " ON CONFLICT (id) DO NOTHING";
    backend_ops!();
    const MIGRATIONS: &'static [Migration] = crate::migrations::SQLITE;

    fn inbox_claim<'a>(consumer: &'a str, key: &'a str) -> BoxedSqlQuery<'a, Self, SqlQuery> {
        diesel::sql_query("INSERT OR IGNORE INTO outbox_inbox (consumer, message_id) VALUES (?, ?)")
            .into_boxed()
            .bind::<Text, _>(consumer)
            .bind::<Text, _>(key)
    }

    fn inbox_cleanup(older_than: Duration, limit: usize) -> BoxedSqlQuery<'static, Self, SqlQuery> {
        let now = outbox_core::now_micros();
        let cutoff = chrono::Duration::from_std(clamp(older_than))
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .unwrap_or(now);
        diesel::sql_query(
            "DELETE FROM outbox_inbox WHERE rowid IN ( \
                 SELECT rowid FROM outbox_inbox WHERE processed_at < ? \
                 ORDER BY processed_at LIMIT ?)",
        )
        .into_boxed()
        .bind::<Text, _>(sqlite_timestamp(cutoff))
        .bind::<BigInt, _>(limit_of(limit))
    }

    type Row = TextIdRow<String>;

    fn row(m: &NewMessage) -> Self::Row {
        TextIdRow {
            id: m.id.hyphenated().to_string(),
            headers: m.headers_json(),
            at: sqlite_timestamp(m.created_at),
        }
    }

    fn walk_row<'b>(
        m: &'b NewMessage,
        row: &'b Self::Row,
        out: &mut AstPass<'_, 'b, Self>,
    ) -> diesel::QueryResult<()> {
        text_id_row!(m, row, out, Text)
    }
}

/// SQLite has no timestamp type: the outbox stores UTC as `YYYY-MM-DD HH:MM:SS.ffffff`, always
/// with six fraction digits so that text order is time order. Diesel reads it back as a
/// `Timestamp`.
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite_timestamp(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
}

/// The longest retention window the inbox cleanup computes with: a century, so that
/// `now - window` stays within every backend's date range (MySQL's `DATETIME` starts with the
/// year 1000).
const MAX_WINDOW: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn clamp(window: Duration) -> Duration {
    window.min(MAX_WINDOW)
}

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}
