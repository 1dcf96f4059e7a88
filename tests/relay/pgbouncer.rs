//! Relays and writers through a real PgBouncer (Debian's, 1.18: no prepared-statement
//! tracking) in transaction mode, with fewer server connections than clients, so that
//! every client's transactions land on server connections other clients used before.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::{CacheSize, SimpleConnection};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};
use outbox::prelude::*;
use outbox::relay::{Backoff, MemoryBroker, Mode, PgRelayStore, Relay, RelayConfig};

use crate::backends::{Backend, Contract, Postgres};
use crate::support::{AppError, OrderEvent, TestDatabase};

/// Server connections PgBouncer may open to the database: fewer than its clients here.
const POOL_SIZE: usize = 3;

/// A private PgBouncer in transaction mode in front of the shared PostgreSQL, on a free
/// port; stopped (and its directory removed) when dropped.
struct PgBouncer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    fn start() -> PgBouncer {
        let bin = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .expect("pgbouncer is installed (scripts/test.sh installs Debian's package)");
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (host, server_port) = host_port(&crate::support::postgres_admin_url());
        // PgBouncer refuses to run as root; as root it switches to `user` after start-up.
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"));
        let user = if root { "user = postgres\n" } else { "" };
        let users = dir.path().join("userlist.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n\"root\" \"\"\n").unwrap();
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host={host} port={server_port}\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {users}\n\
                 pool_mode = transaction\ndefault_pool_size = {POOL_SIZE}\n\
                 max_client_conn = 200\nignore_startup_parameters = extra_float_digits,options\n\
                 logfile = {log}\n{user}",
                users = users.display(),
                log = dir.path().join("pgbouncer.log").display(),
            ),
        )
        .unwrap();
        if root {
            // The dropped privileges must still read the configuration and write the log.
            let _ = Command::new("chmod")
                .args(["-R", "a+rwX"])
                .arg(dir.path())
                .status();
        }
        let child = Command::new(bin)
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let bouncer = PgBouncer { child, port, dir };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "pgbouncer did not listen on {port}: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    /// `db`'s URL, through this PgBouncer.
    fn url(&self, db: &TestDatabase) -> String {
        let (scheme, rest) = db.url.split_once("://").unwrap();
        let (authority, path) = rest.split_once('/').unwrap();
        let user = authority.rsplit_once('@').map(|(u, _)| format!("{u}@"));
        format!(
            "{scheme}://{}127.0.0.1:{}/{path}",
            user.unwrap_or_default(),
            self.port
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

/// The host and port of a `postgres://` URL (5432 if it gives none).
fn host_port(url: &str) -> (String, u16) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().unwrap_or(5432)),
        None => (hostport.to_string(), 5432),
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A writer's connection through PgBouncer, as a Diesel application configures one there:
/// no prepared-statement cache (Diesel then sends each statement unnamed, prepared and
/// bound in one message).
fn writer(url: &str) -> PgConnection {
    let mut conn = PgConnection::establish(url).unwrap();
    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
    conn
}

fn config(mode: Mode) -> RelayConfig {
    RelayConfig {
        mode,
        batch_size: 100,
        poll_interval: Duration::from_millis(20),
        lease: Duration::from_secs(6),
        publish_timeout: Duration::from_secs(2),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: 0.0,
        },
        // No server session is a relay's behind the pooler: the lease is the rule.
        session_check: None,
        ..RelayConfig::default()
    }
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    value: String,
}

fn setting(conn: &mut PgConnection, name: &str) -> String {
    diesel::sql_query(format!("SELECT current_setting('{name}') AS value"))
        .get_result::<Setting>(conn)
        .unwrap()
        .value
}

