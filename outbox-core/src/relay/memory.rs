//! In-memory broker and store: for tests of your own code and of the relay's logic, and for
//! the embedded quickstart. Never a stand-in for a real broker in production.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{
    Claim, ClaimOrder, Completion, Delivery, Failure, OutboxMessage, Publisher, RelayStore,
    ShardAssignment, StoreError,
};
use crate::{
    HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_TYPE, HEADER_EVENT_VERSION, HEADER_ID,
    Headers, NewMessage, SHARD_COUNT,
};

/// A message as the in-memory broker stored it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The topic it was published to.
    pub topic: String,
    /// Its key (the aggregate id).
    pub key: String,
    /// The headers a Kafka message would carry (see [`message_headers`]).
    pub headers: Vec<(String, String)>,
    /// The payload, JSON text.
    pub payload: String,
    /// The event id.
    pub id: Uuid,
    /// Position in the topic, from 0.
    pub offset: u64,
}

impl Record {
    /// The value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The headers every publisher sends with a message: `id`, `event_type`, `event_version`,
/// `aggregate_type`, `created_at` (RFC 3339, UTC, microseconds), then the event's own
/// headers (e.g. `traceparent`).
pub fn message_headers(m: &OutboxMessage) -> Vec<(String, String)> {
    let mut h = vec![
        (HEADER_ID.to_owned(), m.id.hyphenated().to_string()),
        (HEADER_EVENT_TYPE.to_owned(), m.event_type.clone()),
        (HEADER_EVENT_VERSION.to_owned(), m.event_version.to_string()),
        (HEADER_AGGREGATE_TYPE.to_owned(), m.aggregate_type.clone()),
        (
            HEADER_CREATED_AT.to_owned(),
            m.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        ),
    ];
    h.extend(m.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
    h
}

type FaultFn = dyn Fn(&OutboxMessage) -> Option<String> + Send + Sync;

/// A broker in memory, implementing [`Publisher`] with the same contract as Kafka's.
///
/// Faults can be injected: [`set_available`](MemoryBroker::set_available) takes it down and
/// [`fail_when`](MemoryBroker::fail_when) fails chosen messages.
#[derive(Default)]
pub struct MemoryBroker {
    topics: Mutex<BTreeMap<String, Vec<Record>>>,
    down: std::sync::atomic::AtomicBool,
    fault: Mutex<Option<Box<FaultFn>>>,
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

impl MemoryBroker {
    /// An empty broker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the broker down (`false`: every publish fails) or brings it back.
    pub fn set_available(&self, available: bool) {
        self.down
            .store(!available, std::sync::atomic::Ordering::SeqCst);
    }

    /// Fails every message for which `f` returns an error, until replaced or cleared
    /// (`clear_faults`).
    pub fn fail_when(&self, f: impl Fn(&OutboxMessage) -> Option<String> + Send + Sync + 'static) {
        *lock(&self.fault) = Some(Box::new(f));
    }

    /// Removes the fault set by [`fail_when`](MemoryBroker::fail_when).
    pub fn clear_faults(&self) {
        *lock(&self.fault) = None;
    }

    /// The records of `topic`, in offset order.
    pub fn records(&self, topic: &str) -> Vec<Record> {
        lock(&self.topics).get(topic).cloned().unwrap_or_default()
    }

    /// Every record of every topic, topics in name order.
    pub fn all_records(&self) -> Vec<Record> {
        lock(&self.topics).values().flatten().cloned().collect()
    }
}

impl Publisher for MemoryBroker {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return vec![Delivery::Failed("broker unavailable".into()); batch.len()];
        }
        let fault = lock(&self.fault);
        let mut topics = lock(&self.topics);
        let mut failed_keys: HashSet<(&str, &str)> = HashSet::new();
        batch
            .iter()
            .map(|m| {
                if failed_keys.contains(&m.ordering_key()) {
                    return Delivery::NotAttempted;
                }
                if let Some(error) = fault.as_ref().and_then(|f| f(m)) {
                    failed_keys.insert(m.ordering_key());
                    return Delivery::Failed(error);
                }
                let records = topics.entry(m.topic().to_owned()).or_default();
                records.push(Record {
                    topic: m.topic().to_owned(),
                    key: m.aggregate_id.clone(),
                    headers: message_headers(m),
                    payload: m.payload.clone(),
                    id: m.id,
                    offset: records.len() as u64,
                });
                Delivery::Published
            })
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data here; carry on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A message for examples and tests: aggregate, id and event type, payload `{}`.
#[doc(hidden)]
pub fn test_message(aggregate_type: &str, aggregate_id: &str, event_type: &str) -> NewMessage {
    NewMessage {
        id: Uuid::now_v7(),
        aggregate_type: aggregate_type.to_owned().into(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: event_type.to_owned().into(),
        event_version: 1,
        payload: "{}".to_owned(),
        headers: Headers::new(),
        topic: None,
        shard: crate::shard_of(aggregate_type, aggregate_id),
        created_at: crate::now_micros(),
    }
}

#[derive(Debug, Clone)]
struct Row {
    message: NewMessage,
    attempts: i32,
    locked_by: Option<String>,
    locked_until: Option<Instant>,
    available_at: Instant,
    published: Option<Instant>,
    dead: bool,
    last_error: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    rows: BTreeMap<i64, Row>,
    next_seq: i64,
    leader: Option<(String, Instant)>,
    shards: HashMap<i16, (String, Instant)>,
    relays: HashMap<String, Instant>,
    fail_next: usize,
}

/// An outbox in memory implementing [`RelayStore`] with the same semantics as the SQL
/// stores (leases, fencing, head-of-line blocking per aggregate, shard and leader leases),
/// for testing the relay's logic. Clones share the same outbox.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl MemoryStore {
    /// Adds a message; returns its `seq`.
    pub fn insert(&self, message: NewMessage) -> i64 {
        let mut s = lock(&self.state);
        s.next_seq += 1;
        let seq = s.next_seq;
        s.rows.insert(
            seq,
            Row {
                message,
                attempts: 0,
                locked_by: None,
                locked_until: None,
                available_at: Instant::now(),
                published: None,
                dead: false,
                last_error: None,
            },
        );
        seq
    }

    /// Whether every row is published or dead-lettered.
    pub fn is_drained(&self) -> bool {
        lock(&self.state)
            .rows
            .values()
            .all(|r| r.published.is_some() || r.dead)
    }

    /// `(seq, last_error)` of the dead-lettered rows.
    pub fn dead_letters(&self) -> Vec<(i64, String)> {
        lock(&self.state)
            .rows
            .iter()
            .filter(|(_, r)| r.dead)
            .map(|(seq, r)| (*seq, r.last_error.clone().unwrap_or_default()))
            .collect()
    }

    /// Pending rows (neither published nor dead).
    pub fn pending(&self) -> usize {
        lock(&self.state)
            .rows
            .values()
            .filter(|r| r.published.is_none() && !r.dead)
            .count()
    }

    /// Makes the next `n` store calls fail, as if the database were unreachable.
    pub fn fail_next_calls(&self, n: usize) {
        lock(&self.state).fail_next = n;
    }

    fn enter(&self, operation: &'static str) -> Result<MutexGuard<'_, State>, StoreError> {
        let mut s = lock(&self.state);
        if s.fail_next > 0 {
            s.fail_next -= 1;
            return Err(StoreError::new(
                operation,
                "database unavailable (injected)",
            ));
        }
        Ok(s)
    }
}

fn leased_by_other(row: &Row, relay: &str, now: Instant) -> bool {
    matches!((&row.locked_by, row.locked_until), (Some(by), Some(until)) if by != relay && until > now)
}

fn to_message(seq: i64, row: &Row) -> OutboxMessage {
    let m = &row.message;
    OutboxMessage {
        seq,
        id: m.id,
        aggregate_type: m.aggregate_type.to_string(),
        aggregate_id: m.aggregate_id.clone(),
        event_type: m.event_type.to_string(),
        event_version: m.event_version,
        payload: m.payload.clone(),
        headers: m.headers.clone(),
        topic: m.topic.as_ref().map(|t| t.to_string()),
        shard: m.shard,
        created_at: m.created_at,
        attempts: row.attempts,
    }
}

impl RelayStore for MemoryStore {
    async fn claim(&mut self, claim: &Claim<'_>) -> Result<Vec<OutboxMessage>, StoreError> {
        let mut s = self.enter("claim")?;
        let now = Instant::now();
        let relay = claim.relay;
        let (ordered, shards_only, leader_only, dead_block) = match claim.order {
            ClaimOrder::Unordered => (false, false, false, false),
            ClaimOrder::Ordered {
                owned_shards_only,
                leader_only,
                dead_letters_block,
            } => (true, owned_shards_only, leader_only, dead_letters_block),
        };
        if leader_only && !matches!(&s.leader, Some((h, until)) if h == relay && *until > now) {
            return Ok(Vec::new());
        }
        let owned: HashSet<i16> = s
            .shards
            .iter()
            .filter(|(_, (o, until))| o == relay && *until > now)
            .map(|(k, _)| *k)
            .collect();
        let mut blocked: HashSet<(String, String)> = HashSet::new();
        let mut picked = Vec::new();
        for (seq, row) in s.rows.iter() {
            if picked.len() >= claim.limit {
                break;
            }
            if row.published.is_some() {
                continue;
            }
            let key = (
                row.message.aggregate_type.to_string(),
                row.message.aggregate_id.clone(),
            );
            if shards_only && !owned.contains(&row.message.shard) {
                continue;
            }
            if row.dead {
                if ordered && dead_block {
                    blocked.insert(key);
                }
                continue;
            }
            let claimable = row.available_at <= now && !leased_by_other(row, relay, now);
            if ordered {
                if blocked.contains(&key) {
                    continue;
                }
                if !claimable {
                    blocked.insert(key);
                    continue;
                }
            } else if !claimable {
                continue;
            }
            picked.push(*seq);
        }
        let until = now + claim.lease;
        let mut out = Vec::with_capacity(picked.len());
        for seq in picked {
            if let Some(row) = s.rows.get_mut(&seq) {
                row.attempts += 1;
                row.locked_by = Some(relay.to_owned());
                row.locked_until = Some(until);
                out.push(to_message(seq, row));
            }
        }
        Ok(out)
    }

    async fn complete(
        &mut self,
        relay: &str,
        seqs: &[i64],
        completion: Completion,
    ) -> Result<u64, StoreError> {
        let mut s = self.enter("mark published")?;
        let mut n = 0;
        for seq in seqs {
            let ours = s
                .rows
                .get(seq)
                .is_some_and(|r| r.locked_by.as_deref() == Some(relay));
            if !ours {
                continue;
            }
            n += 1;
            match completion {
                Completion::Delete => {
                    s.rows.remove(seq);
                }
                Completion::MarkPublished => {
                    if let Some(r) = s.rows.get_mut(seq) {
                        r.published = Some(Instant::now());
                        r.locked_by = None;
                        r.locked_until = None;
                    }
                }
            }
        }
        Ok(n)
    }

    async fn fail(&mut self, relay: &str, failures: &[Failure]) -> Result<u64, StoreError> {
        let mut s = self.enter("record failures")?;
        let now = Instant::now();
        let mut n = 0;
        for f in failures {
            if let Some(r) = s
                .rows
                .get_mut(&f.seq)
                .filter(|r| r.locked_by.as_deref() == Some(relay))
            {
                n += 1;
                r.locked_by = None;
                r.locked_until = None;
                r.last_error = Some(f.error.clone());
                match f.retry_after {
                    Some(d) => r.available_at = now + d,
                    None => r.dead = true,
                }
            }
        }
        Ok(n)
    }

    async fn release(&mut self, relay: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        let mut s = self.enter("release")?;
        let mut n = 0;
        for seq in seqs {
            if let Some(r) = s
                .rows
                .get_mut(seq)
                .filter(|r| r.locked_by.as_deref() == Some(relay))
            {
                n += 1;
                r.locked_by = None;
                r.locked_until = None;
                r.attempts -= 1;
            }
        }
        Ok(n)
    }

    async fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut s = self.enter("acquire leadership")?;
        let now = Instant::now();
        let free = match &s.leader {
            None => true,
            Some((holder, until)) => holder == relay || *until <= now,
        };
        if free {
            s.leader = Some((relay.to_owned(), now + lease));
        }
        Ok(free)
    }

    async fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<ShardAssignment, StoreError> {
        let mut s = self.enter("rebalance shards")?;
        let now = Instant::now();
        s.relays.insert(relay.to_owned(), now + lease);
        s.relays.retain(|_, until| *until > now);
        let live = s.relays.len().max(1);
        let fair = (usize::from(SHARD_COUNT)).div_ceil(live);
        let mut owned: Vec<i16> = s
            .shards
            .iter()
            .filter(|(_, (o, until))| o == relay && *until > now)
            .map(|(k, _)| *k)
            .collect();
        owned.sort_unstable();
        while owned.len() > fair {
            if let Some(shard) = owned.pop() {
                s.shards.remove(&shard);
            }
        }
        for shard in 0..SHARD_COUNT as i16 {
            if owned.len() >= fair {
                break;
            }
            let free = match s.shards.get(&shard) {
                None => true,
                Some((_, until)) => *until <= now,
            };
            if free {
                owned.push(shard);
            }
        }
        for shard in &owned {
            s.shards.insert(*shard, (relay.to_owned(), now + lease));
        }
        owned.sort_unstable();
        Ok(ShardAssignment {
            owned,
            live_relays: live,
        })
    }

    async fn release_all(&mut self, relay: &str) -> Result<(), StoreError> {
        let mut s = self.enter("release leases")?;
        s.shards.retain(|_, (o, _)| o != relay);
        s.relays.remove(relay);
        if matches!(&s.leader, Some((h, _)) if h == relay) {
            s.leader = None;
        }
        for r in s.rows.values_mut() {
            if r.locked_by.as_deref() == Some(relay) {
                r.locked_by = None;
                r.locked_until = None;
                r.attempts -= 1;
            }
        }
        Ok(())
    }

    async fn cleanup(&mut self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let mut s = self.enter("clean up")?;
        let now = Instant::now();
        let old: Vec<i64> = s
            .rows
            .iter()
            .filter(|(_, r)| r.published.is_some_and(|at| at + older_than <= now))
            .map(|(k, _)| *k)
            .take(limit)
            .collect();
        for seq in &old {
            s.rows.remove(seq);
        }
        Ok(old.len() as u64)
    }
}
