//! The MySQL/MariaDB relay store's units of work that run in a transaction of their own,
//! and the retry of a transaction InnoDB chose as a deadlock victim.

use diesel::QueryableByName;
use diesel::mysql::Mysql;
use diesel::sql_types::{BigInt, Bool, SmallInt, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::relay::{Claim, ClaimOrder, OutboxMessage, ShardAssignment, Share, share};

use super::sql::*;
use crate::relay::common::{
    CountRow, Malformed, ShardRow, TextIdRow, assignment, in_list, micros, seq_lists,
};

/// How often a unit of work that InnoDB chose as a deadlock victim is run again at once.
pub(super) const DEADLOCK_RETRIES: u32 = 3;

/// Whether InnoDB rolled the transaction back to break a deadlock (error 1213). diesel-async
/// keeps only the server's message, so this reads it; under a non-English `lc_messages` it
/// misses, and the error goes to the relay, which backs off and retries the same way.
fn is_deadlock(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().starts_with("Deadlock found"))
}

/// Runs `$f` in a transaction on `$conn`, again (up to [`DEADLOCK_RETRIES`] times) when
/// InnoDB aborts it as a deadlock victim. Every unit of work here is safe to rerun whole:
/// the rollback undid all of it. Deadlocks are expected now and then: an ordered claim
/// locks a row's `outbox_events_pending` entry and then the row, while a mark of that row
/// holds the row and then updates the entry (`published_at` is in that index).
macro_rules! in_transaction {
    ($conn:expr, $f:expr) => {{
        let mut tries = 0u32;
        loop {
            match $conn.transaction($f).await {
                Err(e)
                    if tries < $crate::mysql::relay::units::DEADLOCK_RETRIES
                        && $crate::mysql::relay::units::IsDeadlock::is_deadlock(&e) =>
                {
                    tries += 1;
                    tracing::debug!(tries, "deadlock victim; running the transaction again");
                }
                r => break r,
            }
        }
    }};
}
pub(super) use in_transaction;

/// Errors that can say whether they are a deadlock.
pub(super) trait IsDeadlock {
    fn is_deadlock(&self) -> bool;
}

impl IsDeadlock for diesel::result::Error {
    fn is_deadlock(&self) -> bool {
        is_deadlock(self)
    }
}

#[derive(QueryableByName)]
struct SeqRow {
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// Why a claim's transaction rolled back.
pub(super) enum ClaimError {
    Db(diesel::result::Error),
    /// The relay lost its shard or leadership lease while the claim waited for row locks.
    Fenced,
}

impl From<diesel::result::Error> for ClaimError {
    fn from(e: diesel::result::Error) -> Self {
        ClaimError::Db(e)
    }
}

impl IsDeadlock for ClaimError {
    fn is_deadlock(&self) -> bool {
        matches!(self, ClaimError::Db(e) if is_deadlock(e))
    }
}

pub(super) async fn claim_in(
    conn: &mut AsyncMysqlConnection,
    claim: &Claim<'_>,
) -> Result<Vec<Result<OutboxMessage, Malformed>>, ClaimError> {
    let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX);
    let (shards_only, leader_only) = match claim.order {
        ClaimOrder::Unordered => (false, false),
        ClaimOrder::Ordered {
            owned_shards_only,
            leader_only,
            ..
        } => (owned_shards_only, leader_only),
        // Refused by the store's `claim` before it gets here.
        ClaimOrder::Stream { .. } => return Ok(Vec::new()),
    };
    let locked = match claim.order {
        ClaimOrder::Unordered => {
            diesel::sql_query(SELECT_UNORDERED)
                .bind::<BigInt, _>(limit)
                .load::<SeqRow>(conn)
                .await?
        }
        ClaimOrder::Ordered {
            dead_letters_block, ..
        } => {
            diesel::sql_query(SELECT_ORDERED)
                .bind::<Bool, _>(shards_only)
                .bind::<Text, _>(claim.relay)
                .bind::<Bool, _>(leader_only)
                .bind::<Text, _>(claim.relay)
                .bind::<Bool, _>(dead_letters_block)
                .bind::<BigInt, _>(limit)
                .load::<SeqRow>(conn)
                .await?
        }
        ClaimOrder::Stream { .. } => return Ok(Vec::new()), // refused by the store's `claim`
    };
    let seqs: Vec<i64> = locked.into_iter().map(|r| r.seq).collect();
    let until = micros(claim.lease);
    let mut leased = 0;
    let lease_rows = seq_lists::<Mysql, _>(LEASE_ROWS, "", &seqs, |q| {
        q.bind::<Text, _>(claim.relay)
            .bind::<BigInt, _>(until)
            .bind::<Bool, _>(shards_only)
            .bind::<Text, _>(claim.relay)
            .bind::<Bool, _>(leader_only)
            .bind::<Text, _>(claim.relay)
    });
    for q in lease_rows {
        leased += q.execute(conn).await?;
    }
    if leased != seqs.len() {
        // All or nothing: a part of the batch could miss an earlier event of an aggregate.
        return Err(ClaimError::Fenced);
    }
    let mut out = Vec::with_capacity(seqs.len());
    for q in seq_lists::<Mysql, _>(READ_ROWS, " ORDER BY seq", &seqs, |q| q) {
        for row in q.load::<TextIdRow>(conn).await? {
            out.push(row.into_message());
        }
    }
    Ok(out)
}

