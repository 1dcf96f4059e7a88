//! Kafka over TLS and SASL through the `outbox` binary, against a private tansu broker behind
//! stunnel, which terminates TLS with a certificate of a CA made here. tansu advertises
//! stunnel's address, so every connection a client opens (bootstrap, partition leader, group
//! coordinator) is a TLS one; tansu's own plain port is never given to a client.
//!
//! - mutual TLS: the relay publishes with `security.protocol=SSL`, the private CA and a client
//!   certificate whose key is encrypted (`ssl.key.password`), all from a `--kafka-config-file`,
//!   and a consumer reads the events back over the same path;
//! - a broker certificate of a CA the relay does not trust: at start the relay stops with one
//!   line naming the failed verification; while it runs, it is an outage (no attempt counted,
//!   nothing dead-lettered), and delivery resumes once the broker's certificate is right again;
//! - SASL_SSL with SCRAM-SHA-512 against tansu with `--authentication`: the build speaks it
//!   (no "not supported in this build"), and a refused login stops the relay in one line and is
//!   an outage for the publisher (tansu keeps its users in its storage, memory only in the
//!   wheel the tests use, and creates them only for an authenticated client: no login can
//!   succeed there);
//! - SASL_PLAINTEXT with PLAIN against the shared noida-db, which takes any credentials: the
//!   relay logs in and publishes, a consumer reads back.
//!
//! No secret is ever printed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::{Connection, RunQueryDsl};
use outbox::prelude::*;
use rcgen::{CertificateParams, DnType, KeyPair};

use crate::chaos::services::{free_port, tansu_bin, wait_port};
use crate::harness::{RelayProcess, consume_with, outbox_bin, outbox_ok, unique_prefix};
use crate::support::{Count, OrderCreated, TestDatabase, claimed};
use crate::tls::ca;

/// The encrypted client key's password (`ssl.key.password`).
const KEY_PASSWORD: &str = "hunter2-keypass";
/// The SASL password the broker refuses.
const SASL_PASSWORD: &str = "hunter2-sasl";

/// Every secret a test gives the relay: none may appear in what it prints.
const SECRETS: [&str; 2] = [KEY_PASSWORD, SASL_PASSWORD];

/// A CA, a server certificate it signed for `127.0.0.1` and `localhost`, a client certificate
/// it signed (its key in `client.key` encrypted with [`KEY_PASSWORD`], in `client-plain.key`
/// not), and a second CA with a server certificate of its own: PEM files in a temporary
/// directory.
pub(crate) struct Pki {
    pub(crate) dir: tempfile::TempDir,
}

impl Pki {
    pub(crate) fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("outbox-e2e-kafka-tls-")
            .tempdir()
            .unwrap();
        let write = |name: &str, pem: &str| std::fs::write(dir.path().join(name), pem).unwrap();
        let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let trusted = ca("outbox Kafka test CA");
        let key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(names.clone())
            .unwrap()
            .signed_by(&key, &trusted)
            .unwrap();
        write("ca.pem", &trusted.pem());
        write("server.crt", &server.pem());
        write("server.key", &key.serialize_pem());

