//! The outbox's schema migrations, embedded, and a runner for sync and async connections.
//!
//! The SQL lives in `outbox-diesel/migrations/{postgres,mysql,sqlite}/<version>_<name>/{up,down}.sql`,
//! inside this package (so the published crate carries the files it embeds), in Diesel's
//! migration layout, so the Diesel CLI can run the same files
//! (`diesel migration run --migration-dir outbox-diesel/migrations/postgres`). The runner here records
//! applied versions in Diesel's own `__diesel_schema_migrations` table, so the two agree on
//! what has run, and needs no `diesel_migrations` dependency.

use crate::OutboxBackend;

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

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
macro_rules! embed {
    ($backend:literal: $($version:literal _ $name:literal),* $(,)?) => {
        &[$(Migration {
            version: $version,
            name: $name,
            up: include_str!(concat!("../migrations/", $backend, "/", $version, "_", $name, "/up.sql")),
            down: include_str!(concat!("../migrations/", $backend, "/", $version, "_", $name, "/down.sql")),
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
    "20261201000001" _ "hot_claims",
    "20261201000002" _ "stream_positions",
    "20261202000001" _ "stream_dead_letters",
    "20261202000002" _ "stream_retention",
    "20261202000003" _ "stream_partitions",
    "20261203000001" _ "stream_partition_stats",
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

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
/// A row of `__diesel_schema_migrations`. Public only because the runner's bounds name it.
#[doc(hidden)]
#[derive(diesel::QueryableByName)]
pub struct AppliedVersion {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
const APPLIED_SQL: &str = "SELECT version FROM __diesel_schema_migrations";

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
/// The statement that records `version` as applied. `version` is one of our own constants
/// (checked to be digits), never input.
fn record_sql(version: &str) -> String {
    debug_assert!(version.bytes().all(|b| b.is_ascii_digit()));
    format!("INSERT INTO __diesel_schema_migrations (version) VALUES ('{version}')")
}

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
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

/// The versions of the outbox migrations not yet applied on this database, oldest first,
/// without applying any: what [`run_async`] would apply. It only reads; on a database that
/// never ran a migration (no `__diesel_schema_migrations` table) it fails with the server's
/// error.
///
/// ```
/// # include!("doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::{AsyncConnection, sync_connection_wrapper::SyncConnectionWrapper};
/// use outbox_diesel::migrations;
/// let mut conn = SyncConnectionWrapper::<diesel::SqliteConnection>::establish(":memory:").await?;
/// assert!(migrations::unapplied_async(&mut conn).await.is_err()); // nothing ever ran
/// migrations::run_async(&mut conn).await?;
/// assert!(migrations::unapplied_async(&mut conn).await?.is_empty());
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn unapplied_async<C>(conn: &mut C) -> diesel::QueryResult<Vec<&'static str>>
where
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
{
    <C::Backend as OutboxBackend>::unapplied_async(conn).await
}

#[cfg(any(
    feature = "postgres_backend",
    feature = "mysql_backend",
    feature = "sqlite"
))]
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

#[cfg(all(
    feature = "async",
    any(
        feature = "postgres_backend",
        feature = "mysql_backend",
        feature = "sqlite"
    )
))]
pub(crate) async fn run_async_impl<C>(
    conn: &mut C,
    migrations: &'static [Migration],
) -> diesel::QueryResult<Vec<&'static str>>
where
    C: diesel_async::AsyncConnection<Backend: 'static>,
    AppliedVersion: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    conn.batch_execute(diesel::migration::CREATE_MIGRATIONS_TABLE)
        .await?;
    let mut done = Vec::new();
    for m in pending_async(conn, migrations).await? {
        conn.transaction(async |conn| {
            conn.batch_execute(m.up).await?;
            conn.batch_execute(&record_sql(m.version)).await
        })
        .await?;
        done.push(m.version);
    }
    Ok(done)
}

#[cfg(all(
    feature = "async",
    any(
        feature = "postgres_backend",
        feature = "mysql_backend",
        feature = "sqlite"
    )
))]
/// The migrations of `migrations` not recorded as applied on `conn`'s database (it only reads;
/// an error where the migrations table does not exist).
pub(crate) async fn pending_async<C>(
    conn: &mut C,
    migrations: &'static [Migration],
) -> diesel::QueryResult<Vec<&'static Migration>>
where
    C: diesel_async::AsyncConnection<Backend: 'static>,
    AppliedVersion: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    use diesel_async::RunQueryDsl;
    let applied: Vec<AppliedVersion> = diesel::sql_query(APPLIED_SQL).load(conn).await?;
    Ok(pending(migrations, &applied))
}

#[cfg(test)]
mod tests {
    /// Every folder under `migrations/<backend>/` is embedded, in version order: a migration
    /// added on disk but not to the lists above would be shipped and never run.
    #[test]
    fn every_migration_folder_is_embedded() {
        let mut backends: Vec<(&str, &[super::Migration])> = Vec::new();
        #[cfg(feature = "postgres_backend")]
        backends.push(("postgres", super::POSTGRES));
        #[cfg(feature = "mysql_backend")]
        backends.push(("mysql", super::MYSQL));
        #[cfg(feature = "sqlite")]
        backends.push(("sqlite", super::SQLITE));
        for (backend, embedded) in backends {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(backend);
            let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            on_disk.sort();
            let listed: Vec<String> = embedded
                .iter()
                .map(|m| format!("{}_{}", m.version, m.name))
                .collect();
            assert_eq!(on_disk, listed, "{backend}");
        }
    }
}
