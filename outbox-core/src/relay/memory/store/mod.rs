//! The in-memory [`MemoryStore`]: its state and the handles tests use; its
//! [`RelayStore`](crate::relay::RelayStore) methods are in `relay_store.rs`.

mod relay_store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::lock;
use crate::NewMessage;
use crate::relay::{RelayHealth, RelayIdInUse, RelayState, StoreError};

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

/// A row of a [`MemoryStore`], as tests look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryRow {
    /// Its position in the outbox.
    pub seq: i64,
    /// Claims counted against it.
    pub attempts: i32,
    /// The relay whose lease it last was (cleared when settled or released).
    pub locked_by: Option<String>,
    /// Whether it was published.
    pub published: bool,
    /// Whether it was dead-lettered.
    pub dead: bool,
    /// The last failure recorded.
    pub last_error: Option<String>,
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

/// An outbox in memory implementing [`RelayStore`](crate::relay::RelayStore) with the same semantics as the SQL
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
    /// [`heartbeat`](crate::relay::RelayStore::heartbeat), if it has a heartbeat row.
    pub fn relay_health(&self, relay: &str) -> Option<(RelayState, Option<String>)> {
        lock(&self.state)
            .health
            .get(relay)
            .map(|h| (h.health.state, h.health.last_error.clone()))
    }

    /// Ends `relay`'s database session, as the database sees it when the relay's process dies
    /// (its connection closes): [`reap_dead_relays`](crate::relay::RelayStore::reap_dead_relays) then
    /// replaces it, if it tracked its session. A later heartbeat opens a new session.
    pub fn end_session(&self, relay: &str) {
        if let Some(h) = lock(&self.state).health.get_mut(relay)
            && let Some((handle, _)) = h.session
        {
            h.session = Some((handle, false));
        }
    }

    /// Every row, in `seq` order.
    pub fn rows(&self) -> Vec<MemoryRow> {
        lock(&self.state)
            .rows
            .iter()
            .map(|(seq, r)| MemoryRow {
                seq: *seq,
                attempts: r.attempts,
                locked_by: r.locked_by.clone(),
                published: r.published.is_some(),
                dead: r.dead,
                last_error: r.last_error.clone(),
            })
            .collect()
    }

    /// Every relay with a heartbeat row, with the health it last reported (`None` for one
    /// that only rebalanced shards, which records its liveness too), by id.
    pub fn relays(&self) -> Vec<(String, Option<RelayHealth>)> {
        let s = lock(&self.state);
        let mut ids: Vec<&String> = s.health.keys().chain(s.relays.keys()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| (id.clone(), s.health.get(id).map(|h| h.health.clone())))
            .collect()
    }

    /// The shards whose lease names `relay`, expired or not (a lease keeps its owner until
    /// another relay takes it), in order.
    pub fn shards_of(&self, relay: &str) -> Vec<i16> {
        let mut shards: Vec<i16> = lock(&self.state)
            .shards
            .iter()
            .filter(|(_, (owner, _))| owner == relay)
            .map(|(shard, _)| *shard)
            .collect();
        shards.sort_unstable();
        shards
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