        let other = ca("another CA");
        let key = KeyPair::generate().unwrap();
        let rogue = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &other)
            .unwrap();
        write("other-ca.pem", &other.pem());
        write("rogue.crt", &rogue.pem());
        write("rogue.key", &key.serialize_pem());

        let key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, "outbox-relay");
        let client = client.signed_by(&key, &trusted).unwrap();
        write("client.crt", &client.pem());
        write("client-plain.key", &key.serialize_pem());
        // An encrypted PKCS#8 key, as operators are handed them: `ssl.key.password` unlocks it.
        let out = Command::new("openssl")
            .args(["pkcs8", "-topk8", "-v2", "aes-256-cbc"])
            .args(["-passout", "env:OUTBOX_TEST_KEY_PASSWORD", "-in"])
            .arg(dir.path().join("client-plain.key"))
            .arg("-out")
            .arg(dir.path().join("client.key"))
            .env("OUTBOX_TEST_KEY_PASSWORD", KEY_PASSWORD)
            .output()
            .expect("the openssl command runs (Debian: openssl)");
        assert!(
            out.status.success(),
            "openssl pkcs8: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Pki { dir }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// Which certificate a server presents.
#[derive(Clone, Copy)]
pub(crate) enum ServerCert {
    /// Signed by the CA the clients trust.
    Trusted,
    /// Signed by another CA.
    Rogue,
}

/// A private tansu broker (in memory, on a plain port of its own) behind stunnel, which
/// terminates TLS on [`port`](Self::port) and forwards to tansu; tansu advertises stunnel's
/// address. Both processes are killed, and their files removed, on drop.
struct TlsKafka {
    tansu: Child,
    tansu_port: u16,
    stunnel: Option<Child>,
    port: u16,
    /// Whether stunnel asks for a client certificate of the CA.
    client_certs: bool,
    work: tempfile::TempDir,
}

impl TlsKafka {
    /// tansu, with `--authentication` (SASL SCRAM) if `sasl`, behind stunnel presenting the
    /// trusted certificate and, if `client_certs`, refusing clients without one of the CA's.
    fn start(pki: &Pki, sasl: bool, client_certs: bool) -> TlsKafka {
        let work = tempfile::Builder::new()
            .prefix("outbox-e2e-kafka-tls-run-")
            .tempdir()
            .unwrap();
        let tansu_port = free_port();
        let port = free_port();
        let log = std::fs::File::create(work.path().join("tansu.log")).unwrap();
        let mut tansu = Command::new(tansu_bin());
        tansu
            .arg("broker")
            .args(["--listener-url", &format!("tcp://127.0.0.1:{tansu_port}")])
            .args([
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{port}"),
            ])
            .args(["--storage-engine", "memory://tansu/"]);
        if sasl {
            tansu.arg("--authentication");
        }
        let tansu = tansu
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        wait_port(tansu_port);
        let mut kafka = TlsKafka {
            tansu,
            tansu_port,
            stunnel: None,
            port,
            client_certs,
            work,
        };
        kafka.serve(pki, ServerCert::Trusted);
        kafka
    }

    /// (Re)starts stunnel on the same port, presenting `cert`.
    fn serve(&mut self, pki: &Pki, cert: ServerCert) {
        self.stop_stunnel();
        let upstream = format!("127.0.0.1:{}", self.tansu_port);
        let stunnel = stunnel(
            pki,
            self.work.path(),
            self.port,
            &upstream,
            cert,
            self.client_certs,
        );
        self.stunnel = Some(stunnel);
    }

    fn stop_stunnel(&mut self) {
        if let Some(mut stunnel) = self.stunnel.take() {
            let _ = stunnel.kill();
            let _ = stunnel.wait();
        }
    }

    /// stunnel's address: the only one clients are given and the one tansu advertises.
    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What stunnel and tansu logged, for failure messages.
    fn logs(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.work.path().join(name));
        format!(
            "--- stunnel:\n{}\n--- tansu:\n{}",
            read("stunnel.log").unwrap_or_default(),
            read("tansu.log").unwrap_or_default()
        )
    }
}

impl ServerCert {
    /// The certificate's and its key's file names in the [`Pki`].
    pub(crate) fn files(self) -> (&'static str, &'static str) {
        match self {
            ServerCert::Trusted => ("server.crt", "server.key"),
            ServerCert::Rogue => ("rogue.crt", "rogue.key"),
        }
    }
}

