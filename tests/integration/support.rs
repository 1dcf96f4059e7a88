//! Test support: a fresh database per test (created here, dropped on drop), and backend
//! specific SQL for reading the outbox back.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use serde::{Deserialize, Serialize};

/// Base URL of the PostgreSQL server the tests create their databases on.
pub fn postgres_admin_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Base URL of the MySQL/MariaDB server the tests create their databases on.
pub fn mysql_admin_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A unique database name: the test's label, the process id and a counter, so that tests of
/// one run and of concurrent runs never share a database.
fn unique_name(label: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let label: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(30)
        .collect();
    format!("outbox_t_{label}_{}_{n}", std::process::id())
}

fn replace_database(url: &str, db: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("database URL has a path");
    format!("{base}/{db}")
}

/// A database that exists for the life of this value.
pub struct TestDatabase {
    pub url: String,
    kind: Kind,
}

enum Kind {
    Postgres { admin: String, name: String },
    Mysql { admin: String, name: String },
    Sqlite { _dir: tempfile::TempDir },
}

impl TestDatabase {
    #[cfg(feature = "postgres")]
    pub fn postgres(label: &str) -> Self {
        Self::postgres_on(postgres_admin_url(), label)
    }

    /// [`TestDatabase::postgres`] on the server of `admin` (a URL of a database there that
    /// may create others), e.g. a test's private cluster.
    #[cfg(feature = "postgres")]
    pub fn postgres_on(admin: String, label: &str) -> Self {
        use diesel::{Connection, RunQueryDsl};
        let name = unique_name(label);
        let mut conn = diesel::PgConnection::establish(&admin)
            .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {admin}: {e}"));
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .unwrap();
        let db = TestDatabase {
            url: replace_database(&admin, &name),
            kind: Kind::Postgres { admin, name },
        };
        let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
        outbox::migrations::run(&mut conn).unwrap();
        diesel::sql_query(ORDERS_DDL).execute(&mut conn).unwrap();
        db
    }

    /// [`TestDatabase::postgres`] with `outbox_events` partitioned into a ring of 4 slots of
    /// 1,000 transaction ids (`outbox_partition_events`, as `outbox partition` runs it).
    #[cfg(feature = "postgres")]
    #[allow(dead_code)]
    pub fn postgres_partitioned(label: &str) -> Self {
        use diesel::{Connection, RunQueryDsl};
        let db = Self::postgres(label);
        let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
        diesel::sql_query("SELECT outbox_partition_events(4, 1000)")
            .execute(&mut conn)
            .unwrap();
        db
    }

    #[cfg(feature = "mysql")]
    pub fn mysql(label: &str) -> Self {
        use diesel::{Connection, RunQueryDsl};
        let admin = mysql_admin_url();
        let name = unique_name(label);
        let mut conn = diesel::MysqlConnection::establish(&admin)
            .unwrap_or_else(|e| panic!("cannot reach MySQL/MariaDB at {admin}: {e}"));
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .unwrap();
        let db = TestDatabase {
            url: replace_database(&admin, &name),
            kind: Kind::Mysql { admin, name },
        };
        let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
        outbox::migrations::run(&mut conn).unwrap();
        diesel::sql_query(ORDERS_DDL).execute(&mut conn).unwrap();
        db
    }

    #[cfg(feature = "sqlite")]
    pub fn sqlite(_label: &str) -> Self {
        use diesel::{Connection, RunQueryDsl};
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("test.db").to_str().unwrap().to_owned();
        let mut conn = diesel::SqliteConnection::establish(&url).unwrap();
        diesel::sql_query("PRAGMA journal_mode = WAL")
            .execute(&mut conn)
            .unwrap();
        outbox::migrations::run(&mut conn).unwrap();
        diesel::sql_query(ORDERS_DDL).execute(&mut conn).unwrap();
        TestDatabase {
            url,
            kind: Kind::Sqlite { _dir: dir },
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        #[allow(unused_imports)]
        use diesel::{Connection, RunQueryDsl};
        match &self.kind {
            #[cfg(feature = "postgres")]
            Kind::Postgres { admin, name } => {
                if let Ok(mut conn) = diesel::PgConnection::establish(admin) {
                    let _ =
                        diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .execute(&mut conn);
                }
            }
            #[cfg(feature = "mysql")]
            Kind::Mysql { admin, name } => {
                if let Ok(mut conn) = diesel::MysqlConnection::establish(admin) {
                    let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {name}"))
                        .execute(&mut conn);
                }
            }
            _ => {}
        }
    }
}

pub const ORDERS_DDL: &str =
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, total_cents BIGINT NOT NULL)";

/// An outbox row read back, every column as the test compares it.
#[derive(Debug, QueryableByName)]
pub struct StoredEvent {
    #[diesel(sql_type = BigInt)]
    pub seq: i64,
    #[diesel(sql_type = Text)]
    pub id: String,
    #[diesel(sql_type = Text)]
    pub aggregate_type: String,
    #[diesel(sql_type = Text)]
    pub aggregate_id: String,
    #[diesel(sql_type = Text)]
    pub event_type: String,
    #[diesel(sql_type = Integer)]
    pub event_version: i32,
    #[diesel(sql_type = Text)]
    pub payload: String,
    #[diesel(sql_type = Text)]
    pub headers: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub topic: Option<String>,
    #[diesel(sql_type = Integer)]
    pub shard: i32,
    /// UTC, `YYYY-MM-DD HH:MM:SS.ffffff`.
    #[diesel(sql_type = Text)]
    pub created_at: String,
    #[diesel(sql_type = Text)]
    pub available_at: String,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub published_at: Option<String>,
}

