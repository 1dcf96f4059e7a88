//! [`TestDatabase`]: a fresh database per test, with the outbox migrated, dropped afterwards.

use std::fmt;

/// A database that exists for the life of this value: created fresh on a server (PostgreSQL,
/// MySQL/MariaDB) or as a temporary SQLite file, with the outbox's migrations applied, and
/// dropped (or deleted) when the value is dropped, also while a test panics.
///
/// One place maps the URL to a backend: `postgres://` or `postgresql://` (feature `postgres`),
/// `mysql://` (feature `mysql`), anything else a SQLite file (feature `sqlite`). The URL of a
/// server names a database the test may create others from (`CREATE DATABASE`); the new one
/// is called `outbox_t_kit_<process>_<n>`, so that tests run in parallel and in several
/// processes never share one.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::prelude::*;
/// use outbox_diesel::testing::TestDatabase;
///
/// let db = TestDatabase::sqlite()?;
/// let mut conn: SqliteConnection = db.connect()?;
/// diesel::sql_query("CREATE TABLE orders (id BIGINT PRIMARY KEY)").execute(&mut conn)?;
/// assert!(outbox_diesel::testing::written_events(&mut conn)?.is_empty()); // the outbox is there
/// let path = db.url().to_owned();
/// drop((conn, db));
/// assert!(!std::path::Path::new(&path).exists());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TestDatabase {
    url: String,
    name: String,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    #[cfg(feature = "postgres")]
    Postgres { admin: String },
    #[cfg(feature = "mysql")]
    Mysql { admin: String },
    #[cfg(feature = "sqlite")]
    Sqlite,
}

/// Why a [`TestDatabase`] could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum DatabaseError {
    /// The environment variable that names the server is not set.
    NoUrl {
        /// The variable.
        var: String,
    },
    /// The URL names a backend this build does not have (its feature is off).
    Unsupported {
        /// The URL's scheme.
        scheme: String,
    },
    /// The server could not be reached (the URL is left out: it may carry a password).
    Connect {
        /// What was being connected to.
        what: &'static str,
        /// Why.
        source: diesel::ConnectionError,
    },
    /// Creating the database or migrating it failed.
    Database(diesel::result::Error),
    /// The SQLite file, or the application's migrations directory, could not be read.
    Io(std::io::Error),
    /// One of the application's migrations failed.
    Migration {
        /// The migration's directory name.
        name: String,
        /// Why.
        source: diesel::result::Error,
    },
    /// A pool could not be built on the database.
    Pool(outbox_core::BoxError),
}

impl fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseError::NoUrl { var } => write!(
                f,
                "set {var} to the URL of a database server the tests may create databases on"
            ),
            DatabaseError::Unsupported { scheme } => write!(
                f,
                "no backend for `{scheme}` URLs in this build (enable the outbox feature `postgres`, `mysql` or `sqlite`)"
            ),
            DatabaseError::Connect { what, source } => {
                write!(f, "cannot connect to the {what}: {source}")
            }
            DatabaseError::Database(e) => write!(f, "preparing the test database failed: {e}"),
            DatabaseError::Io(e) => write!(f, "preparing the test database failed: {e}"),
            DatabaseError::Migration { name, source } => {
                write!(f, "the migration `{name}` failed: {source}")
            }
            DatabaseError::Pool(e) => write!(f, "building a pool on the test database failed: {e}"),
        }
    }
}

impl std::error::Error for DatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DatabaseError::Connect { source, .. } => Some(source),
            DatabaseError::Database(e) => Some(e),
            DatabaseError::Io(e) => Some(e),
            DatabaseError::Migration { source, .. } => Some(source),
            DatabaseError::Pool(e) => Some(&**e),
            _ => None,
        }
    }
}

impl From<diesel::result::Error> for DatabaseError {
    fn from(e: diesel::result::Error) -> Self {
        DatabaseError::Database(e)
    }
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn unique_name() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("outbox_t_kit_{}_{n}", std::process::id())
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn replace_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_end..].find('/') {
        Some(i) => &base[..authority_end + i],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{db}?{query}"),
        None => format!("{base}/{db}"),
    }
}

