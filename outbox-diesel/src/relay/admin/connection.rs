//! The connection types the admin API runs on; each backend's file implements them with its
//! own SQL.

use std::future::Future;
use std::time::Duration;

use super::types::{AdminError, DeadLetter, Filter, Sample, Status};

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
    /// The gauges' figures, each statement limited to `timeout`.
    #[doc(hidden)]
    fn admin_sample(
        &mut self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Sample, AdminError>> + Send;
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
    fn admin_rotate(
        &mut self,
        keep: Duration,
    ) -> impl Future<Output = Result<Vec<crate::relay::admin::Rotated>, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_cleanup(
        &mut self,
        older_than: Duration,
        limit: i64,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
}

/// Stream mode's dead-letter statements (PostgreSQL): [`filtered_statements!`]'s
/// `STREAM_DEAD`, `None` on a backend without stream mode. Each covers the lease modes' dead
/// rows and stream mode's dead letters (rows of `outbox_stream_dead_letters` with
/// `parked_behind IS NULL`; parked rows are not dead letters, as the events a lease-mode dead
/// letter holds back are simply pending).
pub(crate) struct StreamDeadStatements {
    /// `LIST_DEAD` `UNION ALL` the stream dead letters: one statement, one `ORDER BY seq
    /// LIMIT` over both, parameters as `LIST_DEAD`'s.
    pub list: &'static str,
    /// `COUNT_DEAD` plus the stream dead letters, in one statement.
    pub count: &'static str,
    /// Asks for a retry of the stream dead letters not asked for yet (`retry_requested_at`,
    /// `attempts = 0`): the stream relay then releases their aggregates. Runs after `RETRY`,
    /// in its transaction; binds the filter, then the retry's now as `RETRY` does.
    pub retry: &'static str,
    /// Deletes the stream dead letters (never a parked row: the stream relay then releases
    /// their aggregates' parked events). Runs after `PURGE`, in its transaction.
    pub purge: &'static str,
    /// While stream mode is in use (see `stream_in_use!`), retries the lease modes' dead rows
    /// through the stream: copies them into `outbox_stream_dead_letters`, retry-requested, and
    /// marks their event rows published (no relay reads them again; the copy is what the
    /// stream relay holding their shard releases, in order). A dead row made pending in place
    /// could be passed by a position the stream relay is about to write, and never be read.
    /// Runs before `RETRY` (which then finds none of them), in its transaction; binds the
    /// filter.
    pub retry_stream: &'static str,
    /// `REPLAY_BOUND` over what stream mode published too: rows a position passed that are
    /// not dead (`published_at` stays NULL in stream mode) and are not in
    /// `outbox_stream_dead_letters`.
    pub replay_bound: &'static str,
    /// `REPLAY` that republishes through the relay that will see each row: while stream mode
    /// is in use (see `stream_in_use!`), the rows are copied into
    /// `outbox_stream_dead_letters`, retry-requested (the stream relay releases them, in
    /// order per aggregate, parking the aggregate's newer events behind them; a row made
    /// pending in place could be passed by a position about to be written, and never read);
    /// otherwise they are made pending again, as `REPLAY` does. Returns the count as `n`.
    pub replay: &'static str,
}

/// The columns `outbox_stream_dead_letters` copies from `outbox_events`, for the copies a
/// retry or a replay in stream mode makes (their `attempts`, `last_error` and
/// `retry_requested_at` follow).
#[cfg(feature = "postgres_backend")]
macro_rules! stream_copy {
    () => {
        "INSERT INTO outbox_stream_dead_letters (seq, id, aggregate_type, aggregate_id, \
         event_type, event_version, payload, headers, topic, shard, created_at, attempts, \
         last_error, retry_requested_at) \
         SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.event_version, \
         o.payload, o.headers, o.topic, o.shard, o.created_at, 0, "
    };
}
#[cfg(feature = "postgres_backend")]
pub(crate) use stream_copy;

/// The rows of `outbox_events` a replay selects where there is stream mode: published by a
/// lease mode, or passed by a stream position and not dead, and not in the stream's dead
/// letters already. The bound of a replay batch and the batch itself select by it.
#[cfg(feature = "postgres_backend")]
macro_rules! replayable {
    () => {
        concat!(
            "(published_at IS NOT NULL OR (dead_at IS NULL AND ",
            $crate::pg::relay::handover::passed!(),
            ")) AND NOT EXISTS (SELECT 1 FROM outbox_stream_dead_letters d \
             WHERE d.seq = outbox_events.seq)"
        )
    };
}
#[cfg(feature = "postgres_backend")]
pub(crate) use replayable;

/// Defines the admin statements whose text is the same on every backend but for the filter
/// and the text of a time column (the backend's `filter!()` and `time!(column)`, expanded
/// where this is), the time they take as now (`now`, `retry_now`, `replay_now`: SQLite binds
/// it, `?1`, `?9` and `?11`), the placeholders of their own parameters (`after`, `limit`,
/// `last`), the integer type a count is cast to (`int`), and the relay's session and the
/// event's id as text (`session`, `id`).
///
/// `stream_dead_letters: true` (PostgreSQL) also defines `STREAM_DEAD` as `Some` of the
/// statements over stream mode's dead letters ([`StreamDeadStatements`]); `false` defines it
/// as `None`. They are written here, not in the backend's file as `STREAM` is, because the
/// list and the count are one statement over both tables (a page is one `ORDER BY seq LIMIT`
/// of the union, read in one snapshot), so they need the lease statements' text, which only
/// exists here: the `@`-rules below give it as literals to both `LIST_DEAD`/`COUNT_DEAD` and
/// the union (`concat!` takes literals, not constants). The table's columns are named as
/// `outbox_events`'s, so the same `filter!()` and `time!()` apply.
macro_rules! filtered_statements {
    (
        @list_dead id: $id:literal, int: $int:literal, after: $after:literal, limit: $limit:literal
    ) => {
        concat!(
            "SELECT seq, ",
            $id,
            " AS id, aggregate_type, aggregate_id, event_type, event_version, topic, attempts, ",
            time!("created_at"),
            " AS created_at, ",
            time!("dead_at"),
            " AS dead_at, last_error, NULL AS retry_requested_at, CAST(0 AS ",
            $int,
            ") AS stream FROM outbox_events \
             WHERE dead_at IS NOT NULL AND published_at IS NULL",
            filter!(),
            " AND seq > ",
            $after,
            " ORDER BY seq LIMIT ",
            $limit
        )
    };
    (@count_dead) => {
        concat!(
            "SELECT COUNT(*) AS n FROM outbox_events \
             WHERE dead_at IS NOT NULL AND published_at IS NULL",
            filter!()
        )
    };
    (@stream_dead false, $($unused:tt)*) => {
        None
    };
    (
        @stream_dead true,
        id: $id:literal,
        int: $int:literal,
        retry_now: $retry_now:literal,
        after: $after:literal,
        limit: $limit:literal,
        last: $last:literal
    ) => {
        Some($crate::relay::admin::connection::StreamDeadStatements {
            list: concat!(
                "(",
                filtered_statements!(@list_dead id: $id, int: $int, after: $after, limit: $limit),
                ") UNION ALL (SELECT seq, ",
                $id,
                " AS id, aggregate_type, aggregate_id, event_type, event_version, topic, \
                 attempts, ",
                time!("created_at"),
                " AS created_at, ",
                time!("dead_at"),
                " AS dead_at, last_error, ",
                time!("retry_requested_at"),
                " AS retry_requested_at, CAST(1 AS ",
                $int,
                ") AS stream FROM outbox_stream_dead_letters WHERE parked_behind IS NULL",
                filter!(),
                " AND seq > ",
                $after,
                " ORDER BY seq LIMIT ",
                $limit,
                ") ORDER BY seq LIMIT ",
                $limit
            ),
            count: concat!(
                "SELECT (",
                filtered_statements!(@count_dead),
                ") + (SELECT COUNT(*) FROM outbox_stream_dead_letters \
                 WHERE parked_behind IS NULL",
                filter!(),
                ") AS n"
            ),
            retry: concat!(
                "UPDATE outbox_stream_dead_letters SET retry_requested_at = ",
                $retry_now,
                ", attempts = 0 WHERE parked_behind IS NULL AND retry_requested_at IS NULL",
                filter!()
            ),
            purge: concat!(
                "DELETE FROM outbox_stream_dead_letters WHERE parked_behind IS NULL",
                filter!()
            ),
            retry_stream: concat!(
                "WITH sel AS MATERIALIZED (SELECT seq FROM outbox_events \
                 WHERE dead_at IS NOT NULL AND published_at IS NULL AND ",
                $crate::pg::relay::handover::stream_in_use!(),
                " AND NOT EXISTS (SELECT 1 FROM outbox_stream_dead_letters d \
                 WHERE d.seq = outbox_events.seq)",
                filter!(),
                "), copied AS (",
                $crate::relay::admin::connection::stream_copy!(),
                "o.last_error, ",
                $retry_now,
                " FROM outbox_events o JOIN sel s ON s.seq = o.seq \
                 ON CONFLICT DO NOTHING RETURNING seq) \
                 UPDATE outbox_events SET published_at = ",
                $retry_now,
                ", dead_at = NULL, locked_by = NULL, locked_until = NULL \
                 WHERE seq IN (SELECT seq FROM copied)"
            ),
            replay_bound: concat!(
                "SELECT MAX(seq) AS last FROM (SELECT seq FROM outbox_events \
                 WHERE ",
                $crate::relay::admin::connection::replayable!(),
                filter!(),
                " AND seq > ",
                $after,
                " ORDER BY seq LIMIT ",
                $limit,
                ") s"
            ),
            replay: concat!(
                "WITH stream AS MATERIALIZED (SELECT ",
                $crate::pg::relay::handover::stream_in_use!(),
                " AS in_use), \
                 sel AS MATERIALIZED (SELECT seq FROM outbox_events \
                 WHERE ",
                $crate::relay::admin::connection::replayable!(),
                filter!(),
                " AND seq > ",
                $after,
                " AND seq <= ",
                $last,
                "), copied AS (",
                $crate::relay::admin::connection::stream_copy!(),
                "'replayed', ",
                $retry_now,
                " FROM outbox_events o JOIN sel s ON s.seq = o.seq \
                 WHERE (SELECT in_use FROM stream) \
                 ON CONFLICT DO NOTHING RETURNING seq), \
                 reset AS (UPDATE outbox_events SET published_at = NULL, attempts = 0, \
                 available_at = ",
                $retry_now,
                ", locked_by = NULL, locked_until = NULL, last_error = NULL \
                 WHERE seq IN (SELECT seq FROM sel) AND NOT (SELECT in_use FROM stream) \
                 RETURNING seq) \
                 SELECT (SELECT COUNT(*) FROM copied) + (SELECT COUNT(*) FROM reset) AS n"
            ),
        })
    };
    (
        now: $now:literal,
        int: $int:literal,
        session: $session:literal,
        id: $id:literal,
        retry_now: $retry_now:literal,
        replay_now: $replay_now:literal,
        after: $after:literal,
        limit: $limit:literal,
        last: $last:literal,
        stream_dead_letters: $stream_dead:tt $(,)?
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
        /// The lease modes' dead rows (`retry_requested_at` NULL, `stream` 0: the columns of
        /// stream mode's dead letters in `STREAM_DEAD.list`).
        const LIST_DEAD: &str =
            filtered_statements!(@list_dead id: $id, int: $int, after: $after, limit: $limit);
        /// Aggregates whose dead letter holds back a later pending event (index
        /// `outbox_events_dead_aggregate`, then `outbox_events_pending_aggregate`).
        const BLOCKED: &str = "SELECT COUNT(*) AS n FROM (SELECT DISTINCT d.aggregate_type, \
             d.aggregate_id FROM outbox_events d WHERE d.dead_at IS NOT NULL \
             AND d.published_at IS NULL \
             AND EXISTS (SELECT 1 FROM outbox_events p WHERE p.aggregate_type = d.aggregate_type \
                 AND p.aggregate_id = d.aggregate_id AND p.seq > d.seq \
                 AND p.published_at IS NULL AND p.dead_at IS NULL)) b";
        const COUNT_DEAD: &str = filtered_statements!(@count_dead);
        /// Stream mode's dead letters, where there is stream mode (see
        /// `StreamDeadStatements`).
        const STREAM_DEAD: Option<$crate::relay::admin::connection::StreamDeadStatements> =
            filtered_statements!(
                @stream_dead $stream_dead,
                id: $id,
                int: $int,
                retry_now: $retry_now,
                after: $after,
                limit: $limit,
                last: $last
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
/// expanded in: the constants `COUNTS`, `BLOCKED`, `RELAYS`, `LEADER`, `STREAM` and
/// `STREAM_DEAD` (`None` where there is no stream mode), `LIST_DEAD`,
/// `COUNT_DEAD`, `COUNT_PUBLISHED`, `RETRY`, `PURGE`, `REPLAY_BOUND` and `REPLAY`, and the
/// functions `bind(sql, filter)` (a boxed query with the filter bound), `clock()` and
/// `stamp(query, &clock)` (the "now" a statement binds: SQLite binds the caller's clock,
/// the servers read their own and `stamp` binds nothing), `cleanup_query(older_than, limit)`,
/// and `rotate(conn, keep)` (PostgreSQL empties its partitions, the others have none).
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

            async fn admin_sample(&mut self, timeout: Duration) -> Result<Sample, AdminError> {
                sample(self, timeout).await
            }

            async fn admin_dead(
                &mut self,
                filter: &Filter,
                after_seq: i64,
                limit: i64,
            ) -> Result<Vec<DeadLetter>, AdminError> {
                let sql = STREAM_DEAD.as_ref().map_or(LIST_DEAD, |s| s.list);
                let q = bind(sql, filter)
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
                let sql = match (dead, &STREAM_DEAD) {
                    (true, Some(s)) => s.count,
                    (true, None) => COUNT_DEAD,
                    (false, _) => COUNT_PUBLISHED,
                };
                let row: NRow = db("count events", bind(sql, filter).get_result(self).await)?;
                Ok(row.n)
            }

            async fn admin_retry(&mut self, filter: &Filter) -> Result<u64, AdminError> {
                let now = clock();
                let Some(stream) = &STREAM_DEAD else {
                    let q = stamp(bind(RETRY, filter), &now);
                    return db("retry dead letters", q.execute(self).await).map(|n| n as u64);
                };
                // Both kinds in one transaction: a retry is all or nothing.
                let (now, stream_retry, retry_stream) = (&now, stream.retry, stream.retry_stream);
                let n = diesel_async::AsyncConnection::transaction(self, async |conn| {
                    let copied = stamp(bind(retry_stream, filter), now).execute(conn).await?;
                    let lease = stamp(bind(RETRY, filter), now).execute(conn).await?;
                    let stream = stamp(bind(stream_retry, filter), now).execute(conn).await?;
                    Ok::<_, diesel::result::Error>(copied + lease + stream)
                })
                .await;
                db("retry dead letters", n).map(|n| n as u64)
            }

            async fn admin_purge(&mut self, filter: &Filter) -> Result<u64, AdminError> {
                let Some(stream) = &STREAM_DEAD else {
                    let q = bind(PURGE, filter);
                    return db("purge dead letters", q.execute(self).await).map(|n| n as u64);
                };
                // Both kinds in one transaction: a purge is all or nothing.
                let stream_purge = stream.purge;
                let n = diesel_async::AsyncConnection::transaction(self, async |conn| {
                    let lease = bind(PURGE, filter).execute(conn).await?;
                    let stream = bind(stream_purge, filter).execute(conn).await?;
                    Ok::<_, diesel::result::Error>(lease + stream)
                })
                .await;
                db("purge dead letters", n).map(|n| n as u64)
            }

            async fn admin_replay_bound(
                &mut self,
                filter: &Filter,
                after: i64,
                limit: i64,
            ) -> Result<Option<i64>, AdminError> {
                let sql = STREAM_DEAD
                    .as_ref()
                    .map_or(REPLAY_BOUND, |s| s.replay_bound);
                let q = bind(sql, filter)
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
                let sql = STREAM_DEAD.as_ref().map_or(REPLAY, |s| s.replay);
                let q = bind(sql, filter)
                    .bind::<BigInt, _>(after)
                    .bind::<BigInt, _>(last);
                let q = stamp(q, &clock());
                if STREAM_DEAD.is_none() {
                    return db("replay events", q.execute(self).await).map(|n| n as u64);
                }
                let row: NRow = db("replay events", q.get_result(self).await)?;
                Ok(row.n as u64)
            }

            async fn admin_rotate(
                &mut self,
                keep: Duration,
            ) -> Result<Vec<crate::relay::admin::Rotated>, AdminError> {
                rotate(self, keep).await
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
