//! Counting what arrived against what was committed. The outbox table is the truth of what
//! committed (the suite never deletes published rows); the Kafka records are what arrived.
//!
//! - written: rows in the outbox table (committed events).
//! - delivered: written events read back at least once.
//! - lost: written events neither delivered, nor dead-lettered, nor waiting behind a dead
//!   letter of their aggregate when the scenario ended (after waiting generously for the
//!   backlog to drain); plus events a writer saw commit that are not in the table.
//! - phantom: records whose id is no committed row (a rolled-back transaction's event).
//! - duplicated: records beyond the first of an id.
//! - out of order: per aggregate, taking each event's first delivery in partition order, an
//!   event that arrives after a later event of its aggregate.
//! - dead-lettered: rows with `dead_at`; of those, how many had in fact reached the broker.
//! - blocked: rows still pending behind a dead letter of their aggregate.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use diesel::{Connection, RunQueryDsl};

use super::reader::Record;
use super::writers::WriterLog;

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Tally {
    pub written: u64,
    pub rolled_back: u64,
    pub delivered: u64,
    pub lost: u64,
    pub phantom: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    pub dead_lettered: u64,
    pub dead_but_delivered: u64,
    pub blocked: u64,
}

impl Tally {
    pub fn line(&self) -> String {
        format!(
            "written {}, rolled back {}, delivered {}, lost {}, phantom {}, duplicated {}, out of order {}, dead-lettered {} ({} of them delivered), blocked behind dead letters {}",
            self.written,
            self.rolled_back,
            self.delivered,
            self.lost,
            self.phantom,
            self.duplicated,
            self.out_of_order,
            self.dead_lettered,
            self.dead_but_delivered,
            self.blocked
        )
    }
}

/// An outbox row as the tally needs it.
#[derive(Debug, diesel::QueryableByName)]
pub struct OutboxRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub seq: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub aggregate_id: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub amount: i64,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub published: bool,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub dead: bool,
}

/// The URL with `application_name` set, so that a scenario killing sessions can spare ours.
pub fn named(url: &str, app: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={app}")
}

fn monitor(url: &str) -> Option<diesel::PgConnection> {
    diesel::PgConnection::establish(&named(url, "chaos-monitor")).ok()
}

