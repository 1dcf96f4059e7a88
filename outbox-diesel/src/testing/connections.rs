//! What `#[outbox::test]` can hand a test: [`TestConnection`] (sync connections and r2d2
//! pools) and [`AsyncTestConnection`] (diesel-async connections and their pools, and every
//! sync one).

use super::{DatabaseError, TestDatabase};

/// The environment variable `#[outbox::test]` reads the PostgreSQL server's URL from.
pub const POSTGRES_URL_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
/// The environment variable `#[outbox::test]` reads the MySQL/MariaDB server's URL from.
pub const MYSQL_URL_VAR: &str = "OUTBOX_TEST_MYSQL_URL";

/// A connection or pool a synchronous `#[outbox::test]` can open on its fresh database.
///
/// Implemented for `PgConnection`, `MysqlConnection`, `SqliteConnection` and (feature
/// `r2d2`) `r2d2::Pool<ConnectionManager<_>>` of those; implement it for a pool of your own.
#[diagnostic::on_unimplemented(
    message = "`#[outbox::test]` cannot open `{Self}` for a synchronous test",
    label = "not a connection or pool a sync test can be given",
    note = "a sync test takes `&mut PgConnection`, `&mut MysqlConnection`, `&mut SqliteConnection` or an r2d2 `Pool` of one; for a diesel-async connection or pool make the test an `async fn`"
)]
pub trait TestConnection: Sized {
    /// The environment variable naming the database server (`None`: a SQLite file).
    const URL_VAR: Option<&'static str>;

    /// Opens one on `db`.
    fn open(db: &TestDatabase) -> Result<Self, DatabaseError>;
}

/// A connection or pool an `async fn` `#[outbox::test]` can open on its fresh database:
/// `AsyncPgConnection`, `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`,
/// diesel-async's deadpool and bb8 pools of those, and the [`TestConnection`]s above.
#[diagnostic::on_unimplemented(
    message = "`#[outbox::test]` cannot open `{Self}`",
    label = "not a connection or pool a test can be given",
    note = "a test takes a Diesel connection (`&mut PgConnection`, `&mut AsyncPgConnection`, ...) or a pool of them (r2d2; deadpool or bb8 in an `async fn`)"
)]
pub trait AsyncTestConnection: Sized {
    /// The environment variable naming the database server (`None`: a SQLite file).
    const URL_VAR: Option<&'static str>;

    /// Opens one on `db`.
    fn open(db: &TestDatabase) -> impl Future<Output = Result<Self, DatabaseError>> + Send;
}

/// Every sync connection or pool is also given to `async fn` tests (implemented one by one,
/// not for every `TestConnection`, so that a type neither trait knows is reported once).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
macro_rules! also_async {
    ($ty:ty) => {
        fn open(db: &TestDatabase) -> impl Future<Output = Result<Self, DatabaseError>> + Send {
            std::future::ready(<$ty as TestConnection>::open(db))
        }
    };
}

macro_rules! sync_connection {
    ($feature:literal, $conn:ty, $var:expr) => {
        #[cfg(feature = $feature)]
        impl TestConnection for $conn {
            const URL_VAR: Option<&'static str> = $var;

            fn open(db: &TestDatabase) -> Result<Self, DatabaseError> {
                db.connect()
            }
        }

        #[cfg(feature = $feature)]
        impl AsyncTestConnection for $conn {
            const URL_VAR: Option<&'static str> = $var;
            also_async!($conn);
        }
    };
}

sync_connection!("postgres", diesel::PgConnection, Some(POSTGRES_URL_VAR));
sync_connection!("mysql", diesel::MysqlConnection, Some(MYSQL_URL_VAR));
sync_connection!("sqlite", diesel::SqliteConnection, None);

#[cfg(feature = "r2d2")]
impl<C> TestConnection for diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<C>>
where
    C: TestConnection + diesel::r2d2::R2D2Connection + 'static,
{
    const URL_VAR: Option<&'static str> = C::URL_VAR;

    fn open(db: &TestDatabase) -> Result<Self, DatabaseError> {
        diesel::r2d2::Pool::builder()
            .max_size(4)
            .build(diesel::r2d2::ConnectionManager::new(db.url()))
            .map_err(|e| DatabaseError::Pool(e.into()))
    }
}

#[cfg(feature = "r2d2")]
impl<C> AsyncTestConnection for diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<C>>
where
    C: TestConnection + diesel::r2d2::R2D2Connection + 'static,
{
    const URL_VAR: Option<&'static str> = C::URL_VAR;
    also_async!(Self);
}

