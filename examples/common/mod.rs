//! Shared by the teaching examples (each declares `mod common;`, found here beside it):
//! throwaway databases, a relay run until a condition holds, and `expect`, which ends the
//! example with a non-zero exit when its demonstration does not demonstrate.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use outbox::relay::{MemoryBroker, Publisher, Relay, RelayConfig, RelayStats, RelayStore};

/// Ends the example with a non-zero exit (101) when `ok` is false: the failure it shows did not
/// happen, or the fix did not hold.
pub fn expect(ok: bool, what: &str) {
    if ok {
        println!("   ✓ {what}");
    } else {
        fail(what);
    }
}

/// Unwinds out of `main` (so that private databases and clusters are dropped), without the
/// panic hook's message; the exit code is 101.
fn fail(what: &str) -> ! {
    eprintln!("DEMONSTRATION FAILED: expected {what}");
    std::panic::resume_unwind(Box::new(()))
}

/// [`expect`] without the line on success, for steps that are not the point.
pub fn ensure(ok: bool, what: &str) {
    if !ok {
        fail(what);
    }
}

/// A fresh SQLite database file with the outbox tables, in a directory deleted on drop.
pub struct SqliteDb {
    pub path: String,
    _dir: tempfile::TempDir,
}

impl SqliteDb {
    pub fn new() -> SqliteDb {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("example.db").to_string_lossy().into_owned();
        let db = SqliteDb { path, _dir: dir };
        outbox::migrations::run(&mut db.conn()).expect("outbox migrations");
        db
    }

    /// A connection that waits up to 5 s for another writer (a relay's claim or mark) instead
    /// of failing at once with "database is locked": SQLite's default `busy_timeout` is 0.
    pub fn conn(&self) -> SqliteConnection {
        let mut conn = SqliteConnection::establish(&self.path).expect("open the SQLite file");
        diesel::connection::SimpleConnection::batch_execute(
            &mut conn,
            "PRAGMA busy_timeout = 5000",
        )
        .expect("set busy_timeout");
        conn
    }
}

/// A private PostgreSQL database on `DATABASE_URL` (default
/// postgres://postgres@127.0.0.1:5432/test) with the outbox tables, dropped on drop.
#[cfg(feature = "postgres")]
pub struct PgDb {
    pub url: String,
    admin: String,
    name: String,
}

#[cfg(feature = "postgres")]
impl PgDb {
    pub fn new(label: &str) -> PgDb {
        let admin = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let name = format!("outbox_ex_{label}_{}", std::process::id());
        let mut conn = PgConnection::establish(&admin)
            .unwrap_or_else(|e| panic!("this example needs PostgreSQL at {admin}: {e}"));
        // A failed run exits without dropping its database: remove this example's leftovers.
        #[derive(QueryableByName)]
        struct Db {
            #[diesel(sql_type = diesel::sql_types::Text)]
            datname: String,
        }
        let old: Vec<Db> = diesel::sql_query(format!(
            "SELECT datname FROM pg_database WHERE datname LIKE 'outbox\\_ex\\_{label}\\_%'"
        ))
        .load(&mut conn)
        .expect("list old databases");
        // Only those of processes that are gone: a concurrent run keeps its database.
        let gone = |name: &str| {
            let pid = name.rsplit('_').next().unwrap_or_default();
            !std::path::Path::new("/proc").join(pid).exists()
        };
        for db in old.into_iter().filter(|db| gone(&db.datname)) {
            diesel::sql_query(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                db.datname
            ))
            .execute(&mut conn)
            .expect("drop an old database");
        }
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .expect("create the example's database");
        let (base, _) = admin.rsplit_once('/').expect("a database URL with a path");
        let db = PgDb {
            url: format!("{base}/{name}"),
            admin,
            name,
        };
        outbox::migrations::run(&mut db.conn()).expect("outbox migrations");
        db
    }

    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url).expect("connect to the example's database")
    }
}

#[cfg(feature = "postgres")]
impl Drop for PgDb {
    fn drop(&mut self) {
        if let Ok(mut conn) = PgConnection::establish(&self.admin) {
            let _ = diesel::sql_query(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut conn);
        }
    }
}

/// A relay configuration for examples: fast polls and retries.
pub fn quick_config() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(20),
        lease: Duration::from_secs(2),
        publish_timeout: Duration::from_secs(1),
        backoff: outbox::relay::Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.0,
        },
        ..RelayConfig::default()
    }
}

/// Runs a relay until `done` holds (true) or `limit` passes (false), then stops it.
pub fn relay_until<S: RelayStore, P: Publisher>(
    store: S,
    publisher: P,
    config: RelayConfig,
    limit: Duration,
    done: impl Fn() -> bool + Send + 'static,
) -> (bool, Arc<RelayStats>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let relay = Relay::new(store, publisher, config).expect("a valid relay configuration");
    let stats = relay.stats();
    let start = Instant::now();
    let met = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = met.clone();
    runtime.block_on(relay.run(async move {
        while start.elapsed() < limit {
            if done() {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }));
    (met.load(std::sync::atomic::Ordering::SeqCst), stats)
}

/// How many records of `topic` the broker holds.
pub fn records(broker: &MemoryBroker, topic: &str) -> usize {
    broker.records(topic).len()
}

/// `SELECT COUNT(*) FROM <table>` on any Diesel connection.
#[macro_export]
macro_rules! count {
    ($conn:expr, $table:expr) => {{
        use diesel::RunQueryDsl as _;
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
            "(SELECT COUNT(*) FROM {})",
            $table
        )))
        .get_result::<i64>($conn)
        .expect("count rows")
    }};
}

