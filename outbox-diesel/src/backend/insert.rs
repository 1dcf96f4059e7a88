//! The multi-row `INSERT` every backend writes the outbox with.

use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use outbox_core::NewMessage;

use super::{OUTBOX_TABLE, OutboxBackend, ROWS_PER_INSERT};

/// Columns written on insert, in bind order.
pub(crate) const INSERT_COLUMNS: &str = "id, aggregate_type, aggregate_id, event_type, \
     event_version, payload, headers, topic, shard, created_at, available_at";

/// Multi-row `VALUES` statements of up to this many rows keep their prepared statement in
/// Diesel's per-connection cache (one entry per row count): a transaction's `INSERT` is then
/// parsed and planned once per connection instead of once per transaction. Larger ones are
/// prepared each time (PostgreSQL writes those with arrays instead, see `pg_unnest`).
pub(crate) const CACHED_ROWS: usize = 16;

/// The `INSERT` of a chunk of messages as a Diesel query; each backend writes its SQL
/// ([`OutboxBackend::walk_insert`]). The SQL holds only placeholders (every value travels as a
/// bind parameter), so Diesel may cache it by its SQL; `diesel::sql_query` never is.
pub(crate) struct InsertMessages<'a, DB: OutboxBackend> {
    messages: &'a [NewMessage],
    rows: DB::Rows<'a>,
    keep_existing: bool,
}

impl<'a, DB: OutboxBackend> InsertMessages<'a, DB> {
    pub(crate) fn new(messages: &'a [NewMessage]) -> Self {
        InsertMessages {
            messages,
            rows: DB::rows(messages),
            keep_existing: false,
        }
    }

    /// Skip rows whose id is already stored (`ON CONFLICT (id) DO NOTHING` or MySQL's twin).
    pub(crate) fn keep_existing(mut self, keep: bool) -> Self {
        self.keep_existing = keep;
        self
    }
}

impl<DB: OutboxBackend> QueryFragment<DB> for InsertMessages<'_, DB> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> diesel::QueryResult<()> {
        DB::walk_insert(self.messages, &self.rows, self.keep_existing, out)
    }
}

/// `INSERT INTO outbox_events (...) VALUES (row), (row), ...`, `walk_row` writing each row: the
/// statement of the backends without array parameters (MySQL, SQLite), and PostgreSQL's up to
/// [`CACHED_ROWS`] rows. Its SQL depends on the number of rows; up to [`CACHED_ROWS`] rows it
/// is cached.
pub(crate) fn walk_values<'b, DB, R, F>(
    messages: &'b [NewMessage],
    rows: &'b [R],
    keep_existing: bool,
    mut out: AstPass<'_, 'b, DB>,
    mut walk_row: F,
) -> diesel::QueryResult<()>
where
    DB: OutboxBackend,
    F: FnMut(&'b NewMessage, &'b R, &mut AstPass<'_, 'b, DB>) -> diesel::QueryResult<()>,
{
    if messages.len() > CACHED_ROWS {
        out.unsafe_to_cache_prepared();
    }
    out.push_sql("INSERT INTO ");
    out.push_sql(OUTBOX_TABLE);
    out.push_sql(" (");
    out.push_sql(INSERT_COLUMNS);
    out.push_sql(") VALUES ");
    for (i, (message, row)) in messages.iter().zip(rows).enumerate() {
        if i > 0 {
            out.push_sql(", ");
        }
        walk_row(message, row, &mut out)?;
    }
    if keep_existing {
        out.push_sql(DB::KEEP_EXISTING);
    }
    Ok(())
}

impl<DB: OutboxBackend> QueryId for InsertMessages<'_, DB> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: OutboxBackend, Conn> diesel::RunQueryDsl<Conn> for InsertMessages<'_, DB> {}

/// The `INSERT`s that write `messages`: one per [`ROWS_PER_INSERT`] rows.
pub(crate) fn inserts<DB: OutboxBackend>(
    messages: &[NewMessage],
    keep_existing: bool,
) -> impl Iterator<Item = InsertMessages<'_, DB>> {
    messages
        .chunks(ROWS_PER_INSERT)
        .map(move |chunk| InsertMessages::new(chunk).keep_existing(keep_existing))
}

/// The statement that wakes relays, when this backend has one and the throttle lets this
/// transaction notify (see [`crate::notify`]).
pub(crate) fn notify<DB: OutboxBackend>() -> Option<diesel::query_builder::SqlQuery> {
    DB::NOTIFY_SQL
        .filter(|_| crate::notify::due())
        .map(diesel::sql_query)
}
