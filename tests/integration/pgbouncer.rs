//! A private PgBouncer in transaction mode for the tests (Debian's, 1.18: no prepared-statement
//! tracking), with fewer server connections than the tests' clients, so that every client's
//! transactions land on server connections other clients used before.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::connection::CacheSize;
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};

use crate::support::TestDatabase;

/// Server connections PgBouncer may open to the database: fewer than its clients here.
pub const POOL_SIZE: usize = 3;

/// A private PgBouncer in transaction mode in front of the shared PostgreSQL, on a free
/// port; stopped (and its directory removed) when dropped.
pub struct PgBouncer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    pub fn start() -> PgBouncer {
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
    pub fn url(&self, db: &TestDatabase) -> String {
        let (scheme, rest) = db.url.split_once("://").unwrap();
        let (authority, path) = rest.split_once('/').unwrap();
        let user = authority.rsplit_once('@').map(|(u, _)| format!("{u}@"));
        format!(
            "{scheme}://{}127.0.0.1:{}/{path}",
            user.unwrap_or_default(),
            self.port
        )
    }

    pub fn log(&self) -> String {
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
pub fn writer(url: &str) -> PgConnection {
    let mut conn = PgConnection::establish(url).unwrap();
    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
    conn
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    value: String,
}

pub fn setting(conn: &mut PgConnection, name: &str) -> String {
    diesel::sql_query(format!("SELECT current_setting('{name}') AS value"))
        .get_result::<Setting>(conn)
        .unwrap()
        .value
}

/// The server's `synchronous_commit` and `statement_timeout`, as every server connection of
/// the pool reports them: as many writers as the pool has server connections, each holding a
/// transaction, so each is on a server connection of its own.
pub fn pool_settings(url: &str) -> Vec<(String, String)> {
    use diesel::connection::SimpleConnection;
    let mut held: Vec<PgConnection> = (0..POOL_SIZE).map(|_| writer(url)).collect();
    let mut seen = Vec::new();
    for conn in &mut held {
        conn.batch_execute("BEGIN").unwrap();
        seen.push((
            setting(conn, "synchronous_commit"),
            setting(conn, "statement_timeout"),
        ));
    }
    for conn in &mut held {
        conn.batch_execute("COMMIT").unwrap();
    }
    seen
}

/// The same two settings on a direct session to `db`.
pub fn server_settings(db: &TestDatabase) -> (String, String) {
    let mut direct = PgConnection::establish(&db.url).unwrap();
    (
        setting(&mut direct, "synchronous_commit"),
        setting(&mut direct, "statement_timeout"),
    )
}