/// Heartbeats `relay` and forgets relays dead for an hour: two statements, each its own
/// transaction. Inside one transaction they deadlock: each relay's heartbeat holds its own
/// row, and each `DELETE` scans (and waits for) every row, uncommitted inserts included.
pub(super) async fn heartbeat(
    conn: &mut AsyncMysqlConnection,
    relay: &str,
    lease: i64,
) -> diesel::QueryResult<()> {
    diesel::sql_query(HEARTBEAT)
        .bind::<Text, _>(relay)
        .bind::<BigInt, _>(lease)
        .bind::<BigInt, _>(lease)
        .execute(conn)
        .await?;
    diesel::sql_query(FORGET_DEAD_RELAYS).execute(conn).await?;
    Ok(())
}

/// Counts live relays, renews `relay`'s shard leases, gives up its surplus or takes free
/// shards: one transaction. It waits for no lock another rebalance holds while waiting
/// itself: the renewal's `UPDATE` reads locked rows semi-consistently (it waits only for a
/// row whose committed owner is `relay`, which another relay is taking over, and that one
/// waits for nothing), and free shards are taken with `SKIP LOCKED`.
pub(super) async fn rebalance_in(
    conn: &mut AsyncMysqlConnection,
    relay: &str,
    lease: i64,
) -> diesel::QueryResult<ShardAssignment> {
    let live = diesel::sql_query(LIVE_RELAYS)
        .get_result::<CountRow>(conn)
        .await?
        .n;
    diesel::sql_query(RENEW_SHARDS)
        .bind::<BigInt, _>(lease)
        .bind::<Text, _>(relay)
        .execute(conn)
        .await?;
    let mut owned: Vec<i16> = diesel::sql_query(OWNED_SHARDS)
        .bind::<Text, _>(relay)
        .load::<ShardRow>(conn)
        .await?
        .into_iter()
        .map(|r| r.shard)
        .collect();
    match share(&mut owned, usize::try_from(live).unwrap_or(1)) {
        Share::GiveUp(surplus) => {
            in_list(
                GIVE_UP_SHARDS,
                &surplus,
                "",
                |q| q.bind::<Text, _>(relay),
                |q, s| q.bind::<SmallInt, _>(*s),
            )
            .execute(conn)
            .await?;
        }
        Share::Take(want) => {
            let free: Vec<i16> = diesel::sql_query(FREE_SHARDS)
                .bind::<BigInt, _>(i64::try_from(want).unwrap_or(i64::MAX))
                .load::<ShardRow>(conn)
                .await?
                .into_iter()
                .map(|r| r.shard)
                .collect();
            if !free.is_empty() {
                in_list(
                    TAKE_SHARDS,
                    &free,
                    "",
                    |q| q.bind::<Text, _>(relay).bind::<BigInt, _>(lease),
                    |q, s| q.bind::<SmallInt, _>(*s),
                )
                .execute(conn)
                .await?;
                owned.extend(free);
                owned.sort_unstable();
            }
        }
        Share::Keep => {}
    }
    Ok(assignment(owned, live))
}
