//! [`OutboxBackend`] for PostgreSQL.

use std::time::Duration;

use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Text};
use outbox_core::NewMessage;

use crate::backend::{OutboxBackend, clamp, limit_of, private};
use crate::migrations::Migration;

impl private::Sealed for diesel::pg::Pg {}

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl OutboxBackend for diesel::pg::Pg {
    const NAME: &'static str = "postgres";
    // No conflict target: on the plain table the only other unique key is the generated
    // `seq`, and on a partitioned one (`Admin::partition_events`) the unique key is
    // `(id, slot)`, which a target of `(id)` would not name (a transaction's rows share a
    // slot, so the rows this skips are found all the same).
    const KEEP_EXISTING: &'static str = " ON CONFLICT DO NOTHING";
    const NOTIFY_SQL: Option<&'static str> = Some("SELECT pg_notify('outbox_events', '')");
    backend_ops!();
    const MIGRATIONS: &'static [Migration] = crate::migrations::POSTGRES;

    fn inbox_claim<'a>(consumer: &'a str, key: &'a str) -> BoxedSqlQuery<'a, Self, SqlQuery> {
        diesel::sql_query(
            "INSERT INTO outbox_inbox (consumer, message_id) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING",
        )
        .into_boxed()
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(key)
    }

    fn inbox_cleanup(older_than: Duration, limit: usize) -> BoxedSqlQuery<'static, Self, SqlQuery> {
        // The key columns, not `ctid`: a row updated meanwhile would move.
        diesel::sql_query(
            "DELETE FROM outbox_inbox i USING ( \
                 SELECT consumer, message_id FROM outbox_inbox \
                 WHERE processed_at < now() - make_interval(secs => $1) \
                 ORDER BY processed_at LIMIT $2) old \
             WHERE i.consumer = old.consumer AND i.message_id = old.message_id",
        )
        .into_boxed()
        .bind::<diesel::sql_types::Double, _>(clamp(older_than).as_secs_f64())
        .bind::<BigInt, _>(limit_of(limit))
    }

    type Rows<'a> = super::unnest::PgRows<'a>;

    fn rows(messages: &[NewMessage]) -> Self::Rows<'_> {
        super::unnest::PgRows::new(messages)
    }

    fn walk_insert<'a, 'b>(
        messages: &'b [NewMessage],
        rows: &'b Self::Rows<'a>,
        keep_existing: bool,
        out: AstPass<'_, 'b, Self>,
    ) -> diesel::QueryResult<()> {
        super::unnest::walk_insert(messages, rows, keep_existing, out)
    }
}
