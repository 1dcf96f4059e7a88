//! Reading a topic back with a real Kafka consumer, keeping what the tally needs: where each
//! record sits, its key, its event id and its timestamp.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    /// The `id` header: the outbox row's id.
    pub id: String,
    /// The record's timestamp (CreateTime: set by the relay's producer when it sends).
    pub timestamp_ms: Option<i64>,
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
/// expected, read for the half second only.
fn read_until(
    brokers: &str,
    topic: &str,
    deadline: Duration,
    wait: bool,
    mut done: impl FnMut(&Record) -> bool,
) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("chaos-{}", uuid::Uuid::now_v7().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .create()
        .unwrap();
    let start = Instant::now();
    let partitions = loop {
        if let Ok(md) = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            let n = md.topics().first().map_or(0, |t| t.partitions().len());
            if n > 0 {
                break n;
            }
        }
        if start.elapsed() > deadline {
            return Vec::new();
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut complete = !wait;
    let mut extra_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        match extra_until {
            None if complete || start.elapsed() > deadline => {
                extra_until = Some(now + Duration::from_millis(500));
            }
            Some(t) if now > t => break,
            _ => {}
        }
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
                complete |= done(&record);
                out.push(record);
            }
            Some(Err(e)) => eprintln!("chaos reader: {e}"),
            None => {}
        }
    }
    out
}
