//! `outbox`: run the outbox's migrations and its relay, and operate it, from the command line.
//!
//! ```text
//! outbox migrate --database-url postgres://app@db/app
//! outbox relay   --database-url postgres://app@db/app --brokers kafka:9092 --mode sharded
//! outbox status  --database-url postgres://app@db/app [--json]
//! outbox dead list|retry|purge --aggregate-type order --aggregate-id 42 [--yes]
//! outbox replay  --from-seq 100 --to-seq 200 --yes
//! outbox cleanup --older-than 30d --yes
//! outbox partition --slots 4 --slot-xids 10000000 --yes
//! ```
//! Every flag can also come from the environment (`DATABASE_URL`, `KAFKA_BROKERS`,
//! `OUTBOX_MODE`, ...: see `outbox relay --help`). The URL's scheme picks the backend:
//! `postgres://` or `postgresql://`, `mysql://`, `sqlite://path`; without a scheme, a file
//! path is SQLite, and a libpq keyword string (`host=… dbname=…`) is refused. No password is
//! ever printed: every URL in a message or log line goes through [`outbox::redact::url`].

mod brokers;
mod inputs;
mod ops;
mod serve;

use std::process::ExitCode;
use std::time::Duration;

use brokers::Broker;
use clap::{Parser, Subcommand};
use diesel_async::AsyncConnection;
use outbox::relay::{
    Completion, DeadLetterPolicy, Mode, MysqlRelayStore, PgRelayStore, Publisher, Relay,
    RelayConfig, RelayStore, Retention, SqliteRelayStore,
};

#[derive(Parser)]
#[command(
    name = "outbox",
    version,
    about = "Migrations, relay and status of a Diesel transactional outbox"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create or update the outbox tables.
    Migrate {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Publish committed outbox events to Kafka, NATS JetStream or RabbitMQ until stopped
    /// (SIGINT/SIGTERM: finish the batch in flight, release the leases, exit).
    Relay(RelayArgs),
    /// Show the backlog, its oldest event, dead letters, in-flight leases, shard owners and
    /// each relay's state (running, waiting_for_broker, standby).
    Status {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Print the status as JSON (fields: see `outbox::relay::admin::Status`).
        #[arg(long)]
        json: bool,
    },
    /// Dead letters: list, retry (make pending again) or purge (delete).
    Dead {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
        database_url: Option<String>,
        #[command(subcommand)]
        command: ops::DeadCommand,
    },
    /// Publish already published events again, with their original ids.
    Replay(ops::ReplayArgs),
    /// Delete published events older than a retention window, in bounded batches.
    Cleanup(ops::CleanupArgs),
    /// PostgreSQL, stream mode: turn the event table into a ring of partitions that
    /// retention empties with TRUNCATE (no DELETE, no dead tuples, no VACUUM).
    Partition(ops::PartitionArgs),
    /// PostgreSQL: switch the table from stream mode to a lease mode (mark what the stream
    /// relays published, give their dead letters back). Run with the stream relays stopped.
    StreamHandover(ops::HandoverArgs),
}