#[cfg(feature = "async")]
mod async_impls {
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;

    use super::*;

    macro_rules! async_connection {
        ($feature:literal, $conn:ty, $var:expr) => {
            #[cfg(feature = $feature)]
            impl AsyncTestConnection for $conn {
                const URL_VAR: Option<&'static str> = $var;

                async fn open(db: &TestDatabase) -> Result<Self, DatabaseError> {
                    db.connect_async().await
                }
            }
        };
    }

    async_connection!(
        "postgres",
        diesel_async::AsyncPgConnection,
        Some(POSTGRES_URL_VAR)
    );
    async_connection!(
        "mysql",
        diesel_async::AsyncMysqlConnection,
        Some(MYSQL_URL_VAR)
    );
    async_connection!(
        "sqlite",
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
        None
    );

    macro_rules! async_pools {
        ($feature:literal, $conn:ty) => {
            #[cfg(feature = $feature)]
            impl AsyncTestConnection for diesel_async::pooled_connection::deadpool::Pool<$conn> {
                const URL_VAR: Option<&'static str> = <$conn as AsyncTestConnection>::URL_VAR;

                async fn open(db: &TestDatabase) -> Result<Self, DatabaseError> {
                    let manager = AsyncDieselConnectionManager::<$conn>::new(db.url());
                    diesel_async::pooled_connection::deadpool::Pool::builder(manager)
                        .max_size(4)
                        .build()
                        .map_err(|e| DatabaseError::Pool(e.into()))
                }
            }

            #[cfg(feature = $feature)]
            impl AsyncTestConnection for diesel_async::pooled_connection::bb8::Pool<$conn> {
                const URL_VAR: Option<&'static str> = <$conn as AsyncTestConnection>::URL_VAR;

                async fn open(db: &TestDatabase) -> Result<Self, DatabaseError> {
                    let manager = AsyncDieselConnectionManager::<$conn>::new(db.url());
                    diesel_async::pooled_connection::bb8::Pool::builder()
                        .max_size(4)
                        .build(manager)
                        .await
                        .map_err(|e| DatabaseError::Pool(e.into()))
                }
            }
        };
    }

    async_pools!("postgres", diesel_async::AsyncPgConnection);
    async_pools!("mysql", diesel_async::AsyncMysqlConnection);
}

/// The fresh database of a test whose parameter is a `T`: on the server `env` (or `T`'s
/// default variable) names, or a SQLite file; the outbox migrated, then the application's
/// migrations in `migrations` (a directory of Diesel migrations) applied.
fn database(
    url_var: Option<&'static str>,
    env: Option<&str>,
    migrations: Option<&str>,
) -> Result<TestDatabase, DatabaseError> {
    let db = match url_var {
        None => TestDatabase::sqlite()?,
        Some(default) => TestDatabase::from_env(env.unwrap_or(default))?,
    };
    if let Some(dir) = migrations {
        db.migrate_dir(dir)?;
    }
    Ok(db)
}

/// The fresh database and the connection of a sync test whose parameter is a `T`. Not
/// public API: what `#[outbox::test]` generates calls it.
#[doc(hidden)]
pub fn sync_setup<T: TestConnection>(
    env: Option<&str>,
    migrations: Option<&str>,
) -> (TestDatabase, T) {
    let db =
        database(T::URL_VAR, env, migrations).unwrap_or_else(|e| panic!("#[outbox::test]: {e}"));
    let conn = T::open(&db).unwrap_or_else(|e| panic!("#[outbox::test]: {e}"));
    (db, conn)
}

/// [`sync_setup`] for an `async fn` test. Not public API. (A boxed future, so that only this
/// call checks `T`'s bound: a type the kit cannot open is reported once.)
#[doc(hidden)]
#[allow(clippy::type_complexity)]
pub fn async_setup<T: AsyncTestConnection + 'static>(
    env: Option<&'static str>,
    migrations: Option<&'static str>,
) -> std::pin::Pin<Box<dyn Future<Output = (TestDatabase, T)>>> {
    Box::pin(async move {
        let db = database(T::URL_VAR, env, migrations)
            .unwrap_or_else(|e| panic!("#[outbox::test]: {e}"));
        let conn = T::open(&db)
            .await
            .unwrap_or_else(|e| panic!("#[outbox::test]: {e}"));
        (db, conn)
    })
}

/// The runtime an async `#[outbox::test]` runs on. Not public API.
#[doc(hidden)]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("#[outbox::test]: cannot start a Tokio runtime: {e}"))
}
