//! The SQLite relay store's `RelayStore` methods: each call's unit of work runs on the
//! blocking pool, multi-statement ones in `BEGIN IMMEDIATE` transactions.

use std::time::Duration;

use chrono::Utc;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::sqlite::Sqlite;
use diesel::{RunQueryDsl, SqliteConnection};
use outbox_core::relay::{
    Claim, ClaimOrder, Completion, Failure, OutboxMessage, RelayHealth, RelayStore,
    ShardAssignment, Share, StoreError, share,
};

use super::sql::*;
use super::{SqliteRelayStore, after, before, cleanup_query};
use crate::relay::common::{
    CountRow, HolderRow, Malformed, ShardRow, TextIdRow, assignment, mode_name, seq_lists,
    settle_malformed, split_malformed,
};
use crate::sqlite::sqlite_timestamp;

/// Runs `prefix(?, …)` over `seqs`, [`seq_lists`] statements, `bind` binding the prefix's
/// own parameters; returns the rows changed.
fn for_each_chunk<'a>(
    conn: &mut SqliteConnection,
    prefix: &'a str,
    seqs: &'a [i64],
    bind: impl Fn(BoxedSqlQuery<'a, Sqlite, SqlQuery>) -> BoxedSqlQuery<'a, Sqlite, SqlQuery> + 'a,
) -> diesel::QueryResult<u64> {
    let mut n = 0;
    for q in seq_lists(prefix, "", seqs, bind) {
        n += q.execute(conn)?;
    }
    Ok(n as u64)
}

fn claim_in(
    conn: &mut SqliteConnection,
    relay: &str,
    limit: i64,
    lease: Duration,
    order: ClaimOrder,
) -> diesel::QueryResult<Vec<Result<OutboxMessage, Malformed>>> {
    let now = Utc::now();
    let (at, until) = (sqlite_timestamp(now), after(now, lease));
    let rows = match order {
        ClaimOrder::Unordered => diesel::sql_query(format!("{CLAIM_UNORDERED}{RETURNING}"))
            .bind::<Text, _>(relay)
            .bind::<Text, _>(&at)
            .bind::<Text, _>(&until)
            .bind::<BigInt, _>(limit)
            .load::<TextIdRow>(conn)?,
        ClaimOrder::Ordered {
            owned_shards_only,
            leader_only,
            dead_letters_block,
        } => diesel::sql_query(format!("{CLAIM_ORDERED}{RETURNING}"))
            .bind::<Text, _>(relay)
            .bind::<Text, _>(&at)
            .bind::<Text, _>(&until)
            .bind::<BigInt, _>(limit)
            .bind::<Bool, _>(owned_shards_only)
            .bind::<Bool, _>(leader_only)
            .bind::<Bool, _>(dead_letters_block)
            .load::<TextIdRow>(conn)?,
        // Refused by the store's `claim` before it gets here.
        ClaimOrder::Stream { .. } => Vec::new(),
    };
    Ok(rows.into_iter().map(TextIdRow::into_message).collect())
}

fn rebalance_in(
    conn: &mut SqliteConnection,
    relay: &str,
    lease: Duration,
) -> diesel::QueryResult<ShardAssignment> {
    let now = Utc::now();
    let (at, until) = (sqlite_timestamp(now), after(now, lease));
    diesel::sql_query(HEARTBEAT)
        .bind::<Text, _>(relay)
        .bind::<Text, _>(&until)
        .execute(conn)?;
    diesel::sql_query(FORGET_DEAD_RELAYS)
        .bind::<Text, _>(before(now, Duration::from_secs(3600)))
        .execute(conn)?;
    let live = diesel::sql_query(LIVE_RELAYS)
        .bind::<Text, _>(&at)
        .get_result::<CountRow>(conn)?
        .n;
    let mut owned: Vec<i16> = diesel::sql_query(RENEW_SHARDS)
        .bind::<Text, _>(relay)
        .bind::<Text, _>(&until)
        .load::<ShardRow>(conn)?
        .into_iter()
        .map(|r| r.shard)
        .collect();
    owned.sort_unstable();
    match share(&mut owned, usize::try_from(live).unwrap_or(1)) {
        Share::GiveUp(surplus) => {
            let surplus: Vec<i64> = surplus.into_iter().map(i64::from).collect();
            for_each_chunk(conn, GIVE_UP_SHARDS, &surplus, |q| q.bind::<Text, _>(relay))?;
        }
        Share::Take(want) => {
            let taken = diesel::sql_query(TAKE_SHARDS)
                .bind::<Text, _>(relay)
                .bind::<Text, _>(&until)
                .bind::<Text, _>(&at)
                .bind::<BigInt, _>(i64::try_from(want).unwrap_or(i64::MAX))
                .load::<ShardRow>(conn)?;
            owned.extend(taken.into_iter().map(|r| r.shard));
            owned.sort_unstable();
        }
        Share::Keep => {}
    }
    Ok(assignment(owned, live))
}