impl StoredEvent {
    pub fn payload_json(&self) -> serde_json::Value {
        serde_json::from_str(&self.payload).unwrap()
    }
    pub fn headers_json(&self) -> serde_json::Value {
        serde_json::from_str(&self.headers).unwrap()
    }
    pub fn created_at(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::NaiveDateTime::parse_from_str(&self.created_at, "%Y-%m-%d %H:%M:%S%.f")
            .unwrap_or_else(|e| panic!("created_at {:?}: {e}", self.created_at))
            .and_utc()
    }
}

#[derive(Debug, QueryableByName)]
pub struct Count {
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// SQL that reads the outbox back in `seq` order, per backend.
pub trait ReadBack {
    const SELECT_EVENTS: &'static str;
}

#[cfg(feature = "postgres")]
impl ReadBack for diesel::pg::Pg {
    const SELECT_EVENTS: &'static str = "SELECT seq, id::text AS id, aggregate_type, aggregate_id, \
        event_type, event_version, payload::text AS payload, headers::text AS headers, topic, \
        shard::int AS shard, \
        to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS created_at, \
        to_char(available_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS available_at, \
        attempts, published_at::text AS published_at FROM outbox_events ORDER BY seq";
}

#[cfg(feature = "mysql")]
impl ReadBack for diesel::mysql::Mysql {
    const SELECT_EVENTS: &'static str = "SELECT seq, id, aggregate_type, aggregate_id, \
        event_type, event_version, CAST(payload AS CHAR) AS payload, \
        CAST(headers AS CHAR) AS headers, topic, CAST(shard AS SIGNED) AS shard, \
        DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f') AS created_at, \
        DATE_FORMAT(available_at, '%Y-%m-%d %H:%i:%s.%f') AS available_at, \
        attempts, CAST(published_at AS CHAR) AS published_at FROM outbox_events ORDER BY seq";
}

#[cfg(feature = "sqlite")]
impl ReadBack for diesel::sqlite::Sqlite {
    const SELECT_EVENTS: &'static str = "SELECT seq, id, aggregate_type, aggregate_id, \
        event_type, event_version, payload, headers, topic, shard, created_at, available_at, \
        attempts, published_at FROM outbox_events ORDER BY seq";
}

pub const COUNT_EVENTS: &str = "SELECT COUNT(*) AS n FROM outbox_events";
pub const COUNT_ORDERS: &str = "SELECT COUNT(*) AS n FROM orders";

// ---------------------------------------------------------------------------------------
// Events used by the tests.

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, outbox::OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 3)]
pub struct OrderCreated {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub total_cents: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, outbox::OutboxEvent)]
#[outbox(aggregate = "order", topic = "order-lifecycle")]
pub enum OrderEvent {
    Paid {
        #[outbox(aggregate_id)]
        order_id: i64,
        amount: i64,
    },
    #[outbox(event_type = "OrderCancelled", version = 2)]
    Cancelled {
        #[outbox(aggregate_id)]
        order_id: i64,
        reason: String,
    },
}

/// An event with a body of any size, for the payload limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, outbox::OutboxEvent)]
#[outbox(aggregate = "document", event_type = "DocumentStored")]
pub struct DocumentStored {
    #[outbox(aggregate_id)]
    pub id: i64,
    pub body: String,
}

/// An event whose payload cannot be serialised: a map with non-string keys.
#[derive(Debug, Serialize, outbox::OutboxEvent)]
#[outbox(aggregate = "ledger", event_type = "Unserialisable")]
pub struct Unserialisable {
    #[outbox(aggregate_id)]
    pub id: uuid::Uuid,
    pub bad: std::collections::HashMap<(i32, i32), i32>,
}

impl Unserialisable {
    pub fn new() -> Self {
        let mut bad = std::collections::HashMap::new();
        bad.insert((1, 2), 3);
        Unserialisable {
            id: uuid::Uuid::now_v7(),
            bad,
        }
    }
}

/// The error type the tests' closures return.
#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Outbox(outbox::Error),
    Business(&'static str),
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

impl From<outbox::Error> for AppError {
    fn from(e: outbox::Error) -> Self {
        AppError::Outbox(e)
    }
}

/// `event` as a relay hands it to the publisher once claimed: first attempt, no topic of its
/// own (the publisher's topic applies).
#[cfg(feature = "relay")]
pub fn claimed(event: &impl outbox::OutboxEvent) -> outbox::relay::OutboxMessage {
    let m = outbox::NewMessage::from_event(event, outbox::Headers::new()).unwrap();
    outbox::relay::OutboxMessage {
        seq: 0,
        id: m.id,
        aggregate_type: m.aggregate_type.into_owned(),
        aggregate_id: m.aggregate_id,
        event_type: m.event_type.into_owned(),
        event_version: m.event_version,
        payload: m.payload,
        headers: m.headers,
        topic: None,
        shard: m.shard,
        created_at: m.created_at,
        attempts: 1,
    }
}
