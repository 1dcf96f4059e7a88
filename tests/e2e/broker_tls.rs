//! NATS and RabbitMQ over TLS through the `outbox` binary and the consumers, with a CA made
//! here: a private nats-server (JetStream, TLS required, client certificates verified) and
//! stunnel in front of the shared RabbitMQ (client certificates required).
//!
//! - mutual TLS: the relay publishes with `--broker-ca-file`, `--broker-cert-file` and
//!   `--broker-key-file`, and our consumer reads every event back over TLS with the same files;
//! - a server certificate of a CA the relay does not trust: the relay stops at start with one
//!   line naming the failed verification, and shows no password.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use outbox::prelude::*;

use crate::chaos::brokers::{amqp_url, host_port};
use crate::chaos::services::{free_port, wait_port};
use crate::harness::{RelayProcess, outbox_bin, outbox_ok};
use crate::kafka_tls::{
    PENDING, Pki, ServerCert, UNEXPECTED, count, exit_of, stunnel, wait_published, write_orders,
};
use crate::support::{OrderCreated, TestDatabase};

/// The broker a test runs against, behind TLS of the test's [`Pki`].
enum TlsBroker {
    /// A nats-server of the test's own, TLS only, verifying client certificates.
    Nats { server: Child, port: u16 },
    /// stunnel in front of the shared RabbitMQ, requiring client certificates.
    RabbitMq { stunnel: Child, port: u16 },
}

impl TlsBroker {
    fn nats(pki: &Pki, work: &tempfile::TempDir, cert: ServerCert) -> TlsBroker {
        let port = free_port();
        let (crt, key) = cert.files();
        let log = std::fs::File::create(work.path().join("nats-server.log")).unwrap();
        let server = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
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
        wait_port(port);
        TlsBroker::Nats { server, port }
    }

    fn rabbitmq(pki: &Pki, work: &tempfile::TempDir, cert: ServerCert) -> TlsBroker {
        let port = free_port();
        let stunnel = stunnel(pki, work.path(), port, &host_port(&amqp_url()), cert, true);
        TlsBroker::RabbitMq { stunnel, port }
    }

    /// The relay's `--broker`: TLS on the broker's port, the shared RabbitMQ's user.
    fn url(&self) -> String {
        match self {
            TlsBroker::Nats { port, .. } => format!("tls://127.0.0.1:{port}"),
            TlsBroker::RabbitMq { port, .. } => {
                let plain = amqp_url();
                let (_, rest) = plain.split_once("://").unwrap();
                let (user, rest) = rest.rsplit_once('@').unwrap_or(("guest:guest", rest));
                let vhost = rest.split_once('/').map_or("%2f", |(_, v)| v);
                format!("amqps://{user}@localhost:{port}/{vhost}")
            }
        }
    }
}

