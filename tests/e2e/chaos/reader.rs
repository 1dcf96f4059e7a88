//! Reading a topic back with a real Kafka consumer, keeping what the tally needs: where each
//! record sits, its key, its event id and its timestamp.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::message::{Headers, Message};

use super::tally::OutboxRow;
use crate::harness::assigned_consumer;

#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    /// The `id` header: the outbox row's id.
    pub id: String,
    /// The record's timestamp (CreateTime: set by the relay's producer when it sends).
    pub timestamp_ms: Option<i64>,
}

/// Reads back what the relays published of `rows` to `{prefix}order-lifecycle`: until every
/// published row arrived or 120 s passed, then half a second more.
pub fn read_published(brokers: &str, prefix: &str, rows: &[OutboxRow]) -> Vec<Record> {
    read_rows(brokers, prefix, rows, |r| r.published)
}

/// Reads the outbox topic until every row that is not a dead letter arrived (stream mode,
/// whose rows keep `published_at` NULL: once its positions have passed every row, every one
/// must be on the broker), or 120 s passed.
pub fn read_all(brokers: &str, prefix: &str, rows: &[OutboxRow]) -> Vec<Record> {
    read_rows(brokers, prefix, rows, |r| !r.dead)
}

/// Reads the outbox topic until every row `expected` picks arrived, or 120 s passed.
fn read_rows(
    brokers: &str,
    prefix: &str,
    rows: &[OutboxRow],
    expected: impl Fn(&OutboxRow) -> bool,
) -> Vec<Record> {
    let want: HashSet<String> = rows
        .iter()
        .filter(|r| expected(r))
        .map(|r| r.id.clone())
        .collect();
    read(
        brokers,
        &format!("{prefix}order-lifecycle"),
        &want,
        Duration::from_secs(120),
    )
}

/// Reads `topic` from the beginning of every partition until every id in `want` arrived or
/// `deadline` passed, then half a second more (what comes then is a duplicate worth seeing).
pub fn read(brokers: &str, topic: &str, want: &HashSet<String>, deadline: Duration) -> Vec<Record> {
    let mut missing: HashSet<&str> = want.iter().map(String::as_str).collect();
    read_until(brokers, topic, deadline, !want.is_empty(), |r| {
        missing.remove(r.id.as_str());
        missing.is_empty()
    })
}

/// Reads `topic` until `n` records arrived or `deadline` passed, then half a second more.
pub fn read_count(brokers: &str, topic: &str, n: usize, deadline: Duration) -> Vec<Record> {
    let mut seen = 0;
    read_until(brokers, topic, deadline, n > 0, |_| {
        seen += 1;
        seen >= n
    })
}

/// Reads until `done` says so (called on each record) or `deadline`; `wait` false: nothing is
/// expected, read for the half second only. `brokers` is Kafka's bootstrap servers, or a
/// `nats://` or `amqp://` URL ([`super::brokers`] reads those).
fn read_until(
    brokers: &str,
    topic: &str,
    deadline: Duration,
    wait: bool,
    done: impl FnMut(&Record) -> bool,
) -> Vec<Record> {
    if brokers.contains("://") {
        return super::brokers::read_until(brokers, topic, deadline, wait, done);
    }
    read_kafka(brokers, topic, deadline, wait, done)
}

/// When a read ends: half a second after `done` first said so or the deadline passed (to
/// catch what comes late: a duplicate, an event out of order), at once if not `wait`ing.
pub struct ReadWindow {
    start: Instant,
    deadline: Duration,
    complete: bool,
    extra_until: Option<Instant>,
}

impl ReadWindow {
    pub fn new(start: Instant, deadline: Duration, wait: bool) -> ReadWindow {
        ReadWindow {
            start,
            deadline,
            complete: !wait,
            extra_until: None,
        }
    }

    /// Records whether the read is complete after a record.
    pub fn saw(&mut self, complete: bool) {
        self.complete |= complete;
    }

    /// Whether the read is over.
    pub fn over(&mut self) -> bool {
        let now = Instant::now();
        match self.extra_until {
            None if self.complete || self.start.elapsed() > self.deadline => {
                self.extra_until = Some(now + Duration::from_millis(500));
                false
            }
            Some(t) => now > t,
            None => false,
        }
    }
}

fn read_kafka(
    brokers: &str,
    topic: &str,
    deadline: Duration,
    wait: bool,
    mut done: impl FnMut(&Record) -> bool,
) -> Vec<Record> {
    let start = Instant::now();
    let Some(consumer) = assigned_consumer(brokers, topic, start, deadline) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut window = ReadWindow::new(start, deadline, wait);
    while !window.over() {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let id = m
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == "id"))
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                let record = Record {
                    partition: m.partition(),
                    offset: m.offset(),
                    id,
                    timestamp_ms: m.timestamp().to_millis(),
                };
                window.saw(done(&record));
                out.push(record);
            }
            Some(Err(e)) => eprintln!("chaos reader: {e}"),
            None => {}
        }
    }
    out
}
