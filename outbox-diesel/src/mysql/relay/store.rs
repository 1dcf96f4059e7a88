//! The MySQL/MariaDB relay store's `RelayStore` methods.

use std::time::Duration;

use diesel::OptionalExtension;
use diesel::mysql::Mysql;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};
use outbox_core::relay::{
    Claim, Completion, Failure, OutboxMessage, RelayStore, ShardAssignment, StoreError,
};

use super::sql::*;
use super::units::{ClaimError, claim_in, heartbeat, in_transaction, rebalance_in};
use super::{MysqlRelayStore, cleanup_query};
use crate::relay::base::server_methods;
use crate::relay::common::{
    HolderRow, micros, run_each, seq_lists, settle_malformed, split_malformed,
};

/// `last_error` is a `TEXT` column: at most 65,535 bytes.
const MAX_ERROR_BYTES: usize = 65_535;

/// `error`, cut at a character boundary to fit `last_error`.
fn truncate_error(error: &str) -> &str {
    if error.len() <= MAX_ERROR_BYTES {
        return error;
    }
    let mut end = MAX_ERROR_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    &error[..end]
}

impl RelayStore for MysqlRelayStore {
    async fn claim(&mut self, claim: &Claim<'_>) -> Result<Vec<OutboxMessage>, StoreError> {
        if matches!(claim.order, outbox_core::relay::ClaimOrder::Stream { .. }) {
            return Err(StoreError::new(
                "claim",
                outbox_core::relay::UnsupportedMode::new("stream", "MySQL/MariaDB"),
            ));
        }
        let conn = self.base.guarded("claim", claim.lease).await?;
        match in_transaction!(conn, async |conn| claim_in(conn, claim).await) {
            Ok(rows) => {
                let sorted = split_malformed(rows);
                settle_malformed(self, claim.relay, sorted).await
            }
            Err(ClaimError::Fenced) => {
                tracing::warn!(
                    relay = claim.relay,
                    "lease lost while claiming (the claim waited for row locks); claimed nothing"
                );
                Ok(Vec::new())
            }
            Err(ClaimError::Db(e)) => self.base.check("claim", Err(e)).await,
        }
    }

    async fn complete(
        &mut self,
        relay: &str,
        seqs: &[i64],
        completion: Completion,
    ) -> Result<u64, StoreError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let sql = match completion {
            Completion::MarkPublished => COMPLETE_MARK,
            Completion::Delete => COMPLETE_DELETE,
        };
        let conn = self.base.conn().await?;
        let r = in_transaction!(conn, async |conn| {
            let mut n = 0;
            for q in seq_lists::<Mysql, _>(sql, "", seqs, |q| q.bind::<Text, _>(relay)) {
                n += q.execute(conn).await?;
            }
            Ok::<_, diesel::result::Error>(n as u64)
        });
        self.base.check("mark published", r).await
    }

    async fn fail(&mut self, relay: &str, failures: &[Failure]) -> Result<u64, StoreError> {
        if failures.is_empty() {
            return Ok(0);
        }
        // Rows are locked in `seq` order, as claims and marks lock them.
        let mut sorted: Vec<&Failure> = failures.iter().collect();
        sorted.sort_unstable_by_key(|f| f.seq);
        let conn = self.base.conn().await?;
        let r = in_transaction!(conn, async |conn| {
            let mut n = 0;
            for f in &sorted {
                let error = truncate_error(&f.error);
                n += match f.retry_after {
                    Some(delay) => {
                        diesel::sql_query(FAIL_RETRY)
                            .bind::<Text, _>(error)
                            .bind::<BigInt, _>(micros(delay))
                            .bind::<BigInt, _>(f.seq)
                            .bind::<Text, _>(relay)
                            .execute(conn)
                            .await?
                    }
                    None => {
                        diesel::sql_query(FAIL_DEAD)
                            .bind::<Text, _>(error)
                            .bind::<BigInt, _>(f.seq)
                            .bind::<Text, _>(relay)
                            .execute(conn)
                            .await?
                    }
                };
            }
            Ok::<_, diesel::result::Error>(n as u64)
        });
        self.base.check("record failures", r).await
    }

    async fn release(&mut self, relay: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let conn = self.base.conn().await?;
        let r = in_transaction!(conn, async |conn| {
            let mut n = 0;
            for q in seq_lists::<Mysql, _>(RELEASE, "", seqs, |q| q.bind::<Text, _>(relay)) {
                n += q.execute(conn).await?;
            }
            Ok::<_, diesel::result::Error>(n as u64)
        });
        self.base.check("release", r).await
    }

    async fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let conn = self.base.guarded("acquire leadership", lease).await?;
        let lease = micros(lease);
        let r = in_transaction!(conn, async |conn| {
            diesel::sql_query(LEAD)
                .bind::<Text, _>(relay)
                .bind::<BigInt, _>(lease)
                .bind::<Text, _>(relay)
                .bind::<Text, _>(relay)
                .bind::<Text, _>(relay)
                .bind::<BigInt, _>(lease)
                .execute(conn)
                .await?;
            let holder = diesel::sql_query(LEADER)
                .get_result::<HolderRow>(conn)
                .await
                .optional()?;
            Ok::<_, diesel::result::Error>(holder.is_some_and(|h| h.holder == relay))
        });
        self.base.check("acquire leadership", r).await
    }

    async fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<ShardAssignment, StoreError> {
        let conn = self.base.guarded("rebalance shards", lease).await?;
        let lease = micros(lease);
        let r = match heartbeat(conn, relay, lease).await {
            Ok(()) => {
                in_transaction!(conn, async |conn| rebalance_in(conn, relay, lease).await)
            }
            Err(e) => Err(e),
        };
        self.base.check("rebalance shards", r).await
    }

    async fn release_all(&mut self, relay: &str) -> Result<(), StoreError> {
        let Some(conn) = self.base.releasing().await? else {
            return Ok(());
        };
        let r = in_transaction!(conn, async |conn| run_each(conn, &RELEASE_ALL, relay).await);
        self.base.check("release leases", r).await
    }

    server_methods!();
}
