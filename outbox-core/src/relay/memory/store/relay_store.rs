//! [`RelayStore`] on the in-memory outbox, rule for rule the SQL stores' (the same contract
//! suite runs on both: `tests/relay/store_suite.rs`).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{HealthRow, MemoryStore, Row};
use crate::SHARD_COUNT;
use crate::relay::{
    Claim, ClaimOrder, Completion, Failure, OutboxMessage, RelayHealth, RelayIdInUse, RelayStore,
    ShardAssignment, Share, StoreError, share,
};

/// Whether a live lease holds the row (anyone's: a relay does not claim its own leased rows
/// again either).
fn leased(row: &Row, now: Instant) -> bool {
    row.locked_until.is_some_and(|until| until >= now)
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
            ClaimOrder::Stream { .. } => {
                return Err(StoreError::new(
                    "claim",
                    crate::relay::UnsupportedMode::new("stream", "the in-memory store"),
                ));
            }
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
        // Published, their mark being written beside this claim (see `Claim::settling`).
        let settling: HashSet<i64> = claim.settling.iter().copied().collect();
        let mut picked = Vec::new();
        for (seq, row) in s.rows.iter() {
            if picked.len() >= claim.limit {
                break;
            }
            if row.published.is_some()
                || (settling.contains(seq) && row.locked_by.as_deref() == Some(relay))
            {
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
            let claimable = row.available_at <= now && !leased(row, now);
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
            Some((holder, until)) => holder == relay || *until < now,
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
        // Every lease that names this relay is renewed, expired ones too (no other relay took
        // them), as the SQL stores renew `WHERE owner = relay`.
        let mut owned: Vec<i16> = s
            .shards
            .iter()
            .filter(|(_, (o, _))| o == relay)
            .map(|(k, _)| *k)
            .collect();
        owned.sort_unstable();
        match share(&mut owned, live) {
            Share::GiveUp(surplus) => {
                for shard in surplus {
                    s.shards.remove(&shard);
                }
            }
            Share::Take(want) => {
                // Free: unleased, or its lease ran out (not one of this relay's own).
                let free: Vec<i16> = (0..SHARD_COUNT as i16)
                    .filter(|shard| !owned.contains(shard))
                    .filter(|shard| s.shards.get(shard).is_none_or(|(_, until)| *until < now))
                    .take(want)
                    .collect();
                owned.extend(free);
            }
            Share::Keep => {}
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
                if health.mode == crate::relay::Mode::Sharded {
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

    /// A clone: the same rows, as a second connection to one database sees them (so the
    /// relays of every test on this store settle beside their claims, as on PostgreSQL; its
    /// ordered claims honour [`Claim::settling`] as PostgreSQL's do).
    fn settler(&mut self) -> Option<Self> {
        Some(self.clone())
    }

    async fn cleanup(&mut self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let mut s = self.enter("clean up")?;
        let now = Instant::now();
        // The oldest publications first, as the SQL stores' `ORDER BY published_at`.
        let mut old: Vec<(Instant, i64)> = s
            .rows
            .iter()
            .filter_map(|(seq, r)| r.published.map(|at| (at, *seq)))
            .filter(|(at, _)| *at + older_than < now)
            .collect();
        old.sort_unstable();
        let old: Vec<i64> = old.into_iter().take(limit).map(|(_, seq)| seq).collect();
        for seq in &old {
            s.rows.remove(seq);
        }
        Ok(old.len() as u64)
    }
}
