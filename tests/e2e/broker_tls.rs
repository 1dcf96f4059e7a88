//! NATS and RabbitMQ over TLS through the `outbox` binary and the consumers, with a CA made
//! here: a private nats-server (JetStream, TLS required, client certificates verified) and
//! stunnel in front of the shared RabbitMQ (client certificates required).
//!
//! - mutual TLS: the relay publishes with `--broker-ca-file`, `--broker-cert-file` and
//!   `--broker-key-file`, and our consumer reads every event back over TLS with the same files;
//! - a server certificate of a CA the relay does not trust: the relay stops at start with one
//!   line naming the failed verification, and shows no password;
//! - the server's certificate replaced by one of another CA while the relay runs: an outage
//!   (nothing published, nothing dead-lettered with `--max-attempts 1`), and every event
//!   published once, with one attempt, when the right certificate is back.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use outbox::prelude::*;

use crate::chaos::brokers::{amqp_url, host_port, runtime};
use crate::chaos::services::{free_port, wait_port};
use crate::harness::{RelayProcess, outbox_bin, outbox_ok};
use crate::kafka_tls::{
    PENDING, Pki, ServerCert, UNEXPECTED, count, exit_of, stunnel, wait_published, write_orders,
};
use crate::support::{OrderCreated, TestDatabase};

/// Which broker a test runs against.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A nats-server of the test's own, TLS only, verifying client certificates.
    Nats,
    /// stunnel in front of the shared RabbitMQ, requiring client certificates.
    RabbitMq,
}

/// The broker a test runs against, behind TLS of the test's [`Pki`], on a port of its own.
struct TlsBroker {
    kind: Kind,
    port: u16,
    /// nats-server or stunnel.
    process: Option<Child>,
}

impl TlsBroker {
    fn start(kind: Kind, pki: &Pki, work: &tempfile::TempDir, cert: ServerCert) -> TlsBroker {
        let mut broker = TlsBroker {
            kind,
            port: free_port(),
            process: None,
        };
        broker.serve(pki, work, cert);
        broker
    }

