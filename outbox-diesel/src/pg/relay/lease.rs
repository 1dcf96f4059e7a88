//! The lease modes' half of the PostgreSQL store (unordered, leader, sharded): claims that
//! lease rows to the relay, and settles fenced by those leases.

use diesel::sql_types::{Array, BigInt, Bool, Double, Text};
use diesel_async::RunQueryDsl;
use outbox_core::relay::{Claim, ClaimOrder, Completion, Failure, StoreError};

use super::sql::*;
use super::{PgConnector, Row};
use crate::relay::base::Base;
use crate::relay::common::{Prepared, Sorted, secs, split_malformed};

/// What the lease modes keep between calls.
#[derive(Default)]
pub(super) struct LeaseStore {
    /// Whether a claim found the table free of what stream mode leaves behind (see
    /// [`handover`](super::handover)); looked for until it is.
    handed_over: bool,
}

impl LeaseStore {
    /// Claims rows for `claim`, leased to its relay, and sorts out the malformed ones.
    pub(super) async fn claim(
        &mut self,
        base: &mut Base<PgConnector>,
        claim: &Claim<'_>,
    ) -> Result<Sorted, StoreError> {
        let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX);
        if !self.handed_over {
            let conn = base.guarded("claim", claim.lease).await?;
            let left = super::handover::left_behind(conn).await;
            if let Some(left) = base.check("claim", left).await? {
                return Err(StoreError::new("claim", left));
            }
            self.handed_over = true;
        }
        let conn = base.guarded("claim", claim.lease).await?;
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
            // Stream claims go to stream mode's store.
            ClaimOrder::Stream { .. } => Ok(Vec::new()),
        };
        Ok(split_malformed(
            base.check("claim", r)
                .await?
                .into_iter()
                .map(Row::into_message),
        ))
    }
}

/// Marks `seqs` published (or deletes them), where `relay` still holds their lease.
pub(super) async fn complete(
    base: &mut Base<PgConnector>,
    relay: &str,
    seqs: &[i64],
    completion: Completion,
) -> Result<u64, StoreError> {
    let sql = match completion {
        Completion::MarkPublished => COMPLETE_MARK,
        Completion::Delete => COMPLETE_DELETE,
    };
    let conn = base.conn().await?;
    let r = Prepared(
        diesel::sql_query(sql)
            .bind::<Text, _>(relay)
            .bind::<Array<BigInt>, _>(seqs),
    )
    .execute(conn)
    .await;
    base.check("mark published", r).await.map(|n| n as u64)
}

/// Records `failures` (a retry time, or a dead letter), where `relay` still holds their lease.
pub(super) async fn fail(
    base: &mut Base<PgConnector>,
    relay: &str,
    failures: &[Failure],
) -> Result<u64, StoreError> {
    let seqs: Vec<i64> = failures.iter().map(|f| f.seq).collect();
    let delays: Vec<f64> = failures
        .iter()
        .map(|f| f.retry_after.map(secs).unwrap_or(0.0))
        .collect();
    let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
    let dead: Vec<bool> = failures.iter().map(|f| f.retry_after.is_none()).collect();
    let conn = base.conn().await?;
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
    base.check("record failures", r).await.map(|n| n as u64)
}

/// Gives `seqs` back as they were (no attempt counted), where `relay` still holds their lease.
pub(super) async fn release(
    base: &mut Base<PgConnector>,
    relay: &str,
    seqs: &[i64],
) -> Result<u64, StoreError> {
    let conn = base.conn().await?;
    let r = Prepared(
        diesel::sql_query(RELEASE)
            .bind::<Text, _>(relay)
            .bind::<Array<BigInt>, _>(seqs),
    )
    .execute(conn)
    .await;
    base.check("release", r).await.map(|n| n as u64)
}
