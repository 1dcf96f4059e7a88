//! Bad inputs to `outbox relay` and `outbox migrate`, as an operator would type them: each is
//! refused before anything runs, with one line that names the flag and its environment
//! variable, and nothing in the database changes.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use diesel::{Connection, RunQueryDsl};

use crate::harness::outbox_ok;
use crate::support::*;

/// Runs `outbox relay` with `args` (and the environment changes in `env`), waits at most
/// 30 s, and returns whether it succeeded and its stderr. A relay that passed validation
/// would run until stopped, so a timeout is a failure of the test.
fn relay(args: &[&str], env: &[(&str, Option<&str>)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox"));
    cmd.arg("relay").args(args);
    for (k, _) in ENV_VARS {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = cmd
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the outbox binary runs");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status.success(), err);
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`outbox relay {}` did not stop within 30 s", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every variable the relay reads, cleared so the test's own environment cannot interfere.
const ENV_VARS: &[(&str, ())] = &[
    ("DATABASE_URL", ()),
    ("KAFKA_BROKERS", ()),
    ("OUTBOX_BROKER", ()),
    ("OUTBOX_MODE", ()),
    ("OUTBOX_BATCH_SIZE", ()),
    ("OUTBOX_POLL_INTERVAL_MS", ()),
    ("OUTBOX_LEASE_MS", ()),
    ("OUTBOX_MESSAGE_TIMEOUT_MS", ()),
    ("OUTBOX_MAX_ATTEMPTS", ()),
    ("OUTBOX_RETRY_INITIAL_MS", ()),
    ("OUTBOX_RETRY_MAX_MS", ()),
    ("OUTBOX_RETENTION_HOURS", ()),
    ("OUTBOX_RELAY_ID", ()),
    ("OUTBOX_KAFKA_CONFIG", ()),
    ("OUTBOX_KAFKA_CONFIG_FILE", ()),
];

/// The error is exactly one line, `error: <expected>`.
fn assert_refused(args: &[&str], env: &[(&str, Option<&str>)], expected: &str) {
    let (ok, err) = relay(args, env);
    assert!(!ok, "{args:?} {env:?} must fail; stderr: {err}");
    assert_eq!(
        err.trim_end(),
        format!("error: {expected}"),
        "{args:?} {env:?}: one line naming the flag"
    );
}

/// The bad numbers found by trying 72 inputs, each now refused with its flag and variable,
/// given as a flag and as the environment variable.
#[test]
fn bad_numbers_are_refused_naming_flag_and_variable() {
    let db = "/nonexistent/never-opened.db";
    let base = ["--database-url", db, "--brokers", "127.0.0.1:9092"];
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "--lease",
            "OUTBOX_LEASE_MS",
            "9999999999",
            "--lease / OUTBOX_LEASE_MS must be between 100 and 86400000 ms, got 9999999999",
        ),
        (
            "--lease",
            "OUTBOX_LEASE_MS",
            "6393600000", // 74 days
            "--lease / OUTBOX_LEASE_MS must be between 100 and 86400000 ms, got 6393600000",
        ),
        (
            "--retention-hours",
            "OUTBOX_RETENTION_HOURS",
            "5124095576030432",
            "--retention-hours / OUTBOX_RETENTION_HOURS must be between 1 and 87600 hours, got 5124095576030432",
        ),
        (
            "--retention-hours",
            "OUTBOX_RETENTION_HOURS",
            "18446744073709551615",
            "--retention-hours / OUTBOX_RETENTION_HOURS must be between 1 and 87600 hours, got 18446744073709551615",
        ),
        (
            "--retention-hours",
            "OUTBOX_RETENTION_HOURS",
            "0",
            "--retention-hours / OUTBOX_RETENTION_HOURS must be between 1 and 87600 hours, got 0",
        ),
        (
            "--message-timeout",
            "OUTBOX_MESSAGE_TIMEOUT_MS",
            "0",
            "--message-timeout / OUTBOX_MESSAGE_TIMEOUT_MS must be between 1 and 86400000 ms, got 0",
        ),
        (
            "--batch-size",
            "OUTBOX_BATCH_SIZE",
            "0",
            "--batch-size / OUTBOX_BATCH_SIZE must be between 1 and 10000, got 0",
        ),
        (
            "--stream-read-ahead",
            "OUTBOX_STREAM_READ_AHEAD",
            "100001",
            "--stream-read-ahead / OUTBOX_STREAM_READ_AHEAD must be between 0 and 100000 rows, got 100001",
        ),
        (
            "--max-in-flight",
            "OUTBOX_MAX_IN_FLIGHT",
            "65",
            "--max-in-flight / OUTBOX_MAX_IN_FLIGHT must be between 1 and 64, got 65",
        ),
        (
            "--poll-interval",
            "OUTBOX_POLL_INTERVAL_MS",
            "0",
            "--poll-interval / OUTBOX_POLL_INTERVAL_MS must be between 1 and 3600000 ms, got 0",
        ),
        (
            "--max-attempts",
            "OUTBOX_MAX_ATTEMPTS",
            "0",
            "--max-attempts / OUTBOX_MAX_ATTEMPTS must be between 1 and 1000000, got 0",
        ),
        (
            "--retry-initial",
            "OUTBOX_RETRY_INITIAL_MS",
            "0",
            "--retry-initial / OUTBOX_RETRY_INITIAL_MS must be between 1 and 86400000 ms, got 0",
        ),
        (
            "--retry-max",
            "OUTBOX_RETRY_MAX_MS",
            "10",
            "--retry-max / OUTBOX_RETRY_MAX_MS must be between 1000 and 86400000 ms (at least --retry-initial / OUTBOX_RETRY_INITIAL_MS), got 10",
        ),
    ];
    for &(flag, var, value, expected) in cases {
        let mut args = base.to_vec();
        args.extend([flag, value]);
        assert_refused(&args, &[], expected);
        assert_refused(&base, &[(var, Some(value))], expected);
    }
    // A lease that a publish cannot fit in is refused too (both in range on their own).
    let mut args = base.to_vec();
    args.extend(["--lease", "1000", "--message-timeout", "5000"]);
    let (ok, err) = relay(&args, &[]);
    assert!(!ok);
    assert_eq!(
        err.trim_end(),
        "error: --lease / OUTBOX_LEASE_MS (1000 ms) must be longer than a publish can take \
         (7500 ms with --message-timeout / OUTBOX_MESSAGE_TIMEOUT_MS 5000 ms): raise --lease or lower --message-timeout"
    );
}

/// An empty broker list names the flag and the variable, not the library's builder call.
#[test]
fn empty_brokers_name_the_flag_and_variable() {
    let expected = "--brokers / KAFKA_BROKERS is empty: give the Kafka bootstrap servers, host:port[,host:port…]";
    let db = "/nonexistent/never-opened.db";
    assert_refused(
        &["--database-url", db],
        &[("KAFKA_BROKERS", Some(""))],
        expected,
    );
    assert_refused(&["--database-url", db, "--brokers", " "], &[], expected);
    assert_refused(
        &[
            "--database-url",
            db,
            "--brokers",
            "127.0.0.1:9092",
            "--kafka-config",
            "bootstrap.servers=",
        ],
        &[],
        "no Kafka brokers: --brokers / KAFKA_BROKERS is overridden by an empty --kafka-config bootstrap.servers",
    );
}

/// `--broker`'s scheme names the broker; one broker is given, not two or none; the Kafka-only
/// flags are refused with another broker; no password is printed.
#[test]
fn the_broker_is_named_once_by_its_scheme() {
    let db = "/nonexistent/never-opened.db";
    assert_refused(
        &[
            "--database-url",
            db,
            "--broker",
            "redis://app:hunter2@cache:6379",
        ],
        &[],
        "--broker / OUTBOX_BROKER `redis://app:***@cache:6379`: the scheme names the broker: kafka://, nats:// (or tls://), amqp:// (or amqps://)",
    );
    assert_refused(
        &["--database-url", db, "--broker", "nats://n:4222"],
        &[("KAFKA_BROKERS", Some("k:9092"))],
        "both --broker / OUTBOX_BROKER and --brokers / KAFKA_BROKERS are given: keep one",
    );
    assert_refused(
        &["--database-url", db],
        &[],
        "no broker: give --broker / OUTBOX_BROKER (kafka://host:9092, nats://host:4222 or amqp://user:password@host:5672/vhost), or Kafka's --brokers / KAFKA_BROKERS",
    );
    assert_refused(
        &["--database-url", db, "--kafka-config", "linger.ms=5"],
        &[("OUTBOX_BROKER", Some("amqp://relay:hunter2@r:5672/%2f"))],
        "--kafka-config, --kafka-config-file and OUTBOX_KAFKA_CONFIG are librdkafka settings: they do not apply to rabbitmq amqp://relay:***@r:5672/%2f",
    );
}

/// The NATS and RabbitMQ TLS files: refused with Kafka, read before anything connects, and
/// each fault named by its flag and path; a TLS file beside a plain `amqp://` URI is refused.
#[test]
fn broker_tls_files_are_checked_and_named_by_their_flags() {
    let db = "/nonexistent/never-opened.db";
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.txt");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let not_pem = not_pem.to_str().unwrap();
    assert_refused(
        &[
            "--database-url",
            db,
            "--brokers",
            "k:9092",
            "--broker-ca-file",
            not_pem,
        ],
        &[],
        "--broker-ca-file, --broker-cert-file and --broker-key-file are for NATS and RabbitMQ: give Kafka's TLS files as ssl.ca.location, ssl.certificate.location and ssl.key.location in --kafka-config-file",
    );
    assert_refused(
        &["--database-url", db, "--broker", "tls://n:4222"],
        &[("OUTBOX_BROKER_CA_FILE", Some("/nonexistent/ca.pem"))],
        "invalid `tls_ca_file`: cannot read `/nonexistent/ca.pem`: No such file or directory (os error 2) (check --broker-ca-file / OUTBOX_BROKER_CA_FILE)",
    );
    assert_refused(
        &[
            "--database-url",
            db,
            "--broker",
            "amqps://relay:hunter2@r:5671/%2f",
            "--broker-ca-file",
            not_pem,
        ],
        &[],
        &format!(
            "invalid `tls_ca_file`: `{not_pem}` holds no PEM certificate (`-----BEGIN CERTIFICATE-----`) (check --broker-ca-file / OUTBOX_BROKER_CA_FILE)"
        ),
    );
    assert_refused(
        &[
            "--database-url",
            db,
            "--broker",
            "amqp://relay:hunter2@r:5672/%2f",
            "--broker-cert-file",
            not_pem,
            "--broker-key-file",
            not_pem,
        ],
        &[],
        "invalid `tls_client_cert`: TLS files need an `amqps://` URI, and amqp://relay:***@r:5672/%2f is not one (check --broker-cert-file and --broker-key-file)",
    );
}

/// `--nats-credentials-file`: refused with another broker, and a file that is not a
/// `.creds` file is named by the flag, before anything connects.
#[test]
fn nats_credentials_file_is_checked_and_named_by_its_flag() {
    let db = "/nonexistent/never-opened.db";
    let dir = tempfile::tempdir().unwrap();
    let not_creds = dir.path().join("relay.creds");
    std::fs::write(&not_creds, "-----BEGIN NATS USER JWT-----\nnot a jwt\n").unwrap();
    let not_creds = not_creds.to_str().unwrap();
    assert_refused(
        &[
            "--database-url",
            db,
            "--broker",
            "amqp://relay:hunter2@r:5672/%2f",
        ],
        &[("OUTBOX_NATS_CREDENTIALS_FILE", Some(not_creds))],
        "--nats-credentials-file / OUTBOX_NATS_CREDENTIALS_FILE is for NATS: it does not apply to rabbitmq amqp://relay:***@r:5672/%2f",
    );
    assert_refused(
        &[
            "--database-url",
            db,
            "--broker",
            "nats://n:4222",
            "--nats-credentials-file",
            not_creds,
        ],
        &[],
        &format!(
            "invalid `credentials_file`: `{not_creds}` is not a NATS credentials file (a `-----BEGIN NATS USER JWT-----` block and a `-----BEGIN USER NKEY SEED-----` block, as `nsc` writes them) (check --nats-credentials-file / OUTBOX_NATS_CREDENTIALS_FILE)"
        ),
    );
}

/// The overflowing retention once deleted a published row two hours old: now the relay does
/// not start, and the row is still there.
#[test]
fn overflowing_retention_deletes_nothing() {
    let db = TestDatabase::postgres("e2e_retention");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    diesel::sql_query(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload, \
         created_at, available_at, published_at) \
         VALUES ('order', '1', 'OrderPlaced', 1, '{}', now() - interval '2 hours', \
                 now() - interval '2 hours', now() - interval '2 hours')",
    )
    .execute(&mut conn)
    .unwrap();
    assert_refused(
        &[
            "--database-url",
            &db.url,
            "--brokers",
            "127.0.0.1:9092",
            "--retention-hours",
            "5124095576030432",
        ],
        &[],
        "--retention-hours / OUTBOX_RETENTION_HOURS must be between 1 and 87600 hours, got 5124095576030432",
    );
    std::thread::sleep(Duration::from_millis(200));
    let left = diesel::sql_query("SELECT COUNT(*) AS n FROM outbox_events")
        .get_result::<Count>(&mut conn)
        .unwrap();
    assert_eq!(left.n, 1, "the published row is kept");
}