#[derive(clap::Args)]
struct RelayArgs {
    /// The database: postgres://…, mysql://… or an SQLite file path.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// The broker, as a URL whose scheme names it: `kafka://host:9092[,host:9092…]`,
    /// `nats://host:4222` (or `tls://`; NATS JetStream), `amqp://user:password@host:5672/vhost`
    /// (or `amqps://`; RabbitMQ). Keep a password in OUTBOX_BROKER, not on the command line.
    #[arg(long, env = "OUTBOX_BROKER", hide_env_values = true)]
    broker: Option<String>,
    /// Kafka bootstrap servers, `host:port[,host:port…]` (the same as
    /// `--broker kafka://host:port`).
    #[arg(long, env = "KAFKA_BROKERS")]
    brokers: Option<String>,
    /// How relays share the work: `sharded` (per-aggregate order, the default), `leader`
    /// (one active relay, ordered), `unordered` (no order, opt-out) or `stream` (PostgreSQL
    /// only: ordered, reads by snapshots and never updates event rows).
    #[arg(long, env = "OUTBOX_MODE", default_value = "sharded")]
    mode: Mode,
    /// Events per claim.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = 500)]
    batch_size: usize,
    /// Batches in flight at once: the next ones are claimed and the previous ones settled
    /// while one is published (1: one batch at a time).
    #[arg(long, env = "OUTBOX_MAX_IN_FLIGHT", default_value_t = 4)]
    max_in_flight: usize,
    /// Bytes of events (payloads, headers, keys) the batches in flight may hold: with large
    /// events the relay claims fewer at a time, so its memory stays near this.
    #[arg(long, env = "OUTBOX_MAX_IN_FLIGHT_BYTES", default_value_t = outbox::relay::DEFAULT_MAX_IN_FLIGHT_BYTES)]
    max_in_flight_bytes: usize,
    /// Milliseconds between polls of an empty outbox (PostgreSQL's NOTIFY wakes earlier).
    #[arg(long, env = "OUTBOX_POLL_INTERVAL_MS", default_value_t = 500)]
    poll_interval: u64,
    /// Milliseconds a claim, a shard or the leadership is leased for; a dead relay's work
    /// moves on after this.
    #[arg(long, env = "OUTBOX_LEASE_MS", default_value_t = 30_000)]
    lease: u64,
    /// How long one message may take to be acknowledged: Kafka's `message.timeout.ms`,
    /// JetStream's publish acknowledgement, RabbitMQ's publisher confirm.
    #[arg(long, env = "OUTBOX_MESSAGE_TIMEOUT_MS", default_value_t = 10_000)]
    message_timeout: u64,
    /// Attempts before an event is dead-lettered.
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = 10)]
    max_attempts: u32,
    /// First retry delay in milliseconds (doubles per attempt, with jitter).
    #[arg(long, env = "OUTBOX_RETRY_INITIAL_MS", default_value_t = 1_000)]
    retry_initial: u64,
    /// Longest retry delay in milliseconds.
    #[arg(long, env = "OUTBOX_RETRY_MAX_MS", default_value_t = 300_000)]
    retry_max: u64,
    /// Ordered modes: let an aggregate's later events pass a dead-lettered one.
    #[arg(long, env = "OUTBOX_SKIP_DEAD_LETTERS")]
    skip_dead_letters: bool,
    /// Delete rows once published instead of marking them.
    #[arg(long, env = "OUTBOX_DELETE_PUBLISHED")]
    delete_published: bool,
    /// Delete published rows older than this many hours (in batches of 1,000).
    #[arg(long, env = "OUTBOX_RETENTION_HOURS")]
    retention_hours: Option<u64>,
    /// This relay's id (default: host, pid and a random suffix). Every relay needs its own:
    /// do not set one value for all replicas. A second live relay with an id in use is
    /// refused (it logs the conflict and waits) unless `--no-session-check`, where nothing
    /// can detect it.
    #[arg(long, env = "OUTBOX_RELAY_ID")]
    relay_id: Option<String>,
    /// Prefix for every topic (NATS: every subject; RabbitMQ: every exchange), e.g. `prod.`.
    #[arg(long, env = "OUTBOX_TOPIC_PREFIX")]
    topic_prefix: Option<String>,
    /// Extra librdkafka producer settings, `key=value`, repeatable. They also come from
    /// OUTBOX_KAFKA_CONFIG (`key=value` entries, one per line or separated by commas; a comma
    /// followed by anything but `key=` stays in the value, so `bootstrap.servers=a:9092,b:9092`
    /// is one entry) and from --kafka-config-file. Precedence, later wins: the file, then
    /// OUTBOX_KAFKA_CONFIG, then these flags. Keep secrets (`sasl.password`, ...) in the file
    /// or the variable, not on the command line; no setting's value is ever printed.
    #[arg(long = "kafka-config", value_name = "KEY=VALUE")]
    kafka_config: Vec<String>,
    /// A file of librdkafka producer settings, one `key=value` per line (`#` starts a comment
    /// line, blank lines are ignored); overridden by OUTBOX_KAFKA_CONFIG and --kafka-config.
    #[arg(long, env = "OUTBOX_KAFKA_CONFIG_FILE", value_name = "PATH")]
    kafka_config_file: Option<std::path::PathBuf>,
    /// NATS and RabbitMQ over TLS: a PEM file of CA certificates to trust, e.g. a private CA
    /// (NATS: instead of the system's roots, and TLS is then required; RabbitMQ: besides
    /// them, with an `amqps://` broker). Kafka: `ssl.ca.location` in --kafka-config.
    #[arg(long, env = "OUTBOX_BROKER_CA_FILE", value_name = "PATH")]
    broker_ca_file: Option<std::path::PathBuf>,
    /// NATS and RabbitMQ mutual TLS: the client certificate, PEM (with --broker-key-file).
    #[arg(
        long,
        env = "OUTBOX_BROKER_CERT_FILE",
        value_name = "PATH",
        requires = "broker_key_file"
    )]
    broker_cert_file: Option<std::path::PathBuf>,
    /// NATS and RabbitMQ mutual TLS: the client certificate's private key, PEM, not
    /// encrypted (with --broker-cert-file).
    #[arg(
        long,
        env = "OUTBOX_BROKER_KEY_FILE",
        value_name = "PATH",
        requires = "broker_cert_file"
    )]
    broker_key_file: Option<std::path::PathBuf>,
    /// NATS: a `.creds` file (a user JWT and its nkey seed, as `nsc` or Synadia Cloud give
    /// them) to authenticate with.
    #[arg(long, env = "OUTBOX_NATS_CREDENTIALS_FILE", value_name = "PATH")]
    nats_credentials_file: Option<std::path::PathBuf>,
    /// PostgreSQL: do not LISTEN for writers' notifications; poll only.
    #[arg(long, env = "OUTBOX_NO_LISTEN")]
    no_listen: bool,
    /// PostgreSQL: let the relay's own writes (claims, marks, leases) wait for their WAL
    /// flush. By default they do not: a server crash may then lose the last moment of them,
    /// which publishes those events again (never loses one, never breaks order).
    #[arg(long, env = "OUTBOX_SYNCHRONOUS_COMMIT")]
    synchronous_commit: bool,
    /// PostgreSQL, stream mode: rows a claim reads at least; the rows past its batch are held
    /// in memory (with their payloads) and handed out by the next claims. 0 reads one batch
    /// a claim.
    #[arg(long, env = "OUTBOX_STREAM_READ_AHEAD", default_value_t = outbox::relay::PG_STREAM_READ_AHEAD as u64)]
    stream_read_ahead: u64,
    /// Do not watch relays' database sessions (replace a dead relay only when its lease runs
    /// out). Needed behind a transaction pooler (e.g. PgBouncer in transaction mode), where a
    /// server session does not belong to one relay.
    #[arg(long, env = "OUTBOX_NO_SESSION_CHECK")]
    no_session_check: bool,
    /// PostgreSQL: the database URL is a pooler in transaction mode (e.g. PgBouncer with
    /// `pool_mode = transaction`). Each unit of work then runs in a transaction of its own
    /// with its settings local to it (nothing stays on the server connections the
    /// application gets), no statement is kept prepared, the relay polls instead of
    /// LISTEN, and sessions are not checked (as --no-session-check).
    #[arg(long, env = "OUTBOX_TRANSACTION_POOLER")]
    transaction_pooler: bool,
    /// Serve Prometheus metrics at /metrics, and /healthz and /readyz, on this address
    /// (e.g. `0.0.0.0:9464`).
    #[arg(long, env = "OUTBOX_METRICS_ADDR", value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
}