/// stunnel in the foreground, terminating TLS on `127.0.0.1:accept` with `cert` and forwarding
/// to `upstream` (`host:port`); with `client_certs`, refusing a client without a certificate
/// of the CA. It logs to `stunnel.log` in `work`; the caller kills it. Returns once it listens.
pub(crate) fn stunnel(
    pki: &Pki,
    work: &Path,
    accept: u16,
    upstream: &str,
    cert: ServerCert,
    client_certs: bool,
) -> Child {
    let (crt, key) = cert.files();
    let mut conf = format!(
        "foreground = yes\npid =\n[tls]\naccept = 127.0.0.1:{accept}\nconnect = {upstream}\n\
         cert = {}\nkey = {}\n",
        pki.path(crt),
        pki.path(key)
    );
    if client_certs {
        conf.push_str(&format!(
            "CAfile = {}\nverifyChain = yes\nrequireCert = yes\n",
            pki.path("ca.pem")
        ));
    }
    let path = work.join("stunnel.conf");
    std::fs::write(&path, conf).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(work.join("stunnel.log"))
        .unwrap();
    let child = Command::new("stunnel4")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("stunnel4 runs (Debian: stunnel4)");
    wait_port(accept);
    child
}

impl Drop for TlsKafka {
    fn drop(&mut self) {
        self.stop_stunnel();
        let _ = self.tansu.kill();
        let _ = self.tansu.wait();
    }
}

/// Writes `settings` as a `--kafka-config-file` in `dir`; returns its path.
fn config_file(dir: &Path, settings: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("kafka.properties");
    let text: String = settings.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(&path, format!("# the relay's Kafka settings\n{text}")).unwrap();
    path
}

/// `outbox relay` with the binary's default log filter (as a user runs it), its Kafka
/// settings from `config`, logging to `log`; killed on drop if still running.
fn relay(
    db: &str,
    brokers: &str,
    prefix: &str,
    config: &Path,
    log: &Path,
    id: &str,
) -> RelayProcess {
    let child = Command::new(outbox_bin())
        .args(["relay", "--database-url", db, "--brokers", brokers])
        .args(["--relay-id", id, "--topic-prefix", prefix])
        .args(["--kafka-config-file", config.to_str().unwrap()])
        .args(["--message-timeout", "2000", "--lease", "6000"])
        .args(["--poll-interval", "100", "--retry-initial", "100"])
        .args(["--retry-max", "1000", "--max-attempts", "1"])
        .env_remove("RUST_LOG")
        .env_remove("OUTBOX_KAFKA_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .expect("the outbox binary runs");
    RelayProcess {
        child,
        log: log.to_owned(),
        id: id.to_owned(),
    }
}

/// Waits for `child` to exit (at most 60 s, its start-up check takes 10); returns its status.
pub(crate) fn exit_of(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the relay neither started nor stopped in 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes orders `ids` beside a running relay (SQLite: waits for its writes).
pub(crate) fn write_orders(url: &str, ids: std::ops::Range<i64>) {
    let mut conn = diesel::SqliteConnection::establish(url).unwrap();
    diesel::connection::SimpleConnection::batch_execute(&mut conn, "PRAGMA busy_timeout = 5000")
        .unwrap();
    for order_id in ids {
        conn.transaction_with_outbox(|tx| {
            tx.publish(&OrderCreated {
                order_id,
                total_cents: 100,
            })?;
            Ok::<_, outbox::Error>(())
        })
        .unwrap();
    }
}

/// How many events match `filter` (an SQL condition on `outbox_events`).
pub(crate) fn count(url: &str, filter: &str) -> i64 {
    let mut conn = diesel::SqliteConnection::establish(url).unwrap();
    diesel::connection::SimpleConnection::batch_execute(&mut conn, "PRAGMA busy_timeout = 5000")
        .unwrap();
    diesel::sql_query(format!(
        "SELECT COUNT(*) AS n FROM outbox_events WHERE {filter}"
    ))
    .get_result::<Count>(&mut conn)
    .unwrap()
    .n
}

pub(crate) const PENDING: &str = "published_at IS NULL AND dead_at IS NULL";

/// Once all are published: a dead letter, or an event claimed more than once that counted
/// the claims (a claim counts an attempt; one given back after an outage is uncounted).
pub(crate) const UNEXPECTED: &str = "dead_at IS NOT NULL OR attempts <> 1";

/// Waits until nothing is pending, or fails after 60 s with the relay's log and `more()`.
pub(crate) fn wait_published(url: &str, log: &Path, more: &dyn Fn() -> String) {
    let start = Instant::now();
    while count(url, PENDING) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} events still pending; relay log:\n{}\n{}",
            count(url, PENDING),
            std::fs::read_to_string(log).unwrap_or_default(),
            more()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows a secret: {text}");
    }
}

