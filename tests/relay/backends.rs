//! Per-backend test plumbing: a relay store on a test database, and filling its outbox.

use outbox::relay::{MemoryStore, RelayStore};

use crate::support::*;

/// What the store contract needs of a backend: an outbox, stores on it, and a look at what
/// it holds. The SQL stores and the memory store implement it, so the contract is one.
pub trait Contract: 'static {
    /// The outbox: a test database, or the memory store whose clones share it.
    type Db;
    type Store: RelayStore;
    /// Whether the store sees relays' database sessions (and so reaps dead relays).
    const SESSIONS: bool;
    /// How a refused relay id names the session that holds it.
    const HOLDER: &'static str;
    /// A fresh outbox (a database with the migrations applied).
    fn database(label: &str) -> Self::Db;
    /// A relay store on it.
    fn store(db: &Self::Db) -> Self::Store;
    /// Writes `per_aggregate` events for each of `aggregates` aggregates, interleaved
    /// (E0 of every aggregate, then E1, ...), as the application writes them.
    fn fill(db: &Self::Db, aggregates: usize, per_aggregate: usize);
    /// How many rows match `what`.
    fn count_of(db: &Self::Db, what: What<'_>) -> i64;
    /// Ends `store`'s session, as when its relay's process is killed: its connection closes.
    fn end_session(store: Self::Store, _relay: &str) {
        drop(store);
    }
}

/// What a contract test counts: the SQL backends run [`What::sql`], the memory store counts
/// its state.
#[derive(Clone, Copy)]
pub enum What<'a> {
    /// Every row of the outbox.
    Rows,
    /// Published rows no lease names.
    PublishedUnleased,
    /// Rows not published (pending or dead).
    Unpublished,
    /// Dead letters whose last error is this.
    DeadWithError(&'a str),
    /// Rows whose lease names this relay.
    LeasedTo(&'a str),
    /// Shard leases naming this relay.
    ShardsOf(&'a str),
    /// Relays with a heartbeat row.
    Relays,
    /// Heartbeat rows of this relay.
    Relay(&'a str),
    /// Heartbeat rows of `relay` with this health, and the time its state began.
    Health {
        relay: &'a str,
        mode: &'a str,
        state: &'a str,
        last_error: &'a str,
    },
}

impl What<'_> {
    /// `SELECT COUNT(*) AS n ...`.
    pub fn sql(self) -> String {
        let events = "SELECT COUNT(*) AS n FROM outbox_events";
        match self {
            What::Rows => events.to_owned(),
            What::PublishedUnleased => {
                format!("{events} WHERE published_at IS NOT NULL AND locked_by IS NULL")
            }
            What::Unpublished => format!("{events} WHERE published_at IS NULL"),
            What::DeadWithError(e) => {
                format!("{events} WHERE dead_at IS NOT NULL AND last_error = '{e}'")
            }
            What::LeasedTo(r) => format!("{events} WHERE locked_by = '{r}'"),
            What::ShardsOf(r) => {
                format!("SELECT COUNT(*) AS n FROM outbox_shard_leases WHERE owner = '{r}'")
            }
            What::Relays => "SELECT COUNT(*) AS n FROM outbox_relays".to_owned(),
            What::Relay(r) => {
                format!("SELECT COUNT(*) AS n FROM outbox_relays WHERE relay_id = '{r}'")
            }
            What::Health {
                relay,
                mode,
                state,
                last_error,
            } => format!(
                "SELECT COUNT(*) AS n FROM outbox_relays WHERE relay_id = '{relay}' \
                 AND state = '{state}' AND last_error = '{last_error}' \
                 AND mode = '{mode}' AND state_since IS NOT NULL"
            ),
        }
    }
}

/// What the tests of the SQL stores need too: statements of their own, the admin API.
pub trait Backend: Contract<Db = TestDatabase> {
    /// Runs a statement.
    fn exec(db: &TestDatabase, sql: &str);
    /// `SELECT COUNT(*) AS n ...`.
    fn count(db: &TestDatabase, sql: &str) -> i64;
    /// Reverts (with their `down.sql`) the migrations newer than `version`, so a test can
    /// write rows that later constraints would refuse.
    fn revert_after(db: &TestDatabase, version: &str);
    /// A `created_at` the backend stores that no `DateTime<Utc>` represents, as SQL.
    const UNREPRESENTABLE_TIME: &'static str;
    /// The connection the admin API runs on.
    type AdminConn: outbox::relay::admin::AdminConnection;
    /// An admin connection to the database.
    #[allow(async_fn_in_trait)]
    async fn admin(db: &TestDatabase) -> Self::AdminConn;
    /// Holds, on a connection of its own and for `hold`, what a store's claim then waits
    /// for (a row lock on the first row; SQLite: the write lock); returns once it is held.
    fn hold_lock(db: &TestDatabase, hold: std::time::Duration) -> std::thread::JoinHandle<()>;
}

/// [`Backend::hold_lock`]: `$begin` (`transaction`, `immediate_transaction`) on a `$conn`,
/// running `$sql`, then sleeping `$hold`.
macro_rules! hold_lock {
    ($conn:ty, $db:expr, $hold:expr, $begin:ident, $sql:expr) => {{
        use diesel::{Connection, RunQueryDsl};
        let (url, hold) = ($db.url.clone(), $hold);
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let mut conn = <$conn>::establish(&url).unwrap();
            conn.$begin(|conn| {
                diesel::sql_query($sql).execute(conn)?;
                held_tx.send(()).unwrap();
                std::thread::sleep(hold);
                Ok::<_, diesel::result::Error>(())
            })
            .unwrap();
        });
        held_rx.recv().unwrap();
        handle
    }};
}