/// An error for the operator: one line, saying what to do.
struct Fatal(String);

impl<E: std::fmt::Display> From<E> for Fatal {
    fn from(e: E) -> Self {
        Fatal(e.to_string())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Postgres,
    Mysql,
    Sqlite,
}

/// Runs `$body` with `$conn` bound to a new connection to `$url` on `$backend`: the one place
/// the command line opens a database connection (PostgreSQL through
/// [`outbox::connect::postgres`], or [`outbox::connect::postgres_pooled`] when `$pooled`;
/// MySQL/MariaDB through [`outbox::connect::mysql`]; SQLite as diesel-async's wrapper). If the
/// connection cannot be opened, `$on_error` runs with `$error` bound to the message (one
/// line, no password).
macro_rules! with_connection {
    ($backend:expr, $url:expr, $pooled:expr, |$conn:ident| $body:expr, |$error:ident| $on_error:expr) => {{
        let url: &str = $url;
        match $backend {
            $crate::Backend::Postgres => {
                let opened = if $pooled {
                    outbox::connect::postgres_pooled(url).await
                } else {
                    outbox::connect::postgres(url).await
                };
                match opened {
                    Ok($conn) => $body,
                    Err(e) => {
                        let $error = e.to_string();
                        $on_error
                    }
                }
            }
            $crate::Backend::Mysql => match outbox::connect::mysql(url).await {
                Ok($conn) => $body,
                Err(e) => {
                    let $error = e.to_string();
                    $on_error
                }
            },
            $crate::Backend::Sqlite => match $crate::sqlite_connection(url).await {
                Ok($conn) => $body,
                Err($crate::Fatal(e)) => {
                    let $error = e;
                    $on_error
                }
            },
        }
    }};
}
pub(crate) use with_connection;

/// The backend a URL names, and the URL to give it. The one place that maps a URL to a
/// backend: `postgres://`/`postgresql://`, `mysql://`/`mariadb://`, `sqlite://` (or `file://`);
/// without a scheme, SQLite for what looks like a file path (`:memory:`, an existing file, a
/// name ending in `.db`, `.sqlite` or `.sqlite3`, or anything without `=`), and an error for
/// the rest: a libpq keyword string (`host=db password=…`) would otherwise become a file of
/// that name. The errors never quote the URL (it may hold a password).
fn backend_of(url: &str) -> Result<(Backend, String), Fatal> {
    if url.trim().is_empty() {
        return Err(Fatal(
            "the database URL is empty: pass --database-url or set DATABASE_URL".into(),
        ));
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        return match scheme {
            "postgres" | "postgresql" => Ok((Backend::Postgres, url.to_owned())),
            "mysql" | "mariadb" => Ok((Backend::Mysql, format!("mysql://{rest}"))),
            "sqlite" | "file" => Ok((Backend::Sqlite, rest.to_owned())),
            other => Err(Fatal(format!(
                "unsupported database URL scheme `{other}`: use postgres://…, mysql://… or an SQLite file path"
            ))),
        };
    }
    let lower = url.to_ascii_lowercase();
    let file_like = url == ":memory:"
        || [".db", ".sqlite", ".sqlite3"]
            .iter()
            .any(|ext| lower.ends_with(ext))
        || std::path::Path::new(url).is_file();
    if !file_like && url.contains('=') {
        let keywords = url
            .split_whitespace()
            .filter_map(|w| w.split_once('=').map(|(k, _)| k))
            .any(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        return Err(Fatal(if keywords {
            "the database URL looks like a libpq keyword string (`host=… dbname=…`), which is \
             not supported: give a URL, postgres://user:password@host:port/dbname?sslmode=…"
                .to_owned()
        } else {
            "the database URL has no scheme and contains `=`, so it is not taken for an SQLite \
             file path: give postgres://…, mysql://… or sqlite://path"
                .to_owned()
        }));
    }
    Ok((Backend::Sqlite, url.to_owned()))
}

/// `url` as messages and logs show it: passwords hidden ([`outbox::redact::url`]).
fn describe(url: &str) -> String {
    outbox::redact::url(url).into_owned()
}

async fn migrate(url: &str) -> Result<Vec<&'static str>, Fatal> {
    let (backend, url) = backend_of(url)?;
    let applied = with_connection!(
        backend,
        &url,
        false,
        |c| {
            let mut c = c;
            outbox::migrations::run_async(&mut c).await?
        },
        |e| return Err(Fatal(e))
    );
    Ok(applied)
}

type SqliteAsync =
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

async fn sqlite_connection(path: &str) -> Result<SqliteAsync, Fatal> {
    SqliteAsync::establish(path).await.map_err(|e| {
        Fatal(format!(
            "cannot open the SQLite database `{}`: {e}",
            describe(path)
        ))
    })
}

/// Fails with a clear instruction when the outbox tables are missing or not up to date.
async fn check_migrated(url: &str) -> Result<(), Fatal> {
    check_migrated_on(url, false).await
}

/// [`check_migrated`]; `pooled`: through a pooler in transaction mode, where the connection is
/// opened for it and the check runs in a transaction (nothing prepared is left on a server
/// connection).
async fn check_migrated_on(url: &str, pooled: bool) -> Result<(), Fatal> {
    use diesel_async::AsyncConnection;
    let (backend, url) = backend_of(url)?;
    if backend == Backend::Sqlite && !std::path::Path::new(&url).exists() {
        let url = describe(&url);
        return Err(Fatal(format!(
            "the SQLite database `{url}` does not exist: run `outbox migrate --database-url {url}` first"
        )));
    }
    let all = |list: &'static [outbox::migrations::Migration]| -> Vec<&'static str> {
        list.iter().map(|m| m.version).collect()
    };
    let every = match backend {
        Backend::Postgres => all(outbox::migrations::list::<diesel::pg::Pg>()),
        Backend::Mysql => all(outbox::migrations::list::<diesel::mysql::Mysql>()),
        Backend::Sqlite => all(outbox::migrations::list::<diesel::sqlite::Sqlite>()),
    };
    // In a transaction: behind a pooler in transaction mode, nothing prepared is left on a
    // server connection. A database where no migration ran has no migrations table: every
    // one is missing.
    let missing: Vec<&str> = with_connection!(
        backend,
        &url,
        pooled,
        |c| {
            let mut c = c;
            c.transaction(async |c| outbox::migrations::unapplied_async(c).await)
                .await
                .unwrap_or(every)
        },
        |e| return Err(Fatal(e))
    );
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Fatal(format!(
            "the outbox tables in {} are missing or out of date (migrations {} not applied): run `outbox migrate --database-url …` first",
            describe(&url),
            missing.join(", ")
        )))
    }
}