pub fn outbox_rows(url: &str) -> Vec<OutboxRow> {
    let mut c = monitor(url).expect("the database is reachable for the tally");
    diesel::sql_query(
        "SELECT seq, id::text AS id, aggregate_id, \
         (COALESCE(payload->'Paid', payload)->>'amount')::bigint AS amount, \
         published_at IS NOT NULL AS published, dead_at IS NOT NULL AS dead \
         FROM outbox_events ORDER BY seq",
    )
    .load(&mut c)
    .unwrap()
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn count(url: &str, sql: &str) -> Option<i64> {
    let mut c = monitor(url)?;
    diesel::sql_query(sql)
        .get_result::<N>(&mut c)
        .ok()
        .map(|r| r.n)
}

/// Pending rows (neither published nor dead), `None` when the database cannot be asked.
pub fn pending(url: &str) -> Option<i64> {
    count(
        url,
        "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL",
    )
}

pub fn published(url: &str) -> Option<i64> {
    count(
        url,
        "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NOT NULL",
    )
}

pub fn dead(url: &str) -> Option<i64> {
    count(
        url,
        "SELECT COUNT(*) AS n FROM outbox_events WHERE dead_at IS NOT NULL",
    )
}

/// Once stream mode has run (a position moved): the events beyond the stream's positions
/// (stream mode leaves `published_at` NULL), as `outbox status` counts them.
fn stream_owed(url: &str) -> Option<Option<i64>> {
    let ran = count(
        url,
        "SELECT COUNT(*) AS n FROM outbox_stream_positions WHERE version > 0",
    )?;
    if ran == 0 {
        return Some(None);
    }
    count(
        url,
        "SELECT COUNT(*) AS n FROM outbox_events o JOIN outbox_stream_positions p USING (shard) \
         WHERE NOT pg_visible_in_snapshot(o.xid, p.last_snapshot) \
           AND (p.cur_snapshot IS NULL OR o.seq > p.cur_seq \
                OR NOT pg_visible_in_snapshot(o.xid, p.cur_snapshot))",
    )
    .map(Some)
}

/// Pending rows that no dead letter of their aggregate holds back: what the relay still owes
/// (in stream mode: the events beyond its positions).
pub fn owed(url: &str) -> Option<i64> {
    if let Some(n) = stream_owed(url)? {
        return Some(n);
    }
    let p = pending(url)?;
    if p == 0 || dead(url)? == 0 {
        return Some(p);
    }
    count(
        url,
        "SELECT COUNT(*) AS n FROM outbox_events e \
         WHERE e.published_at IS NULL AND e.dead_at IS NULL AND NOT EXISTS ( \
           SELECT 1 FROM outbox_events d WHERE d.aggregate_type = e.aggregate_type \
           AND d.aggregate_id = e.aggregate_id AND d.dead_at IS NOT NULL \
           AND d.published_at IS NULL AND d.seq < e.seq)",
    )
}

/// Waits until the relay owes nothing (see [`owed`]) or `deadline` passes; returns how long
/// it took, `None` if it never settled.
pub fn wait_settled(url: &str, deadline: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if owed(url) == Some(0) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// The tally, and for each delivered row id its first delivery's timestamp (ms).
pub fn count_up(
    rows: &[OutboxRow],
    records: &[Record],
    writers: Option<&WriterLog>,
) -> (Tally, HashMap<String, i64>) {
    let by_id: HashMap<&str, &OutboxRow> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut t = Tally {
        written: rows.len() as u64,
        ..Tally::default()
    };
    let mut first: HashMap<String, i64> = HashMap::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut phantoms: HashSet<&str> = HashSet::new();
    let mut last: HashMap<&str, i64> = HashMap::new();
    for r in sorted {
        let Some(row) = by_id.get(r.id.as_str()) else {
            if !phantoms.insert(r.id.as_str()) {
                t.duplicated += 1;
            }
            continue;
        };
        if !seen.insert(r.id.as_str()) {
            t.duplicated += 1;
            continue;
        }
        first.insert(r.id.clone(), r.timestamp_ms.unwrap_or(0));
        let prev = last.entry(row.aggregate_id.as_str()).or_insert(i64::MIN);
        if row.amount < *prev {
            t.out_of_order += 1;
        } else {
            *prev = row.amount;
        }
    }
    t.phantom = phantoms.len() as u64;
    t.delivered = seen.len() as u64;
    let dead_aggregates: HashMap<&str, i64> =
        rows.iter()
            .filter(|r| r.dead && !r.published)
            .fold(HashMap::new(), |mut m, r| {
                let e = m.entry(r.aggregate_id.as_str()).or_insert(i64::MAX);
                *e = (*e).min(r.seq);
                m
            });
    for r in rows {
        let delivered = seen.contains(r.id.as_str());
        if r.dead {
            t.dead_lettered += 1;
            t.dead_but_delivered += u64::from(delivered);
        } else if !delivered {
            let behind_dead = dead_aggregates
                .get(r.aggregate_id.as_str())
                .is_some_and(|&d| d < r.seq);
            if behind_dead && !r.published {
                t.blocked += 1;
            } else {
                t.lost += 1;
            }
        }
    }
    if let Some(w) = writers {
        t.rolled_back = w.rolled_back_never_inserted + w.rolled_back_after_insert;
        let in_table: HashSet<(&str, i64)> = rows
            .iter()
            .map(|r| (r.aggregate_id.as_str(), r.amount))
            .collect();
        let acknowledged_missing = w
            .committed
            .keys()
            .filter(|(o, a)| !in_table.contains(&(o.to_string().as_str(), *a)))
            .count();
        t.lost += acknowledged_missing as u64;
    }
    (t, first)
}

/// Commit → publish, milliseconds, for every committed event the writers timed and that was
/// delivered: the first delivery's record timestamp minus the writer's clock at `COMMIT`'s
/// return. Only events committed within `window` (instants of the writers' clock) count.
pub fn commit_to_publish(
    rows: &[OutboxRow],
    first: &HashMap<String, i64>,
    writers: &WriterLog,
    window: Option<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)>,
) -> Vec<f64> {
    rows.iter()
        .filter_map(|r| {
            let ts = *first.get(&r.id)?;
            let order: i64 = r.aggregate_id.parse().ok()?;
            let committed = *writers.committed.get(&(order, r.amount))?;
            if let Some((from, to)) = window
                && (committed < from || committed > to)
            {
                return None;
            }
            Some((ts - committed.timestamp_millis()) as f64)
        })
        .collect()
}
