//! The admin statements on SQLite (times UTC text `YYYY-MM-DD HH:MM:SS.ffffff`, so text
//! order is time order). A filter is `?1`..`?8` (see [`bind`]); a list of `seq`s is bound as
//! one JSON array and read with `json_each`. "Now" is the caller's clock, bound, as the
//! SQLite relay store does (SQLite runs in-process).

use std::time::Duration;

use chrono::Utc;
use diesel::SqliteConnection;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::Sqlite;
use diesel_async::RunQueryDsl;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

use super::backend::{AdminConnection, Sealed};
use super::types::{
    self, AdminError, BoundRow, CountsRow, DeadLetter, DeadRow, Filter, LeaderRow, NRow, RelayRow,
    Status, db,
};
use crate::backend::sqlite_timestamp;

macro_rules! filter {
    () => {
        " AND (?1 IS NULL OR seq IN (SELECT value FROM json_each(?1))) \
          AND (?2 IS NULL OR seq >= ?2) AND (?3 IS NULL OR seq <= ?3) \
          AND (?4 IS NULL OR created_at >= ?4) AND (?5 IS NULL OR created_at < ?5) \
          AND (?6 IS NULL OR aggregate_type = ?6) AND (?7 IS NULL OR aggregate_id = ?7) \
          AND (?8 IS NULL OR event_type = ?8)"
    };
}

/// `?1`: now.
const COUNTS: &str = "SELECT \
     CAST(COALESCE(SUM(published_at IS NULL AND dead_at IS NULL), 0) AS INTEGER) AS pending, \
     CAST(COALESCE(SUM(published_at IS NULL AND dead_at IS NULL AND locked_until > ?1), 0) AS INTEGER) AS in_flight, \
     CAST(COALESCE(SUM(published_at IS NULL AND dead_at IS NULL AND attempts > 0 AND available_at > ?1 \
         AND (locked_until IS NULL OR locked_until <= ?1)), 0) AS INTEGER) AS retrying, \
     CAST(COALESCE(SUM(dead_at IS NOT NULL AND published_at IS NULL), 0) AS INTEGER) AS dead, \
     CAST(COALESCE(SUM(published_at IS NOT NULL), 0) AS INTEGER) AS published, \
     MIN(CASE WHEN published_at IS NULL AND dead_at IS NULL THEN created_at END) AS oldest_pending, \
     (julianday(?1) - julianday(MIN(CASE WHEN published_at IS NULL AND dead_at IS NULL THEN created_at END))) \
         * 86400.0 AS oldest_pending_age \
     FROM outbox_events";
const BLOCKED: &str = "SELECT COUNT(*) AS n FROM (SELECT DISTINCT d.aggregate_type, d.aggregate_id \
     FROM outbox_events d WHERE d.dead_at IS NOT NULL AND d.published_at IS NULL \
     AND EXISTS (SELECT 1 FROM outbox_events p WHERE p.aggregate_type = d.aggregate_type \
         AND p.aggregate_id = d.aggregate_id AND p.seq > d.seq \
         AND p.published_at IS NULL AND p.dead_at IS NULL)) b";
/// `?1`: now. SQLite relays record no session.
const RELAYS: &str = "SELECT r.relay_id, r.mode, r.state, r.state_since, \
     CAST(CASE WHEN r.heartbeat_until > ?1 THEN 1 ELSE 0 END AS INTEGER) AS live, \
     r.last_error, NULL AS session, \
     (SELECT COUNT(*) FROM outbox_shard_leases s WHERE s.owner = r.relay_id AND s.lease_until > ?1) AS shards \
     FROM outbox_relays r ORDER BY r.relay_id";
const LEADER: &str =
    "SELECT holder FROM outbox_leader WHERE lease_until > ?1 ORDER BY name LIMIT 1";
const LIST_DEAD: &str = concat!(
    "SELECT seq, id, aggregate_type, aggregate_id, event_type, event_version, topic, attempts, \
     created_at, dead_at, last_error FROM outbox_events \
     WHERE dead_at IS NOT NULL AND published_at IS NULL",
    filter!(),
    " AND seq > ?9 ORDER BY seq LIMIT ?10"
);
const COUNT_DEAD: &str = concat!(
    "SELECT COUNT(*) AS n FROM outbox_events WHERE dead_at IS NOT NULL AND published_at IS NULL",
    filter!()
);
const COUNT_PUBLISHED: &str = concat!(
    "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NOT NULL",
    filter!()
);
/// `?9`: now.
const RETRY: &str = concat!(
    "UPDATE outbox_events SET attempts = 0, dead_at = NULL, available_at = ?9, \
     locked_by = NULL, locked_until = NULL \
     WHERE dead_at IS NOT NULL AND published_at IS NULL",
    filter!()
);
const PURGE: &str = concat!(
    "DELETE FROM outbox_events WHERE dead_at IS NOT NULL AND published_at IS NULL",
    filter!()
);
const REPLAY_BOUND: &str = concat!(
    "SELECT MAX(seq) AS last FROM (SELECT seq FROM outbox_events \
     WHERE published_at IS NOT NULL",
    filter!(),
    " AND seq > ?9 ORDER BY seq LIMIT ?10) s"
);
/// `?11`: now.
const REPLAY: &str = concat!(
    "UPDATE outbox_events SET published_at = NULL, attempts = 0, available_at = ?11, \
     locked_by = NULL, locked_until = NULL, last_error = NULL \
     WHERE published_at IS NOT NULL",
    filter!(),
    " AND seq > ?9 AND seq <= ?10"
);

