//! Scenario 2: the broker goes away for a minute (20 s in the short form) while writers run,
//! once as refused connections (the broker is down: open connections are cut, new ones
//! refused) and once as a black hole (a network partition: connections stay open, nothing
//! moves, new connections are accepted and go nowhere). The relays run with
//! `--max-attempts 2`: an outage is not the events' fault, so it must cost no attempt and
//! dead-letter nothing. Run against Kafka (a private tansu) and NATS JetStream.

use std::time::{Duration, Instant};

use super::brokers::{ChaosBroker, Kind, forget};
use super::proxy::Mode;
use super::services::{relay, status};
use super::tally::{count_up, dead, outbox_rows, pending, published, wait_settled};
use super::writers::{WriterSpec, Writers};
use super::{Area, Row, size};
use crate::harness::unique_prefix;
use crate::support::TestDatabase;

#[test]
fn chaos_broker_outage_refused() {
    broker_outage(Kind::Kafka, Mode::Refuse);
}

#[test]
fn chaos_broker_outage_black_hole() {
    broker_outage(Kind::Kafka, Mode::BlackHole);
}

#[test]
fn chaos_nats_outage_refused() {
    broker_outage(Kind::Nats, Mode::Refuse);
}

#[test]
fn chaos_nats_outage_black_hole() {
    broker_outage(Kind::Nats, Mode::BlackHole);
}

#[test]
fn chaos_rabbitmq_outage_refused() {
    broker_outage(Kind::RabbitMq, Mode::Refuse);
}

#[test]
fn chaos_rabbitmq_outage_black_hole() {
    broker_outage(Kind::RabbitMq, Mode::BlackHole);
}

fn broker_outage(kind: Kind, mode: Mode) {
    let started = Instant::now();
    // Kafka's rows keep their names from before there were other brokers.
    let (name, title) = match (kind, mode) {
        (Kind::Kafka, Mode::Refuse) => (
            "broker_outage_refused".to_owned(),
            "Broker outage: refused connections".to_owned(),
        ),
        (Kind::Kafka, _) => (
            "broker_outage_black_hole".to_owned(),
            "Broker outage: black hole".to_owned(),
        ),
        (kind, Mode::Refuse) => (
            format!("{}_outage_refused", kind.name()),
            format!("{} outage: refused connections", kind.title()),
        ),
        (kind, _) => (
            format!("{}_outage_black_hole", kind.name()),
            format!("{} outage: black hole", kind.title()),
        ),
    };
    let mut row = Row::new(&name, &title, Area::Relay);
    let outage = Duration::from_secs(size(20, 60));
    let before = Duration::from_secs(size(5, 10));
    let broker = ChaosBroker::start(kind);
    let db = TestDatabase::postgres("chaos_broker");
    let prefix = unique_prefix("outage");
    let rate = 200.0;
    let spec = WriterSpec {
        threads: 2,
        pool_size: 2,
        aggregates: 250,
        events: u64::MAX,
        rate,
        hold: Duration::ZERO,
    };
    let args = ["--max-attempts", "2"];
    super::brokers::prepare(&broker.address(), &format!("{prefix}order-lifecycle"));
    let mut relays: Vec<_> = (0..2)
        .map(|_| relay(&db.url, &broker.address(), &prefix, &args))
        .collect();
    let writers = Writers::start(&db.url, &spec);
    // Wait for the first publishes (the topic is created on first use), then the lead time.
    let t0 = Instant::now();
    while published(&db.url).unwrap_or(0) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "nothing published before the outage"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(before);
    broker.set(mode);
    let cut_at = Instant::now();
    let pending_at_cut = pending(&db.url).unwrap_or(-1);
    std::thread::sleep(outage / 2);
    let status_during = status(&db.url);
    std::thread::sleep(outage.saturating_sub(cut_at.elapsed()));
    let dead_during = dead(&db.url).unwrap_or(-1);
    let pending_at_restore = pending(&db.url).unwrap_or(-1);
    let published_at_restore = published(&db.url).unwrap_or(0);
    broker.set(Mode::Forward);
    let restored = Instant::now();
    let log = writers.stop();
    // Delivery resumes: the first row marked published after the broker's return.
    let resumed = loop {
        if published(&db.url).unwrap_or(0) > published_at_restore {
            break Some(restored.elapsed());
        }
        if restored.elapsed() > Duration::from_secs(120) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let settled =
        wait_settled(&db.url, Duration::from_secs(size(90, 180))).map(|_| restored.elapsed());
    let rows = outbox_rows(&db.url);
    let records = super::reader::read_published(&broker.address(), &prefix, &rows);
    forget(&broker.address(), &format!("{prefix}order-lifecycle"));
    let publish_failures: usize = relays
        .iter()
        .map(|r| r.log_text().matches("publish failed").count())
        .sum();
    for r in &mut relays {
        r.terminate();
    }
    let (tally, _) = count_up(&rows, &records, Some(&log));
    row.tally = tally;
    row.recover_s = settled.map(|d| d.as_secs_f64());
    row.recover_means =
        "from the broker's return to the backlog drained (all the relay owes)".into();
    let fmt =
        |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    row.figure(
        "relays",
        format!(
            "2 sharded to {}, `--max-attempts 2`, relay defaults otherwise",
            kind.title()
        ),
    );
    row.figure(
        "outage",
        format!(
            "{} s ({})",
            outage.as_secs(),
            match mode {
                Mode::Refuse => "connections cut, new ones refused",
                _ => "connections held open, nothing forwarded, new ones accepted and held",
            }
        ),
    );
    row.figure(
        "writers",
        format!("{rate:.0} events/s until the broker's return"),
    );
    row.figure("pending when the broker went away", pending_at_cut);
    row.figure("pending when it came back", pending_at_restore);
    row.figure("dead letters when it came back", dead_during);
    row.figure(
        "\"publish failed\" lines in the relays' logs",
        publish_failures,
    );
    row.figure("delivery resumed after the broker's return", fmt(resumed));
    row.figure("backlog drained after the broker's return", fmt(settled));
    row.captures.push((
        "`outbox status` half-way through the outage".into(),
        status_during.clone(),
    ));
    let t = row.tally.clone();
    row.target_intact();
    row.target("0 dead letters", t.dead_lettered, t.dead_lettered == 0);
    row.target(
        "every event delivered (none held behind a dead letter)",
        format!("{} of {}", t.delivered, t.written),
        t.delivered == t.written,
    );
    row.timing_target(
        "delivery resumes within 5 s of the broker's return",
        fmt(resumed),
        resumed.is_some_and(|d| d <= Duration::from_secs(5)),
    );
    let waiting = status_during.contains("waiting_for_broker");
    row.target(
        "`outbox status` shows the relay waiting for the broker",
        if waiting {
            "shows `waiting_for_broker`"
        } else {
            "does not show `waiting_for_broker`"
        },
        waiting,
    );
    row.finish(started);
}
