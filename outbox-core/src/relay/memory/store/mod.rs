//! The in-memory [`MemoryStore`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::lock;
use crate::relay::{
    Claim, ClaimOrder, Completion, Failure, OutboxMessage, RelayHealth, RelayIdInUse, RelayState,
    RelayStore, ShardAssignment, StoreError,
};
use crate::{NewMessage, SHARD_COUNT};

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
    health: HashMap<String, HealthRow>,
    fail_next: usize,
    /// The last clone's handle (the first store is 0).
    handles: u64,
}

/// A relay's heartbeat row.
#[derive(Debug, Clone)]
struct HealthRow {
    health: RelayHealth,
    /// `Some((handle, alive))` when the relay tracks its session: the store handle that
    /// heartbeats for it stands for its database session.
    session: Option<(u64, bool)>,
}

/// An outbox in memory implementing [`RelayStore`] with the same semantics as the SQL
/// stores (leases, fencing, head-of-line blocking per aggregate, shard and leader leases),
/// for testing the relay's logic. Clones share the same outbox.
///
/// Each clone stands for one database session, as each SQL store has its own connection: a
/// heartbeat that tracks its session is refused ([`RelayIdInUse`]) while another clone's
/// live session holds the relay id, and the clone then refuses claims, shards and leadership,
/// as the SQL stores do. [`end_session`](Self::end_session) ends a relay's session.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    /// This clone's session.
    handle: u64,
    /// Set while another clone's live session holds the relay id this clone heartbeats for.
    in_use: Option<RelayIdInUse>,
}

impl Clone for MemoryStore {
    fn clone(&self) -> Self {
        let mut s = lock(&self.state);
        s.handles += 1;
        MemoryStore {
            state: self.state.clone(),
            handle: s.handles,
            in_use: None,
        }
    }
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

    /// The state and last outage error `relay` last reported with
    /// [`heartbeat`](RelayStore::heartbeat), if it has a heartbeat row.
    pub fn relay_health(&self, relay: &str) -> Option<(RelayState, Option<String>)> {
        lock(&self.state)
            .health
            .get(relay)
            .map(|h| (h.health.state, h.health.last_error.clone()))
    }

    /// Ends `relay`'s database session, as the database sees it when the relay's process dies
    /// (its connection closes): [`reap_dead_relays`](RelayStore::reap_dead_relays) then
    /// replaces it, if it tracked its session. A later heartbeat opens a new session.
    pub fn end_session(&self, relay: &str) {
        if let Some(h) = lock(&self.state).health.get_mut(relay)
            && let Some((handle, _)) = h.session
        {
            h.session = Some((handle, false));
        }
    }

    /// Makes the next `n` store calls fail, as if the database were unreachable.
    pub fn fail_next_calls(&self, n: usize) {
        lock(&self.state).fail_next = n;
    }

    /// `Err` while another clone's live session holds the relay id.
    fn refuse(&self, operation: &'static str) -> Result<(), StoreError> {
        match &self.in_use {
            Some(c) => Err(StoreError::new(operation, c.clone())),
            None => Ok(()),
        }
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
        self.refuse("claim")?;
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
        self.refuse("acquire leadership")?;
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
        self.refuse("rebalance shards")?;
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
        if self.in_use.is_some() {
            return Ok(()); // the id's leases are the other relay's
        }
        let mut s = self.enter("release leases")?;
        s.shards.retain(|_, (o, _)| o != relay);
        s.relays.remove(relay);
        s.health.remove(relay);
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

    async fn heartbeat(
        &mut self,
        relay: &str,
        lease: Duration,
        health: &RelayHealth,
    ) -> Result<(), StoreError> {
        let handle = self.handle;
        let holder = {
            let mut s = self.enter("heartbeat")?;
            let holder = match s.health.get(relay).and_then(|h| h.session) {
                Some((other, true)) if health.track_session && other != handle => Some(other),
                _ => None,
            };
            if holder.is_none() {
                if health.mode == super::super::Mode::Sharded {
                    s.relays.insert(relay.to_owned(), Instant::now() + lease);
                }
                s.health.insert(
                    relay.to_owned(),
                    HealthRow {
                        health: health.clone(),
                        session: health.track_session.then_some((handle, true)),
                    },
                );
            }
            holder
        };
        self.in_use =
            holder.map(|other| RelayIdInUse::new(relay, format!("memory store clone {other}")));
        self.refuse("heartbeat")
    }

    async fn reap_dead_relays(&mut self, relay: &str) -> Result<Vec<String>, StoreError> {
        if self.in_use.is_some() {
            return Ok(Vec::new());
        }
        let mut s = self.enter("reap dead relays")?;
        let dead: Vec<String> = s
            .health
            .iter()
            .filter(|(id, h)| id.as_str() != relay && matches!(h.session, Some((_, false))))
            .map(|(id, _)| id.clone())
            .collect();
        let now = Instant::now();
        for id in &dead {
            s.health.remove(id);
            s.relays.remove(id);
            s.shards.retain(|_, (owner, _)| owner != id);
            if matches!(&s.leader, Some((h, _)) if h == id) {
                s.leader = None;
            }
            // Expire the row leases; the attempt stays counted, as when a lease runs out.
            for r in s.rows.values_mut() {
                if r.locked_by.as_deref() == Some(id.as_str()) {
                    r.locked_until = Some(now);
                }
            }
        }
        Ok(dead)
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