async fn relay(args: RelayArgs) -> Result<(), Fatal> {
    let (backend, url) = backend_of(&args.database_url)?;
    let broker = Broker::of(&args)?;
    inputs::check_relay_args(&args)?;
    broker.check_flags(&args)?;
    match &broker {
        Broker::Kafka(brokers) => {
            let (publisher, probe) = brokers::kafka(&args, brokers)?;
            let publish_timeout = publisher.publish_timeout();
            let probe = move || probe.build().map_err(|e| Fatal(e.to_string()));
            relay_to(
                args,
                backend,
                url,
                &broker,
                publisher,
                probe,
                publish_timeout,
            )
            .await
        }
        Broker::Nats(servers) => {
            let publisher = brokers::nats(&args, servers).await?;
            let publish_timeout = publisher.publish_timeout();
            relay_shared(args, backend, url, &broker, publisher, publish_timeout).await
        }
        Broker::RabbitMq(uri) => {
            let publisher = brokers::rabbitmq(&args, uri)?;
            let publish_timeout = publisher.publish_timeout();
            relay_shared(args, backend, url, &broker, publisher, publish_timeout).await
        }
    }
}

/// [`relay_to`] with one publisher, shared by the relay and the `/readyz` probe (NATS and
/// RabbitMQ answer a probe on the relay's own connection; Kafka's probe has a producer of
/// its own).
async fn relay_shared<P: Publisher>(
    args: RelayArgs,
    backend: Backend,
    url: String,
    broker: &Broker,
    publisher: P,
    publish_timeout: Duration,
) -> Result<(), Fatal> {
    let publisher = std::sync::Arc::new(publisher);
    let probe = publisher.clone();
    relay_to(
        args,
        backend,
        url,
        broker,
        publisher,
        move || Ok(probe),
        publish_timeout,
    )
    .await
}

