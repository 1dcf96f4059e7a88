//! The fault class of real database errors, through the real drivers: libpq and mysqlclient
//! (sync Diesel), tokio-postgres and mysql_async (diesel-async). A statement cancelled by its
//! time limit is an outage; a value the server refuses is the message's fault, even when the
//! value reads like an outage.

// The helpers serve the PostgreSQL and MySQL tests; a build with fewer backends leaves some unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "mysql")),
    allow(dead_code, unused_imports)
)]

use diesel::Connection;
use diesel_async::AsyncConnection;
use outbox::fault::{ErrorClass, classify};

use crate::support::*;

/// A statement that runs into the session's time limit, and one that refuses the value
/// `timed out` (which the old message matching took for an outage).
struct Probe {
    limit: &'static str,
    slow: &'static str,
    invalid: &'static [&'static str],
}

#[cfg(feature = "postgres")]
const POSTGRES: Probe = Probe {
    limit: "SET statement_timeout = '100ms'",
    slow: "SELECT pg_sleep(5)",
    // 22P02: invalid input syntax for type integer: "timed out"
    invalid: &["SELECT CAST('timed out' AS integer)"],
};

#[cfg(feature = "mysql")]
const MARIADB: Probe = Probe {
    // MariaDB's 1969 (MySQL's equivalent, 3024, is `max_execution_time`).
    limit: "SET SESSION max_statement_time = 0.1",
    slow: "SELECT SLEEP(5)",
    // 1366: Incorrect integer value: 'timed out' for column ...
    invalid: &[
        "SET SESSION sql_mode = 'STRICT_ALL_TABLES'",
        "CREATE TABLE probe (n INT)",
        "INSERT INTO probe (n) VALUES ('timed out')",
    ],
};

fn check(what: &str, slow: diesel::result::Error, invalid: diesel::result::Error) {
    assert!(invalid.to_string().contains("timed out"), "{invalid}");
    assert_eq!(
        (classify(&slow, &[]), classify(&invalid, &[])),
        (ErrorClass::Transient, ErrorClass::Permanent),
        "{what}: a statement cancelled by its time limit is an outage ({slow}), a refused \
         value is the message's fault ({invalid})"
    );
}

fn sync_errors<C: Connection>(
    url: &str,
    probe: &Probe,
) -> (diesel::result::Error, diesel::result::Error) {
    let mut conn = C::establish(url).unwrap();
    conn.batch_execute(probe.limit).unwrap();
    let slow = conn.batch_execute(probe.slow).unwrap_err();
    let (last, setup) = probe.invalid.split_last().unwrap();
    for sql in setup {
        conn.batch_execute(sql).unwrap();
    }
    let invalid = conn.batch_execute(last).unwrap_err();
    (slow, invalid)
}

async fn async_errors<C: AsyncConnection>(
    url: &str,
    probe: &Probe,
) -> (diesel::result::Error, diesel::result::Error) {
    let mut conn = C::establish(url).await.unwrap();
    conn.batch_execute(probe.limit).await.unwrap();
    let slow = conn.batch_execute(probe.slow).await.unwrap_err();
    let (last, setup) = probe.invalid.split_last().unwrap();
    for sql in setup {
        conn.batch_execute(sql).await.unwrap();
    }
    let invalid = conn.batch_execute(last).await.unwrap_err();
    (slow, invalid)
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_statement_timeout_is_an_outage_and_invalid_input_is_poison_through_libpq() {
    let db = TestDatabase::postgres("fault_sync");
    let (slow, invalid) = sync_errors::<diesel::PgConnection>(&db.url, &POSTGRES);
    check("PgConnection", slow, invalid);
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_statement_timeout_is_an_outage_and_invalid_input_is_poison_through_tokio_postgres()
 {
    let db = TestDatabase::postgres("fault_async");
    let (slow, invalid) = async_errors::<diesel_async::AsyncPgConnection>(&db.url, &POSTGRES).await;
    check("AsyncPgConnection", slow, invalid);
}

#[cfg(feature = "mysql")]
#[test]
fn mariadb_statement_time_is_an_outage_and_an_invalid_value_is_poison_through_mysqlclient() {
    let db = TestDatabase::mysql("fault_sync");
    let (slow, invalid) = sync_errors::<diesel::MysqlConnection>(&db.url, &MARIADB);
    check("MysqlConnection", slow, invalid);
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mariadb_statement_time_is_an_outage_and_an_invalid_value_is_poison_through_mysql_async() {
    let db = TestDatabase::mysql("fault_async");
    let (slow, invalid) =
        async_errors::<diesel_async::AsyncMysqlConnection>(&db.url, &MARIADB).await;
    check("AsyncMysqlConnection", slow, invalid);
}

/// A lock held past the waiter's limit, and a session the server (or an operator) ends: the
/// errors each driver gives for them are outages, recognised by the servers' exact texts.
struct Outages {
    /// Run by the holder: makes the table and takes its row lock, keeping the transaction open.
    hold: &'static [&'static str],
    /// Run by the connection under test; the last statement waits for the lock and fails.
    wait: &'static [&'static str],
}

#[cfg(feature = "postgres")]
const POSTGRES_OUTAGES: Outages = Outages {
    hold: &[
        "CREATE TABLE held (n INT PRIMARY KEY)",
        "INSERT INTO held VALUES (1)",
        "BEGIN",
        "SELECT * FROM held FOR UPDATE",
    ],
    // 55P03: canceling statement due to lock timeout
    wait: &[
        "SET lock_timeout = '100ms'",
        "SELECT * FROM held FOR UPDATE",
    ],
};

#[cfg(feature = "mysql")]
const MARIADB_OUTAGES: Outages = Outages {
    hold: &[
        "CREATE TABLE held (n INT PRIMARY KEY) ENGINE = InnoDB",
        "INSERT INTO held VALUES (1)",
        "BEGIN",
        "SELECT * FROM held FOR UPDATE",
    ],
    // 1205: Lock wait timeout exceeded; try restarting transaction
    wait: &[
        "SET SESSION innodb_lock_wait_timeout = 1",
        "SELECT * FROM held FOR UPDATE",
    ],
};

/// Ends every other session on the test database, as an operator (or a failover) would.
fn end_other_sessions(url: &str) {
    use diesel::RunQueryDsl;
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres") {
        let mut conn = diesel::PgConnection::establish(url).unwrap();
        diesel::sql_query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .execute(&mut conn)
        .unwrap();
        return;
    }
    #[cfg(feature = "mysql")]
    {
        #[derive(diesel::QueryableByName)]
        struct Session {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            id: i64,
        }
        let mut conn = diesel::MysqlConnection::establish(url).unwrap();
        let sessions: Vec<Session> = diesel::sql_query(
            "SELECT CAST(ID AS SIGNED) AS id FROM information_schema.PROCESSLIST \
             WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
        )
        .load(&mut conn)
        .unwrap();
        for s in sessions {
            diesel::sql_query(format!("KILL CONNECTION {}", s.id))
                .execute(&mut conn)
                .unwrap();
        }
    }
}