/// The first row, locked.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const LOCK_FIRST_ROW: &str = "SELECT seq FROM outbox_events ORDER BY seq LIMIT 1 FOR UPDATE";

macro_rules! revert_after {
    ($conn:ty, $db:expr, $version:expr) => {{
        use diesel::Connection;
        use diesel::connection::SimpleConnection;
        let mut conn = <$conn>::establish(&$db.url).unwrap();
        let all = outbox::migrations::list::<<$conn as Connection>::Backend>();
        for m in all.iter().rev().filter(|m| m.version > $version) {
            conn.batch_execute(m.down).unwrap();
        }
    }};
}

macro_rules! fill_with {
    ($conn:ty, $db:expr, $aggregates:expr, $per:expr) => {{
        use diesel::Connection;
        use outbox::prelude::*;
        let mut conn = <$conn>::establish(&$db.url).unwrap();
        let mut all = Vec::new();
        for i in 0..$per {
            for a in 0..$aggregates {
                all.push(OrderEvent::Paid {
                    order_id: a as i64,
                    amount: i as i64,
                });
            }
        }
        for chunk in all.chunks(2000) {
            conn.transaction_with_outbox(|tx| {
                for e in chunk {
                    tx.publish(e)?;
                }
                Ok::<_, AppError>(())
            })
            .unwrap();
        }
    }};
}

#[cfg(feature = "postgres")]
pub struct Postgres;

#[cfg(feature = "postgres")]
impl Contract for Postgres {
    type Db = TestDatabase;
    type Store = outbox::relay::PgRelayStore;
    const SESSIONS: bool = true;
    const HOLDER: &'static str = "PostgreSQL backend pid ";
    fn database(label: &str) -> TestDatabase {
        TestDatabase::postgres(label)
    }
    fn store(db: &TestDatabase) -> Self::Store {
        outbox::relay::PgRelayStore::new(&db.url)
    }
    fn fill(db: &TestDatabase, aggregates: usize, per_aggregate: usize) {
        fill_with!(diesel::PgConnection, db, aggregates, per_aggregate)
    }
    fn count_of(db: &TestDatabase, what: What<'_>) -> i64 {
        Self::count(db, &what.sql())
    }
}