impl Drop for TlsBroker {
    fn drop(&mut self) {
        let (TlsBroker::Nats { server: child, .. } | TlsBroker::RabbitMq { stunnel: child, .. }) =
            self;
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `outbox relay --broker url` with the binary's default log filter, the TLS flags
/// `tls` (flag, file of `pki`), logging to `log`.
fn relay(
    db: &str,
    url: &str,
    prefix: &str,
    tls: &[(&str, String)],
    log: &std::path::Path,
) -> Child {
    let mut command = Command::new(outbox_bin());
    command
        .args(["relay", "--database-url", db, "--broker", url])
        .args(["--topic-prefix", prefix])
        .args(["--message-timeout", "2000", "--lease", "10000"])
        .args(["--poll-interval", "100", "--retry-initial", "100"])
        .args(["--retry-max", "1000", "--max-attempts", "1"]);
    for (flag, file) in tls {
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
struct Consuming {
    runtime: tokio::runtime::Runtime,
    seen: Seen,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Consuming {
    /// Spawns `consume(handler, shutdown)`: it builds a consumer with `handler` and runs it
    /// until `shutdown`.
    fn start<F>(consume: impl FnOnce(Handler, Shutdown) -> F) -> Consuming
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

    /// Waits until `want` orders were seen (at most 60 s), stops the consumer and returns
    /// the ids seen, sorted.
    fn stop_after(self, want: usize) -> Vec<i64> {
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

type Handler = Arc<
    dyn Fn(Envelope<OrderCreated>) -> std::future::Ready<Result<Outcome<()>, String>> + Send + Sync,
>;
type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Writes orders 0..5 and 5..8 beside a relay with mutual TLS, waits until every one is
/// published once, and returns the relay's log and `outbox status`.
fn relay_eight(db: &TestDatabase, broker: &TlsBroker, pki: &Pki, prefix: &str) -> (String, String) {
    let log = pki
        .dir
        .path()
        .join(format!("relay-{}.log", prefix.trim_end_matches('.')));
    write_orders(&db.url, 0..5);
    let mut child = RelayProcess {
        child: relay(&db.url, &broker.url(), prefix, &mutual_tls(pki), &log),
        log: log.clone(),
        id: "broker-tls".into(),
    };
    wait_published(&db.url, &log, &String::new);
    write_orders(&db.url, 5..8);
    wait_published(&db.url, &log, &String::new);
    let status = outbox_ok(&["status", "--database-url", &db.url]);
    child.kill();
    assert_eq!(count(&db.url, PENDING), 0);
    assert_eq!(count(&db.url, UNEXPECTED), 0, "one attempt each: {status}");
    (std::fs::read_to_string(&log).unwrap(), status)
}

#[test]
fn nats_mutual_tls_relay_publishes_and_a_consumer_reads_back() {
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let nats = TlsBroker::nats(&pki, &work, ServerCert::Trusted);
    let db = TestDatabase::sqlite("nats_tls");
    let prefix = format!("t{}.", uuid::Uuid::now_v7().simple());
    let (servers, topic) = (nats.url(), format!("{prefix}order"));
    let (ca, cert, key) = client_files(&pki);
    let consuming = Consuming::start(|handler, shutdown| async move {
        let consumer = outbox::nats::NatsConsumer::builder()
            .servers(servers)
            .tls_ca_file(ca)
            .tls_client_cert(cert, key)
            .group("billing")
            .topic(topic)
            .handler(move |event| handler(event))
            .build()
            .await
            .unwrap();
        consumer.run(shutdown).await;
    });

    relay_eight(&db, &nats, &pki, &prefix);
    let ids = consuming.stop_after(8);
    let log = work.path().join("nats-server.log");
    assert_eq!(
        ids,
        (0..8).collect::<Vec<_>>(),
        "nats-server: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

#[test]
fn rabbitmq_mutual_tls_relay_publishes_and_a_consumer_reads_back() {
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let rabbit = TlsBroker::rabbitmq(&pki, &work, ServerCert::Trusted);
    let db = TestDatabase::sqlite("rabbitmq_tls");
    let prefix = format!("t{}.", uuid::Uuid::now_v7().simple());
    let topic = format!("{prefix}order");
    let queue = format!("billing.{topic}");
    let _cleanup = Cleanup {
        queues: vec![queue.clone(), format!("{topic}.dlt")],
        exchanges: vec![topic.clone(), format!("{topic}.dlt")],
    };

    // The consumer declares its queue before anything is published (a message no queue
    // takes is refused), over TLS with the relay's files.
    let (uri, ca, cert, key) = (
        rabbit.url(),
        client_files(&pki).0,
        client_files(&pki).1,
        client_files(&pki).2,
    );
    let consuming = Consuming::start(|handler, shutdown| async move {
        let consumer = outbox::rabbitmq::RabbitMqConsumer::builder()
            .uri(uri)
            .tls_ca_file(ca)
            .tls_client_cert(cert, key)
            .group("billing")
            .topic(topic)
            .handler(move |event| handler(event))
            .build()
            .unwrap();
        consumer.run(shutdown).await;
    });
    let start = Instant::now();
    while !queue_exists(&queue) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the consumer declared no queue: {}",
            std::fs::read_to_string(work.path().join("stunnel.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let (relay_log, status) = relay_eight(&db, &rabbit, &pki, &prefix);
    let ids = consuming.stop_after(8);
    assert_eq!(
        ids,
        (0..8).collect::<Vec<_>>(),
        "stunnel: {}",
        std::fs::read_to_string(work.path().join("stunnel.log")).unwrap_or_default()
    );
    for shown in [&relay_log, &status] {
        assert!(
            !shown.contains("guest:guest"),
            "a password is shown: {shown}"
        );
    }
}

/// The consumers' CA, client certificate and key: the relay's.
fn client_files(pki: &Pki) -> (String, String, String) {
    (
        pki.path("ca.pem"),
        pki.path("client.crt"),
        pki.path("client-plain.key"),
    )
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
        TlsBroker::nats(&pki, &work, ServerCert::Rogue),
        TlsBroker::rabbitmq(&pki, &work, ServerCert::Rogue),
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
    block_on(async {
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
        block_on(async {
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

fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}
