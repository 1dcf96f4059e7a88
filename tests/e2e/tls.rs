//! TLS to PostgreSQL: the relay, `outbox migrate`, `outbox status` and the admin API over
//! `sslmode=require` on the shared server, every session checked encrypted in `pg_stat_ssl`;
//! and `verify-full` against a CA made here, installed on a private cluster that accepts
//! TLS sessions only, with the wrong CA, the wrong host name and `sslmode=disable` each
//! refused in one line.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Bool, Integer};
use diesel::{Connection, QueryableByName, RunQueryDsl};
use outbox::OutboxConnection;
use outbox::relay::{MemoryBroker, PgRelayStore, Relay, RelayConfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

use crate::private_postgres::{PrivatePostgres, ServerTls};
use crate::support::{OrderCreated, postgres_admin_url};

/// A CA, a server certificate it signed for `localhost` only, a client certificate for the
/// user `postgres`, and a second CA that signed nothing of the server's: PEM files in a
/// temporary directory.
pub(crate) struct Pki {
    dir: tempfile::TempDir,
    pub server_cert: String,
    pub server_key: String,
    pub ca: String,
}

impl Pki {
    pub(crate) fn new() -> Pki {
        let ca = ca("outbox test CA");
        let other = ca_cert_only("another CA");
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&server_key, &ca)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, "postgres");
        let client = client.signed_by(&client_key, &ca).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: &str| std::fs::write(dir.path().join(name), pem).unwrap();
        write("ca.pem", &ca.pem());
        write("other-ca.pem", &other);
        write("client.crt", &client.pem());
        write("client.key", &client_key.serialize_pem());
        // An RSA client certificate (the MySQL driver takes RSA keys only), its key as
        // PKCS#8 and as PKCS#1, made by the openssl command.
        let rsa_key = dir.path().join("client-rsa.key");
        let ok = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&rsa_key)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(ok.success(), "openssl genpkey");
        let ok = Command::new("openssl")
            .args(["rsa", "-traditional", "-in"])
            .arg(&rsa_key)
            .arg("-out")
            .arg(dir.path().join("client-rsa-pkcs1.key"))
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(ok.success(), "openssl rsa -traditional");
        let rsa = KeyPair::from_pem(&std::fs::read_to_string(&rsa_key).unwrap()).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "certified");
        write(
            "client-rsa.crt",
            &params.signed_by(&rsa, &ca).unwrap().pem(),
        );
        Pki {
            server_cert: server.pem(),
            server_key: server_key.serialize_pem(),
            ca: ca.pem(),
            dir,
        }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

pub(crate) fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn ca_cert_only(name: &str) -> String {
    ca(name).pem()
}

#[derive(QueryableByName)]
struct Ssl {
    #[diesel(sql_type = Bool)]
    ssl: bool,
}

/// Whether the session of `conn` is encrypted, as the server sees it.
async fn encrypted(conn: &mut diesel_async::AsyncPgConnection) -> bool {
    let query = diesel::sql_query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()");
    diesel_async::RunQueryDsl::get_result::<Ssl>(query, conn)
        .await
        .unwrap()
        .ssl
}

