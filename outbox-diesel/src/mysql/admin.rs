//! The admin statements on MySQL/MariaDB (times UTC `DATETIME(6)`). MySQL numbers no
//! parameters, so a filter binds each value twice: `(? IS NULL OR column = ?)` (see
//! [`bind`]); a list of `seq`s is bound as one JSON array.

use std::time::Duration;

use diesel::mysql::Mysql;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Datetime, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};

use crate::mysql::relay::cleanup_query;
use crate::relay::admin::connection::server::{clock, stamp};
use crate::relay::admin::connection::{
    AdminConnection, Sealed, admin_connection, filtered_statements,
};
use crate::relay::admin::types::{
    self, AdminError, BoundRow, CountsRow, DeadLetter, DeadRow, Filter, LeaderRow, NRow, RelayRow,
    Sample, Status, StreamRow, db,
};

macro_rules! filter {
    () => {
        " AND (? IS NULL OR JSON_CONTAINS(?, CAST(seq AS CHAR))) \
          AND (? IS NULL OR seq >= ?) AND (? IS NULL OR seq <= ?) \
          AND (? IS NULL OR created_at >= ?) AND (? IS NULL OR created_at < ?) \
          AND (? IS NULL OR aggregate_type = ?) AND (? IS NULL OR aggregate_id = ?) \
          AND (? IS NULL OR event_type = ?)"
    };
}
macro_rules! time {
    ($c:literal) => {
        concat!("DATE_FORMAT(", $c, ", '%Y-%m-%d %H:%i:%s.%f')")
    };
}

const COUNTS: &str = concat!(
    "SELECT \
     CAST(COALESCE(SUM(published_at IS NULL AND dead_at IS NULL), 0) AS SIGNED) AS pending, \
     CAST(COALESCE(SUM(published_at IS NULL AND dead_at IS NULL AND locked_until > UTC_TIMESTAMP(6)), 0) AS SIGNED) AS in_flight, \
     CAST(COALESCE(SUM(published_at IS NULL AND dead_at IS NULL AND attempts > 0 \
         AND available_at > UTC_TIMESTAMP(6) \
         AND (locked_until IS NULL OR locked_until <= UTC_TIMESTAMP(6))), 0) AS SIGNED) AS retrying, \
     CAST(COALESCE(SUM(dead_at IS NOT NULL AND published_at IS NULL), 0) AS SIGNED) AS dead, \
     CAST(COALESCE(SUM(published_at IS NOT NULL), 0) AS SIGNED) AS published, ",
    time!("MIN(CASE WHEN published_at IS NULL AND dead_at IS NULL THEN created_at END)"),
    " AS oldest_pending, \
     CAST(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN published_at IS NULL AND dead_at IS NULL THEN created_at END), \
         UTC_TIMESTAMP(6)) AS DOUBLE) / 1000000.0 AS oldest_pending_age \
     FROM outbox_events"
);
/// Stream mode is PostgreSQL's only.
const STREAM: Option<&str> = None;

filtered_statements!(
    now: "UTC_TIMESTAMP(6)",
    int: "SIGNED",
    session: "r.session_lock",
    id: "id",
    retry_now: "UTC_TIMESTAMP(6)",
    replay_now: "UTC_TIMESTAMP(6)",
    after: "?",
    limit: "?",
    last: "?",
    stream_dead_letters: false, // no stream mode: `STREAM_DEAD` is `None`
);

