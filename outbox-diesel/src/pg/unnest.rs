//! PostgreSQL's outbox `INSERT`: up to [`CACHED_ROWS`] rows the multi-row `VALUES` statement
//! the other backends write (cached per row count); above that one statement whatever the
//! number of rows, each column bound as one array and turned back into rows by `unnest`.
//!
//! The cached `VALUES` statement is the cheaper one for a few rows (no arrays to build and
//! unpack); past 16 rows it is prepared anew for every transaction and its 11 binds per row
//! cost more than ten arrays, so the arrays take over there. Measured:
//! `docs/design/write-path.md`, section "The outbox `INSERT` on PostgreSQL".

use diesel::pg::Pg;
use diesel::query_builder::AstPass;
use diesel::sql_types::{Array, Integer, Nullable, SmallInt, Text, Timestamptz, Uuid};
use outbox_core::NewMessage;

use crate::backend::insert::{CACHED_ROWS, INSERT_COLUMNS, walk_values};
use crate::backend::{OUTBOX_TABLE, OutboxBackend};

/// What follows `INSERT INTO outbox_events (columns)` up to the arrays. `unnest` of several
/// arrays is a function scan that yields its rows in array order, so `seq` (a sequence default,
/// drawn as the rows are inserted) follows the order of the messages, which per-aggregate order
/// relies on. `available_at` is `created_at`.
const SELECT_UNNEST: &str = ") SELECT id, aggregate_type, aggregate_id, event_type, \
     event_version, CAST(payload AS jsonb), CAST(headers AS jsonb), topic, shard, created_at, \
     created_at FROM unnest(";

/// The names of `unnest`'s columns, after the arrays.
const UNNEST_AS: &str = ") AS r(id, aggregate_type, aggregate_id, event_type, event_version, \
     payload, headers, topic, shard, created_at)";

/// The columns of an `INSERT` of more than [`CACHED_ROWS`] rows, one array each (text borrowed
/// from the messages, the headers serialised).
#[doc(hidden)]
pub struct PgColumns<'a> {
    id: Vec<uuid::Uuid>,
    aggregate_type: Vec<&'a str>,
    aggregate_id: Vec<&'a str>,
    event_type: Vec<&'a str>,
    event_version: Vec<i32>,
    payload: Vec<&'a str>,
    headers: Vec<String>,
    topic: Vec<Option<&'a str>>,
    shard: Vec<i16>,
    created_at: Vec<chrono::DateTime<chrono::Utc>>,
}

/// What PostgreSQL binds for one `INSERT`: the headers of each row for `VALUES`, or the columns
/// as arrays.
#[doc(hidden)]
pub enum PgRows<'a> {
    /// Up to [`CACHED_ROWS`] rows: each row's headers as JSON.
    Values(Vec<String>),
    /// More rows: the arrays (boxed: ten vectors, against one for `Values`).
    Arrays(Box<PgColumns<'a>>),
}

impl<'a> PgRows<'a> {
    pub(super) fn new(messages: &'a [NewMessage]) -> Self {
        if messages.len() <= CACHED_ROWS {
            PgRows::Values(messages.iter().map(NewMessage::headers_json).collect())
        } else {
            PgRows::Arrays(Box::new(PgColumns::new(messages)))
        }
    }
}

/// The `INSERT` of `messages`: `VALUES` up to [`CACHED_ROWS`] rows, arrays above.
pub(super) fn walk_insert<'b>(
    messages: &'b [NewMessage],
    rows: &'b PgRows<'_>,
    keep_existing: bool,
    out: AstPass<'_, 'b, Pg>,
) -> diesel::QueryResult<()> {
    match rows {
        PgRows::Values(headers) => {
            walk_values(messages, headers, keep_existing, out, |m, headers, out| {
                out.push_sql("(");
                out.push_bind_param::<Uuid, _>(&m.id)?;
                bind_common!(&mut *out, m, headers, "CAST(", " AS jsonb)");
                out.push_sql(", ");
                out.push_bind_param::<Timestamptz, _>(&m.created_at)?;
                out.push_sql(", ");
                out.push_bind_param::<Timestamptz, _>(&m.created_at)?;
                out.push_sql(")");
                Ok(())
            })
        }
        PgRows::Arrays(columns) => walk_unnest(columns, keep_existing, out),
    }
}

impl<'a> PgColumns<'a> {
    fn new(messages: &'a [NewMessage]) -> Self {
        let column = |f: fn(&'a NewMessage) -> &'a str| messages.iter().map(f).collect();
        PgColumns {
            id: messages.iter().map(|m| m.id).collect(),
            aggregate_type: column(|m| &m.aggregate_type),
            aggregate_id: column(|m| &m.aggregate_id),
            event_type: column(|m| &m.event_type),
            event_version: messages.iter().map(|m| m.event_version).collect(),
            payload: column(|m| &m.payload),
            headers: messages.iter().map(NewMessage::headers_json).collect(),
            topic: messages.iter().map(|m| m.topic.as_deref()).collect(),
            shard: messages.iter().map(|m| m.shard).collect(),
            created_at: messages.iter().map(|m| m.created_at).collect(),
        }
    }
}

/// `INSERT INTO outbox_events (...) SELECT ... FROM unnest($1, ..., $10) AS r(...)`, with
/// `ON CONFLICT DO NOTHING` when `keep_existing`: two statements in all, both cached.
fn walk_unnest<'b>(
    c: &'b PgColumns<'_>,
    keep_existing: bool,
    mut out: AstPass<'_, 'b, Pg>,
) -> diesel::QueryResult<()> {
    out.push_sql("INSERT INTO ");
    out.push_sql(OUTBOX_TABLE);
    out.push_sql(" (");
    out.push_sql(INSERT_COLUMNS);
    out.push_sql(SELECT_UNNEST);
    out.push_bind_param::<Array<Uuid>, _>(&c.id)?;
    for text in [&c.aggregate_type, &c.aggregate_id, &c.event_type] {
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(text)?;
    }
    out.push_sql(", ");
    out.push_bind_param::<Array<Integer>, _>(&c.event_version)?;
    out.push_sql(", ");
    out.push_bind_param::<Array<Text>, _>(&c.payload)?;
    out.push_sql(", ");
    out.push_bind_param::<Array<Text>, _>(&c.headers)?;
    out.push_sql(", ");
    out.push_bind_param::<Array<Nullable<Text>>, _>(&c.topic)?;
    out.push_sql(", ");
    out.push_bind_param::<Array<SmallInt>, _>(&c.shard)?;
    out.push_sql(", ");
    out.push_bind_param::<Array<Timestamptz>, _>(&c.created_at)?;
    out.push_sql(UNNEST_AS);
    if keep_existing {
        out.push_sql(<Pg as OutboxBackend>::KEEP_EXISTING);
    }
    Ok(())
}
