//! The admin statements on PostgreSQL. A filter is `$1`..`$8` (see [`bind`]); a `NULL`
//! parameter disables its condition. `sql_query` statements are planned per execution
//! (unnamed, never cached), so PostgreSQL folds the disabled conditions away and uses the
//! `seq` primary key or the partial indexes as the remaining ones allow.

use std::time::Duration;

use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::backend::server::{clock, stamp};
use super::backend::{AdminConnection, Sealed, admin_connection, filtered_statements};
use super::types::{
    self, AdminError, BoundRow, CountsRow, DeadLetter, DeadRow, Filter, LeaderRow, NRow, RelayRow,
    Status, db,
};
use crate::relay::pg::cleanup_query;

macro_rules! filter {
    () => {
        " AND ($1::bigint[] IS NULL OR seq = ANY($1)) \
          AND ($2::bigint IS NULL OR seq >= $2) AND ($3::bigint IS NULL OR seq <= $3) \
          AND ($4::timestamptz IS NULL OR created_at >= $4) \
          AND ($5::timestamptz IS NULL OR created_at < $5) \
          AND ($6::text IS NULL OR aggregate_type = $6) \
          AND ($7::text IS NULL OR aggregate_id = $7) \
          AND ($8::text IS NULL OR event_type = $8)"
    };
}
macro_rules! time {
    ($c:literal) => {
        concat!(
            "to_char(",
            $c,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
        )
    };
}

const COUNTS: &str = concat!(
    "SELECT \
     COUNT(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL) AS pending, \
     COUNT(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL AND locked_until > now()) AS in_flight, \
     COUNT(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL AND attempts > 0 \
         AND available_at > now() AND (locked_until IS NULL OR locked_until <= now())) AS retrying, \
     COUNT(*) FILTER (WHERE dead_at IS NOT NULL AND published_at IS NULL) AS dead, \
     COUNT(*) FILTER (WHERE published_at IS NOT NULL) AS published, ",
    time!("MIN(created_at) FILTER (WHERE published_at IS NULL AND dead_at IS NULL)"),
    " AS oldest_pending, \
     EXTRACT(EPOCH FROM now() - MIN(created_at) FILTER (WHERE published_at IS NULL AND dead_at IS NULL))::float8 \
         AS oldest_pending_age \
     FROM outbox_events"
);
filtered_statements!(
    now: "now()",
    int: "BIGINT",
    session: "CAST(r.session_pid AS TEXT)",
    id: "id::text",
    retry_now: "now()",
    replay_now: "now()",
    after: "$9",
    limit: "$10",
    last: "$10",
);

/// Binds a filter as `$1`..`$8`.
fn bind<'a>(sql: &'static str, f: &'a Filter) -> BoxedSqlQuery<'a, Pg, SqlQuery> {
    diesel::sql_query(sql)
        .into_boxed::<Pg>()
        .bind::<Nullable<Array<BigInt>>, _>(f.seqs.as_deref())
        .bind::<Nullable<BigInt>, _>(f.from_seq)
        .bind::<Nullable<BigInt>, _>(f.to_seq)
        .bind::<Nullable<Timestamptz>, _>(f.since)
        .bind::<Nullable<Timestamptz>, _>(f.until)
        .bind::<Nullable<Text>, _>(f.aggregate_type.as_deref())
        .bind::<Nullable<Text>, _>(f.aggregate_id.as_deref())
        .bind::<Nullable<Text>, _>(f.event_type.as_deref())
}

admin_connection!(AsyncPgConnection);
