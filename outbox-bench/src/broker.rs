//! A Kafka-protocol broker of the bench's own: noida-db (the test brokers' `scripts/kafka.sh`
//! installs it into `.venv-kafka/`) started on a free port with an empty data directory, and
//! emptied again before each run that publishes.
//!
//! Why: noida-db keeps a topic's records in memory and persists them as one JSON snapshot,
//! which it rewrites whole after writes. On the shared test broker, after a day of tests and
//! benchmark runs, that file was 800 MB and each rewrite took about 2 s of CPU (measured from
//! /proc while the broker was otherwise idle: 160–205 ticks in the 2 s after a 20,000-event
//! publish), which lands in the middle of whichever drain is running and takes one of the
//! machine's two cores from PostgreSQL and the relay. A Kafka broker appends to its log; its
//! cost per record does not grow with what it already holds. Emptied before each run, the
//! broker here holds at most one run's records, as a broker with a retention policy would.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running private noida-db; stopped and its data removed when dropped.
pub struct PrivateBroker {
    bin: PathBuf,
    dir: PathBuf,
    child: Child,
    /// `127.0.0.1:port`.
    pub addr: String,
}

/// The noida-db binary: `OUTBOX_BENCH_NOIDA`, else the one `scripts/kafka.sh` installed.
fn noida_bin() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("OUTBOX_BENCH_NOIDA") {
        return Ok(PathBuf::from(bin));
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-kafka/lib");
    let found = std::fs::read_dir(&lib)
        .map_err(|e| format!("{}: {e} (run ./scripts/kafka.sh start)", lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/noida_db/noida-db"))
        .find(|p| p.exists());
    found.ok_or_else(|| format!("no noida_db/noida-db under {}", lib.display()))
}

impl PrivateBroker {
    /// Starts one and waits until it accepts connections.
    pub fn start() -> Result<PrivateBroker, String> {
        let bin = noida_bin()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let dir = std::env::temp_dir().join(format!("outbox-bench-broker-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let log = std::fs::File::create(dir.join("noida.log")).map_err(|e| e.to_string())?;
        let child = Command::new(&bin)
            .args(["start", "--only", "kafka", "--host", "127.0.0.1"])
            .args(["--kafka-port", &port.to_string()])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let broker = PrivateBroker {
            bin,
            dir,
            child,
            addr: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&broker.addr).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "noida-db did not listen on {} within 30 s; see {}",
                    broker.addr,
                    broker.dir.join("noida.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(broker)
    }

    /// Deletes every topic and record (`noida-db reset kafka`), the broker still running.
    pub fn reset(&self) {
        let out = Command::new(&self.bin)
            .args(["reset", "kafka", "--yes", "--data-dir"])
            .arg(self.dir.join("data"))
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "noida-db reset kafka failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => panic!("{}: {e}", self.bin.display()),
        }
    }

    /// The broker's version, as `noida-db version` prints it.
    pub fn version(&self) -> String {
        Command::new(&self.bin)
            .arg("version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
