//! The fault class of real database errors, through the real drivers: libpq and mysqlclient
//! (sync Diesel), tokio-postgres and mysql_async (diesel-async). A statement cancelled by its
//! time limit is an outage; a value the server refuses is the message's fault, even when the
//! value reads like an outage.

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
