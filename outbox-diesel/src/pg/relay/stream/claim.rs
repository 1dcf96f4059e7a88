//! The stream claim: a release batch, rows read ahead, or the next delta.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use diesel::sql_types::{Array, BigInt, Bool, Nullable, SmallInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::relay::{OutboxMessage, StoreError};

use super::pending::{Ahead, AheadRow, Pending};
use super::ring::{Ring, on_partition, snapshot_bounds};
use super::sql::{
    ANALYZE_PARTITIONS, CANDIDATES, CandidateRow, POSITIONS, PositionRow, RELEASABLE, StatsRow,
};
use super::{Ask, IDLE_ADVANCE, Outcome, RELEASE_CHECK, STATS_CHECK, STATS_RETRY, StreamStore};
use crate::pg::relay::PgConnector;
use crate::relay::base::Base;
use crate::relay::common::Prepared;

impl StreamStore {
    /// A stream claim (see the module's documentation): a release batch if an aggregate is
    /// due for one, else the next delta.
    pub(in crate::pg::relay) async fn claim(
        &mut self,
        base: &mut Base<PgConnector>,
        ask: Ask<'_>,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let Ask {
            relay,
            limit,
            lease,
            dead_letters_block,
        } = ask;
        if dead_letters_block && !self.no_lease_dead {
            let conn = base.guarded("claim", lease).await?;
            let dead = crate::pg::relay::handover::lease_dead_letters(conn).await;
            if let Some(dead) = base.check("claim", dead).await? {
                return Err(StoreError::new("claim", dead));
            }
            self.no_lease_dead = true;
        }
        if self.pending.take().is_some() {
            // The engine claims only after the batch in flight settled; one left means its
            // settle gave up (the database was away past the lease): its rows come again.
            tracing::warn!("stream batch was not settled; its rows will be published again");
            self.ahead = None;
        }
        if self.next_release_check.is_none_or(|t| Instant::now() >= t) {
            let batch = self.claim_release(base, relay, limit, lease).await?;
            if !batch.is_empty() {
                // The rows read ahead were parked behind what this releases: read again.
                self.ahead = None;
                self.next_release_check = None;
                return Ok(batch);
            }
            self.next_release_check = Some(Instant::now() + RELEASE_CHECK);
        }
        if self.next_stats_check.is_none_or(|t| Instant::now() >= t) {
            self.next_stats_check = Some(Instant::now() + STATS_CHECK);
            let conn = base.conn().await?;
            let r = Prepared(diesel::sql_query(ANALYZE_PARTITIONS))
                .get_result::<StatsRow>(conn)
                .await;
            // Not the claim's failure: an ANALYZE cut by the statement timeout (a slow disk,
            // a huge partition) would otherwise fail every claim, each second, for as long as
            // it lasts. The claim goes on (a database outage fails it next, as any claim);
            // the check waits STATS_RETRY, and the ring's layout stays as last read.
            match base.check("analyse new partitions", r).await {
                Ok(row) => {
                    self.ring = match (row.slots, row.slot_xids) {
                        (Some(slots), Some(slot_xids)) => Some(Ring { slots, slot_xids }),
                        _ => None,
                    };
                    if row.n > 0 {
                        tracing::info!(
                            analysed = row.n,
                            "outbox partitions analysed (they had no statistics)"
                        );
                    }
                }
                Err(e) => {
                    self.next_stats_check = Some(Instant::now() + STATS_RETRY);
                    tracing::warn!(error = %e, retry_in = ?STATS_RETRY, "could not analyse new partitions");
                }
            }
        }
        // A bounded delta can hold nothing for this relay (its rows were all seen by the last
        // snapshot, or are other shards'), or only rows to copy aside (parked, malformed):
        // its positions move on at once and the claim looks again, so that an event committed
        // after the bound is not held back until the next idle advance. Each round moves
        // every such position past at least one row.
        for _ in 0..8 {
            if let Some(batch) = self.claim_round(base, ask).await? {
                return Ok(batch);
            }
        }
        Ok(Vec::new())
    }

    /// One claim: `None` when it found nothing to publish but moved positions on. The batch is
    /// the next `limit` rows read ahead by an earlier claim, if there are any and they were
    /// read less than a quarter of the lease ago (the positions they were read at are then
    /// still this relay's: each batch's `ADVANCE` is fenced by the shard leases and by the
    /// versions, and one fenced drops them); else the first `limit` of a new read of at least
    /// `read_ahead` rows, whose rest is kept.
    pub(super) async fn claim_round(
        &mut self,
        base: &mut Base<PgConnector>,
        ask: Ask<'_>,
    ) -> Result<Option<Vec<OutboxMessage>>, StoreError> {
        let Ask {
            relay,
            limit,
            lease,
            ..
        } = ask;
        let now = Instant::now();
        self.holds.retain(|_, until| *until > now);
        let kept = self
            .ahead
            .take()
            .filter(|a| a.rows.len() >= limit && a.read_at.elapsed() < lease / 4 && !a.assumes);
        let (mut ahead, bounded) = match kept {
            Some(ahead) => (ahead, false),
            None => {
                // Whole batches: a short one tells the engine the outbox is drained.
                let batches = self.read_ahead.div_ceil(limit.max(1)).max(1);
                let read = limit.saturating_mul(batches);
                match self.read_delta(base, ask, read, None).await? {
                    Some(read) => read,
                    None => return Ok(Some(Vec::new())),
                }
            }
        };
        let take = limit.min(ahead.rows.len());
        let mut rows = Vec::with_capacity(take);
        let mut messages = Vec::with_capacity(take);
        let mut outcomes = HashMap::new();
        for r in ahead.rows.drain(..take) {
            rows.push((r.seq, r.shard));
            match r.row {
                Ok(m) => messages.push(m),
                Err(outcome) => {
                    outcomes.insert(r.seq, outcome);
                }
            }
        }
        // What the delta offers from this batch on: the rows handed out before were passed.
        let offered = ahead.offered.clone();
        for (_, shard) in &rows {
            if let Some(n) = ahead.offered.get_mut(shard) {
                *n -= 1;
            }
        }
        let pending = Pending {
            release: false,
            positions: ahead.positions.clone(),
            offered,
            full: ahead.full || !ahead.rows.is_empty(),
            rows,
            outcomes,
        };
        if !ahead.rows.is_empty() {
            self.ahead = Some(ahead);
        }
        if messages.is_empty() {
            if bounded || !pending.outcomes.is_empty() {
                self.advance(base, relay, &pending).await?;
                return Ok(None);
            }
            // Nothing to publish: move the idle shards on, at most once per IDLE_ADVANCE.
            if self
                .last_idle_advance
                .is_none_or(|t| t.elapsed() >= IDLE_ADVANCE)
            {
                self.last_idle_advance = Some(Instant::now());
                self.advance(base, relay, &pending).await?;
            }
            return Ok(Some(messages));
        }
        self.pending = Some(pending);
        Ok(Some(messages))
    }

    /// Reads the next `read` rows (at least the batch, `limit`) of the held shards' deltas
    /// (`POSITIONS`, then `CANDIDATES`), and whether a delta's end is a bound; `None` if the
    /// relay holds no shard it may claim. The positions are the table's, but those `given`
    /// (with the snapshot being consumed, if any), which are where the batch in flight will
    /// leave them; without `given`, the batch settled last is written first.
    pub(super) async fn read_delta(
        &mut self,
        base: &mut Base<PgConnector>,
        ask: Ask<'_>,
        read: usize,
        given: Option<&[(PositionRow, Option<String>)]>,
    ) -> Result<Option<(Ahead, bool)>, StoreError> {
        let Ask {
            relay,
            limit,
            lease,
            dead_letters_block,
        } = ask;
        if given.is_none() {
            self.flush_owed(base, relay).await?;
            self.malformed.clear();
        }
        let given = given.unwrap_or_default();
        let g_shards: Vec<i16> = given.iter().map(|(p, _)| p.shard).collect();
        let g_lasts: Vec<&str> = given.iter().map(|(p, _)| p.last_snap.as_str()).collect();
        let g_curs: Vec<Option<&str>> = given.iter().map(|(_, c)| c.as_deref()).collect();
        let g_cursors: Vec<i64> = given.iter().map(|(p, _)| p.cur_seq).collect();
        let g_versions: Vec<i64> = given.iter().map(|(p, _)| p.version).collect();
        // Reading ahead, the deltas are bounded at twice the read, so that a read is full (its
        // batches whole) however the bounds of the shards fall: with deltas bounded at the
        // read, reads come back short once the shards' positions have parted, and each short
        // batch makes the relay wait for its poll interval. A read of one batch keeps the bound
        // at the batch: twice that makes each read scan the other half of its deltas again.
        // Measured: `docs/design/stream-mode.md`, section "How far a read's deltas reach".
        let bound = if read > limit {
            read.saturating_mul(2)
        } else {
            read
        };
        // On the ring, the bounds are looked for in the partition of the last read's lowest
        // xmin. Any bound is correct (it is only taken where every transaction below it has
        // ended); one found there sizes the deltas as the parent would, and none (the
        // positions moved on to the next slot) ends them at the current snapshot, whose read
        // goes through the parent.
        let ring = self.ring;
        let positions_sql = match ring.zip(self.last_xmin).and_then(|(r, x)| r.slot(x)) {
            Some(slot) => std::borrow::Cow::Owned(on_partition(POSITIONS, slot)),
            None => std::borrow::Cow::Borrowed(POSITIONS),
        };
        let conn = base.guarded("claim", lease).await?;
        let r = Prepared(
            diesel::sql_query(positions_sql)
                .bind::<Text, _>(relay)
                .bind::<BigInt, _>(i64::try_from(bound).unwrap_or(i64::MAX))
                .bind::<Array<SmallInt>, _>(&g_shards)
                .bind::<Array<Text>, _>(&g_lasts)
                .bind::<Array<Nullable<Text>>, _>(&g_curs)
                .bind::<Array<BigInt>, _>(&g_cursors)
                .bind::<Array<BigInt>, _>(&g_versions),
        )
        .load::<PositionRow>(conn)
        .await;
        let mut positions = base.check("claim", r).await?;
        positions.retain(|p| !self.holds.contains_key(&p.shard));
        if positions.is_empty() {
            return Ok(None);
        }
        let read_at = Instant::now();
        let bounded = positions.iter().any(|p| p.bounded);
        let shards: Vec<i16> = positions.iter().map(|p| p.shard).collect();
        let lasts: Vec<&str> = positions.iter().map(|p| p.last_snap.as_str()).collect();
        let curs: Vec<&str> = positions.iter().map(|p| p.cur_snap.as_str()).collect();
        let cursors: Vec<i64> = positions.iter().map(|p| p.cur_seq).collect();
        let batch = i64::try_from(read).unwrap_or(i64::MAX - 1);
        // The xid range of the deltas: `[lowest xmin of the last snapshots, highest xmax of
        // the snapshots they end at)`, the range the scans read.
        // (On the ring only.)
        let range = ring.and_then(|_| {
            positions
                .iter()
                .try_fold((i64::MAX, i64::MIN), |(lo, hi), p| {
                    let (xmin, _) = snapshot_bounds(&p.last_snap)?;
                    let (_, xmax) = snapshot_bounds(&p.cur_snap)?;
                    Some((lo.min(xmin), hi.max(xmax)))
                })
        });
        self.last_xmin = range.map(|(lo, _)| lo);
        let candidates_sql = match ring.zip(range).and_then(|(r, (lo, hi))| r.slot_of(lo, hi)) {
            Some(slot) => std::borrow::Cow::Owned(on_partition(CANDIDATES, slot)),
            None => std::borrow::Cow::Borrowed(CANDIDATES),
        };
        let conn = base.conn().await?;
        let r = Prepared(
            diesel::sql_query(candidates_sql)
                .bind::<Array<SmallInt>, _>(&shards)
                .bind::<Array<Text>, _>(&lasts)
                .bind::<Array<Text>, _>(&curs)
                .bind::<Array<BigInt>, _>(&cursors)
                .bind::<BigInt, _>(batch)
                .bind::<Bool, _>(dead_letters_block),
        )
        .load::<CandidateRow>(conn)
        .await;
        let candidates = base.check("claim", r).await?;
        let full = candidates.len() >= read;

        let mut offered = HashMap::new();
        let mut rows = std::collections::VecDeque::with_capacity(candidates.len());
        for c in candidates {
            offered.insert(c.stream_shard, c.shard_rows);
            let seq = c.columns.seq;
            let shard = c.stream_shard;
            let row = if let Some(behind) = c.parked_behind {
                Err(Outcome::Parked(behind))
            } else {
                match c.columns.into_message(Ok(c.id), c.created_at) {
                    // Looked up only while there are malformed rows (the key is two copies).
                    Ok(m) if dead_letters_block && !self.malformed.is_empty() => {
                        match self
                            .malformed
                            .get(&(m.aggregate_type.clone(), m.aggregate_id.clone()))
                        {
                            Some(behind) => Err(Outcome::Parked(*behind)),
                            None => Ok(m),
                        }
                    }
                    Ok(m) => Ok(m),
                    Err(bad) => {
                        // A row that does not decode (the table's checks refuse most such
                        // rows; one from before them, or a time out of range) is a dead
                        // letter at once, as in the lease modes.
                        tracing::error!(
                            seq, error = %bad.failure.error,
                            "stream: malformed event dead-lettered"
                        );
                        self.malformed.entry(bad.key().clone()).or_insert(seq);
                        Err(Outcome::Malformed(bad.failure.error))
                    }
                }
                .map(|mut m| {
                    m.attempts += self.attempts.get(&m.seq).copied().unwrap_or(0) + 1;
                    m
                })
            };
            rows.push_back(AheadRow { seq, shard, row });
        }
        let ahead = Ahead {
            positions,
            offered,
            full,
            rows,
            read_at,
            assumes: false,
        };
        Ok(Some((ahead, bounded)))
    }

    /// A release batch (see the module docs): the copies of the aggregates due, in `seq`
    /// order, as messages; empty if none is due.
    pub(super) async fn claim_release(
        &mut self,
        base: &mut Base<PgConnector>,
        relay: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let now = Instant::now();
        self.holds.retain(|_, until| *until > now);
        let held: Vec<i16> = self.holds.keys().copied().collect();
        let conn = base.guarded("claim", lease).await?;
        let r = Prepared(
            diesel::sql_query(RELEASABLE)
                .bind::<Text, _>(relay)
                .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
                .bind::<Array<SmallInt>, _>(&held),
        )
        .load::<CandidateRow>(conn)
        .await;
        let candidates = base.check("claim dead letters to release", r).await?;
        let mut rows = Vec::new();
        let mut messages = Vec::new();
        let mut outcomes = HashMap::new();
        for c in candidates {
            let seq = c.columns.seq;
            rows.push((seq, c.stream_shard));
            match c.columns.into_message(Ok(c.id), c.created_at) {
                Ok(mut m) => {
                    m.attempts += self.attempts.get(&m.seq).copied().unwrap_or(0) + 1;
                    messages.push(m);
                }
                Err(bad) => {
                    outcomes.insert(seq, Outcome::Malformed(bad.failure.error));
                }
            }
        }
        if rows.is_empty() {
            return Ok(messages);
        }
        tracing::info!(
            events = rows.len(),
            "stream: releasing dead letters retried or purged, in order"
        );
        let pending = Pending {
            release: true,
            positions: Vec::new(),
            offered: HashMap::new(),
            full: false,
            rows,
            outcomes,
        };
        if messages.is_empty() {
            // Only malformed copies: dead letters again.
            self.settle_release(base, relay, &pending).await?;
            return Ok(messages);
        }
        self.pending = Some(pending);
        Ok(messages)
    }
}