    /// (Re)starts the TLS server on the same port, presenting `cert`. nats-server keeps its
    /// JetStream directory, so its streams outlive a restart.
    fn serve(&mut self, pki: &Pki, work: &tempfile::TempDir, cert: ServerCert) {
        self.stop();
        self.process = Some(match self.kind {
            Kind::Nats => {
                let (crt, key) = cert.files();
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(work.path().join("nats-server.log"))
                    .unwrap();
                let server = Command::new("nats-server")
                    .args([
                        "-a",
                        "127.0.0.1",
                        "-p",
                        &self.port.to_string(),
                        "-js",
                        "-sd",
                    ])
                    .arg(work.path().join("jetstream"))
                    .args([
                        "--tls",
                        "--tlscert",
                        &pki.path(crt),
                        "--tlskey",
                        &pki.path(key),
                    ])
                    .args(["--tlsverify", "--tlscacert", &pki.path("ca.pem")])
                    .stdout(Stdio::null())
                    .stderr(Stdio::from(log))
                    .spawn()
                    .expect("nats-server runs");
                wait_port(self.port);
                server
            }
            Kind::RabbitMq => {
                let upstream = host_port(&amqp_url());
                stunnel(pki, work.path(), self.port, &upstream, cert, true)
            }
        });
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// The relay's `--broker`: TLS on the broker's port, the shared RabbitMQ's user.
    fn url(&self) -> String {
        let port = self.port;
        match self.kind {
            Kind::Nats => format!("tls://127.0.0.1:{port}"),
            Kind::RabbitMq => {
                let plain = amqp_url();
                let (_, rest) = plain.split_once("://").unwrap();
                let (user, rest) = rest.rsplit_once('@').unwrap_or(("guest:guest", rest));
                let vhost = rest.split_once('/').map_or("%2f", |(_, v)| v);
                format!("amqps://{user}@localhost:{port}/{vhost}")
            }
        }
    }

    /// What the TLS server logged, for failure messages.
    fn log(&self, work: &tempfile::TempDir) -> String {
        let name = match self.kind {
            Kind::Nats => "nats-server.log",
            Kind::RabbitMq => "stunnel.log",
        };
        std::fs::read_to_string(work.path().join(name)).unwrap_or_default()
    }
}

impl Drop for TlsBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The relays' `--relay-id`, as `outbox status` shows it.
pub(crate) const RELAY_ID: &str = "broker-tls";

/// `outbox relay --broker url` with the binary's default log filter and `files` (a flag
/// and its file each), logging to `log`.
pub(crate) fn relay(
    db: &str,
    url: &str,
    prefix: &str,
    files: &[(&str, String)],
    log: &std::path::Path,
) -> Child {
    let mut command = Command::new(outbox_bin());
    command
        .args(["relay", "--database-url", db, "--broker", url])
        .args(["--topic-prefix", prefix, "--relay-id", RELAY_ID])
        .args(["--message-timeout", "2000", "--lease", "10000"])
        .args(["--poll-interval", "100", "--retry-initial", "100"])
        .args(["--retry-max", "1000", "--max-attempts", "1"]);
    for (flag, file) in files {
        command.arg(flag).arg(file);
    }
    command
        .env_remove("RUST_LOG")
        .env_remove("OUTBOX_BROKER")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .expect("the outbox binary runs")
}

/// The relay's mutual TLS flags.
fn mutual_tls(pki: &Pki) -> Vec<(&'static str, String)> {
    vec![
        ("--broker-ca-file", pki.path("ca.pem")),
        ("--broker-cert-file", pki.path("client.crt")),
        ("--broker-key-file", pki.path("client-plain.key")),
    ]
}

/// The order ids a consumer's handler got.
type Seen = Arc<Mutex<Vec<i64>>>;

/// A consumer running on a runtime of its own, its handler recording the order ids.
pub(crate) struct Consuming {
    runtime: tokio::runtime::Runtime,
    seen: Seen,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Consuming {
    /// Spawns `consume(handler, shutdown)`: it builds a consumer with `handler` and runs it
    /// until `shutdown`.
    pub(crate) fn start<F>(consume: impl FnOnce(Handler, Shutdown) -> F) -> Consuming
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let seen = Seen::default();
        let recorded = seen.clone();
        let handler: Handler = Arc::new(move |event: Envelope<OrderCreated>| {
            recorded.lock().unwrap().push(event.payload.order_id);
            std::future::ready(Ok(Outcome::Applied(())))
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown: Shutdown = Box::pin(async move {
            stopped.await.ok();
        });
        let task = runtime.spawn(consume(handler, shutdown));
        Consuming {
            runtime,
            seen,
            stop,
            task,
        }
    }

    /// `builder` (its servers and credentials set) run as the group `billing` of `topic`.
    pub(crate) fn nats(builder: outbox::nats::NatsConsumerBuilder, topic: String) -> Consuming {
        Consuming::start(|handler, shutdown| async move {
            let consumer = builder
                .group("billing")
                .topic(topic)
                .handler(move |event| handler(event))
                .build()
                .await
                .unwrap();
            consumer.run(shutdown).await;
        })
    }

    /// `builder` (its URI and credentials set) run as the group `billing` of `topic`.
    fn rabbitmq(builder: outbox::rabbitmq::RabbitMqConsumerBuilder, topic: String) -> Consuming {
        Consuming::start(|handler, shutdown| async move {
            let consumer = builder
                .group("billing")
                .topic(topic)
                .handler(move |event| handler(event))
                .build()
                .unwrap();
            consumer.run(shutdown).await;
        })
    }

    /// Waits until `want` orders were seen (at most 60 s), stops the consumer and returns
    /// the ids seen, sorted.
    pub(crate) fn stop_after(self, want: usize) -> Vec<i64> {
        let start = Instant::now();
        while self.seen.lock().unwrap().len() < want && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.stop.send(());
        let task = self.task;
        let _ = self
            .runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(20), task).await });
        let mut ids = self.seen.lock().unwrap().clone();
        ids.sort();
        ids
    }
}

pub(crate) type Handler = Arc<
    dyn Fn(Envelope<OrderCreated>) -> std::future::Ready<Result<Outcome<()>, String>> + Send + Sync,
