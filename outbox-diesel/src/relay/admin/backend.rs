//! The connection types the admin API runs on; each backend's file implements them with its
//! own SQL.

use std::future::Future;
use std::time::Duration;

use super::types::{AdminError, DeadLetter, Filter, Status};

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// A connection the admin API runs on: `AsyncPgConnection`, `AsyncMysqlConnection`, or
/// `SyncConnectionWrapper<SqliteConnection>` (with the matching feature). Sealed: its
/// methods are the per-backend statements behind [`Admin`](super::Admin).
#[allow(missing_docs)] // hidden methods, not API
pub trait AdminConnection: Sealed + Send {
    #[doc(hidden)]
    fn admin_status(&mut self) -> impl Future<Output = Result<Status, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_dead(
        &mut self,
        filter: &Filter,
        after_seq: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, AdminError>> + Send;
    /// Rows matching `filter` among the dead letters (`dead`) or the published events.
    #[doc(hidden)]
    fn admin_count(
        &mut self,
        filter: &Filter,
        dead: bool,
    ) -> impl Future<Output = Result<i64, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_retry(
        &mut self,
        filter: &Filter,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_purge(
        &mut self,
        filter: &Filter,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
    /// The highest `seq` of the next `limit` published rows matching `filter` after `after`.
    #[doc(hidden)]
    fn admin_replay_bound(
        &mut self,
        filter: &Filter,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Option<i64>, AdminError>> + Send;
    /// Replays the published rows matching `filter` with `after < seq <= last`.
    #[doc(hidden)]
    fn admin_replay(
        &mut self,
        filter: &Filter,
        after: i64,
        last: i64,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_cleanup(
        &mut self,
        older_than: Duration,
        limit: i64,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
}

/// Defines the admin statements whose text is the same on every backend but for the filter
/// and the text of a time column (the backend's `filter!()` and `time!(column)`, expanded
/// where this is), the time they take as now (`now`, `retry_now`, `replay_now`: SQLite binds
/// it, `?1`, `?9` and `?11`), the placeholders of their own parameters (`after`, `limit`,
/// `last`), the integer type a count is cast to (`int`), and the relay's session and the
/// event's id as text (`session`, `id`).
macro_rules! filtered_statements {
    (
        now: $now:literal,
        int: $int:literal,
        session: $session:literal,
        id: $id:literal,
        retry_now: $retry_now:literal,
        replay_now: $replay_now:literal,
        after: $after:literal,
        limit: $limit:literal,
        last: $last:literal $(,)?
    ) => {
        const RELAYS: &str = concat!(
            "SELECT r.relay_id, r.mode, r.state, ",
            time!("r.state_since"),
            " AS state_since, CAST(CASE WHEN r.heartbeat_until > ",
            $now,
            " THEN 1 ELSE 0 END AS ",
            $int,
            ") AS live, r.last_error, ",
            $session,
            " AS session, (SELECT COUNT(*) FROM outbox_shard_leases s \
             WHERE s.owner = r.relay_id AND s.lease_until > ",
            $now,
            ") AS shards FROM outbox_relays r ORDER BY r.relay_id"
        );
        const LEADER: &str = concat!(
            "SELECT holder FROM outbox_leader WHERE lease_until > ",
            $now,
            " ORDER BY name LIMIT 1"
        );
        const LIST_DEAD: &str = concat!(
            "SELECT seq, ",
            $id,
            " AS id, aggregate_type, aggregate_id, event_type, event_version, topic, attempts, ",
            time!("created_at"),
            " AS created_at, ",
            time!("dead_at"),
            " AS dead_at, last_error FROM outbox_events \
             WHERE dead_at IS NOT NULL AND published_at IS NULL",
            filter!(),
            " AND seq > ",
            $after,
            " ORDER BY seq LIMIT ",
            $limit
        );
        /// Aggregates whose dead letter holds back a later pending event (index
        /// `outbox_events_dead_aggregate`, then `outbox_events_pending_aggregate`).
        const BLOCKED: &str = "SELECT COUNT(*) AS n FROM (SELECT DISTINCT d.aggregate_type, \
             d.aggregate_id FROM outbox_events d WHERE d.dead_at IS NOT NULL \
             AND d.published_at IS NULL \
             AND EXISTS (SELECT 1 FROM outbox_events p WHERE p.aggregate_type = d.aggregate_type \
                 AND p.aggregate_id = d.aggregate_id AND p.seq > d.seq \
                 AND p.published_at IS NULL AND p.dead_at IS NULL)) b";
        const COUNT_DEAD: &str = concat!(
            "SELECT COUNT(*) AS n FROM outbox_events \
             WHERE dead_at IS NOT NULL AND published_at IS NULL",
            filter!()
        );
        const COUNT_PUBLISHED: &str = concat!(
            "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NOT NULL",
            filter!()
        );
        const RETRY: &str = concat!(
            "UPDATE outbox_events SET attempts = 0, dead_at = NULL, available_at = ",
            $retry_now,
            ", locked_by = NULL, locked_until = NULL \
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
            " AND seq > ",
            $after,
            " ORDER BY seq LIMIT ",
            $limit,
            ") s"
        );
        const REPLAY: &str = concat!(
            "UPDATE outbox_events SET published_at = NULL, attempts = 0, available_at = ",
            $replay_now,
            ", locked_by = NULL, locked_until = NULL, last_error = NULL \
             WHERE published_at IS NOT NULL",
            filter!(),
            " AND seq > ",
            $after,
            " AND seq <= ",
            $last
        );
    };
}
pub(crate) use filtered_statements;

/// The "now" of a backend whose statements read the server's clock: nothing to bind.
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
pub(crate) struct ServerClock;

/// `clock` and `stamp` of the backends whose statements read the server's clock
/// (PostgreSQL, MySQL).
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
pub(crate) mod server {
    use diesel::query_builder::{BoxedSqlQuery, SqlQuery};

    use super::ServerClock;

    /// The server reads its own clock.
    pub(crate) fn clock() -> ServerClock {
        ServerClock
    }

    /// Binds nothing: the statements read the server's clock.
    pub(crate) fn stamp<'a, DB: diesel::backend::Backend>(
        q: BoxedSqlQuery<'a, DB, SqlQuery>,
        _now: &ServerClock,
    ) -> BoxedSqlQuery<'a, DB, SqlQuery> {
        q
    }
}

/// Implements [`AdminConnection`] for `$conn` over the statements of the module it is
/// expanded in: the constants `COUNTS`, `BLOCKED`, `RELAYS`, `LEADER`, `STREAM` (`None` where
/// there is no stream mode), `LIST_DEAD`,
/// `COUNT_DEAD`, `COUNT_PUBLISHED`, `RETRY`, `PURGE`, `REPLAY_BOUND` and `REPLAY`, and the
/// functions `bind(sql, filter)` (a boxed query with the filter bound), `clock()` and
/// `stamp(query, &clock)` (the "now" a statement binds: SQLite binds the caller's clock,
/// the servers read their own and `stamp` binds nothing), and `cleanup_query(older_than, limit)`.
///
/// A macro rather than one generic impl: the bodies are the same on every backend, but a
/// generic body over Diesel's backends needs, for each statement, bounds that the boxed
/// query is a `LoadQuery` of its row type on that connection for every lifetime, that each
/// row type is `QueryableByName` on the backend (which unfolds into `FromSql` bounds for
/// each column type), and that the resulting futures are `Send`: a page of where-clauses
/// restating what each backend's concrete types already satisfy, and compile errors from
/// them that name none of the SQL. Each backend file keeps its own SQL and binds; this is
/// the one body they share.
macro_rules! admin_connection {
    ($conn:ty) => {
        impl Sealed for $conn {}

        impl AdminConnection for $conn {
            async fn admin_status(&mut self) -> Result<Status, AdminError> {
                let now = clock();
                let q = stamp(diesel::sql_query(COUNTS).into_boxed(), &now);
                let counts: CountsRow = db("count events", q.get_result(self).await)?;
                let blocked: NRow = db(
                    "count blocked aggregates",
                    diesel::sql_query(BLOCKED).get_result(self).await,
                )?;
                let q = stamp(diesel::sql_query(RELAYS).into_boxed(), &now);
                let relays: Vec<RelayRow> = db("list relays", q.load(self).await)?;
                let q = stamp(diesel::sql_query(LEADER).into_boxed(), &now);
                let leader: Vec<LeaderRow> = db("read the leader", q.load(self).await)?;
                let stream: Option<StreamRow> = match STREAM {
                    Some(sql) => Some(db(
                        "read the stream positions",
                        diesel::sql_query(sql).get_result(self).await,
                    )?),
                    None => None,
                };
                types::status(
                    counts,
                    blocked.n,
                    relays,
                    leader.into_iter().next().map(|l| l.holder),
                    stream,
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

            async fn admin_count(
                &mut self,
                filter: &Filter,
                dead: bool,
            ) -> Result<i64, AdminError> {
                let sql = if dead { COUNT_DEAD } else { COUNT_PUBLISHED };
                let row: NRow = db("count events", bind(sql, filter).get_result(self).await)?;
                Ok(row.n)
            }

            async fn admin_retry(&mut self, filter: &Filter) -> Result<u64, AdminError> {
                let q = stamp(bind(RETRY, filter), &clock());
                db("retry dead letters", q.execute(self).await).map(|n| n as u64)
            }

            async fn admin_purge(&mut self, filter: &Filter) -> Result<u64, AdminError> {
                let q = bind(PURGE, filter);
                db("purge dead letters", q.execute(self).await).map(|n| n as u64)
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
                    .bind::<BigInt, _>(last);
                let q = stamp(q, &clock());
                db("replay events", q.execute(self).await).map(|n| n as u64)
            }

            async fn admin_cleanup(
                &mut self,
                older_than: Duration,
                limit: i64,
            ) -> Result<u64, AdminError> {
                let q = cleanup_query(older_than, limit);
                db("clean up published events", q.execute(self).await).map(|n| n as u64)
            }
        }
    };
}
pub(crate) use admin_connection;