/// The event most examples publish: an order was placed.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, outbox::OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderPlaced", version = 1)]
pub struct OrderPlaced {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub total_cents: i64,
}

/// The business table of the examples.
pub const ORDERS_DDL: &str = "CREATE TABLE orders (id BIGINT PRIMARY KEY, total_cents BIGINT NOT NULL CHECK (total_cents > 0))";

/// The naive way: the application sends `event` to the broker itself, outside any outbox.
pub fn send_direct<P: Publisher>(
    broker: &P,
    event: &impl outbox::OutboxEvent,
) -> outbox::relay::Delivery {
    send_direct_within(broker, event, Duration::from_secs(3600)).expect("an answer within the hour")
}

/// [`send_direct`] with the client's request timeout: `None` when no answer came within it.
pub fn send_direct_within<P: Publisher>(
    broker: &P,
    event: &impl outbox::OutboxEvent,
    within: Duration,
) -> Option<outbox::relay::Delivery> {
    let m = outbox::NewMessage::from_event(event, outbox::Headers::new()).expect("serialise");
    let message = outbox::relay::OutboxMessage {
        seq: 0,
        id: m.id,
        aggregate_type: m.aggregate_type.into_owned(),
        aggregate_id: m.aggregate_id,
        event_type: m.event_type.into_owned(),
        event_version: m.event_version,
        payload: m.payload,
        headers: m.headers,
        topic: m.topic.map(|t| t.into_owned()),
        shard: m.shard,
        created_at: m.created_at,
        attempts: 1,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let sent = runtime.block_on(async {
        tokio::time::timeout(within, broker.publish(std::slice::from_ref(&message))).await
    });
    sent.ok()
        .map(|mut d| d.pop().expect("one delivery per message"))
}

/// A broker whose acknowledgements get lost: it stores the first `lose` batches it is sent
/// and then reports a timeout, as when the connection drops after the broker wrote the
/// message but before its ack arrived. The sender cannot tell "stored" from "not stored".
pub struct LostAcks {
    pub broker: Arc<MemoryBroker>,
    pub lose: std::sync::atomic::AtomicUsize,
}

impl Publisher for LostAcks {
    async fn publish(
        &self,
        batch: &[outbox::relay::OutboxMessage],
    ) -> Vec<outbox::relay::Delivery> {
        let deliveries = self.broker.publish(batch).await;
        let lose = self.lose.load(std::sync::atomic::Ordering::SeqCst);
        if lose == 0 {
            return deliveries;
        }
        self.lose
            .store(lose - 1, std::sync::atomic::Ordering::SeqCst);
        let timeout = "timed out waiting for the broker's ack (outcome unknown)";
        deliveries
            .iter()
            .map(|_| outbox::relay::Delivery::Unavailable(timeout.into()))
            .collect()
    }
}

/// A private PostgreSQL cluster with `wal_level = logical`, in a temporary directory, stopped
/// and deleted on drop (for the change-data-capture examples). Uses the server binaries under
/// /usr/lib/postgresql/<newest>/bin; run as root, it runs the server as `postgres`.
#[cfg(feature = "postgres")]
pub struct PrivatePg {
    pub dir: std::path::PathBuf,
    pub port: u16,
}

#[cfg(feature = "postgres")]
impl PrivatePg {
    pub fn bin(name: &str) -> std::path::PathBuf {
        let mut versions: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries under /usr/lib/postgresql")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        versions.sort();
        versions
            .last()
            .expect("a PostgreSQL version")
            .join("bin")
            .join(name)
    }

    fn run(args: &[&str]) -> bool {
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false);
        let mut cmd = if root {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]);
            c.arg(Self::bin(args[0]));
            c
        } else {
            std::process::Command::new(Self::bin(args[0]))
        };
        cmd.args(&args[1..])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        cmd.status().map(|s| s.success()).unwrap_or(false)
    }

    pub fn start() -> PrivatePg {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("outbox-ex-pg-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::process::Command::new("chown")
            .arg("postgres:postgres")
            .arg(&dir)
            .status();
        let data = dir.join("data");
        let data = data.to_str().unwrap();
        assert!(
            Self::run(&["initdb", "-A", "trust", "-U", "postgres", "-D", data]),
            "initdb failed"
        );
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_wal_size=1GB -c autovacuum=off",
            dir.display()
        );
        assert!(
            Self::run(&["pg_ctl", "-D", data, "-w", "-o", &opts, "start"]),
            "pg_ctl start failed"
        );
        PrivatePg { dir, port }
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_wal_lsn_diff(a, b)` and friends: one bigint from SQL.
    pub fn bigint(conn: &mut PgConnection, sql: &str) -> i64 {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(sql))
            .get_result(conn)
            .unwrap()
    }
}

#[cfg(feature = "postgres")]
impl Drop for PrivatePg {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        Self::run(&[
            "pg_ctl",
            "-D",
            data.to_str().unwrap(),
            "-m",
            "immediate",
            "stop",
        ]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The changes a logical slot has for us (test_decoding's text, one line per row and a
/// `BEGIN`/`COMMIT` per transaction), consumed.
#[cfg(feature = "postgres")]
pub fn slot_changes(conn: &mut PgConnection, slot: &str) -> Vec<String> {
    #[derive(QueryableByName)]
    struct Change {
        #[diesel(sql_type = diesel::sql_types::Text)]
        data: String,
    }
    diesel::sql_query(format!(
        "SELECT data FROM pg_logical_slot_get_changes('{slot}', NULL, NULL)"
    ))
    .load::<Change>(conn)
    .unwrap()
    .into_iter()
    .map(|c| c.data)
    .collect()
}
