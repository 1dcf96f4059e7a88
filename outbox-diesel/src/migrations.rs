//! The outbox's schema migrations, embedded, and a runner for sync and async connections.
//!
//! The SQL lives in `migrations/{postgres,mysql,sqlite}/<version>_<name>/{up,down}.sql` at the
//! root of the repository, in Diesel's migration layout, so the Diesel CLI can run the same
//! files (`diesel migration run --migration-dir migrations/postgres`). The runner here records
//! applied versions in Diesel's own `__diesel_schema_migrations` table, so the two agree on
//! what has run, and needs no `diesel_migrations` dependency.

use diesel::QueryableByName;

use crate::OutboxBackend;
use diesel::sql_types::Text;

/// One embedded migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The version, as Diesel derives it from the folder name (the digits before `_`).
    pub version: &'static str,
    /// The name after the version, e.g. `"create_outbox"`.
    pub name: &'static str,
    /// The SQL that applies it.
    pub up: &'static str,
    /// The SQL that reverts it.
    pub down: &'static str,
}

macro_rules! embed {
    ($backend:literal: $($version:literal _ $name:literal),* $(,)?) => {
        &[$(Migration {
            version: $version,
            name: $name,
            up: include_str!(concat!("../../migrations/", $backend, "/", $version, "_", $name, "/up.sql")),
            down: include_str!(concat!("../../migrations/", $backend, "/", $version, "_", $name, "/down.sql")),
        }),*]
    };
}

#[cfg(feature = "postgres_backend")]
pub(crate) const POSTGRES: &[Migration] = embed!("postgres":
    "20261129000001" _ "create_outbox",
    "20261129000002" _ "relay_leases",
    "20261130000001" _ "relay_sessions",
    "20261130000004" _ "row_checks",
    "20261130000005" _ "insert_defaults",
);
#[cfg(feature = "mysql_backend")]
pub(crate) const MYSQL: &[Migration] = embed!("mysql":
    "20261129000001" _ "create_outbox",
    "20261129000002" _ "relay_leases",
    "20261130000001" _ "relay_sessions",
    "20261130000004" _ "row_checks",
    "20261130000005" _ "insert_defaults",
);
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE: &[Migration] = embed!("sqlite":
    "20261129000001" _ "create_outbox",
    "20261129000002" _ "relay_leases",
    "20261130000001" _ "relay_sessions",
    "20261130000004" _ "row_checks",
    "20261130000005" _ "insert_defaults",
);

/// A row of `__diesel_schema_migrations`. Public only because the runner's bounds name it.
#[doc(hidden)]
#[derive(QueryableByName)]
pub struct AppliedVersion {
    #[diesel(sql_type = Text)]
    version: String,
}

const APPLIED_SQL: &str = "SELECT version FROM __diesel_schema_migrations";

/// The statement that records `version` as applied. `version` is one of our own constants
/// (checked to be digits), never input.
fn record_sql(version: &str) -> String {
    debug_assert!(version.bytes().all(|b| b.is_ascii_digit()));
    format!("INSERT INTO __diesel_schema_migrations (version) VALUES ('{version}')")
}

fn pending<'m>(all: &'m [Migration], applied: &[AppliedVersion]) -> Vec<&'m Migration> {
    all.iter()
        .filter(|m| !applied.iter().any(|a| a.version == m.version))
        .collect()
}

/// The embedded migrations of backend `DB`, oldest first: their SQL, for tools that apply
/// migrations their own way.
///
/// ```
/// let all = outbox_diesel::migrations::list::<diesel::sqlite::Sqlite>();
/// assert!(all[0].up.contains("CREATE TABLE outbox_events"));
/// ```
pub fn list<DB: OutboxBackend>() -> &'static [Migration] {
    DB::MIGRATIONS
}

/// Applies the outbox migrations that have not run yet on this database, each in its own
/// transaction where the backend allows DDL in transactions (PostgreSQL, SQLite; MySQL commits
/// DDL implicitly). Returns the versions it applied, oldest first; running it again applies
/// nothing.
///
/// ```
/// # include!("doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::prelude::*;
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// let applied = outbox_diesel::migrations::run(&mut conn)?;
/// assert_eq!(applied[..2], ["20261129000001", "20261129000002"]);
/// assert_eq!(applied.len(), outbox_diesel::migrations::list::<diesel::sqlite::Sqlite>().len());
/// assert!(outbox_diesel::migrations::run(&mut conn)?.is_empty()); // idempotent
/// # Ok(())
/// # }
/// ```
pub fn run<C>(conn: &mut C) -> diesel::QueryResult<Vec<&'static str>>
where
    C: diesel::connection::LoadConnection<Backend: OutboxBackend>,
{
    <C::Backend as OutboxBackend>::migrate(conn)
}

/// The async twin of [`run`], for diesel-async connections (`AsyncPgConnection`,
/// `AsyncMysqlConnection`, a pooled one, or `SyncConnectionWrapper<SqliteConnection>`).
///
/// ```
/// # include!("doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::{AsyncConnection, sync_connection_wrapper::SyncConnectionWrapper};
/// let mut conn = SyncConnectionWrapper::<diesel::SqliteConnection>::establish(":memory:").await?;
/// let all = outbox_diesel::migrations::list::<diesel::sqlite::Sqlite>().len();
/// assert_eq!(outbox_diesel::migrations::run_async(&mut conn).await?.len(), all);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn run_async<C>(conn: &mut C) -> diesel::QueryResult<Vec<&'static str>>
where
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
{
    <C::Backend as OutboxBackend>::migrate_async(conn).await
}

pub(crate) fn run_sync<C>(
    conn: &mut C,
    migrations: &'static [Migration],
) -> diesel::QueryResult<Vec<&'static str>>
where
    C: diesel::connection::LoadConnection<Backend: 'static>,
    AppliedVersion: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    use diesel::RunQueryDsl;
    conn.batch_execute(diesel::migration::CREATE_MIGRATIONS_TABLE)?;
    let applied: Vec<AppliedVersion> = diesel::sql_query(APPLIED_SQL).load(conn)?;
    let mut done = Vec::new();
    for m in pending(migrations, &applied) {
        conn.transaction(|conn| {
            conn.batch_execute(m.up)?;
            conn.batch_execute(&record_sql(m.version))
        })?;
        done.push(m.version);
    }
    Ok(done)
}

#[cfg(feature = "async")]
pub(crate) async fn run_async_impl<C>(
    conn: &mut C,
    migrations: &'static [Migration],
) -> diesel::QueryResult<Vec<&'static str>>
where
    C: diesel_async::AsyncConnection<Backend: 'static>,
    AppliedVersion: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    use diesel_async::RunQueryDsl;
    conn.batch_execute(diesel::migration::CREATE_MIGRATIONS_TABLE)
        .await?;
    let applied: Vec<AppliedVersion> = diesel::sql_query(APPLIED_SQL).load(conn).await?;
    let mut done = Vec::new();
    for m in pending(migrations, &applied) {
        conn.transaction(async |conn| {
            conn.batch_execute(m.up).await?;
            conn.batch_execute(&record_sql(m.version)).await
        })
        .await?;
        done.push(m.version);
    }
    Ok(done)
}