/// Mutual TLS: the relay publishes through stunnel with the private CA and a client
/// certificate whose key only `ssl.key.password` opens, and a consumer reads the events back
/// over the same TLS path; stunnel refuses a client without a certificate.
#[test]
fn kafka_mutual_tls_relay_publishes_and_a_consumer_reads_back() {
    let pki = Pki::new();
    let kafka = TlsKafka::start(&pki, false, true);
    let db = TestDatabase::sqlite("kafka_tls");
    write_orders(&db.url, 0..5);
    let (ca, crt, key) = (
        pki.path("ca.pem"),
        pki.path("client.crt"),
        pki.path("client.key"),
    );
    let tls = [
        ("security.protocol", "SSL"),
        ("ssl.ca.location", ca.as_str()),
        ("ssl.certificate.location", crt.as_str()),
        ("ssl.key.location", key.as_str()),
        ("ssl.key.password", KEY_PASSWORD),
    ];
    let config = config_file(pki.dir.path(), &tls);
    let log = pki.dir.path().join("relay.log");
    let prefix = unique_prefix("kafkatls");
    let mut child = relay(
        &db.url,
        &kafka.address(),
        &prefix,
        &config,
        &log,
        "kafka-mtls",
    );
    wait_published(&db.url, &log, &|| kafka.logs());
    write_orders(&db.url, 5..8);
    wait_published(&db.url, &log, &|| kafka.logs());

    let messages = consume_with(
        &kafka.address(),
        &tls,
        &format!("{prefix}order"),
        8,
        Duration::from_secs(60),
    );
    let status = outbox_ok(&["status", "--database-url", &db.url]);
    child.kill();
    let relay_log = std::fs::read_to_string(&log).unwrap();
    let mut keys: Vec<i64> = messages.iter().map(|m| m.key.parse().unwrap()).collect();
    keys.sort();
    assert_eq!(keys, (0..8).collect::<Vec<_>>(), "{}", kafka.logs());
    assert_eq!(count(&db.url, UNEXPECTED), 0, "one attempt each: {status}");
    assert_no_secret("the relay's log", &relay_log);
    assert_no_secret("outbox status", &status);

    // Without a client certificate stunnel ends the handshake: the same settings minus the
    // certificate reach nothing.
    let no_cert = &tls[..2];
    let consumer = crate::harness::assigned_consumer_with(
        &kafka.address(),
        no_cert,
        &format!("{prefix}order"),
        Instant::now(),
        Duration::from_secs(3),
    );
    assert!(
        consumer.is_none(),
        "a client without a certificate got metadata"
    );
}