impl TestDatabase {
    /// A fresh database on the server `admin_url` names (see the type's docs for the schemes),
    /// with the outbox migrated.
    pub fn create(admin_url: &str) -> Result<Self, DatabaseError> {
        let scheme = admin_url.split_once("://").map(|(s, _)| s);
        match scheme {
            Some("postgres" | "postgresql") => Self::postgres(admin_url),
            Some("mysql") => Self::mysql(admin_url),
            Some("sqlite" | "file") | None => Self::sqlite(),
            Some(other) => Err(DatabaseError::Unsupported {
                scheme: other.to_owned(),
            }),
        }
    }

    /// [`create`](TestDatabase::create) on the server named by the environment variable `var`.
    pub fn from_env(var: &str) -> Result<Self, DatabaseError> {
        let url = std::env::var(var).map_err(|_| DatabaseError::NoUrl {
            var: var.to_owned(),
        })?;
        Self::create(&url)
    }

    /// A temporary SQLite file, with the outbox migrated.
    #[cfg(feature = "sqlite")]
    pub fn sqlite() -> Result<Self, DatabaseError> {
        use diesel::Connection;
        let name = unique_name();
        let path = std::env::temp_dir().join(format!("{name}.sqlite3"));
        let url = path.to_str().ok_or_else(|| {
            DatabaseError::Io(std::io::Error::other(
                "the temporary directory is not UTF-8",
            ))
        })?;
        let db = TestDatabase {
            url: url.to_owned(),
            name,
            kind: Kind::Sqlite,
        };
        let mut conn = diesel::SqliteConnection::establish(&db.url).map_err(|source| {
            DatabaseError::Connect {
                what: "SQLite file",
                source,
            }
        })?;
        crate::migrations::run(&mut conn)?;
        Ok(db)
    }

    #[cfg(not(feature = "sqlite"))]
    pub(crate) fn sqlite() -> Result<Self, DatabaseError> {
        Err(DatabaseError::Unsupported {
            scheme: "sqlite".to_owned(),
        })
    }

    #[cfg(feature = "postgres")]
    fn postgres(admin: &str) -> Result<Self, DatabaseError> {
        use diesel::{Connection, PgConnection, RunQueryDsl};
        let connect = |url: &str, what| {
            PgConnection::establish(url).map_err(|source| DatabaseError::Connect { what, source })
        };
        let name = unique_name();
        let mut conn = connect(admin, "PostgreSQL server")?;
        diesel::sql_query(format!("CREATE DATABASE {name}")).execute(&mut conn)?;
        let db = TestDatabase {
            url: replace_database(admin, &name),
            name,
            kind: Kind::Postgres {
                admin: admin.to_owned(),
            },
        };
        crate::migrations::run(&mut connect(&db.url, "new PostgreSQL database")?)?;
        Ok(db)
    }

    #[cfg(not(feature = "postgres"))]
    fn postgres(_: &str) -> Result<Self, DatabaseError> {
        Err(DatabaseError::Unsupported {
            scheme: "postgres".to_owned(),
        })
    }

    #[cfg(feature = "mysql")]
    fn mysql(admin: &str) -> Result<Self, DatabaseError> {
        use diesel::{Connection, MysqlConnection, RunQueryDsl};
        let connect = |url: &str, what| {
            MysqlConnection::establish(url)
                .map_err(|source| DatabaseError::Connect { what, source })
        };
        let name = unique_name();
        let mut conn = connect(admin, "MySQL server")?;
        diesel::sql_query(format!("CREATE DATABASE {name}")).execute(&mut conn)?;
        let db = TestDatabase {
            url: replace_database(admin, &name),
            name,
            kind: Kind::Mysql {
                admin: admin.to_owned(),
            },
        };
        crate::migrations::run(&mut connect(&db.url, "new MySQL database")?)?;
        Ok(db)
    }

    #[cfg(not(feature = "mysql"))]
    fn mysql(_: &str) -> Result<Self, DatabaseError> {
        Err(DatabaseError::Unsupported {
            scheme: "mysql".to_owned(),
        })
    }

