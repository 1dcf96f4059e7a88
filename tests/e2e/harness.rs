//! Relay processes, a real Kafka consumer, and waiting for the outbox to drain.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

/// noida-db (or any Kafka named by `KAFKA_BROKERS`).
pub fn noida() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// tansu, the second broker implementation.
pub fn tansu() -> String {
    std::env::var("OUTBOX_TEST_TANSU").unwrap_or_else(|_| "127.0.0.1:9094".to_owned())
}

/// A topic prefix no other test uses.
pub fn unique_prefix(label: &str) -> String {
    format!("t{}-{label}.", uuid::Uuid::now_v7().simple())
}

/// The relay settings the tests use unless they set them: short, so the tests run fast.
pub const TEST_DEFAULTS: &[[&str; 2]] = &[
    ["--lease", "6000"],
    ["--message-timeout", "2000"],
    ["--poll-interval", "100"],
    ["--retry-initial", "100"],
    ["--retry-max", "1000"],
];

/// The `outbox` binary: `OUTBOX_BIN` if set (a copy of this build's binary, for a target
/// directory that other builds share and may overwrite mid-run), else Cargo's.
pub fn outbox_bin() -> String {
    std::env::var("OUTBOX_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_outbox").to_owned())
}

/// Runs `outbox <args>` to completion; asserts it succeeded (else fails with its stderr) and
/// returns its stdout.
pub fn outbox_ok(args: &[&str]) -> String {
    let out = Command::new(outbox_bin()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "outbox {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An `outbox relay` process.
pub struct RelayProcess {
    pub child: Child,
    pub log: PathBuf,
    pub id: String,
}

impl RelayProcess {
    /// `outbox relay --mode <mode>` with the test defaults ([`TEST_DEFAULTS`]) for every flag
    /// `extra` does not set.
    pub fn spawn(db_url: &str, brokers: &str, mode: &str, prefix: &str, extra: &[&str]) -> Self {
        let defaults = TEST_DEFAULTS
            .iter()
            .filter(|[flag, _]| !extra.contains(flag))
            .flatten()
            .copied();
        let args: Vec<&str> = defaults.chain(extra.iter().copied()).collect();
        Self::start(&outbox_bin(), "relay", db_url, brokers, mode, prefix, &args)
    }

    /// `<bin> relay --mode <mode>` with `args` only (the relay's own defaults for the rest),
    /// under a fresh relay id `<label>-<pid>-<n>`, logging to a temporary file.
    pub fn start(
        bin: &str,
        label: &str,
        db_url: &str,
        brokers: &str,
        mode: &str,
        prefix: &str,
        args: &[&str],
    ) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{label}-{}-{n}", std::process::id());
        let log = std::env::temp_dir().join(format!("outbox-e2e-{id}.log"));
        let file = std::fs::File::create(&log).unwrap();
        // A URL names its broker (`nats://…`); Kafka's bootstrap servers go to `--brokers`.
        let flag = if brokers.contains("://") {
            "--broker"
        } else {
            "--brokers"
        };
        let child = Command::new(bin)
            .args(["relay", "--database-url", db_url, flag, brokers])
            .args(["--mode", mode, "--topic-prefix", prefix, "--relay-id", &id])
            .args(args)
            .env("RUST_LOG", "info,librdkafka=error,rdkafka::client=off")
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("the outbox binary runs");
        RelayProcess { child, log, id }
    }

    /// SIGKILL: no shutdown, leases left to expire.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait: graceful shutdown.
    pub fn terminate(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// A message as consumed.
#[derive(Debug, Clone)]
pub struct Consumed {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub payload: String,
    pub headers: HashMap<String, String>,
}

impl Consumed {
    pub fn id(&self) -> &str {
        &self.headers["id"]
    }
}

/// A consumer assigned to every partition of `topic` from the beginning (no group, no
/// commits), once the topic exists; `None` if it has not appeared by `deadline` after `start`.
pub fn assigned_consumer(
    brokers: &str,
    topic: &str,
    start: Instant,
    deadline: Duration,
) -> Option<BaseConsumer> {
    assigned_consumer_with(brokers, &[], topic, start, deadline)
}

/// [`assigned_consumer`] with more librdkafka settings (`security.protocol`, say).
pub fn assigned_consumer_with(
    brokers: &str,
    settings: &[(&str, &str)],
    topic: &str,
    start: Instant,
    deadline: Duration,
) -> Option<BaseConsumer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("e2e-{}", uuid::Uuid::now_v7().simple()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100");
    for (key, value) in settings {
        config.set(*key, *value);
    }
    let consumer: BaseConsumer = config.create().unwrap();
    let partitions = loop {
        if let Ok(md) = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            let n = md.topics().first().map_or(0, |t| t.partitions().len());
            if n > 0 {
                break n;
            }
        }
        if start.elapsed() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    Some(consumer)
}

/// Reads `topic` from the beginning of every partition (assigned, no consumer group) until
/// `expected` messages arrived or `deadline` passed.
pub fn consume(brokers: &str, topic: &str, expected: usize, deadline: Duration) -> Vec<Consumed> {
    consume_with(brokers, &[], topic, expected, deadline)
}

/// [`consume`] with more librdkafka settings (`security.protocol`, say).
pub fn consume_with(
    brokers: &str,
    settings: &[(&str, &str)],
    topic: &str,
    expected: usize,
    deadline: Duration,
) -> Vec<Consumed> {
    let start = Instant::now();
    let consumer = assigned_consumer_with(brokers, settings, topic, start, deadline)
        .unwrap_or_else(|| panic!("topic {topic} never appeared on {brokers}"));
    let mut out = Vec::with_capacity(expected);
    while out.len() < expected && start.elapsed() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let mut headers = HashMap::new();
                if let Some(h) = m.headers() {
                    for i in 0..h.count() {
                        let header = h.get(i);
                        let value = header
                            .value
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default();
                        headers.insert(header.key.to_owned(), value);
                    }
                }
                out.push(Consumed {
                    topic: m.topic().to_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m
                        .key()
                        .map(|k| String::from_utf8_lossy(k).into_owned())
                        .unwrap_or_default(),
                    payload: m
                        .payload()
                        .map(|p| String::from_utf8_lossy(p).into_owned())
                        .unwrap_or_default(),
                    headers,
                });
            }
            Some(Err(e)) => eprintln!("consumer: {e}"),
            None => {}
        }
    }
    // A short extra read: anything beyond `expected` is a duplicate worth seeing.
    let extra_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < extra_until {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let mut headers = HashMap::new();
            if let Some(h) = m.headers() {
                for i in 0..h.count() {
                    let header = h.get(i);
                    headers.insert(
                        header.key.to_owned(),
                        header
                            .value
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default(),
                    );
                }
            }
            out.push(Consumed {
                topic: m.topic().to_owned(),
                partition: m.partition(),
                offset: m.offset(),
                key: m
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default(),
                payload: m
                    .payload()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .unwrap_or_default(),
                headers,
            });
        }
    }
    out
}

/// Per key, in partition order, after dropping repeats of an id already seen: the event ids
/// must be increasing (UUIDv7 ids follow write order). Returns the number of duplicates.
pub fn assert_per_key_order(messages: &[Consumed]) -> usize {
    let mut sorted: Vec<&Consumed> = messages.iter().collect();
    sorted.sort_by_key(|m| (m.partition, m.offset));
    let mut seen = std::collections::HashSet::new();
    let mut last: HashMap<&str, &str> = HashMap::new();
    let mut duplicates = 0;
    for m in sorted {
        if !seen.insert(m.id().to_owned()) {
            duplicates += 1;
            continue;
        }
        if let Some(prev) = last.insert(m.key.as_str(), m.id()) {
            assert!(
                prev < m.id(),
                "key {}: {} delivered after {}",
                m.key,
                m.id(),
                prev
            );
        }
    }
    duplicates
}

/// Waits until `pending()` is zero or `deadline` passes; returns how long it took.
pub fn wait_drained(mut pending: impl FnMut() -> i64, deadline: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let n = pending();
        if n == 0 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < deadline,
            "{n} events still pending after {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