#[cfg(feature = "postgres")]
impl Backend for Postgres {
    const UNREPRESENTABLE_TIME: &'static str = "'infinity'";
    type AdminConn = diesel_async::AsyncPgConnection;
    async fn admin(db: &TestDatabase) -> Self::AdminConn {
        use diesel_async::AsyncConnection;
        <diesel_async::AsyncPgConnection>::establish(&db.url)
            .await
            .unwrap()
    }
    fn exec(db: &TestDatabase, sql: &str) {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
        diesel::sql_query(sql).execute(&mut conn).unwrap();
    }
    fn count(db: &TestDatabase, sql: &str) -> i64 {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
        diesel::sql_query(sql)
            .get_result::<Count>(&mut conn)
            .unwrap()
            .n
    }
    fn revert_after(db: &TestDatabase, version: &str) {
        revert_after!(diesel::PgConnection, db, version);
    }
    fn hold_lock(db: &TestDatabase, hold: std::time::Duration) -> std::thread::JoinHandle<()> {
        hold_lock!(diesel::PgConnection, db, hold, transaction, LOCK_FIRST_ROW)
    }
}

#[cfg(feature = "mysql")]
pub struct Mysql;

#[cfg(feature = "mysql")]
impl Contract for Mysql {
    type Db = TestDatabase;
    type Store = outbox::relay::MysqlRelayStore;
    const SESSIONS: bool = true;
    const HOLDER: &'static str = "MySQL connection id ";
    fn database(label: &str) -> TestDatabase {
        TestDatabase::mysql(label)
    }
    fn store(db: &TestDatabase) -> Self::Store {
        outbox::relay::MysqlRelayStore::new(&db.url)
    }
    fn fill(db: &TestDatabase, aggregates: usize, per_aggregate: usize) {
        fill_with!(diesel::MysqlConnection, db, aggregates, per_aggregate)
    }
    fn count_of(db: &TestDatabase, what: What<'_>) -> i64 {
        Self::count(db, &what.sql())
    }
}

#[cfg(feature = "mysql")]
impl Backend for Mysql {
    const UNREPRESENTABLE_TIME: &'static str = "'0000-00-00 00:00:00'";
    type AdminConn = diesel_async::AsyncMysqlConnection;
    async fn admin(db: &TestDatabase) -> Self::AdminConn {
        use diesel_async::AsyncConnection;
        <diesel_async::AsyncMysqlConnection>::establish(&db.url)
            .await
            .unwrap()
    }
    fn exec(db: &TestDatabase, sql: &str) {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
        diesel::sql_query(sql).execute(&mut conn).unwrap();
    }
    fn count(db: &TestDatabase, sql: &str) -> i64 {
        use diesel::{Connection, RunQueryDsl};
        let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
        diesel::sql_query(sql)
            .get_result::<Count>(&mut conn)
            .unwrap()
            .n
    }
    fn revert_after(db: &TestDatabase, version: &str) {
        revert_after!(diesel::MysqlConnection, db, version);
    }
    fn hold_lock(db: &TestDatabase, hold: std::time::Duration) -> std::thread::JoinHandle<()> {
        hold_lock!(
            diesel::MysqlConnection,
            db,
            hold,
            transaction,
            LOCK_FIRST_ROW
        )
    }
}

#[cfg(feature = "sqlite")]
pub struct Sqlite;

/// A test's own SQLite connection: it waits for the relays' write lock like they do.
#[cfg(feature = "sqlite")]
fn sqlite_conn(db: &TestDatabase) -> diesel::SqliteConnection {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let mut conn = diesel::SqliteConnection::establish(&db.url).unwrap();
    conn.batch_execute("PRAGMA busy_timeout = 5000").unwrap();
    conn
}

#[cfg(feature = "sqlite")]
impl Contract for Sqlite {
    type Db = TestDatabase;
    type Store = outbox::relay::SqliteRelayStore;
    const SESSIONS: bool = false;
    const HOLDER: &'static str = "(SQLite records no sessions)";
    fn database(label: &str) -> TestDatabase {
        TestDatabase::sqlite(label)
    }
    fn store(db: &TestDatabase) -> Self::Store {
        outbox::relay::SqliteRelayStore::new(&db.url)
    }
    fn fill(db: &TestDatabase, aggregates: usize, per_aggregate: usize) {
        fill_with!(diesel::SqliteConnection, db, aggregates, per_aggregate)
    }
    fn count_of(db: &TestDatabase, what: What<'_>) -> i64 {
        Self::count(db, &what.sql())
    }
}