type Conn = SyncConnectionWrapper<SqliteConnection>;

fn now() -> String {
    sqlite_timestamp(Utc::now())
}

/// Binds a filter as `?1`..`?8`.
fn bind(sql: &'static str, f: &Filter) -> BoxedSqlQuery<'static, Sqlite, SqlQuery> {
    diesel::sql_query(sql)
        .into_boxed::<Sqlite>()
        .bind::<Nullable<Text>, _>(f.seqs_json())
        .bind::<Nullable<BigInt>, _>(f.from_seq)
        .bind::<Nullable<BigInt>, _>(f.to_seq)
        .bind::<Nullable<Text>, _>(f.since.map(sqlite_timestamp))
        .bind::<Nullable<Text>, _>(f.until.map(sqlite_timestamp))
        .bind::<Nullable<Text>, _>(f.aggregate_type.clone())
        .bind::<Nullable<Text>, _>(f.aggregate_id.clone())
        .bind::<Nullable<Text>, _>(f.event_type.clone())
}

impl Sealed for Conn {}

impl AdminConnection for Conn {
    async fn admin_status(&mut self) -> Result<Status, AdminError> {
        let now = now();
        let q = diesel::sql_query(COUNTS).bind::<Text, _>(now.clone());
        let counts: CountsRow = db("count events", q.get_result(self).await)?;
        let blocked: NRow = db(
            "count blocked aggregates",
            diesel::sql_query(BLOCKED).get_result(self).await,
        )?;
        let q = diesel::sql_query(RELAYS).bind::<Text, _>(now.clone());
        let relays: Vec<RelayRow> = db("list relays", q.load(self).await)?;
        let q = diesel::sql_query(LEADER).bind::<Text, _>(now);
        let leader: Vec<LeaderRow> = db("read the leader", q.load(self).await)?;
        types::status(
            counts,
            blocked.n,
            relays,
            leader.into_iter().next().map(|l| l.holder),
        )
    }

    async fn admin_dead(
        &mut self,
        filter: &Filter,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, AdminError> {
        let q = bind(LIST_DEAD, filter)
            .bind::<BigInt, _>(after_seq)
            .bind::<BigInt, _>(limit);
        let rows: Vec<DeadRow> = db("list dead letters", q.load(self).await)?;
        rows.into_iter().map(DeadRow::into_dead_letter).collect()
    }

    async fn admin_count(&mut self, filter: &Filter, dead: bool) -> Result<i64, AdminError> {
        let sql = if dead { COUNT_DEAD } else { COUNT_PUBLISHED };
        let row: NRow = db("count events", bind(sql, filter).get_result(self).await)?;
        Ok(row.n)
    }

    async fn admin_retry(&mut self, filter: &Filter) -> Result<u64, AdminError> {
        let q = bind(RETRY, filter).bind::<Text, _>(now());
        db("retry dead letters", q.execute(self).await).map(|n| n as u64)
    }

    async fn admin_purge(&mut self, filter: &Filter) -> Result<u64, AdminError> {
        db(
            "purge dead letters",
            bind(PURGE, filter).execute(self).await,
        )
        .map(|n| n as u64)
    }

    async fn admin_replay_bound(
        &mut self,
        filter: &Filter,
        after: i64,
        limit: i64,
    ) -> Result<Option<i64>, AdminError> {
        let q = bind(REPLAY_BOUND, filter)
            .bind::<BigInt, _>(after)
            .bind::<BigInt, _>(limit);
        let row: BoundRow = db("select events to replay", q.get_result(self).await)?;
        Ok(row.last)
    }

    async fn admin_replay(
        &mut self,
        filter: &Filter,
        after: i64,
        last: i64,
    ) -> Result<u64, AdminError> {
        let q = bind(REPLAY, filter)
            .bind::<BigInt, _>(after)
            .bind::<BigInt, _>(last)
            .bind::<Text, _>(now());
        db("replay events", q.execute(self).await).map(|n| n as u64)
    }

    async fn admin_cleanup(&mut self, older_than: Duration, limit: i64) -> Result<u64, AdminError> {
        let cutoff = chrono::Duration::from_std(older_than.min(crate::relay::common::MAX_INTERVAL))
            .unwrap_or(chrono::Duration::MAX);
        let at = Utc::now();
        let q = diesel::sql_query(crate::relay::sqlite::CLEANUP)
            .bind::<Text, _>(sqlite_timestamp(
                at.checked_sub_signed(cutoff).unwrap_or(at),
            ))
            .bind::<BigInt, _>(limit);
        db("clean up published events", q.execute(self).await).map(|n| n as u64)
    }
}
