//! A PostgreSQL cluster of the bench's own: `initdb` in a temporary directory, started with
//! PostgreSQL's defaults (autovacuum on, fsync on, …), so that the drain, scale and latency
//! figures do not depend on how a shared server happens to be configured. The approach of the
//! chaos tests' `PrivatePostgres` (tests/e2e/chaos/services.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use diesel::prelude::*;

use crate::common::{V, exec};

/// A running private cluster; stopped and removed when dropped.
pub struct PrivatePg {
    dir: PathBuf,
    /// The server URL, without a database.
    pub server: String,
}

/// The newest PostgreSQL server binary `name` under /usr/lib/postgresql.
fn pg_bin(name: &str) -> Result<PathBuf, String> {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root)
        .map_err(|e| {
            format!(
                "PostgreSQL server binaries not found under {}: {e}",
                root.display()
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    versions.sort();
    let bin = versions
        .last()
        .ok_or_else(|| format!("no PostgreSQL version under {}", root.display()))?
        .join("bin")
        .join(name);
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!("{} does not exist", bin.display()))
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// Runs `program args` (as the `postgres` user when this process is root: the server refuses
/// to run as root); an error with its output when it fails.
fn as_postgres(program: &Path, args: &[&str]) -> Result<(), String> {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {} exited with {}: {}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

impl PrivatePg {
    /// `initdb` (trust authentication, user `postgres`) and `pg_ctl start` on a free port of
    /// 127.0.0.1, with no setting changed but the port and the socket directory.
    pub fn start() -> Result<PrivatePg, String> {
        PrivatePg::start_with(&[])
    }

    /// [`start`](Self::start), with `settings` (name, value) passed to the server as `-c`
    /// options: the one way a section departs from PostgreSQL's defaults, said in its report.
    pub fn start_with(settings: &[(&str, &str)]) -> Result<PrivatePg, String> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("outbox-bench-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if is_root() {
            let _ = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&dir)
                .status();
        }
        // From here on, a failure removes the directory (and stops a started server).
        let pg = PrivatePg {
            dir,
            server: format!("postgres://postgres@127.0.0.1:{port}"),
        };
        let data = pg.dir.join("data");
        let data = data.to_str().ok_or("temp dir is not UTF-8")?;
        as_postgres(
            &pg_bin("initdb")?,
            &["-A", "trust", "-U", "postgres", "-E", "UTF8", "-D", data],
        )?;
        let mut opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            pg.dir.display()
        );
        for (name, value) in settings {
            opts.push_str(&format!(" -c {name}={value}"));
        }
        // A diagnostic: settings of every private cluster, `name=value` separated by spaces
        // (e.g. `shared_preload_libraries=auto_explain auto_explain.log_min_duration=1000`);
        // the server log is `server.log` in the cluster's directory, printed here.
        if let Ok(extra) = std::env::var("OUTBOX_BENCH_PG_SETTINGS") {
            for setting in extra.split_whitespace() {
                opts.push_str(&format!(" -c {setting}"));
            }
            eprintln!(
                "private cluster with {extra}: log {}",
                pg.dir.join("server.log").display()
            );
        }
        let log = pg.dir.join("server.log");
        let log = log.to_str().ok_or("temp dir is not UTF-8")?;
        as_postgres(
            &pg_bin("pg_ctl")?,
            &["-D", data, "-w", "-l", log, "-o", &opts, "start"],
        )?;
        Ok(pg)
    }

    /// Creates database `db` with the outbox's migrations and the bench's `bench_orders`;
    /// returns its URL.
    pub fn database(&self, db: &str) -> String {
        let mut admin = PgConnection::establish(&format!("{}/postgres", self.server))
            .unwrap_or_else(|e| panic!("connect {}: {e}", self.server));
        exec(&mut admin, &format!("CREATE DATABASE {db}"));
        let url = format!("{}/{db}", self.server);
        let mut conn = PgConnection::establish(&url).expect("connect");
        crate::prepare(&mut conn);
        url
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        if let Ok(ctl) = pg_bin("pg_ctl") {
            let data = self.dir.join("data");
            if let Some(data) = data.to_str() {
                let _ = as_postgres(&ctl, &["-D", data, "-m", "immediate", "stop"]);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a report says of the server at `url`: its version and the settings the figures
/// depend on.
pub fn describe(url: &str) -> String {
    let mut conn = PgConnection::establish(url).unwrap_or_else(|e| panic!("connect {url}: {e}"));
    diesel::sql_query(
        "SELECT split_part(version(), ' on ', 1) || ': autovacuum = ' \
         || current_setting('autovacuum') || ', fsync = ' || current_setting('fsync') \
         || ', synchronous_commit = ' || current_setting('synchronous_commit') \
         || ', shared_buffers = ' || current_setting('shared_buffers') \
         || ', max_connections = ' || current_setting('max_connections') AS v",
    )
    .get_result::<V>(&mut conn)
    .expect("settings")
    .v
}
