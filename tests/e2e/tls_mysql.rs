//! TLS to MariaDB: a private `mariadbd` with a certificate from the CA the PostgreSQL TLS tests
//! make; `connect::mysql`, `outbox migrate`, `outbox status` and
//! a relay over `ssl-mode=VERIFY_IDENTITY`; the wrong CA and the wrong host name each
//! refused in one line.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl};
use outbox::relay::{MemoryBroker, MysqlRelayStore, Relay, RelayConfig};

use crate::private_postgres::free_port;
use crate::support::OrderCreated;
use crate::tls::Pki;

/// A MariaDB server of the test's own (`mariadb-install-db` in a temporary directory), with
/// TLS on; `root@localhost` has no password.
struct PrivateMariadb {
    dir: PathBuf,
    port: u16,
    server: Child,
}

impl PrivateMariadb {
    /// TLS with `cert_pem`/`key_pem`; client certificates are checked against `ca_pem`.
    fn start(cert_pem: &str, key_pem: &str, ca_pem: &str) -> PrivateMariadb {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("outbox-tls-mariadb-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("server.crt"), cert_pem).unwrap();
        std::fs::write(dir.join("server.key"), key_pem).unwrap();
        std::fs::write(dir.join("ca.pem"), ca_pem).unwrap();
        // The server drops to the `mysql` user when started as root.
        let _ = Command::new("chown")
            .args(["-R", "mysql:mysql"])
            .arg(&dir)
            .status();
        let data = dir.join("data");
        let ok = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args([
                "--user=mysql",
                "--skip-test-db",
                "--auth-root-authentication-method=normal",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("mariadb-install-db runs");
        assert!(ok.success(), "mariadb-install-db failed");
        let server = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg("--user=mysql")
            .arg(format!("--ssl-cert={}", dir.join("server.crt").display()))
            .arg(format!("--ssl-key={}", dir.join("server.key").display()))
            .arg(format!("--ssl-ca={}", dir.join("ca.pem").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd runs");
        let pg = PrivateMariadb { dir, port, server };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "mariadbd did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        pg
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(QueryableByName)]
struct Variable {
    #[diesel(sql_type = Text, column_name = "Value")]
    value: String,
}

/// The session's TLS cipher, empty when it is not encrypted.
async fn cipher(conn: &mut AsyncMysqlConnection) -> String {
    diesel::sql_query("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .get_result::<Variable>(conn)
        .await
        .unwrap()
        .value
}

fn outbox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .output()
        .expect("the outbox binary runs")
}

/// `VERIFY_IDENTITY` against the CA made here: the library, the CLI and a relay work, the
/// sessions `connect::mysql` opens (the relay store's too) encrypted; the wrong CA and the wrong host name are refused
/// in one line naming the server, never the password.
/// (`prefer_socket=false`: mysql_async would otherwise move a `localhost` session to the
/// server's Unix socket, which needs no TLS.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mysql_verify_identity_on_a_private_mariadb() {
    let pki = Pki::new();
    let db = PrivateMariadb::start(&pki.server_cert, &pki.server_key, &pki.ca);
    let port = db.port;
    let ca = pki.path("ca.pem");
    let identity = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
    // A user with a password, made by root (no password, from localhost) over TLS.
    let mut root = outbox::connect::mysql(&format!(
        "mysql://root@localhost:{port}/mysql?prefer_socket=false&{identity}"
    ))
    .await
    .expect("root connects over VERIFY_IDENTITY");
    for sql in [
        "CREATE USER app IDENTIFIED BY 'sekret'",
        "GRANT ALL ON *.* TO app",
        "CREATE USER certified IDENTIFIED BY 'sekret' REQUIRE X509",
        "GRANT SELECT ON *.* TO certified",
    ] {
        diesel::sql_query(sql).execute(&mut root).await.unwrap();
    }
    let on = |host: &str, name: &str, params: &str| {
        format!("mysql://app:sekret@{host}:{port}/{name}?prefer_socket=false&{params}")
    };

    let mut conn = outbox::connect::mysql(&on("localhost", "mysql", &identity))
        .await
        .expect("VERIFY_IDENTITY with the right CA and host connects");
    assert!(
        !cipher(&mut conn).await.is_empty(),
        "the session is encrypted"
    );
    diesel::sql_query("CREATE DATABASE app")
        .execute(&mut conn)
        .await
        .unwrap();
    // REQUIRED encrypts without checking the certificate.
    let mut conn = outbox::connect::mysql(&on("127.0.0.1", "mysql", "ssl-mode=REQUIRED"))
        .await
        .expect("REQUIRED does not verify");
    assert!(!cipher(&mut conn).await.is_empty());

    let refused = async |url: String| -> String {
        let e = outbox::connect::mysql(&url)
            .await
            .err()
            .unwrap_or_else(|| panic!("{url} connected"))
            .to_string();
        assert!(!e.contains("sekret"), "the password leaked: {e}");
        assert_eq!(e.lines().count(), 1, "one line: {e}");
        e
    };
    assert_eq!(
        refused(on(
            "localhost",
            "mysql",
            &format!(
                "ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
                pki.path("other-ca.pem")
            ),
        ))
        .await,
        format!(
            "cannot connect to localhost:{port}: TLS: certificate not signed by a trusted root (ssl-ca)"
        )
    );
    assert_eq!(
        refused(on("127.0.0.1", "mysql", &identity)).await,
        format!(
            "cannot connect to 127.0.0.1:{port}: TLS: certificate not valid for name \"127.0.0.1\""
        )
    );
    // A user created REQUIRE X509: refused without a client certificate, let in with the
    // one the CA signed (its key as PKCS#8 or PKCS#1); half a pair, or a key the driver
    // cannot use, is refused naming the parameter.
    let certified = |params: &str| {
        format!(
            "mysql://certified:sekret@localhost:{port}/mysql?prefer_socket=false&{identity}{params}"
        )
    };
    let e = refused(certified("")).await;
    assert!(
        e.starts_with(&format!("cannot connect to localhost:{port}: ")),
        "{e}"
    );
    for key in ["client-rsa.key", "client-rsa-pkcs1.key"] {
        let client = format!(
            "&ssl-cert={}&ssl-key={}",
            pki.path("client-rsa.crt"),
            pki.path(key)
        );
        let mut conn = outbox::connect::mysql(&certified(&client))
            .await
            .unwrap_or_else(|e| panic!("the client certificate with {key} is accepted: {e}"));
        assert!(!cipher(&mut conn).await.is_empty());
    }
    assert_eq!(
        refused(certified(&format!(
            "&ssl-cert={}",
            pki.path("client-rsa.crt")
        )))
        .await,
        "unusable database URL: ssl-cert is given without ssl-key (the client certificate's key)"
    );
    let ec = refused(certified(&format!(
        "&ssl-cert={}&ssl-key={}",
        pki.path("client.crt"),
        pki.path("client.key")
    )))
    .await;
    assert!(
        ec.starts_with("cannot use ssl-key") && ec.contains("not an RSA key"),
        "{ec}"
    );
    // The CLI and a relay.
    let app = on("localhost", "app", &identity);
    let out = outbox(&["migrate", "--database-url", &app]);
    assert!(
        out.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = outbox(&["status", "--database-url", &app, "--json"]);
    assert!(
        out.status.success(),
        "status: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut conn = outbox::connect::mysql(&app).await.unwrap();
    assert!(!cipher(&mut conn).await.is_empty());
    for order_id in 0..3 {
        let event = OrderCreated {
            order_id,
            total_cents: 1,
        };
        conn.transaction(async |c| outbox::publish_async(c, &event).await)
            .await
            .unwrap();
    }
    let broker = Arc::new(MemoryBroker::new());
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(10),
        publish_timeout: Duration::from_secs(5),
        ..RelayConfig::default()
    };
    let relay = Relay::new(MysqlRelayStore::new(&app), broker.clone(), config).unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    let start = Instant::now();
    while broker.records("order").len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the relay published nothing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    handle.await.unwrap();
}

/// The shared MariaDB (no TLS configured): `PREFERRED` falls back to a plain session,
/// `REQUIRED` is refused in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mysql_preferred_falls_back_on_a_server_without_tls() {
    let admin = crate::support::mysql_admin_url();
    let with = |params: &str| {
        let sep = if admin.contains('?') { '&' } else { '?' };
        format!("{admin}{sep}prefer_socket=false&{params}")
    };
    let mut probe = outbox::connect::mysql(&with("ssl-mode=DISABLED"))
        .await
        .unwrap();
    let have_ssl: Variable = diesel::sql_query("SHOW VARIABLES LIKE 'have_ssl'")
        .get_result(&mut probe)
        .await
        .unwrap();
    if have_ssl.value == "YES" {
        eprintln!("the shared MariaDB has TLS on: nothing to fall back from");
        return;
    }
    let mut conn = outbox::connect::mysql(&with("ssl-mode=PREFERRED"))
        .await
        .expect("PREFERRED connects in plain text");
    assert!(cipher(&mut conn).await.is_empty());
    let e = outbox::connect::mysql(&with("ssl-mode=REQUIRED"))
        .await
        .err()
        .expect("REQUIRED is refused")
        .to_string();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("cannot connect to 127.0.0.1:3306: "), "{e}");
}