/// The relay to `broker` through `publisher`, whose publishes take at most
/// `publish_timeout`; `probe` makes the `/readyz` probe's publisher.
async fn relay_to<P: Publisher>(
    args: RelayArgs,
    backend: Backend,
    url: String,
    broker: &Broker,
    publisher: P,
    probe: impl FnOnce() -> Result<P, Fatal>,
    publish_timeout: Duration,
) -> Result<(), Fatal> {
    let retention_keep = match args.retention_hours {
        Some(h) => Some(Duration::from_secs(inputs::retention_secs(h)?)),
        None => None,
    };
    let lease = Duration::from_millis(args.lease);
    if publish_timeout >= lease {
        return Err(Fatal(format!(
            "--lease / OUTBOX_LEASE_MS ({} ms) must be longer than a publish can take ({} ms with --message-timeout / OUTBOX_MESSAGE_TIMEOUT_MS {} ms): raise --lease or lower --message-timeout",
            args.lease,
            publish_timeout.as_millis(),
            args.message_timeout
        )));
    }
    check_migrated_on(&args.database_url, args.transaction_pooler).await?;
    publisher
        .ready(Duration::from_secs(10))
        .await
        .map_err(|e| Fatal(format!("{e} (check {})", broker.flags(&args))))?;

    let mut config = RelayConfig {
        mode: args.mode,
        batch_size: args.batch_size,
        poll_interval: Duration::from_millis(args.poll_interval),
        lease,
        publish_timeout,
        max_attempts: args.max_attempts,
        max_in_flight: args.max_in_flight,
        max_in_flight_bytes: args.max_in_flight_bytes,
        completion: if args.delete_published {
            Completion::Delete
        } else {
            Completion::MarkPublished
        },
        dead_letters: if args.skip_dead_letters {
            DeadLetterPolicy::Skip
        } else {
            DeadLetterPolicy::Block
        },
        retention: retention_keep.map(|keep| Retention {
            keep,
            batch: 1_000,
            every: Duration::from_secs(60),
        }),
        ..RelayConfig::default()
    };
    config.backoff.initial = Duration::from_millis(args.retry_initial);
    config.backoff.max = Duration::from_millis(args.retry_max);
    if let Some(id) = args.relay_id {
        config.relay_id = id;
    }
    if args.no_session_check || args.transaction_pooler {
        config.session_check = None;
    }
    config.validate()?;
    tracing::info!(
        relay = %config.relay_id, mode = ?config.mode, database = %describe(&url),
        broker = %broker.describe(), "starting relay"
    );
    let serve = match args.metrics_addr {
        Some(addr) => Some((addr, probe()?, backend, url.clone())),
        None => None,
    };
    if config.mode == Mode::Stream && !matches!(backend, Backend::Postgres) {
        return Err(Fatal(
            outbox::relay::UnsupportedMode::new(
                "stream",
                match backend {
                    Backend::Mysql => "MySQL/MariaDB",
                    _ => "SQLite",
                },
            )
            .to_string(),
        ));
    }
    // Behind a transaction pooler the store makes the same check in its first claim's
    // transaction; the admin connection's statements would run outside one.
    if matches!(backend, Backend::Postgres) && !args.transaction_pooler {
        let block = config.dead_letters == outbox::relay::DeadLetterPolicy::Block;
        ops::refuse_mode_switch(&url, config.mode == Mode::Stream, block).await?;
    }
    match backend {
        Backend::Postgres => {
            // The store keeps its statement timeout below a third of the relay's lease.
            if args.transaction_pooler {
                tracing::info!(
                    poll_interval = ?config.poll_interval,
                    "behind a transaction pooler: a transaction per unit of work, no LISTEN \
                     (polling), no session check (the lease is the rule)"
                );
            }
            let store = PgRelayStore::new(url)
                .transaction_pooler(args.transaction_pooler)
                .listen(!args.no_listen)
                .synchronous_commit(args.synchronous_commit)
                .stream_read_ahead(args.stream_read_ahead as usize);
            run(store, publisher, config, serve).await
        }
        Backend::Mysql => run(MysqlRelayStore::new(url), publisher, config, serve).await,
        Backend::Sqlite => run(SqliteRelayStore::new(url), publisher, config, serve).await,
    }
}

