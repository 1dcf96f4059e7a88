//! A PostgreSQL cluster of a test's own (`initdb` in a temporary directory) that the test
//! may stop, restart or crash without disturbing any other test. Shared by the test binaries
//! that break a database (`#[path]`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// A server certificate for [`PrivatePostgres::start_with_tls`].
pub struct ServerTls<'a> {
    /// The server's certificate chain (PEM).
    pub cert_pem: &'a str,
    /// Its private key (PEM).
    pub key_pem: &'a str,
    /// The CA client certificates are checked against (`ssl_ca_file`), if any.
    pub client_ca_pem: Option<&'a str>,
    /// The whole `pg_hba.conf`.
    pub hba: &'a str,
}

impl PrivatePostgres {
    pub fn start() -> Self {
        let pg = Self::init();
        pg.ctl("start");
        pg
    }

    /// A cluster started with `ssl = on` and `tls`'s certificate, key and `pg_hba.conf`.
    pub fn start_with_tls(tls: &ServerTls<'_>) -> Self {
        let pg = Self::init();
        let data = pg.dir.join("data");
        let mut conf =
            String::from("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        pg.write_owned(&data.join("server.crt"), tls.cert_pem, 0o644);
        pg.write_owned(&data.join("server.key"), tls.key_pem, 0o600);
        if let Some(ca) = tls.client_ca_pem {
            pg.write_owned(&data.join("client_ca.crt"), ca, 0o644);
            conf.push_str("ssl_ca_file = 'client_ca.crt'\n");
        }
        pg.write_owned(&data.join("pg_hba.conf"), tls.hba, 0o600);
        let mut pgconf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        pgconf.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), pgconf).unwrap();
        pg.ctl("start");
        pg
    }

    /// Writes a file of the cluster's, owned by the server's user with `mode` (the server
    /// refuses a key others can read).
    fn write_owned(&self, path: &Path, contents: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, contents).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        let _ = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(path)
            .status();
    }

    /// A cluster initialised (`initdb`) but not started.
    fn init() -> Self {
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
        PrivatePostgres { dir, port }
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