fn outbox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .output()
        .expect("the outbox binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// `verify-full` against the CA made here, on a cluster that takes TLS sessions only (and a
/// client certificate for the database `certdb`): the library and the CLI connect; the wrong
/// CA, the wrong host name, a missing client certificate and `sslmode=disable` are each
/// refused in one line naming the server and what failed, never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verify_full_against_a_private_ca() {
    let pki = Pki::new();
    let pg = PrivatePostgres::start_with_tls(&ServerTls {
        cert_pem: &pki.server_cert,
        key_pem: &pki.server_key,
        client_ca_pem: Some(&pki.ca),
        hba: "local all all trust\n\
              hostssl certdb all 127.0.0.1/32 cert\n\
              hostssl all all 127.0.0.1/32 trust\n",
    });
    let port = pg.port;
    let ca = pki.path("ca.pem");
    let on = |host: &str, db: &str, params: &str| {
        format!("postgres://postgres:sekret@{host}:{port}/{db}?{params}")
    };
    let full = format!("sslmode=verify-full&sslrootcert={ca}");

    // The chain and the name check out: the session is encrypted.
    let mut conn = outbox::connect::postgres(&on("localhost", "postgres", &full))
        .await
        .expect("verify-full with the right CA and host connects");
    assert!(encrypted(&mut conn).await);
    for db in ["certdb", "app"] {
        let query = diesel::sql_query(format!("CREATE DATABASE {db}"));
        diesel_async::RunQueryDsl::execute(query, &mut conn)
            .await
            .unwrap();
    }
    // verify-ca checks the chain only: 127.0.0.1 is not in the certificate, and passes.
    let mut conn = outbox::connect::postgres(&on(
        "127.0.0.1",
        "postgres",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .await
    .expect("verify-ca ignores the host name");
    assert!(encrypted(&mut conn).await);

    let refused = async |url: String| -> String {
        let e = outbox::connect::postgres(&url)
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
            "postgres",
            &format!(
                "sslmode=verify-full&sslrootcert={}",
                pki.path("other-ca.pem")
            ),
        ))
        .await,
        format!(
            "cannot connect to localhost:{port}: TLS: certificate not signed by a trusted root \
             (sslrootcert)"
        )
    );
    assert_eq!(
        refused(on("127.0.0.1", "postgres", &full)).await,
        format!(
            "cannot connect to 127.0.0.1:{port}: TLS: certificate not valid for name \"127.0.0.1\""
        )
    );
    let plain = refused(on("localhost", "postgres", "sslmode=disable")).await;
    assert!(
        plain.starts_with(&format!(
            "cannot connect to localhost:{port}: FATAL: no pg_hba.conf entry"
        )) && plain.ends_with("no encryption"),
        "{plain}"
    );

    // The client certificate: `certdb` takes none but a certificate the CA signed.
    let no_cert = refused(on("localhost", "certdb", &full)).await;
    assert_eq!(
        no_cert,
        format!(
            "cannot connect to localhost:{port}: FATAL: connection requires a valid client certificate"
        )
    );
    let with_cert = format!(
        "{full}&sslcert={}&sslkey={}",
        pki.path("client.crt"),
        pki.path("client.key")
    );
    let mut conn = outbox::connect::postgres(&on("localhost", "certdb", &with_cert))
        .await
        .expect("the client certificate is accepted");
    assert!(encrypted(&mut conn).await);

    // The CLI, on a server that takes nothing but TLS: migrate and status succeed over
    // verify-full; the wrong host name fails in one line.
    let app = on("localhost", "app", &full);
    let out = outbox(&["migrate", "--database-url", &app]);
    assert!(out.status.success(), "migrate: {}", stderr(&out));
    let out = outbox(&["status", "--database-url", &app, "--json"]);
    assert!(out.status.success(), "status: {}", stderr(&out));
    let out = outbox(&["status", "--database-url", &on("127.0.0.1", "app", &full)]);
    assert!(!out.status.success());
    assert_eq!(
        stderr(&out),
        format!(
            "error: cannot connect to 127.0.0.1:{port}: TLS: certificate not valid for name \"127.0.0.1\""
        )
    );
}

/// An empty database on the shared server, dropped at the end.
struct EmptyDatabase {
    admin: String,
    name: String,
}

impl EmptyDatabase {
    fn new() -> EmptyDatabase {
        let admin = postgres_admin_url();
        let name = format!("outbox_t_tls_{}", std::process::id());
        let mut conn = diesel::PgConnection::establish(&admin).unwrap();
        diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .unwrap();
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .unwrap();
        EmptyDatabase { admin, name }
    }

    /// Its URL with `params`.
    fn url(&self, params: &str) -> String {
        let (base, _) = self.admin.split_once('?').unwrap_or((&self.admin, ""));
        let (server, _) = base.rsplit_once('/').unwrap();
        format!("{server}/{}?{params}", self.name)
    }
}

impl Drop for EmptyDatabase {
    fn drop(&mut self) {
        if let Ok(mut conn) = diesel::PgConnection::establish(&self.admin) {
            let _ = diesel::sql_query(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut conn);
        }
    }
}

