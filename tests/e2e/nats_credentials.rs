//! NATS `.creds` files through the `outbox` binary and the consumer, against an
//! operator-mode nats-server of the test's own (JetStream, accounts from a memory resolver),
//! whose operator, account and user JWTs the test signs with nkeys:
//!
//! - the relay publishes with `--nats-credentials-file`, and `NatsConsumer` with the same
//!   file reads every event back;
//! - a user the server does not know (signed by an account it was not given): the relay
//!   stops at start with one line naming the refused authorization, and never shows the seed.

use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;

use crate::broker_tls::{Consuming, RELAY_ID, relay};
use crate::chaos::services::free_port;
use crate::harness::{RelayProcess, outbox_ok};
use crate::kafka_tls::{PENDING, UNEXPECTED, count, exit_of, wait_published, write_orders};
use crate::support::TestDatabase;

/// A JWT of `claims` (with `iss` and `sub` filled in) signed by `issuer`, as nsc writes them.
fn jwt(issuer: &KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": uuid::Uuid::now_v7().simple().to_string().to_uppercase(),
        "iat": chrono::Utc::now().timestamp(),
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let signature = URL_SAFE_NO_PAD.encode(issuer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{signature}")
}

/// A user of `account`: its JWT and seed in the `.creds` format.
fn creds(account: &KeyPair) -> (String, String) {
    let user = KeyPair::new_user();
    let nats = serde_json::json!({
        "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
        "type": "user", "version": 2
    });
    let token = jwt(account, &user.public_key(), "relay", nats);
    let seed = user.seed().unwrap();
    let file = format!(
        "-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    );
    (file, seed)
}

/// An operator-mode nats-server with JetStream: one operator, the system account and one
/// account (JetStream unlimited) preloaded in a memory resolver. Killed on drop.
struct OperatorNats {
    server: Child,
    port: u16,
    account: KeyPair,
}

impl OperatorNats {
    fn start(work: &tempfile::TempDir) -> OperatorNats {
        let operator = KeyPair::new_operator();
        let account = KeyPair::new_account();
        let operator_jwt = jwt(
            &operator,
            &operator.public_key(),
            "outbox-test",
            serde_json::json!({"type": "operator", "version": 2}),
        );
        let limits = serde_json::json!({
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
        });
        let account_jwt = jwt(
            &operator,
            &account.public_key(),
            "app",
            serde_json::json!({
                "limits": limits,
                "default_permissions": {"pub": {}, "sub": {}},
                "type": "account", "version": 2
            }),
        );
        // JetStream needs a system account.
        let system = KeyPair::new_account();
        let system_jwt = jwt(
            &operator,
            &system.public_key(),
            "SYS",
            serde_json::json!({"type": "account", "version": 2}),
        );
        let port = free_port();
        let config = work.path().join("nats.conf");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:{port}\noperator: {operator_jwt}\nresolver: MEMORY\n\
                 system_account: {}\n\
                 resolver_preload: {{ {}: {system_jwt}, {}: {account_jwt} }}\n\
                 jetstream: {{ store_dir: {:?} }}\n",
                system.public_key(),
                system.public_key(),
                account.public_key(),
                work.path().join("jetstream")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(work.path().join("nats-server.log")).unwrap();
        let mut server = Command::new("nats-server")
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("nats-server runs");
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = server.try_wait().unwrap() {
                panic!(
                    "nats-server exited ({status}): {}",
                    std::fs::read_to_string(work.path().join("nats-server.log")).unwrap()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        OperatorNats {
            server,
            port,
            account,
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for OperatorNats {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[test]
fn nats_credentials_file_relay_publishes_and_a_consumer_reads_back() {
    let work = tempfile::tempdir().unwrap();
    let nats = OperatorNats::start(&work);
    let server_log = || std::fs::read_to_string(work.path().join("nats-server.log")).unwrap();
    let (file, seed) = creds(&nats.account);
    let path = work.path().join("relay.creds");
    std::fs::write(&path, file).unwrap();
    let path = path.to_str().unwrap().to_owned();
    let prefix = format!("t{}.", uuid::Uuid::now_v7().simple());

    let builder = outbox::nats::NatsConsumer::builder()
        .servers(nats.url())
        .credentials_file(&path);
    let consuming = Consuming::nats(builder, format!("{prefix}order"));

    let db = TestDatabase::sqlite("nats_creds");
    write_orders(&db.url, 0..3);
    let log = work.path().join("relay.log");
    let files = [("--nats-credentials-file", path.clone())];
    let mut child = RelayProcess {
        child: relay(&db.url, &nats.url(), &prefix, &files, &log),
        log: log.clone(),
        id: RELAY_ID.into(),
    };
    wait_published(&db.url, &log, &server_log);
    let status = outbox_ok(&["status", "--database-url", &db.url]);
    child.kill();
    assert_eq!(count(&db.url, UNEXPECTED), 0, "one attempt each: {status}");
    let ids = consuming.stop_after(3);
    assert_eq!(ids, [0, 1, 2], "{}", server_log());
    let relay_log = std::fs::read_to_string(&log).unwrap();
    assert!(!relay_log.contains(&seed), "the seed is shown: {relay_log}");

    // A user of an account the server was not given: refused, in one line, seed unseen.
    let (file, seed) = creds(&KeyPair::new_account());
    let stranger = work.path().join("stranger.creds");
    std::fs::write(&stranger, file).unwrap();
    write_orders(&db.url, 3..4);
    let log = work.path().join("relay-stranger.log");
    let files = [(
        "--nats-credentials-file",
        stranger.to_str().unwrap().to_owned(),
    )];
    let mut child = relay(&db.url, &nats.url(), &prefix, &files, &log);
    let status = exit_of(&mut child);
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: cannot reach NATS")
            && last.to_lowercase().contains("authorization"),
        "one line naming the refused authorization: {out}"
    );
    assert!(!out.contains(&seed), "the seed is shown: {out}");
    assert_eq!(
        count(&db.url, PENDING),
        1,
        "nothing published by the stranger"
    );
}