>;
pub(crate) type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// The consumer of `broker` (group `billing`, topic `<prefix>order`) over TLS with the
/// relay's files; for RabbitMQ, once it declared its queue (a message no queue takes is
/// refused), so that it reads everything the relay publishes.
fn consumer(broker: &TlsBroker, pki: &Pki, work: &tempfile::TempDir, prefix: &str) -> Consuming {
    let topic = format!("{prefix}order");
    let (url, ca, cert, key) = (
        broker.url(),
        pki.path("ca.pem"),
        pki.path("client.crt"),
        pki.path("client-plain.key"),
    );
    let consuming = match broker.kind {
        Kind::Nats => {
            let builder = outbox::nats::NatsConsumer::builder()
                .servers(url)
                .tls_ca_file(ca)
                .tls_client_cert(cert, key);
            Consuming::nats(builder, topic)
        }
        Kind::RabbitMq => {
            let builder = outbox::rabbitmq::RabbitMqConsumer::builder()
                .uri(url)
                .tls_ca_file(ca)
                .tls_client_cert(cert, key);
            Consuming::rabbitmq(builder, topic)
        }
    };
    if let Kind::RabbitMq = broker.kind {
        let start = Instant::now();
        while !queue_exists(&format!("billing.{prefix}order")) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the consumer declared no queue: {}",
                broker.log(work)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    consuming
}

/// A test's topic prefix; on RabbitMQ, what the consumer declares is deleted on drop.
fn prefix_of(kind: Kind) -> (String, Option<Cleanup>) {
    let prefix = format!("t{}.", uuid::Uuid::now_v7().simple());
    let topic = format!("{prefix}order");
    let cleanup = matches!(kind, Kind::RabbitMq).then(|| Cleanup {
        queues: vec![format!("billing.{topic}"), format!("{topic}.dlt")],
        exchanges: vec![topic.clone(), format!("{topic}.dlt")],
    });
    (prefix, cleanup)
}

/// What a test runs with: the PKI, the broker behind TLS, an SQLite outbox, a topic prefix
/// of its own and the consumer reading it.
struct Scene {
    /// Dropped first: the consumer stops before what it declared is deleted.
    consuming: Consuming,
    broker: TlsBroker,
    db: TestDatabase,
    prefix: String,
    _cleanup: Option<Cleanup>,
    pki: Pki,
    work: tempfile::TempDir,
}

impl Scene {
    fn new(kind: Kind) -> Scene {
        let pki = Pki::new();
        let work = tempfile::tempdir().unwrap();
        let broker = TlsBroker::start(kind, &pki, &work, ServerCert::Trusted);
        let (prefix, cleanup) = prefix_of(kind);
        let consuming = consumer(&broker, &pki, &work, &prefix);
        Scene {
            consuming,
            broker,
            db: TestDatabase::sqlite("broker_tls"),
            prefix,
            _cleanup: cleanup,
            pki,
            work,
        }
    }

    fn log(&self) -> std::path::PathBuf {
        self.work.path().join("relay.log")
    }

    /// Writes orders `ids`, starts the relay with mutual TLS and waits until they are
    /// published.
    fn relay(&self, ids: std::ops::Range<i64>) -> RelayProcess {
        write_orders(&self.db.url, ids);
        let child = relay(
            &self.db.url,
            &self.broker.url(),
            &self.prefix,
            &mutual_tls(&self.pki),
            &self.log(),
        );
        self.wait_published();
        RelayProcess {
            child,
            log: self.log(),
            id: RELAY_ID.into(),
        }
    }

    fn wait_published(&self) {
        wait_published(&self.db.url, &self.log(), &|| self.broker.log(&self.work));
    }
}

/// Mutual TLS: the relay publishes orders 0..5, then 5..8, each once, and the consumer
/// reads all 8 over TLS with the same files; no password is shown.
fn mutual_tls_round_trip(kind: Kind) {
    let scene = Scene::new(kind);
    let mut child = scene.relay(0..5);
    write_orders(&scene.db.url, 5..8);
    scene.wait_published();
    let status = outbox_ok(&["status", "--database-url", &scene.db.url]);
    child.kill();
    assert_eq!(
        count(&scene.db.url, UNEXPECTED),
        0,
        "one attempt each: {status}"
    );

    let relay_log = std::fs::read_to_string(scene.log()).unwrap();
    for shown in [&relay_log, &status] {
        assert!(
            !shown.contains("guest:guest"),
            "a password is shown: {shown}"
        );
    }
    let ids = scene.consuming.stop_after(8);
    let shown = scene.broker.log(&scene.work);
    assert_eq!(ids, (0..8).collect::<Vec<_>>(), "{shown}");
}

#[test]
fn nats_mutual_tls_relay_publishes_and_a_consumer_reads_back() {
    mutual_tls_round_trip(Kind::Nats);
}

#[test]
fn rabbitmq_mutual_tls_relay_publishes_and_a_consumer_reads_back() {
    mutual_tls_round_trip(Kind::RabbitMq);
}

/// The broker's certificate replaced by one of another CA while the relay runs: an outage
/// (`waiting_for_broker`, nothing published, nothing dead-lettered with `--max-attempts 1`);
/// with the right certificate back, every event is published, each with one attempt, and the
/// consumer reads them all.
fn certificate_swapped_while_running(kind: Kind) {
    let mut scene = Scene::new(kind);
    let mut child = scene.relay(0..2);
    let db = scene.db.url.clone();

    scene
        .broker
        .serve(&scene.pki, &scene.work, ServerCert::Rogue);
    write_orders(&db, 2..4);
    let start = Instant::now();
    let status = loop {
        let status = outbox_ok(&["status", "--database-url", &db]);
        if status.contains(&format!("{RELAY_ID} (sharded): waiting_for_broker")) {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the relay never waited for the broker: {status}\n{}",
            std::fs::read_to_string(scene.log()).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("outbox status while the certificate is untrusted:\n{status}");
    assert_eq!(
        count(&db, PENDING),
        2,
        "nothing published meanwhile: {status}"
    );
    assert_eq!(
        count(&db, "dead_at IS NOT NULL"),
        0,
        "an outage dead-letters nothing (--max-attempts 1): {status}"
    );

    scene
        .broker
        .serve(&scene.pki, &scene.work, ServerCert::Trusted);
    scene.wait_published();
    child.kill();
    assert_eq!(
        count(&db, UNEXPECTED),
        0,
        "the claims that met the outage were given back uncounted: one attempt each"
    );
    let mut ids = scene.consuming.stop_after(4);
    ids.dedup();
    assert_eq!(ids, [0, 1, 2, 3], "{}", scene.broker.log(&scene.work));
}

#[test]
fn nats_certificate_swapped_while_running_is_an_outage() {
    certificate_swapped_while_running(Kind::Nats);
}

#[test]
fn rabbitmq_certificate_swapped_while_running_is_an_outage() {
    certificate_swapped_while_running(Kind::RabbitMq);
}

/// A server certificate of another CA: the relay stops at start with one line naming the
/// failed verification, for each broker, and shows no password.
#[test]
fn nats_and_rabbitmq_untrusted_server_certificate_stops_the_relay_in_one_line() {
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let db = TestDatabase::sqlite("broker_tls_ca");
    write_orders(&db.url, 0..2);
    for broker in [
        TlsBroker::start(Kind::Nats, &pki, &work, ServerCert::Rogue),
        TlsBroker::start(Kind::RabbitMq, &pki, &work, ServerCert::Rogue),
    ] {
        let log = work.path().join("relay.log");
        let mut child = relay(
            &db.url,
            &broker.url(),
            "untrusted.",
            &mutual_tls(&pki),
            &log,
        );
        let status = exit_of(&mut child);
        let out = std::fs::read_to_string(&log).unwrap();
        assert!(!status.success(), "{out}");
        let last = out.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: ") && last.contains("UnknownIssuer"),
            "the last line names the failed verification: {out}"
        );
        assert!(!out.contains("guest:guest"), "a password is shown: {out}");
        drop(broker);
    }
    assert_eq!(count(&db.url, PENDING), 2, "nothing was published");
}

/// Whether the shared RabbitMQ has queue `name` (a passive declare on a plain connection).
fn queue_exists(name: &str) -> bool {
    runtime().block_on(async {
        let Ok(rabbit) =
            lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await
        else {
            return false;
        };
        let channel = rabbit.create_channel().await.unwrap();
        let passive = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let found = channel
            .queue_declare(name.into(), passive, lapin::types::FieldTable::default())
            .await
            .is_ok();
        let _ = rabbit.close(200, "done".into()).await;
        found
    })
}

/// Deletes the test's queues and exchanges on the shared RabbitMQ when dropped.
struct Cleanup {
    queues: Vec<String>,
    exchanges: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        runtime().block_on(async {
            let Ok(rabbit) =
                lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
                    .await
            else {
                return;
            };
            let Ok(channel) = rabbit.create_channel().await else {
                return;
            };
            for q in &self.queues {
                let _ = channel
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            for e in &self.exchanges {
                let _ = channel
                    .exchange_delete(e.as_str().into(), ExchangeDeleteOptions::default())
                    .await;
            }
            let _ = rabbit.close(200, "done".into()).await;
        });
    }
}
