//! The rows relay statements return, as every backend reads them.

#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
use diesel::QueryableByName;
use outbox_core::relay::{Failure, OutboxMessage};

#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
use super::parse_id;
use super::{CreatedAt, Malformed, malformed, parse_headers};

/// The columns of a claimed row that every backend reads the same way; each store's row
/// embeds it and adds the id and `created_at` in its own types.
#[derive(diesel::QueryableByName)]
pub(crate) struct ClaimedColumns {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub seq: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    aggregate_type: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    aggregate_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_type: String,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    event_version: i32,
    #[diesel(sql_type = diesel::sql_types::Text)]
    payload: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    headers: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    topic: Option<String>,
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    shard: i16,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    attempts: i32,
}

impl ClaimedColumns {
    /// The message, given the id and creation time the backend stored in its own types; a
    /// row that cannot be published as it is (empty aggregate type, aggregate id or event
    /// type, headers not a JSON object, an invalid id, a creation time no `DateTime<Utc>`
    /// represents) is a [`malformed`] failure instead.
    pub(crate) fn into_message(
        self,
        id: Result<uuid::Uuid, Failure>,
        created_at: CreatedAt,
    ) -> Result<OutboxMessage, Malformed> {
        let key = (self.aggregate_type.clone(), self.aggregate_id.clone());
        let bad = |failure| Malformed { failure, key };
        let seq = self.seq;
        for (column, value) in [
            ("aggregate_type", &self.aggregate_type),
            ("aggregate_id", &self.aggregate_id),
            ("event_type", &self.event_type),
        ] {
            if value.is_empty() {
                return Err(bad(malformed(seq, column, value, "is empty")));
            }
        }
        let created_at = created_at.0.map_err(|value| {
            malformed(
                seq,
                "created_at",
                &value,
                "is not a time the relay can represent",
            )
        });
        let (id, headers, created_at) = match (id, parse_headers(seq, &self.headers), created_at) {
            (Ok(id), Ok(headers), Ok(created_at)) => (id, headers, created_at),
            (Err(f), _, _) | (_, Err(f), _) | (_, _, Err(f)) => return Err(bad(f)),
        };
        Ok(OutboxMessage {
            seq,
            id,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event_type,
            event_version: self.event_version,
            headers,
            payload: self.payload,
            topic: self.topic,
            shard: self.shard,
            created_at,
            attempts: self.attempts,
        })
    }
}

/// A claimed row where the id is stored as text and the creation time as naive UTC
/// (MySQL's `DATETIME(6)`, SQLite's `YYYY-MM-DD HH:MM:SS.ffffff` text).
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
#[derive(QueryableByName)]
pub(crate) struct TextIdRow {
    #[diesel(embed)]
    columns: ClaimedColumns,
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
    #[diesel(sql_type = diesel::sql_types::Timestamp)]
    created_at: CreatedAt,
}

#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
impl TextIdRow {
    /// The message, or the row's [`malformed`] failure (an invalid id among them).
    pub(crate) fn into_message(self) -> Result<OutboxMessage, Malformed> {
        let id = parse_id(self.columns.seq, &self.id);
        self.columns.into_message(id, self.created_at)
    }
}

/// One shard number, as the shard statements return it.
#[derive(diesel::QueryableByName)]
pub(crate) struct ShardRow {
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    pub shard: i16,
}

/// `SELECT COUNT(*) AS n`.
#[derive(diesel::QueryableByName)]
pub(crate) struct CountRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

/// The holder of the leadership lease.
#[derive(diesel::QueryableByName)]
pub(crate) struct HolderRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    #[allow(dead_code)] // PostgreSQL and SQLite only test that a row came back
    pub holder: String,
}
