//! Secrets given to `outbox` (database passwords, Kafka SASL and SSL settings) never appear in
//! what it prints, and the ways of giving Kafka secrets off the command line work.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::harness::outbox_bin;

/// Runs `outbox <args>` in `dir` with `env` (and none of the variables it reads otherwise),
/// with a 30 s limit; returns whether it succeeded, and its stdout and stderr together.
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(outbox_bin());
    cmd.current_dir(dir).args(args).env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k == "DATABASE_URL" || k == "KAFKA_BROKERS" || k.starts_with("OUTBOX_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the outbox binary runs");
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn scratch(label: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("outbox-e2e-{label}-"))
        .tempdir()
        .unwrap()
}

/// The relay's arguments up to the Kafka settings: a database that is never reached (the
/// Kafka settings are checked first).
const RELAY: &[&str] = &[
    "relay",
    "--database-url",
    "postgres://app@127.0.0.1:1/never",
    "--brokers",
    "127.0.0.1:9092",
];

/// `OUTBOX_KAFKA_CONFIG` and `--kafka-config-file` are read, and a refused secret setting
/// is named by its key, its value never shown. The build takes TLS and SASL settings
/// (`ssl.key.password`, `SASL_SSL`): what fails here is each source's refused value.
#[test]
fn kafka_secrets_from_env_and_file_are_used_and_never_echoed() {
    let dir = scratch("kafka-secrets");
    // librdkafka quotes a refused `sasl.mechanisms` (and warns quoting values).
    let (ok, out) = run(
        dir.path(),
        RELAY,
        &[(
            "OUTBOX_KAFKA_CONFIG",
            "security.protocol=SASL_SSL,sasl.password=hunter2-env,sasl.mechanisms=hunter2-mech,\
             ssl.key.password=hunter2-pem",
        )],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("Unsupported SASL mechanism"),
        "the env setting is used: {out}"
    );
    assert!(!out.contains("hunter2"), "{out}");
    assert!(!out.contains("not supported in this build"), "{out}");

    // A key file that is not there: librdkafka names `ssl.key.location` and its path.
    let file = dir.path().join("kafka.properties");
    std::fs::write(
        &file,
        "# TLS and SASL\nsecurity.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-512\n\
         sasl.username=svc\nsasl.password=hunter2-file\nssl.key.location=/nonexistent/hunter2-key.pem\n\
         ssl.key.password=hunter2-pem\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let mut args = RELAY.to_vec();
    args.extend(["--kafka-config-file", file]);
    let (ok, out) = run(dir.path(), &args, &[]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("ssl.key.location failed"),
        "the file's settings are used: {out}"
    );
    assert!(!out.contains("hunter2"), "{out}");

    // An inline key (`ssl.key.pem`) that is not PEM.
    let mut args = RELAY.to_vec();
    args.extend(["--kafka-config", "security.protocol=SSL"]);
    args.extend(["--kafka-config", "ssl.key.pem=hunter2-flag"]);
    args.extend(["--kafka-config", "ssl.keystore.password=hunter2-store"]);
    let (ok, out) = run(dir.path(), &args, &[]);
    assert!(!ok && out.contains("ssl.key.pem"), "{out}");
    assert!(!out.contains("hunter2"), "{out}");

    std::fs::write(
        dir.path().join("bad.properties"),
        "acks=all\n\nhunter2-typo\n",
    )
    .unwrap();
    let bad = dir.path().join("bad.properties");
    let mut args = RELAY.to_vec();
    args.extend(["--kafka-config-file", bad.to_str().unwrap()]);
    let (ok, out) = run(dir.path(), &args, &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("bad.properties line 3"), "{out}");
    assert!(!out.contains("hunter2"), "{out}");
}

/// A libpq keyword string is refused, not taken for an SQLite file name: `migrate` creates
/// no file, and nothing prints the password.
#[test]
fn libpq_keyword_string_is_refused_not_created_as_a_file() {
    let dir = scratch("keywords");
    let url = "host=127.0.0.1 user=app password=hunter2 dbname=app";
    for args in [
        vec!["migrate", "--database-url", url],
        vec!["status", "--database-url", url],
        vec!["dead", "list", "--database-url", url],
    ] {
        let (ok, out) = run(dir.path(), &args, &[]);
        assert!(!ok, "{args:?}: {out}");
        assert!(
            out.contains("libpq") && out.contains("postgres://"),
            "{out}"
        );
        assert!(!out.contains("hunter2"), "{out}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "no file is created: {left:?}");
}

/// Passwords in a URL's user info and in its query are hidden in errors and in `--help`'s
/// display of the environment.
#[test]
fn url_passwords_are_never_printed() {
    let dir = scratch("url-passwords");
    let url = "postgres://app:hunter2@127.0.0.1:1/app?connect_timeout=2&password=hunter3";
    let (ok, out) = run(dir.path(), &["status", "--database-url", url], &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("127.0.0.1:1"), "the URL is described: {out}");
    assert!(
        !out.contains("hunter2") && !out.contains("hunter3"),
        "{out}"
    );

    for sub in [
        "relay",
        "status",
        "migrate",
        "replay",
        "cleanup",
        "partition",
    ] {
        let (_, out) = run(dir.path(), &[sub, "--help"], &[("DATABASE_URL", url)]);
        assert!(out.contains("DATABASE_URL"), "{sub}: {out}");
        assert!(!out.contains("hunter2"), "{sub} --help: {out}");
    }
}