impl RelayStore for SqliteRelayStore {
    async fn claim(&mut self, claim: &Claim<'_>) -> Result<Vec<OutboxMessage>, StoreError> {
        if matches!(claim.order, ClaimOrder::Stream { .. }) {
            return Err(StoreError::new(
                "claim",
                outbox_core::relay::UnsupportedMode::new("stream", "SQLite"),
            ));
        }
        self.base.lease(claim.lease);
        let relay = claim.relay.to_owned();
        let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX);
        let (lease, order) = (claim.lease, claim.order);
        let rows = self
            .run("claim", move |c| claim_in(c, &relay, limit, lease, order))
            .await?;
        settle_malformed(self, claim.relay, split_malformed(rows)).await
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
        let (relay, seqs) = (relay.to_owned(), seqs.to_vec());
        self.run("mark published", move |c| {
            let at = sqlite_timestamp(Utc::now());
            c.immediate_transaction(|c| match completion {
                Completion::MarkPublished => for_each_chunk(c, COMPLETE_MARK, &seqs, |q| {
                    q.bind::<Text, _>(at.as_str())
                        .bind::<Text, _>(relay.as_str())
                }),
                Completion::Delete => for_each_chunk(c, COMPLETE_DELETE, &seqs, |q| {
                    q.bind::<Text, _>(relay.as_str())
                }),
            })
        })
        .await
    }

    async fn fail(&mut self, relay: &str, failures: &[Failure]) -> Result<u64, StoreError> {
        if failures.is_empty() {
            return Ok(0);
        }
        let (relay, failures) = (relay.to_owned(), failures.to_vec());
        self.run("record failures", move |c| {
            let now = Utc::now();
            let at = sqlite_timestamp(now);
            c.immediate_transaction(|c| {
                let mut n = 0;
                for f in &failures {
                    let (sql, when) = match f.retry_after {
                        Some(delay) => (FAIL_RETRY, after(now, delay)),
                        None => (FAIL_DEAD, at.clone()),
                    };
                    n += diesel::sql_query(sql)
                        .bind::<Text, _>(&f.error)
                        .bind::<Text, _>(when)
                        .bind::<BigInt, _>(f.seq)
                        .bind::<Text, _>(&relay)
                        .execute(c)?;
                }
                Ok(n as u64)
            })
        })
        .await
    }

    async fn release(&mut self, relay: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let (relay, seqs) = (relay.to_owned(), seqs.to_vec());
        self.run("release", move |c| {
            c.immediate_transaction(|c| {
                for_each_chunk(c, RELEASE, &seqs, |q| q.bind::<Text, _>(relay.as_str()))
            })
        })
        .await
    }

    async fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.base.lease(lease);
        let relay = relay.to_owned();
        self.run("acquire leadership", move |c| {
            let now = Utc::now();
            let rows = diesel::sql_query(LEAD)
                .bind::<Text, _>(&relay)
                .bind::<Text, _>(after(now, lease))
                .bind::<Text, _>(sqlite_timestamp(now))
                .load::<HolderRow>(c)?;
            Ok(!rows.is_empty())
        })
        .await
    }

    async fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<ShardAssignment, StoreError> {
        self.base.lease(lease);
        let relay = relay.to_owned();
        self.run("rebalance shards", move |c| {
            c.immediate_transaction(|c| rebalance_in(c, &relay, lease))
        })
        .await
    }

    async fn heartbeat(
        &mut self,
        relay: &str,
        lease: Duration,
        health: &RelayHealth,
    ) -> Result<(), StoreError> {
        self.base.lease(lease);
        let (relay, health) = (relay.to_owned(), health.clone());
        self.run("heartbeat", move |c| {
            let now = Utc::now();
            diesel::sql_query(HEALTH)
                .bind::<Text, _>(&relay)
                .bind::<Text, _>(after(now, lease))
                .bind::<Text, _>(sqlite_timestamp(now))
                .bind::<Text, _>(mode_name(health.mode))
                .bind::<Text, _>(health.state.as_str())
                .bind::<Nullable<Text>, _>(health.last_error.as_deref())
                .execute(c)
                .map(|_| ())
        })
        .await
    }

    async fn release_all(&mut self, relay: &str) -> Result<(), StoreError> {
        let relay = relay.to_owned();
        self.run("release leases", move |c| {
            c.immediate_transaction(|c| {
                for sql in RELEASE_ALL {
                    diesel::sql_query(sql).bind::<Text, _>(&relay).execute(c)?;
                }
                Ok(())
            })
        })
        .await
    }

    async fn cleanup(&mut self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run("clean up", move |c| {
            let n = cleanup_query(older_than, limit).execute(c)?;
            Ok(n as u64)
        })
        .await
    }
}