    /// Applies the application's own Diesel migrations: every subdirectory of `dir` that holds
    /// an `up.sql`, in name order (Diesel's versions sort so), each as one batch. Returns
    /// their names. They are not recorded in `__diesel_schema_migrations`: the database
    /// lives for one test.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel::prelude::*;
    /// use outbox_diesel::testing::TestDatabase;
    ///
    /// let dir = std::env::temp_dir().join(format!("outbox-migrate-dir-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(dir.join("00000000000001_orders"))?;
    /// std::fs::write(dir.join("00000000000001_orders/up.sql"), "CREATE TABLE orders (id BIGINT PRIMARY KEY);")?;
    ///
    /// let db = TestDatabase::sqlite()?;
    /// assert_eq!(db.migrate_dir(&dir)?, ["00000000000001_orders"]);
    /// let mut conn: SqliteConnection = db.connect()?;
    /// diesel::sql_query("INSERT INTO orders (id) VALUES (1)").execute(&mut conn)?;
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn migrate_dir(
        &self,
        dir: impl AsRef<std::path::Path>,
    ) -> Result<Vec<String>, DatabaseError> {
        let mut migrations = Vec::new();
        for entry in std::fs::read_dir(dir.as_ref()).map_err(DatabaseError::Io)? {
            let path = entry.map_err(DatabaseError::Io)?.path();
            let up = path.join("up.sql");
            if up.is_file() {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let sql = std::fs::read_to_string(&up).map_err(DatabaseError::Io)?;
                migrations.push((name, sql));
            }
        }
        migrations.sort();
        #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
        fn apply<C: diesel::Connection>(
            conn: &mut C,
            migrations: &[(String, String)],
        ) -> Result<(), DatabaseError> {
            for (name, sql) in migrations {
                conn.batch_execute(sql)
                    .map_err(|source| DatabaseError::Migration {
                        name: name.clone(),
                        source,
                    })?;
            }
            Ok(())
        }
        match &self.kind {
            #[cfg(feature = "postgres")]
            Kind::Postgres { .. } => {
                apply(&mut self.connect::<diesel::PgConnection>()?, &migrations)?
            }
            #[cfg(feature = "mysql")]
            Kind::Mysql { .. } => {
                apply(&mut self.connect::<diesel::MysqlConnection>()?, &migrations)?
            }
            #[cfg(feature = "sqlite")]
            Kind::Sqlite => apply(
                &mut self.connect::<diesel::SqliteConnection>()?,
                &migrations,
            )?,
            #[allow(unreachable_patterns)]
            _ => {}
        }
        Ok(migrations.into_iter().map(|(name, _)| name).collect())
    }

    /// The database's URL (a file path for SQLite).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new synchronous connection to it.
    pub fn connect<C: diesel::Connection>(&self) -> Result<C, DatabaseError> {
        C::establish(&self.url).map_err(|source| DatabaseError::Connect {
            what: "test database",
            source,
        })
    }

    /// A new diesel-async connection to it.
    #[cfg(feature = "async")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async")))]
    pub async fn connect_async<C: diesel_async::AsyncConnection>(
        &self,
    ) -> Result<C, DatabaseError> {
        C::establish(&self.url)
            .await
            .map_err(|source| DatabaseError::Connect {
                what: "test database",
                source,
            })
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        match &self.kind {
            #[cfg(feature = "postgres")]
            Kind::Postgres { admin } => {
                use diesel::{Connection, RunQueryDsl};
                // WITH (FORCE): connections the test leaked (a pool, a panicking thread's)
                // must not keep the database alive.
                if let Ok(mut conn) = diesel::PgConnection::establish(admin) {
                    let _ = diesel::sql_query(format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        self.name
                    ))
                    .execute(&mut conn);
                }
            }
            #[cfg(feature = "mysql")]
            Kind::Mysql { admin } => {
                use diesel::{Connection, RunQueryDsl};
                if let Ok(mut conn) = diesel::MysqlConnection::establish(admin) {
                    let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {}", self.name))
                        .execute(&mut conn);
                }
            }
            #[cfg(feature = "sqlite")]
            Kind::Sqlite => {
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", self.url));
                }
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}
