//! [`OutboxBackend`] for SQLite.

use std::time::Duration;

use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Text};
use outbox_core::NewMessage;

use crate::backend::text_id::TextIdRow;
use crate::backend::{OutboxBackend, clamp, limit_of, private};
use crate::migrations::Migration;

impl private::Sealed for diesel::sqlite::Sqlite {}

#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl OutboxBackend for diesel::sqlite::Sqlite {
    const NAME: &'static str = "sqlite";
    const KEEP_EXISTING: &'static str = " ON CONFLICT (id) DO NOTHING";
    backend_ops!();
    const MIGRATIONS: &'static [Migration] = crate::migrations::SQLITE;

    fn inbox_claim<'a>(consumer: &'a str, key: &'a str) -> BoxedSqlQuery<'a, Self, SqlQuery> {
        diesel::sql_query("INSERT OR IGNORE INTO outbox_inbox (consumer, message_id) VALUES (?, ?)")
            .into_boxed()
            .bind::<Text, _>(consumer)
            .bind::<Text, _>(key)
    }

    fn inbox_cleanup(older_than: Duration, limit: usize) -> BoxedSqlQuery<'static, Self, SqlQuery> {
        let now = outbox_core::now_micros();
        let cutoff = chrono::Duration::from_std(clamp(older_than))
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .unwrap_or(now);
        diesel::sql_query(
            "DELETE FROM outbox_inbox WHERE rowid IN ( \
                 SELECT rowid FROM outbox_inbox WHERE processed_at < ? \
                 ORDER BY processed_at LIMIT ?)",
        )
        .into_boxed()
        .bind::<Text, _>(sqlite_timestamp(cutoff))
        .bind::<BigInt, _>(limit_of(limit))
    }

    type Rows<'a> = Vec<TextIdRow<String>>;

    fn rows(messages: &[NewMessage]) -> Self::Rows<'_> {
        messages
            .iter()
            .map(|m| TextIdRow {
                id: m.id.hyphenated().to_string(),
                headers: m.headers_json(),
                at: sqlite_timestamp(m.created_at),
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
            text_id_row!(m, row, out, Text)
        })
    }
}

/// SQLite has no timestamp type: the outbox stores UTC as `YYYY-MM-DD HH:MM:SS.ffffff`, always
/// with six fraction digits so that text order is time order. Diesel reads it back as a
/// `Timestamp`.
pub(crate) fn sqlite_timestamp(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
}