#[cfg(feature = "sqlite")]
impl Backend for Sqlite {
    const UNREPRESENTABLE_TIME: &'static str = "'yesterday'";
    type AdminConn =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    async fn admin(db: &TestDatabase) -> Self::AdminConn {
        use diesel_async::AsyncConnection;
        <diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>>::establish(&db.url).await.unwrap()
    }
    fn exec(db: &TestDatabase, sql: &str) {
        use diesel::RunQueryDsl;
        diesel::sql_query(sql)
            .execute(&mut sqlite_conn(db))
            .unwrap();
    }
    fn count(db: &TestDatabase, sql: &str) -> i64 {
        use diesel::RunQueryDsl;
        diesel::sql_query(sql)
            .get_result::<Count>(&mut sqlite_conn(db))
            .unwrap()
            .n
    }
    fn revert_after(db: &TestDatabase, version: &str) {
        revert_after!(diesel::SqliteConnection, db, version);
    }
    fn hold_lock(db: &TestDatabase, hold: std::time::Duration) -> std::thread::JoinHandle<()> {
        // `BEGIN IMMEDIATE` takes the write lock; the statement itself changes nothing.
        let noop = "UPDATE outbox_events SET attempts = attempts WHERE seq < 0";
        hold_lock!(
            diesel::SqliteConnection,
            db,
            hold,
            immediate_transaction,
            noop
        )
    }
}

/// The in-memory store: its clones share one outbox, each clone a session of its own.
pub struct Memory;

impl Contract for Memory {
    type Db = MemoryStore;
    type Store = MemoryStore;
    const SESSIONS: bool = true;
    const HOLDER: &'static str = "memory store clone ";
    fn database(_label: &str) -> MemoryStore {
        MemoryStore::default()
    }
    fn store(db: &MemoryStore) -> MemoryStore {
        db.clone()
    }
    fn fill(db: &MemoryStore, aggregates: usize, per_aggregate: usize) {
        for i in 0..per_aggregate {
            for a in 0..aggregates {
                let event = OrderEvent::Paid {
                    order_id: a as i64,
                    amount: i as i64,
                };
                db.insert(outbox::NewMessage::from_event(&event, Default::default()).unwrap());
            }
        }
    }
    fn count_of(db: &MemoryStore, what: What<'_>) -> i64 {
        let rows = db.rows();
        let count =
            |f: &dyn Fn(&outbox::relay::MemoryRow) -> bool| rows.iter().filter(|r| f(r)).count();
        let relays = db.relays();
        let n = match what {
            What::Rows => rows.len(),
            What::PublishedUnleased => count(&|r| r.published && r.locked_by.is_none()),
            What::Unpublished => count(&|r| !r.published),
            What::DeadWithError(e) => count(&|r| r.dead && r.last_error.as_deref() == Some(e)),
            What::LeasedTo(relay) => count(&|r| r.locked_by.as_deref() == Some(relay)),
            What::ShardsOf(relay) => db.shards_of(relay).len(),
            What::Relays => relays.len(),
            What::Relay(relay) => relays.iter().filter(|(id, _)| id == relay).count(),
            What::Health {
                relay,
                mode,
                state,
                last_error,
            } => relays
                .iter()
                .filter(|(id, health)| {
                    id == relay
                        && health.as_ref().is_some_and(|h| {
                            format!("{:?}", h.mode).to_lowercase() == mode
                                && h.state.as_str() == state
                                && h.last_error.as_deref() == Some(last_error)
                        })
                })
                .count(),
        };
        n as i64
    }
    fn end_session(store: MemoryStore, relay: &str) {
        store.end_session(relay);
    }
}
