//! Settling the stream batch in flight: its positions advanced, or its release settled, and the writes made beside the next publish.

use std::time::{Duration, Instant};

use diesel::sql_types::{Array, BigInt, Integer, Nullable, SmallInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::relay::{ShardAssignment, StoreError};

use super::pending::{Advance, DeadRows, Pending, advanced, assumed_positions, clean};
use super::sql::{ADVANCE, PositionRow, SETTLE_RELEASE};
use super::{Ask, Outcome, StreamStore};
use crate::pg::relay::PgConnector;
use crate::relay::base::Base;
use crate::relay::common::{CountRow, Prepared};

impl StreamStore {
    /// Records the outcome of `seqs` of the stream batch in flight; once every event of the
    /// batch has one, advances the positions (or settles the release). Returns how many of
    /// `seqs` count as settled (0 if the write was fenced: another relay owns the shards now).
    pub(in crate::pg::relay) async fn settle(
        &mut self,
        base: &mut Base<PgConnector>,
        relay: &str,
        seqs: impl Iterator<Item = (i64, Outcome)>,
    ) -> Result<u64, StoreError> {
        let Some(mut p) = self.pending.take() else {
            return Ok(0);
        };
        let mut n = 0u64;
        for (seq, outcome) in seqs {
            // `rows` is in seq order: a binary search, and the scan only for a seq it missed
            // (the scan alone is O(batch²); measured: `docs/design/stream-mode.md`, section
            // "Settling a batch in memory").
            if p.rows.binary_search_by_key(&seq, |(s, _)| *s).is_ok()
                || p.rows.iter().any(|(s, _)| *s == seq)
            {
                p.outcomes.insert(seq, outcome);
                n += 1;
            }
        }
        if p.outcomes.len() < p.rows.len() {
            self.pending = Some(p);
            return Ok(n);
        }
        let now = Instant::now();
        let mut holds = Vec::new();
        // The attempt just made, of each event that failed (undone if nothing is written).
        let mut counted = Vec::new();
        for (seq, shard) in &p.rows {
            match p.outcomes.get(seq) {
                Some(Outcome::Failed(after)) => {
                    counted.push(*seq);
                    holds.push((*shard, now + *after));
                }
                Some(Outcome::Dead(_)) => counted.push(*seq),
                Some(Outcome::Published) => {
                    self.attempts.remove(seq);
                }
                _ => {}
            }
        }
        for seq in &counted {
            *self.attempts.entry(*seq).or_insert(0) += 1;
        }
        if !p.release && clean(&p) && self.ahead.is_some() {
            // Passed whole, and rows read ahead follow it: their next batch may be published
            // before these positions are written (`overlap` writes them meanwhile),
            // since nothing of this batch holds an aggregate back. One write owed at most.
            if let Err(e) = self.flush_owed(base, relay).await {
                self.pending = Some(p);
                return Err(e);
            }
            let next = advanced(&p);
            self.keep_ahead(&p, &next, true);
            if !next.is_empty() {
                self.owed = Some(p);
            }
            return Ok(n);
        }
        // Put back if not written: the engine calls again.
        let written = if p.release {
            self.settle_release(base, relay, &p).await
        } else {
            self.advance(base, relay, &p).await
        };
        match written {
            Ok(fenced) => {
                for (shard, until) in holds {
                    let e = self.holds.entry(shard).or_insert(until);
                    *e = (*e).max(until);
                }
                // A dead letter's count went with its copy.
                for (seq, _) in &p.rows {
                    if matches!(
                        p.outcomes.get(seq),
                        Some(Outcome::Dead(_) | Outcome::Malformed(_))
                    ) {
                        self.attempts.remove(seq);
                    }
                }
                Ok(if fenced { 0 } else { n })
            }
            Err(e) => {
                for seq in &counted {
                    if let Some(a) = self.attempts.get_mut(seq) {
                        *a -= 1;
                    }
                }
                self.pending = Some(p);
                Err(e)
            }
        }
    }

    /// Writes the positions `p` comes to, with the copies of the dead letters and parked
    /// events they pass (after the write owed, if any); `true` if some were fenced (not
    /// written).
    pub(super) async fn advance(
        &mut self,
        base: &mut Base<PgConnector>,
        relay: &str,
        p: &Pending,
    ) -> Result<bool, StoreError> {
        self.flush_owed(base, relay).await?;
        let next = advanced(p);
        if next.is_empty() {
            self.keep_ahead(p, &next, true);
            return Ok(false);
        }
        let all = self.write_advance(base, relay, p, &next).await?;
        self.keep_ahead(p, &next, all);
        Ok(!all)
    }

    /// Writes the positions of the batch settled last, if they are owed (see `owed`); the
    /// rows read ahead go if some were fenced. Kept owed if the write fails.
    pub(in crate::pg::relay) async fn flush_owed(
        &mut self,
        base: &mut Base<PgConnector>,
        relay: &str,
    ) -> Result<(), StoreError> {
        let Some(p) = self.owed.take() else {
            return Ok(());
        };
        match self.write_advance(base, relay, &p, &advanced(&p)).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.ahead = None;
                Ok(())
            }
            Err(e) => {
                self.owed = Some(p);
                Err(e)
            }
        }
    }

    /// `ADVANCE` of `next`, batch `p`'s positions; whether every one was written (else some
    /// were fenced, and logged).
    pub(super) async fn write_advance(
        &mut self,
        base: &mut Base<PgConnector>,
        relay: &str,
        p: &Pending,
        next: &[Advance],
    ) -> Result<bool, StoreError> {
        let mut dead = DeadRows::default();
        for a in next {
            for seq in &a.passed {
                if let Some(outcome) = p.outcomes.get(seq) {
                    dead.push(*seq, outcome, &self.attempts);
                }
            }
        }
        let shards: Vec<i16> = next.iter().map(|a| a.next.shard).collect();
        let lasts: Vec<&str> = next.iter().map(|a| a.next.last_snap.as_str()).collect();
        let curs: Vec<Option<&str>> = next.iter().map(|a| a.cur.as_deref()).collect();
        let cursors: Vec<i64> = next.iter().map(|a| a.next.cur_seq).collect();
        let versions: Vec<i64> = next.iter().map(|a| a.next.version).collect();
        let conn = base.conn().await?;
        let r = Prepared(
            diesel::sql_query(ADVANCE)
                .bind::<Text, _>(relay)
                .bind::<Array<SmallInt>, _>(&shards)
                .bind::<Array<Text>, _>(&lasts)
                .bind::<Array<Nullable<Text>>, _>(&curs)
                .bind::<Array<BigInt>, _>(&cursors)
                .bind::<Array<BigInt>, _>(&versions)
                .bind::<Array<BigInt>, _>(&dead.seqs)
                .bind::<Array<Integer>, _>(&dead.attempts)
                .bind::<Array<Text>, _>(&dead.errors)
                .bind::<Array<Nullable<BigInt>>, _>(&dead.behind),
        )
        .get_result::<CountRow>(conn)
        .await;
        let written = base.check("advance stream positions", r).await?.n as usize;
        if written < next.len() {
            tracing::warn!(
                fenced = next.len() - written,
                "stream positions not advanced: their shards moved to another relay"
            );
        }
        Ok(written == next.len())
    }

    /// After `ADVANCE` wrote `next` for batch `p` (`all`: every position of it), the rows
    /// read ahead either follow (their positions are now `next`, one version on) or are
    /// dropped: when a position was fenced, or when an event of `p` was not published nor
    /// parked (a failure holds its shard, an outage hands the batch back, and a new dead
    /// letter must park its aggregate's later events, which the read did not know of).
    pub(super) fn keep_ahead(&mut self, p: &Pending, next: &[Advance], all: bool) {
        let Some(ahead) = self.ahead.as_mut() else {
            return;
        };
        if !(all && clean(p)) {
            self.ahead = None;
            return;
        }
        if std::mem::take(&mut ahead.assumes) {
            // Read at the positions `next` (see `overlap`).
            return;
        }
        for a in next {
            if let Some(pos) = ahead.positions.iter_mut().find(|q| q.shard == a.next.shard) {
                *pos = PositionRow {
                    version: a.next.version + 1,
                    ..a.next.clone()
                };
            }
        }
    }

    /// While the batch in flight is published (`RelayStore::overlap`): writes the positions
    /// owed by the batch before it, then, if the batch took the last rows read ahead, reads the
    /// next ones from where its `ADVANCE` will leave the positions (every row passed), so that
    /// the claim after it is served from memory. The read is kept only if the batch is passed
    /// whole and every position written (`keep_ahead`), and for a quarter of the lease as any
    /// read. Errors are left to the calls that need the work: the next settle writes what is
    /// owed, the next claim reads.
    pub(in crate::pg::relay) async fn overlap(
        &mut self,
        base: &mut Base<PgConnector>,
        ask: Ask<'_>,
    ) {
        let Ask { relay, limit, .. } = ask;
        if let Err(e) = self.flush_owed(base, relay).await {
            tracing::debug!(error = %e, "stream positions not written beside the publish");
            return;
        }
        let Some(p) = self.pending.as_ref().filter(|p| !p.release) else {
            return;
        };
        if self.ahead.as_ref().is_some_and(|a| a.rows.len() >= limit) {
            return;
        }
        let given = assumed_positions(p);
        let batches = self.read_ahead.div_ceil(limit.max(1)).max(1);
        let read = limit.saturating_mul(batches);
        match self.read_delta(base, ask, read, Some(&given)).await {
            Ok(Some((mut ahead, _))) if ahead.rows.len() >= limit => {
                ahead.assumes = true;
                self.ahead = Some(ahead);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "stream rows not read beside the publish"),
        }
    }

    /// Settles a release batch: deletes the copies published, makes those that failed for
    /// good dead letters again; `true` if some were fenced (their shard moved on).
    pub(super) async fn settle_release(
        &mut self,
        base: &mut Base<PgConnector>,
        relay: &str,
        p: &Pending,
    ) -> Result<bool, StoreError> {
        self.flush_owed(base, relay).await?;
        let published: Vec<i64> = p
            .rows
            .iter()
            .filter(|(seq, _)| p.outcomes.get(seq) == Some(&Outcome::Published))
            .map(|(seq, _)| *seq)
            .collect();
        let mut dead = DeadRows::default();
        for (seq, _) in &p.rows {
            if let Some(outcome @ (Outcome::Dead(_) | Outcome::Malformed(_))) = p.outcomes.get(seq)
            {
                dead.push(*seq, outcome, &self.attempts);
            }
        }
        let expected = published.len() + dead.seqs.len();
        if expected == 0 {
            return Ok(false);
        }
        let conn = base.conn().await?;
        let r = Prepared(
            diesel::sql_query(SETTLE_RELEASE)
                .bind::<Text, _>(relay)
                .bind::<Array<BigInt>, _>(&published)
                .bind::<Array<BigInt>, _>(&dead.seqs)
                .bind::<Array<Integer>, _>(&dead.attempts)
                .bind::<Array<Text>, _>(&dead.errors),
        )
        .get_result::<CountRow>(conn)
        .await;
        let written = base.check("settle released dead letters", r).await?.n as usize;
        if written < expected {
            tracing::warn!(
                fenced = expected - written,
                "released dead letters not settled: their shards moved to another relay"
            );
        }
        Ok(written < expected)
    }
}

impl StreamStore {
    /// [`shards::rebalance`](super::super::shards::rebalance), with the positions owed written
    /// first (while the shards are still this relay's), and the rows read ahead dropped if
    /// shards were given up (they are their next owner's now).
    pub(in crate::pg::relay) async fn rebalance(
        &mut self,
        base: &mut Base<PgConnector>,
        relay: &str,
        lease: Duration,
    ) -> Result<ShardAssignment, StoreError> {
        self.flush_owed(base, relay).await?;
        let (assignment, gave_up) = super::super::shards::rebalance(base, relay, lease).await?;
        if gave_up {
            self.drop_ahead();
        }
        Ok(assignment)
    }
}