#[derive(QueryableByName)]
struct Sessions {
    #[diesel(sql_type = BigInt)]
    total: i64,
    #[diesel(sql_type = BigInt)]
    encrypted: i64,
}

#[derive(QueryableByName)]
struct Terminated {
    #[diesel(sql_type = Integer)]
    n: i32,
}

/// The sessions on `db` other than the asking one, once there are at least `at_least` (the
/// relay opens its `LISTEN` connection beside its first claims): how many, and how many
/// encrypted.
async fn sessions(admin: &mut diesel::PgConnection, db: &str, at_least: i64) -> Sessions {
    let start = Instant::now();
    loop {
        let seen = sessions_now(admin, db);
        if seen.total >= at_least || start.elapsed() > Duration::from_secs(10) {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sessions_now(admin: &mut diesel::PgConnection, db: &str) -> Sessions {
    diesel::sql_query(format!(
        "SELECT count(*) AS total, count(*) FILTER (WHERE s.ssl) AS encrypted \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.datname = '{db}' AND a.pid <> pg_backend_pid()"
    ))
    .get_result(admin)
    .unwrap()
}

fn write_events(url: &str, from: i64, n: i64) {
    // libpq (sync diesel) honours the URL's sslmode itself.
    let mut conn = diesel::PgConnection::establish(url).unwrap();
    for order_id in from..from + n {
        conn.transaction_with_outbox(|tx| {
            tx.publish(&OrderCreated {
                order_id,
                total_cents: 1,
            })
        })
        .unwrap();
    }
}

async fn wait_for(broker: &MemoryBroker, n: usize) {
    let start = Instant::now();
    while broker.records("order").len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{} of {n} events published",
            broker.records("order").len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `sslmode=require` on the shared server (`ssl = on`, a self-signed certificate): `outbox
/// migrate` and `outbox status` succeed; a relay publishes, and every session it holds (its
/// store's and its `LISTEN` connection) is encrypted, also after the server ended them and
/// it reconnected; the admin API's connection is encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_require_relay_cli_and_admin_on_the_shared_server() {
    let db = EmptyDatabase::new();
    let url = db.url("sslmode=require");
    let out = outbox(&["migrate", "--database-url", &url]);
    assert!(out.status.success(), "migrate: {}", stderr(&out));
    let out = outbox(&["status", "--database-url", &url, "--json"]);
    assert!(out.status.success(), "status: {}", stderr(&out));

    write_events(&url, 0, 3);
    let broker = Arc::new(MemoryBroker::new());
    let store = PgRelayStore::new(&url).listen(true);
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(10),
        publish_timeout: Duration::from_secs(5),
        ..RelayConfig::default()
    };
    let relay = Relay::new(store, broker.clone(), config).unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    wait_for(&broker, 3).await;

    let mut admin = diesel::PgConnection::establish(&postgres_admin_url()).unwrap();
    let seen = sessions(&mut admin, &db.name, 2).await;
    assert!(
        seen.total >= 2,
        "the store's and the listener's sessions: {}",
        seen.total
    );
    assert_eq!(
        seen.encrypted, seen.total,
        "every relay session is encrypted"
    );

    // The server ends the relay's sessions: it reconnects, encrypted again.
    let ended: Terminated = diesel::sql_query(format!(
        "SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity \
         WHERE datname = '{}' AND pid <> pg_backend_pid()",
        db.name
    ))
    .get_result(&mut admin)
    .unwrap();
    assert!(ended.n >= 2);
    write_events(&url, 3, 2);
    wait_for(&broker, 5).await;
    let seen = sessions(&mut admin, &db.name, 1).await;
    assert!(seen.total >= 1, "the relay reconnected");
    assert_eq!(
        seen.encrypted, seen.total,
        "every reconnected session is encrypted"
    );
    stop.send(()).unwrap();
    handle.await.unwrap();

    // The admin API on a connection `connect::postgres` opened.
    let mut conn = outbox::connect::postgres(&url).await.unwrap();
    assert!(encrypted(&mut conn).await);
    let status = outbox::relay::admin::Admin::new(conn)
        .status()
        .await
        .unwrap();
    assert_eq!(status.pending, 0);
}