/// Binds a filter: each value twice, in the order of `filter!`.
fn bind<'a>(sql: &'static str, f: &Filter) -> BoxedSqlQuery<'a, Mysql, SqlQuery> {
    let seqs = f.seqs_json();
    let since = f.since.map(|t| t.naive_utc());
    let until = f.until.map(|t| t.naive_utc());
    diesel::sql_query(sql)
        .into_boxed::<Mysql>()
        .bind::<Nullable<Text>, _>(seqs.clone())
        .bind::<Nullable<Text>, _>(seqs)
        .bind::<Nullable<BigInt>, _>(f.from_seq)
        .bind::<Nullable<BigInt>, _>(f.from_seq)
        .bind::<Nullable<BigInt>, _>(f.to_seq)
        .bind::<Nullable<BigInt>, _>(f.to_seq)
        .bind::<Nullable<Datetime>, _>(since)
        .bind::<Nullable<Datetime>, _>(since)
        .bind::<Nullable<Datetime>, _>(until)
        .bind::<Nullable<Datetime>, _>(until)
        .bind::<Nullable<Text>, _>(f.aggregate_type.clone())
        .bind::<Nullable<Text>, _>(f.aggregate_type.clone())
        .bind::<Nullable<Text>, _>(f.aggregate_id.clone())
        .bind::<Nullable<Text>, _>(f.aggregate_id.clone())
        .bind::<Nullable<Text>, _>(f.event_type.clone())
        .bind::<Nullable<Text>, _>(f.event_type.clone())
}

/// No partitions here (stream mode and its ring are PostgreSQL's).
async fn rotate(
    _: &mut AsyncMysqlConnection,
    _: Duration,
) -> Result<Vec<crate::relay::admin::Rotated>, AdminError> {
    Ok(Vec::new())
}

admin_connection!(AsyncMysqlConnection);

/// The pending events' condition, a prefix of the `outbox_events_pending` index.
macro_rules! pending {
    () => {
        "FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL"
    };
}

/// The sample's counts (a `CountsRow` without `in_flight`, `retrying` and `published`, which
/// need the whole table): ranges of the `outbox_events_pending` index
/// (`published_at, dead_at, seq`), the oldest pending as the lowest pending `seq`.
const SAMPLE: &str = concat!(
    "SELECT (SELECT COUNT(*) ",
    pending!(),
    ") AS pending, \
     CAST(0 AS SIGNED) AS in_flight, CAST(0 AS SIGNED) AS retrying, \
     (SELECT COUNT(*) FROM outbox_events WHERE published_at IS NULL AND dead_at IS NOT NULL) AS dead, \
     CAST(0 AS SIGNED) AS published, \
     (SELECT ",
    time!("created_at"),
    " ",
    pending!(),
    " ORDER BY seq LIMIT 1) AS oldest_pending, \
     (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS DOUBLE) / 1000000.0 ",
    pending!(),
    " ORDER BY seq LIMIT 1) AS oldest_pending_age"
);

#[derive(diesel::QueryableByName)]
struct VersionRow {
    #[diesel(sql_type = Text)]
    version: String,
}

/// [`Admin::sample`](crate::relay::admin::Admin::sample) on MySQL and MariaDB: each statement limited on
/// its own, with no session state left behind: MariaDB's `SET STATEMENT max_statement_time
/// = s FOR …`, MySQL's `MAX_EXECUTION_TIME(ms)` optimizer hint.
async fn sample(conn: &mut AsyncMysqlConnection, timeout: Duration) -> Result<Sample, AdminError> {
    let version: VersionRow = db(
        "read the server version",
        diesel::sql_query("SELECT VERSION() AS version")
            .get_result(conn)
            .await,
    )?;
    let ms = timeout.as_millis().clamp(1, u128::from(u32::MAX));
    let limited = |sql: &str| {
        if version.version.contains("MariaDB") {
            format!(
                "SET STATEMENT max_statement_time = {}.{:03} FOR {sql}",
                ms / 1000,
                ms % 1000
            )
        } else {
            sql.replacen(
                "SELECT",
                &format!("SELECT /*+ MAX_EXECUTION_TIME({ms}) */"),
                1,
            )
        }
    };
    let counts: CountsRow = db(
        "sample the backlog",
        diesel::sql_query(limited(SAMPLE)).get_result(conn).await,
    )?;
    let blocked: NRow = db(
        "sample the blocked aggregates",
        diesel::sql_query(limited(BLOCKED)).get_result(conn).await,
    )?;
    types::sample(counts, blocked.n, None)
}
