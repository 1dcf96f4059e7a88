//! The PostgreSQL relay store's `RelayStore` methods: each one statement (the shard
//! rebalance a few), run on the store's connection.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Double, SmallInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::relay::{
    Claim, ClaimOrder, Completion, Failure, OutboxMessage, RelayStore, ShardAssignment, StoreError,
};

use super::sql::*;
use super::stream::Outcome;
use super::{PgRelayStore, Row, cleanup_query};
use crate::relay::base::server_methods;
use crate::relay::common::{
    CountRow, HolderRow, Prepared, ShardRow, Share, assignment, run_each, secs, settle_malformed,
    share, split_malformed,
};

impl RelayStore for PgRelayStore {
    /// The same database (the same URL, or the same connection factory) and session settings, no listener, no settler of its own; it
    /// records no heartbeat (its statements are fenced by the row leases).
    fn settler(&mut self) -> Option<Self> {
        if !self.settle_beside {
            return None;
        }
        let mut store = PgRelayStore::with_source(self.base.source().clone())
            .synchronous_commit(self.base.connector.synchronous_commit)
            .transaction_pooler(self.base.connector.pooler)
            .listen(false)
            .settle_beside(false);
        store.base.timeout = self.base.timeout;
        Some(store)
    }

    async fn claim(&mut self, claim: &Claim<'_>) -> Result<Vec<OutboxMessage>, StoreError> {
        if let ClaimOrder::Stream { dead_letters_block } = claim.order {
            return self
                .claim_stream(claim.relay, claim.limit, claim.lease, dead_letters_block)
                .await;
        }
        let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX);
        if !self.handed_over {
            let conn = self.base.guarded("claim", claim.lease).await?;
            let left = super::handover::left_behind(conn).await;
            if let Some(left) = self.base.check("claim", left).await? {
                return Err(StoreError::new("claim", left));
            }
            self.handed_over = true;
        }
        let conn = self.base.guarded("claim", claim.lease).await?;
        let r = match claim.order {
            ClaimOrder::Unordered => {
                Prepared(
                    diesel::sql_query(format!("{CLAIM_UNORDERED}{RETURNING}"))
                        .bind::<Text, _>(claim.relay)
                        .bind::<Double, _>(secs(claim.lease))
                        .bind::<BigInt, _>(limit),
                )
                .load::<Row>(conn)
                .await
            }
            ClaimOrder::Ordered {
                owned_shards_only,
                leader_only,
                dead_letters_block,
            } => {
                Prepared(
                    diesel::sql_query(format!("{CLAIM_ORDERED}{RETURNING}"))
                        .bind::<Text, _>(claim.relay)
                        .bind::<Double, _>(secs(claim.lease))
                        .bind::<BigInt, _>(limit)
                        .bind::<Bool, _>(owned_shards_only)
                        .bind::<Bool, _>(leader_only)
                        .bind::<Bool, _>(dead_letters_block)
                        .bind::<diesel::sql_types::Nullable<BigInt>, _>(
                            claim
                                .look_ahead
                                .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
                        )
                        .bind::<Array<BigInt>, _>(claim.settling),
                )
                .load::<Row>(conn)
                .await
            }
            ClaimOrder::Stream { .. } => Ok(Vec::new()), // claimed above
        };
        let sorted = split_malformed(
            self.base
                .check("claim", r)
                .await?
                .into_iter()
                .map(Row::into_message),
        );
        settle_malformed(self, claim.relay, sorted).await
    }

    /// Stream mode: writes the positions of the batch settled last and reads the rows after
    /// the batch in flight (see `stream/`).
    async fn overlap(&mut self, claim: &Claim<'_>) {
        if let ClaimOrder::Stream { dead_letters_block } = claim.order {
            self.overlap_stream(claim.relay, claim.limit, claim.lease, dead_letters_block)
                .await;
        }
    }

    async fn complete(
        &mut self,
        relay: &str,
        seqs: &[i64],
        completion: Completion,
    ) -> Result<u64, StoreError> {
        if self.stream.in_flight() {
            let done = seqs.iter().map(|s| (*s, Outcome::Published));
            return self.settle_stream(relay, done).await;
        }
        let sql = match completion {
            Completion::MarkPublished => COMPLETE_MARK,
            Completion::Delete => COMPLETE_DELETE,
        };
        let conn = self.base.conn().await?;
        let r = Prepared(
            diesel::sql_query(sql)
                .bind::<Text, _>(relay)
                .bind::<Array<BigInt>, _>(seqs),
        )
        .execute(conn)
        .await;
        self.base.check("mark published", r).await.map(|n| n as u64)
    }

    async fn fail(&mut self, relay: &str, failures: &[Failure]) -> Result<u64, StoreError> {
        if self.stream.in_flight() {
            let failed = failures.iter().map(|f| {
                let outcome = match f.retry_after {
                    Some(after) => Outcome::Failed(after),
                    None => Outcome::Dead(f.error.clone()),
                };
                (f.seq, outcome)
            });
            return self.settle_stream(relay, failed).await;
        }
        let seqs: Vec<i64> = failures.iter().map(|f| f.seq).collect();
        let delays: Vec<f64> = failures
            .iter()
            .map(|f| f.retry_after.map(secs).unwrap_or(0.0))
            .collect();
        let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
        let dead: Vec<bool> = failures.iter().map(|f| f.retry_after.is_none()).collect();
        let conn = self.base.conn().await?;
        let r = Prepared(
            diesel::sql_query(FAIL)
                .bind::<Text, _>(relay)
                .bind::<Array<BigInt>, _>(&seqs)
                .bind::<Array<Double>, _>(&delays)
                .bind::<Array<Text>, _>(&errors)
                .bind::<Array<Bool>, _>(&dead),
        )
        .execute(conn)
        .await;
        self.base
            .check("record failures", r)
            .await
            .map(|n| n as u64)
    }

    async fn release(&mut self, relay: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        if self.stream.in_flight() {
            let back = seqs.iter().map(|s| (*s, Outcome::Released));
            return self.settle_stream(relay, back).await;
        }
        let conn = self.base.conn().await?;
        let r = Prepared(
            diesel::sql_query(RELEASE)
                .bind::<Text, _>(relay)
                .bind::<Array<BigInt>, _>(seqs),
        )
        .execute(conn)
        .await;
        self.base.check("release", r).await.map(|n| n as u64)
    }

    async fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let conn = self.base.guarded("acquire leadership", lease).await?;
        let r = Prepared(
            diesel::sql_query(LEAD)
                .bind::<Text, _>(relay)
                .bind::<Double, _>(secs(lease)),
        )
        .load::<HolderRow>(conn)
        .await;
        self.base
            .check("acquire leadership", r)
            .await
            .map(|rows| !rows.is_empty())
    }

    async fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<ShardAssignment, StoreError> {
        // Stream mode: positions owed are written while the shards are still this relay's.
        self.flush_owed(relay).await?;
        let conn = self.base.guarded("rebalance shards", lease).await?;
        let mut gave_up = false;
        let r = async {
            Prepared(
                diesel::sql_query(HEARTBEAT)
                    .bind::<Text, _>(relay)
                    .bind::<Double, _>(secs(lease)),
            )
            .execute(conn)
            .await?;
            Prepared(diesel::sql_query(FORGET_DEAD_RELAYS))
                .execute(conn)
                .await?;
            let live = Prepared(diesel::sql_query(LIVE_RELAYS))
                .get_result::<CountRow>(conn)
                .await?
                .n;
            let mut owned: Vec<i16> = Prepared(
                diesel::sql_query(RENEW_SHARDS)
                    .bind::<Text, _>(relay)
                    .bind::<Double, _>(secs(lease)),
            )
            .load::<ShardRow>(conn)
            .await?
            .into_iter()
            .map(|r| r.shard)
            .collect();
            owned.sort_unstable();
            match share(&mut owned, live) {
                Share::GiveUp(surplus) => {
                    Prepared(
                        diesel::sql_query(GIVE_UP_SHARDS)
                            .bind::<Text, _>(relay)
                            .bind::<Array<SmallInt>, _>(&surplus),
                    )
                    .execute(conn)
                    .await?;
                    gave_up = true;
                }
                Share::Take(want) => {
                    let taken = Prepared(
                        diesel::sql_query(TAKE_SHARDS)
                            .bind::<Text, _>(relay)
                            .bind::<Double, _>(secs(lease))
                            .bind::<BigInt, _>(want),
                    )
                    .load::<ShardRow>(conn)
                    .await?;
                    owned.extend(taken.into_iter().map(|r| r.shard));
                    owned.sort_unstable();
                }
                Share::Keep => {}
            }
            Ok(assignment(owned, live))
        }
        .await;
        if gave_up {
            // Stream mode: rows read ahead of the shards given up are their next owner's now.
            self.stream.drop_ahead();
        }
        self.base.check("rebalance shards", r).await
    }

    async fn release_all(&mut self, relay: &str) -> Result<(), StoreError> {
        self.flush_owed(relay).await?;
        let Some(conn) = self.base.releasing().await? else {
            return Ok(());
        };
        let r = run_each(conn, &RELEASE_ALL, relay).await;
        self.base.check("release leases", r).await
    }

    server_methods!(sessions);

    /// Deletes what there is to delete ([`cleanup_query`], which also records the tick that
    /// tells stream rows' age), then empties the partitions whose rows may all go
    /// ([`super::partition::rotate`]; on a partitioned table the delete takes none of their
    /// rows).
    async fn cleanup(&mut self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let q = cleanup_query(older_than, i64::try_from(limit).unwrap_or(i64::MAX));
        let r = q.execute(self.base.conn().await?).await;
        let deleted = self.base.check("clean up", r).await? as u64;
        let r = super::partition::rotate(self.base.conn().await?, older_than).await;
        self.base.check("rotate partitions", r).await?;
        Ok(deleted)
    }

    async fn wait_for_work(&mut self, timeout: Duration) {
        if !self.listen {
            tokio::time::sleep(timeout).await;
            return;
        }
        if self.listener.is_none() {
            match super::listener::Listener::connect(self.base.source()).await {
                Ok(l) => self.listener = Some(l),
                Err(e) => tracing::warn!(error = %e, "no LISTEN connection; polling"),
            }
        }
        let Some(listener) = self.listener.as_ref() else {
            tokio::time::sleep(timeout).await;
            return;
        };
        if !listener.wait(timeout).await {
            self.listener = None;
        }
    }
}
