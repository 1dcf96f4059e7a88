//! Outages: a broker stopped for 30 s and a PostgreSQL server restarted, both mid-drain, on
//! private instances so that other tests are not disturbed. The relay recovers on its own and
//! nothing is lost.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A noida-db broker of our own, on `port`, keeping its data in `dir` across restarts.
struct PrivateBroker {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateBroker {
    fn start(port: u16, dir: &Path) -> Self {
        let mut b = PrivateBroker {
            port,
            dir: dir.to_owned(),
            child: None,
        };
        b.up();
        b
    }

    fn up(&mut self) {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-kafka/bin/noida-db");
        assert!(
            bin.exists(),
            "{} is missing: run scripts/kafka.sh start",
            bin.display()
        );
        use std::os::unix::process::CommandExt;
        let child = Command::new(bin)
            .process_group(0) // the launcher starts the server as a child: stop the group
            .args([
                "start",
                "--only",
                "kafka",
                "--host",
                "127.0.0.1",
                "--kafka-port",
                &self.port.to_string(),
            ])
            .arg("--data-dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_port(self.port, true);
    }

    fn down(&mut self) {
        self.stop();
        wait_port(self.port, false);
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", c.id())])
                .status();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn relay_rides_out_a_30s_broker_outage() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut broker = PrivateBroker::start(port, dir.path());
    let brokers = format!("127.0.0.1:{port}");
    let db = TestDatabase::postgres("e2e_broker_down");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    fill!(conn, 100, 100);
    let prefix = unique_prefix("brokerdown");
    let mut relay = RelayProcess::spawn(
        &db.url,
        &brokers,
        "sharded",
        &prefix,
        &["--batch-size", "100", "--max-attempts", "1000"],
    );
    let start = Instant::now();
    while pending_pg(&db.url) > 7_000 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.down();
    let during = pending_pg(&db.url);
    std::thread::sleep(Duration::from_secs(30));
    assert!(
        pending_pg(&db.url) > 0,
        "nothing can be published while the broker is down"
    );
    broker.up();
    wait_drained(|| pending_pg(&db.url), Duration::from_secs(180));
    let messages = consume(
        &brokers,
        &format!("{prefix}order-lifecycle"),
        10_000,
        Duration::from_secs(60),
    );
    relay.terminate();
    let ids: HashSet<&str> = messages.iter().map(|m| m.id()).collect();
    assert_eq!(
        ids.len(),
        10_000,
        "nothing lost ({during} were pending when the broker stopped)"
    );
    assert_per_key_order(&messages);
    assert_eq!(
        relay.child.try_wait().unwrap().map(|s| s.success()),
        Some(true),
        "{}",
        relay.log_text()
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