/// `outbox migrate` on MariaDB through the async MySQL driver applies the functions and
/// triggers of `insert_defaults` (multi-statement bodies), and a second run applies nothing.
#[test]
fn migrate_applies_functions_on_mariadb() {
    let admin = mysql_admin_url();
    let name = format!("outbox_t_e2e_migrate_{}", std::process::id());
    let mut conn = diesel::MysqlConnection::establish(&admin).unwrap();
    diesel::sql_query(format!("DROP DATABASE IF EXISTS {name}"))
        .execute(&mut conn)
        .unwrap();
    diesel::sql_query(format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .unwrap();
    let (base, _) = admin.rsplit_once('/').unwrap();
    let url = format!("{base}/{name}");
    let run = |url: &str| outbox_ok(&["migrate", "--database-url", url]);
    assert!(run(&url).contains("20261130000005"));
    assert!(run(&url).contains("up to date"));
    let mut db = diesel::MysqlConnection::establish(&url).unwrap();
    diesel::sql_query(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload) \
         VALUES ('order', '42', 'OrderPlaced', 1, '{}')",
    )
    .execute(&mut db)
    .unwrap();
    let shard = diesel::sql_query(format!(
        "SELECT COUNT(*) AS n FROM outbox_events WHERE shard = {}",
        outbox::shard_of("order", "42")
    ))
    .get_result::<Count>(&mut db)
    .unwrap();
    assert_eq!(shard.n, 1);
    diesel::sql_query(format!("DROP DATABASE {name}"))
        .execute(&mut conn)
        .unwrap();
}
