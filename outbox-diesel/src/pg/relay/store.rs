//! The PostgreSQL relay store's `RelayStore` methods. Claims, settles and shard rebalances go
//! to the store of the relay's mode (`lease`, `stream/`); leadership, sessions, cleanup and
//! waiting for work are the same in every mode.

use std::time::Duration;

use diesel::sql_types::{Double, Text};
use diesel_async::RunQueryDsl;
use outbox_core::relay::{
    Claim, ClaimOrder, Completion, Failure, OutboxMessage, RelayStore, ShardAssignment, StoreError,
};

use super::sql::*;
use super::stream::Outcome;
use super::stream::{Ask, StreamStore};
use super::{PgRelayStore, cleanup_query, lease, shards};
use crate::relay::base::server_methods;
use crate::relay::common::{HolderRow, Prepared, run_each, secs, settle_malformed};

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
            let read_ahead = self.read_ahead;
            return (self.stream)
                .get_or_insert_with(|| StreamStore::new(read_ahead))
                .claim(&mut self.base, Ask::of(claim, dead_letters_block))
                .await;
        }
        let sorted = self.lease.claim(&mut self.base, claim).await?;
        settle_malformed(self, claim.relay, sorted).await
    }

    /// Stream mode: writes the positions of the batch settled last and reads the rows after
    /// the batch in flight (see `stream/`).
    async fn overlap(&mut self, claim: &Claim<'_>) {
        if let (ClaimOrder::Stream { dead_letters_block }, Some(stream)) =
            (claim.order, &mut self.stream)
        {
            stream
                .overlap(&mut self.base, Ask::of(claim, dead_letters_block))
                .await;
        }
    }

    async fn complete(
        &mut self,
        relay: &str,
        seqs: &[i64],
        completion: Completion,
    ) -> Result<u64, StoreError> {
        match &mut self.stream {
            Some(stream) if stream.in_flight() => {
                let done = seqs.iter().map(|s| (*s, Outcome::Published));
                stream.settle(&mut self.base, relay, done).await
            }
            _ => lease::complete(&mut self.base, relay, seqs, completion).await,
        }
    }

    async fn fail(&mut self, relay: &str, failures: &[Failure]) -> Result<u64, StoreError> {
        match &mut self.stream {
            Some(stream) if stream.in_flight() => {
                let failed = failures.iter().map(|f| {
                    let outcome = match f.retry_after {
                        Some(after) => Outcome::Failed(after),
                        None => Outcome::Dead(f.error.clone()),
                    };
                    (f.seq, outcome)
                });
                stream.settle(&mut self.base, relay, failed).await
            }
            _ => lease::fail(&mut self.base, relay, failures).await,
        }
    }

    async fn release(&mut self, relay: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        match &mut self.stream {
            Some(stream) if stream.in_flight() => {
                let back = seqs.iter().map(|s| (*s, Outcome::Released));
                stream.settle(&mut self.base, relay, back).await
            }
            _ => lease::release(&mut self.base, relay, seqs).await,
        }
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
        match &mut self.stream {
            Some(stream) => stream.rebalance(&mut self.base, relay, lease).await,
            None => Ok(shards::rebalance(&mut self.base, relay, lease).await?.0),
        }
    }

    async fn release_all(&mut self, relay: &str) -> Result<(), StoreError> {
        if let Some(stream) = &mut self.stream {
            stream.flush_owed(&mut self.base, relay).await?;
        }
        let Some(conn) = self.base.releasing().await? else {
            return Ok(());
        };
        let r = run_each(conn, &RELEASE_ALL, relay).await;
        self.base.check("release leases", r).await
    }

    server_methods!(sessions);

    /// Deletes what there is to delete (`cleanup_query`, which also records the tick that
    /// tells stream rows' age), then empties the partitions whose rows may all go
    /// (`partition::rotate`; on a partitioned table the delete takes none of their
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
