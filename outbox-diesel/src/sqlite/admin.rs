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

use crate::relay::admin::connection::{
    AdminConnection, Sealed, admin_connection, filtered_statements,
};
use crate::relay::admin::types::{
    self, AdminError, BoundRow, CountsRow, DeadLetter, DeadRow, Filter, LeaderRow, NRow, RelayRow,
    Sample, Status, StreamRow, db,
};
use crate::sqlite::relay::cleanup_query;
use crate::sqlite::sqlite_timestamp;

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
/// SQLite stores times as the text the other backends' `time!` formats theirs to.
macro_rules! time {
    ($c:literal) => {
        $c
    };
}

// SQLite relays record no session.
/// Stream mode is PostgreSQL's only.
const STREAM: Option<&str> = None;

filtered_statements!(
    now: "?1",
    int: "INTEGER",
    session: "NULL",
    id: "id",
    retry_now: "?9",
    replay_now: "?11",
    after: "?9",
    limit: "?10",
    last: "?10",
    stream_dead_letters: false, // no stream mode: `STREAM_DEAD` is `None`
);

type Conn = SyncConnectionWrapper<SqliteConnection>;

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

/// The caller's clock, as the statements bind it.
fn clock() -> String {
    sqlite_timestamp(Utc::now())
}

/// Binds `now` as the statement's next parameter.
fn stamp<'a>(
    q: BoxedSqlQuery<'a, Sqlite, SqlQuery>,
    now: &str,
) -> BoxedSqlQuery<'a, Sqlite, SqlQuery> {
    q.bind::<Text, _>(now.to_owned())
}

/// No partitions here (stream mode and its ring are PostgreSQL's).
async fn rotate(
    _: &mut Conn,
    _: Duration,
) -> Result<Vec<crate::relay::admin::Rotated>, AdminError> {
    Ok(Vec::new())
}

admin_connection!(Conn);

/// [`Admin::sample`](crate::relay::admin::Admin::sample) on SQLite: the status's figures. An embedded
/// database has no statement timeout to set, and its one relay shares the file with nobody
/// whose statements the sample could hold up for long.
async fn sample(conn: &mut Conn, _timeout: Duration) -> Result<Sample, AdminError> {
    conn.admin_status().await.map(Sample::from)
}