/// Each order's events were published once each, in the order written.
fn assert_in_order(broker: &MemoryBroker, aggregates: usize, per: usize) {
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for r in broker.all_records() {
        let p: serde_json::Value = serde_json::from_str(&r.payload).unwrap();
        seen.entry(r.key.clone())
            .or_default()
            .push(p["amount"].as_i64().unwrap());
    }
    assert_eq!(seen.len(), aggregates, "every order published");
    for (key, amounts) in seen {
        assert_eq!(
            amounts,
            (0..per as i64).collect::<Vec<_>>(),
            "order {key}: each event once, in order"
        );
    }
}

/// Two relays in `mode` and two writers, all through PgBouncer, while the writers write:
/// every event published once, in order per order; no dead letter; and every server
/// connection of the pool still has the server's settings afterwards.
async fn through_pgbouncer(mode: Mode, aggregates: usize, per: usize) {
    let db = Postgres::database("pgbouncer");
    let bouncer = PgBouncer::start();
    let url = bouncer.url(&db);
    let server = {
        let mut direct = PgConnection::establish(&db.url).unwrap();
        (
            setting(&mut direct, "synchronous_commit"),
            setting(&mut direct, "statement_timeout"),
        )
    };
    let broker = Arc::new(MemoryBroker::new());
    let mut relays = Vec::new();
    let mut stats = Vec::new();
    for _ in 0..2 {
        let store = PgRelayStore::new(&url).transaction_pooler(true);
        let relay = Relay::new(store, broker.clone(), config(mode)).unwrap();
        stats.push(relay.stats());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            relay
                .run(async move {
                    let _ = rx.await;
                })
                .await;
        });
        relays.push((stop, handle));
    }
    let started = Instant::now();
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let url = url.clone();
            // Each writer its own orders: order ids `w * aggregates/2 ..`.
            std::thread::spawn(move || {
                let mut conn = writer(&url);
                for i in 0..per {
                    conn.transaction_with_outbox(|tx| {
                        for a in 0..aggregates / 2 {
                            tx.publish(&OrderEvent::Paid {
                                order_id: (w * aggregates / 2 + a) as i64,
                                amount: i as i64,
                            })?;
                        }
                        Ok::<_, AppError>(())
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let total = (aggregates * per) as i64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while (broker.all_records().len() as i64) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    for (stop, handle) in relays {
        let _ = stop.send(());
        handle.await.unwrap();
    }
    eprintln!(
        "{mode:?} through PgBouncer: {} of {total} events published in {elapsed:.2?}",
        broker.all_records().len()
    );
    assert_in_order(&broker, aggregates, per);
    let errors: u64 = stats
        .iter()
        .map(|s| s.store_errors.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    assert_eq!(
        errors, 0,
        "no statement of the relays failed behind PgBouncer"
    );
    assert_eq!(
        Postgres::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE dead_at IS NOT NULL"
        ),
        0,
        "no dead letter"
    );
    // As many writers as the pool has server connections, each holding a transaction: each
    // is on a server connection of its own, so together they read every one of them.
    let mut held: Vec<PgConnection> = (0..POOL_SIZE).map(|_| writer(&url)).collect();
    for conn in &mut held {
        conn.batch_execute("BEGIN").unwrap();
        let seen = (
            setting(conn, "synchronous_commit"),
            setting(conn, "statement_timeout"),
        );
        assert_eq!(
            seen, server,
            "a writer through PgBouncer sees the server's settings, not the relay's"
        );
    }
    for conn in &mut held {
        conn.batch_execute("COMMIT").unwrap();
    }
    drop(held);
    drop(bouncer);
}

/// Sharded relays: 10,000 events of 20 orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_relays_and_writers_through_pgbouncer() {
    through_pgbouncer(Mode::Sharded, 20, 500).await;
}

/// A leader and its standby: 2,000 events of 10 orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_relays_and_writers_through_pgbouncer() {
    through_pgbouncer(Mode::Leader, 10, 200).await;
}

/// Stream mode: 2,000 events of 10 orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_relays_and_writers_through_pgbouncer() {
    through_pgbouncer(Mode::Stream, 10, 200).await;
}