/// A broker certificate from a CA the relay does not trust. At start: the relay stops in one
/// line naming the failed verification. While it runs (the broker's certificate replaced): an
/// outage, `waiting_for_broker`, no attempt counted and nothing dead-lettered even with
/// `--max-attempts 1`; with the right certificate back, delivery resumes.
#[test]
fn kafka_tls_untrusted_broker_certificate_is_an_outage_named_in_one_line() {
    let pki = Pki::new();
    let mut kafka = TlsKafka::start(&pki, false, false);
    let db = TestDatabase::sqlite("kafka_tls_ca");
    write_orders(&db.url, 0..2);
    let prefix = unique_prefix("kafkatlsca");

    // The wrong CA from the start.
    let other = pki.path("other-ca.pem");
    let wrong = config_file(
        pki.dir.path(),
        &[
            ("security.protocol", "SSL"),
            ("ssl.ca.location", &other),
            ("ssl.key.password", KEY_PASSWORD),
        ],
    );
    let log = pki.dir.path().join("relay-wrong-ca.log");
    let mut child = relay(
        &db.url,
        &kafka.address(),
        &prefix,
        &wrong,
        &log,
        "kafka-wrong-ca",
    );
    let status = exit_of(&mut child.child);
    let out = std::fs::read_to_string(&log).unwrap();
    eprintln!("the relay with the wrong CA ({status}):\n{out}");
    assert!(!status.success());
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("error: cannot reach Kafka at {}", kafka.address()))
            && last.contains("certificate verify failed"),
        "one line naming the broker and the failed verification: {out}"
    );
    assert_no_secret("the relay's output", &out);
    assert_eq!(count(&db.url, PENDING), 2, "nothing was published");

    // The right CA: the relay publishes; then the broker presents a certificate of another CA.
    let ca = pki.path("ca.pem");
    let right = config_file(
        pki.dir.path(),
        &[("security.protocol", "SSL"), ("ssl.ca.location", &ca)],
    );
    let log = pki.dir.path().join("relay.log");
    let id = "kafka-tls-swap";
    let mut child = relay(&db.url, &kafka.address(), &prefix, &right, &log, id);
    wait_published(&db.url, &log, &|| kafka.logs());
    kafka.serve(&pki, ServerCert::Rogue);
    write_orders(&db.url, 2..4);
    let start = Instant::now();
    let status = loop {
        let status = outbox_ok(&["status", "--database-url", &db.url]);
        if status.contains(&format!("{id} (sharded): waiting_for_broker"))
            && status
                .lines()
                .any(|l| l.contains("last outage:") && l.contains("certificate verify failed"))
        {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the relay never waited for the broker, naming the failed verification: {status}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("outbox status while the broker's certificate is untrusted:\n{status}");
    assert_eq!(count(&db.url, PENDING), 2, "nothing published meanwhile");
    assert_eq!(
        count(&db.url, "dead_at IS NOT NULL"),
        0,
        "an outage dead-letters nothing (--max-attempts 1)"
    );
    kafka.serve(&pki, ServerCert::Trusted);
    wait_published(&db.url, &log, &|| kafka.logs());
    child.kill();
    let relay_log = std::fs::read_to_string(&log).unwrap();
    eprintln!("relay log:\n{relay_log}");
    assert!(
        relay_log.contains("certificate verify failed"),
        "the relay's log names the failed verification: {relay_log}"
    );
    assert_eq!(
        count(&db.url, UNEXPECTED),
        0,
        "the claims that met the outage were given back uncounted: one attempt each"
    );
    let messages = consume_with(
        &kafka.address(),
        &[("security.protocol", "SSL"), ("ssl.ca.location", &ca)],
        &format!("{prefix}order"),
        4,
        Duration::from_secs(60),
    );
    let mut keys: Vec<i64> = messages.iter().map(|m| m.key.parse().unwrap()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys, [0, 1, 2, 3]);
}

/// SASL_SSL with SCRAM-SHA-512 against tansu with `--authentication` (behind stunnel): the
/// build takes every setting (no "not supported in this build"); credentials the broker does
/// not know stop the relay at start in one line naming the authentication failure, and are an
/// outage for the publisher, never poison. The password is in no output.
#[test]
fn kafka_sasl_ssl_scram_refused_login_is_an_outage_without_the_password() {
    let pki = Pki::new();
    let kafka = TlsKafka::start(&pki, true, false);
    let db = TestDatabase::sqlite("kafka_sasl");
    write_orders(&db.url, 0..1);
    let ca = pki.path("ca.pem");
    let sasl = [
        ("security.protocol", "SASL_SSL"),
        ("ssl.ca.location", ca.as_str()),
        ("sasl.mechanisms", "SCRAM-SHA-512"),
        ("sasl.username", "outbox-relay"),
        ("sasl.password", SASL_PASSWORD),
    ];
    let config = config_file(pki.dir.path(), &sasl);
    let log = pki.dir.path().join("relay.log");
    let mut child = relay(
        &db.url,
        &kafka.address(),
        &unique_prefix("kafkasasl"),
        &config,
        &log,
        "kafka-sasl",
    );
    let status = exit_of(&mut child.child);
    let out = std::fs::read_to_string(&log).unwrap();
    eprintln!("the relay with refused SASL credentials ({status}):\n{out}");
    assert!(!status.success());
    assert!(!out.contains("not supported"), "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("error: cannot reach Kafka at {}", kafka.address()))
            && last.contains("SASL"),
        "one line naming the broker and the SASL failure: {out}\n{}",
        kafka.logs()
    );
    assert_no_secret("the relay's output", &out);
    assert_eq!(count(&db.url, PENDING), 1);

    // The publisher with the same settings: the delivery is an outage (`Unavailable`), so
    // the relay would wait and count nothing.
    let mut builder = outbox::kafka::KafkaPublisher::builder()
        .brokers(kafka.address())
        .message_timeout(Duration::from_secs(2));
    for (key, value) in sasl {
        builder = builder.set(key, value);
    }
    let publisher = builder
        .build()
        .expect("the build supports SASL_SSL and SCRAM");
    let message = claimed(&OrderCreated {
        order_id: 1,
        total_cents: 1,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcomes = runtime.block_on(outbox::relay::Publisher::publish(
        &publisher,
        std::slice::from_ref(&message),
    ));
    eprintln!("the publisher's outcome: {outcomes:?}");
    assert!(
        matches!(&outcomes[..], [outbox::relay::Delivery::Unavailable(reason)]
            if reason.contains("SASL authentication error")),
        "a refused login is an outage, named: {outcomes:?}"
    );
    assert_no_secret("the outcome", &format!("{outcomes:?}"));
}

/// SASL_PLAINTEXT with PLAIN against noida-db (the shared broker: it speaks SASL PLAIN and,
/// having no users, takes any credentials): the relay logs in and publishes, and a consumer
/// logged in the same way reads the events back. The password is in no output.
#[test]
fn kafka_sasl_plain_relay_publishes_and_a_consumer_reads_back() {
    let dir = tempfile::Builder::new()
        .prefix("outbox-e2e-kafka-sasl-")
        .tempdir()
        .unwrap();
    let db = TestDatabase::sqlite("kafka_sasl_plain");
    write_orders(&db.url, 0..3);
    let sasl = [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "PLAIN"),
        ("sasl.username", "outbox-relay"),
        ("sasl.password", SASL_PASSWORD),
    ];
    let config = config_file(dir.path(), &sasl);
    let log = dir.path().join("relay.log");
    let prefix = unique_prefix("kafkasaslplain");
    let brokers = crate::harness::noida();
    let mut child = relay(
        &db.url,
        &brokers,
        &prefix,
        &config,
        &log,
        "kafka-sasl-plain",
    );
    wait_published(&db.url, &log, &String::new);
    let messages = consume_with(
        &brokers,
        &sasl,
        &format!("{prefix}order"),
        3,
        Duration::from_secs(60),
    );
    let status = outbox_ok(&["status", "--database-url", &db.url]);
    child.kill();
    let relay_log = std::fs::read_to_string(&log).unwrap();
    let mut keys: Vec<i64> = messages.iter().map(|m| m.key.parse().unwrap()).collect();
    keys.sort();
    assert_eq!(keys, [0, 1, 2], "{relay_log}");
    assert_eq!(count(&db.url, UNEXPECTED), 0);
    assert_no_secret("the relay's log", &relay_log);
    assert_no_secret("outbox status", &status);
}
