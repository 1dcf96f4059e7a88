//! Shard leases: the fair share of the 256 shards among the live relays, renewed, taken and
//! given up in one round (sharded and stream mode).

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Double, SmallInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::relay::{ShardAssignment, Share, StoreError, share};

use super::PgConnector;
use super::sql::*;
use crate::relay::base::Base;
use crate::relay::common::{CountRow, Prepared, ShardRow, assignment, secs};

/// Heartbeats `relay`, forgets dead relays, renews its shards and takes or gives up shards
/// toward its fair share. Returns the assignment and whether shards were given up.
pub(super) async fn rebalance(
    base: &mut Base<PgConnector>,
    relay: &str,
    lease: Duration,
) -> Result<(ShardAssignment, bool), StoreError> {
    let conn = base.guarded("rebalance shards", lease).await?;
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
        match share(&mut owned, usize::try_from(live).unwrap_or(1)) {
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
                        .bind::<BigInt, _>(i64::try_from(want).unwrap_or(i64::MAX)),
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
    let assignment = base.check("rebalance shards", r).await?;
    Ok((assignment, gave_up))
}