fn check_outages(what: &str, locked: diesel::result::Error, ended: diesel::result::Error) {
    eprintln!("{what}: lock: {locked:?}; session ended: {ended:?}");
    assert_eq!(
        (classify(&locked, &[]), classify(&ended, &[])),
        (ErrorClass::Transient, ErrorClass::Transient),
        "{what}: a lock wait timeout ({locked}) and an ended session ({ended}) are outages"
    );
}

fn hold_lock<C: Connection>(url: &str, o: &Outages) -> C {
    let mut holder = C::establish(url).unwrap();
    for sql in o.hold {
        holder.batch_execute(sql).unwrap();
    }
    holder
}

fn sync_outages<C: Connection>(
    url: &str,
    o: &Outages,
) -> (diesel::result::Error, diesel::result::Error) {
    let _holder = hold_lock::<C>(url, o);
    let mut conn = C::establish(url).unwrap();
    let (last, setup) = o.wait.split_last().unwrap();
    for sql in setup {
        conn.batch_execute(sql).unwrap();
    }
    let locked = conn.batch_execute(last).unwrap_err();
    end_other_sessions(url);
    let ended = conn.batch_execute("SELECT 1").unwrap_err();
    (locked, ended)
}

async fn async_outages<H: Connection, C: AsyncConnection>(
    url: &str,
    o: &Outages,
) -> (diesel::result::Error, diesel::result::Error) {
    let _holder = hold_lock::<H>(url, o);
    let mut conn = C::establish(url).await.unwrap();
    let (last, setup) = o.wait.split_last().unwrap();
    for sql in setup {
        conn.batch_execute(sql).await.unwrap();
    }
    let locked = conn.batch_execute(last).await.unwrap_err();
    end_other_sessions(url);
    let ended = conn.batch_execute("SELECT 1").await.unwrap_err();
    (locked, ended)
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_lock_timeout_and_a_terminated_session_are_outages_through_libpq() {
    let db = TestDatabase::postgres("outages_sync");
    let (locked, ended) = sync_outages::<diesel::PgConnection>(&db.url, &POSTGRES_OUTAGES);
    check_outages("PgConnection", locked, ended);
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_lock_timeout_and_a_terminated_session_are_outages_through_tokio_postgres() {
    let db = TestDatabase::postgres("outages_async");
    let (locked, ended) = async_outages::<diesel::PgConnection, diesel_async::AsyncPgConnection>(
        &db.url,
        &POSTGRES_OUTAGES,
    )
    .await;
    check_outages("AsyncPgConnection", locked, ended);
}

#[cfg(feature = "mysql")]
#[test]
fn mariadb_lock_wait_timeout_and_a_killed_session_are_outages_through_mysqlclient() {
    let db = TestDatabase::mysql("outages_sync");
    let (locked, ended) = sync_outages::<diesel::MysqlConnection>(&db.url, &MARIADB_OUTAGES);
    check_outages("MysqlConnection", locked, ended);
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mariadb_lock_wait_timeout_and_a_killed_session_are_outages_through_mysql_async() {
    let db = TestDatabase::mysql("outages_async");
    let (locked, ended) = async_outages::<
        diesel::MysqlConnection,
        diesel_async::AsyncMysqlConnection,
    >(&db.url, &MARIADB_OUTAGES)
    .await;
    check_outages("AsyncMysqlConnection", locked, ended);
}

/// SQLite: a writer that meets another's lock past its busy timeout (`SQLITE_BUSY`) waits for
/// it as for an outage.
#[cfg(feature = "sqlite")]
#[test]
fn sqlite_busy_is_an_outage() {
    use diesel::connection::SimpleConnection;
    let db = TestDatabase::sqlite("busy");
    let mut holder = diesel::SqliteConnection::establish(&db.url).unwrap();
    holder.batch_execute("BEGIN IMMEDIATE").unwrap();
    let mut conn = diesel::SqliteConnection::establish(&db.url).unwrap();
    conn.batch_execute("PRAGMA busy_timeout = 50").unwrap();
    let busy = conn.batch_execute("BEGIN IMMEDIATE").unwrap_err();
    assert_eq!(classify(&busy, &[]), ErrorClass::Transient, "{busy:?}");
}