async fn run<S: RelayStore, P: Publisher>(
    store: S,
    publisher: P,
    config: RelayConfig,
    serve: Option<(std::net::SocketAddr, P, Backend, String)>,
) -> Result<(), Fatal> {
    let lease = config.lease;
    let relay = Relay::new(store, publisher, config)?;
    if let Some((addr, probe, backend, url)) = serve {
        serve::start(addr, relay.stats(), lease, probe, backend, url).await?;
    }
    relay.run(shutdown_signal()).await;
    Ok(())
}

#[cfg(not(unix))]
async fn shutdown_signal() {
    if let Err(e) = tokio::signal::ctrl_c().await {
        tracing::warn!(error = %e, "cannot listen for Ctrl-C");
        std::future::pending::<()>().await;
    }
    tracing::info!("shutting down: finishing the batch in flight");
}

#[cfg(unix)]
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down: finishing the batch in flight");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // librdkafka's log and errors are rate-limited by the publisher (a line of a
                // kind at most once per 30 s): its warnings name the unreachable brokers.
                // async-nats logs every reconnect attempt at `info`, and every refused one
                // (e.g. an authorization violation) at `error` from its connector; the NATS
                // publisher logs connection changes itself, its errors rate-limited alike.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new(
                        "info,librdkafka=warn,rdkafka::client=warn,async_nats=warn,async_nats::connector=off",
                    )
                }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Migrate { database_url } => {
                let applied = migrate(&database_url).await?;
                if applied.is_empty() {
                    println!("the outbox tables are up to date");
                } else {
                    println!("applied migrations: {}", applied.join(", "));
                }
                Ok(ExitCode::SUCCESS)
            }
            Command::Relay(args) => relay(args).await.map(|()| ExitCode::SUCCESS),
            Command::Status { database_url, json } => ops::status(&database_url, json).await,
            Command::Dead {
                database_url,
                command,
            } => {
                let url = database_url
                    .ok_or_else(|| Fatal("pass --database-url or set DATABASE_URL".to_owned()))?;
                ops::dead(&url, command).await
            }
            Command::Replay(args) => ops::replay(args).await,
            Command::Cleanup(args) => ops::cleanup(args).await,
            Command::Partition(args) => ops::partition(args).await,
            Command::StreamHandover(args) => ops::stream_handover(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(Fatal(message)) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> String {
        match backend_of(url) {
            Ok((backend, _)) => panic!("{url} taken for {backend:?}"),
            Err(Fatal(e)) => e,
        }
    }

    #[test]
    fn libpq_keyword_strings_are_not_sqlite_paths() {
        let e = refused("host=db user=app password=hunter2 dbname=app");
        assert!(e.contains("libpq") && e.contains("postgres://"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = refused("dbname=app");
        assert!(e.contains("libpq"), "{e}");
        assert!(!refused("a=b&c=d?").is_empty());
    }

    #[test]
    fn sqlite_paths_and_urls() {
        for (url, path) in [
            ("outbox.db", "outbox.db"),
            ("/var/lib/app/outbox", "/var/lib/app/outbox"),
            ("./data/run=3.sqlite3", "./data/run=3.sqlite3"),
            (":memory:", ":memory:"),
            ("sqlite://a=b", "a=b"),
        ] {
            let (backend, got) = backend_of(url).unwrap_or_else(|Fatal(e)| panic!("{e}"));
            assert_eq!((backend, got.as_str()), (Backend::Sqlite, path));
        }
        assert_eq!(
            backend_of("postgres://u:p@h/d").ok().map(|b| b.0),
            Some(Backend::Postgres)
        );
    }

    #[test]
    fn zero_counts_are_refused_naming_the_flag() {
        for args in [
            &["outbox", "dead", "list", "--limit", "0"][..],
            &[
                "outbox",
                "replay",
                "--database-url",
                "x.db",
                "--all",
                "--batch",
                "0",
            ],
            &[
                "outbox",
                "cleanup",
                "--database-url",
                "x.db",
                "--older-than",
                "1d",
                "--batch",
                "0",
            ],
        ] {
            let err = match Cli::try_parse_from(args) {
                Ok(_) => panic!("{args:?} must be refused"),
                Err(e) => e.to_string(),
            };
            let flag = args[args.len() - 2];
            assert!(err.contains(flag) && err.contains("at least 1"), "{err}");
        }
    }

    #[test]
    fn relay_ids_with_edge_whitespace_are_refused() {
        for (id, why) in [
            ("relay-1 ", "whitespace"),
            (" relay-1", "whitespace"),
            ("relay\u{7}1", "control"),
        ] {
            let cli = Cli::try_parse_from([
                "outbox",
                "relay",
                "--database-url",
                "x.db",
                "--brokers",
                "k:9092",
                "--relay-id",
                id,
            ])
            .unwrap_or_else(|e| panic!("{e}"));
            let Command::Relay(args) = cli.command else {
                unreachable!()
            };
            let Err(Fatal(e)) = inputs::check_relay_args(&args) else {
                panic!("{id:?} must be refused")
            };
            assert!(
                e.starts_with("--relay-id / OUTBOX_RELAY_ID") && e.contains(why),
                "{e}"
            );
        }
    }

    #[test]
    fn describe_redacts_every_password() {
        let shown = describe("postgres://app:hunter2@db/app?sslmode=require&password=hunter3");
        assert_eq!(
            shown,
            "postgres://app:***@db/app?sslmode=require&password=***"
        );
        assert!(!describe("mysql://root@db/app?password=hunter3").contains("hunter3"));
    }
}
