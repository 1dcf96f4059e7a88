//! [`OutboxBackend`] for MySQL and MariaDB.

use std::time::Duration;

use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Text};
use outbox_core::NewMessage;

use crate::backend::text_id::TextIdRow;
use crate::backend::{OutboxBackend, clamp, limit_of, private};
use crate::migrations::Migration;

impl private::Sealed for diesel::mysql::Mysql {}

#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
impl OutboxBackend for diesel::mysql::Mysql {
    const NAME: &'static str = "mysql";
    const KEEP_EXISTING: &'static str = " ON DUPLICATE KEY UPDATE id = id";
    backend_ops!();
    const MIGRATIONS: &'static [Migration] = crate::migrations::MYSQL;

    fn inbox_claim<'a>(consumer: &'a str, key: &'a str) -> BoxedSqlQuery<'a, Self, SqlQuery> {
        // `processed_at` is given, not defaulted: `CURRENT_TIMESTAMP` follows the session's
        // time zone, the outbox stores UTC.
        diesel::sql_query(
            "INSERT IGNORE INTO outbox_inbox (consumer, message_id, processed_at) \
             VALUES (?, ?, UTC_TIMESTAMP(6))",
        )
        .into_boxed()
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(key)
    }

    fn inbox_cleanup(older_than: Duration, limit: usize) -> BoxedSqlQuery<'static, Self, SqlQuery> {
        diesel::sql_query(
            "DELETE FROM outbox_inbox \
             WHERE processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
             ORDER BY processed_at LIMIT ?",
        )
        .into_boxed()
        .bind::<BigInt, _>(i64::try_from(clamp(older_than).as_micros()).unwrap_or(i64::MAX))
        .bind::<BigInt, _>(limit_of(limit))
    }

    type Rows<'a> = Vec<TextIdRow<chrono::NaiveDateTime>>;

    fn rows(messages: &[NewMessage]) -> Self::Rows<'_> {
        messages
            .iter()
            .map(|m| TextIdRow {
                id: m.id.hyphenated().to_string(),
                headers: m.headers_json(),
                at: m.created_at.naive_utc(),
            })
            .collect()
    }

    fn walk_insert<'a, 'b>(
        messages: &'b [NewMessage],
        rows: &'b Self::Rows<'a>,
        keep_existing: bool,
        out: AstPass<'_, 'b, Self>,
    ) -> diesel::QueryResult<()> {
        crate::backend::insert::walk_values(messages, rows, keep_existing, out, |m, row, out| {
            text_id_row!(m, row, out, diesel::sql_types::Datetime)
        })
    }
}
