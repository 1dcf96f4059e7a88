//! Pieces shared by the relay stores.

use outbox_core::Headers;
use outbox_core::relay::StoreError;

/// A store that cannot connect, with what to do about it.
pub type ConnectError = StoreError;

/// A connection failure, worded for the operator.
pub fn connect_error(backend: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::new(
        "connect",
        format!("cannot connect to {backend}: {e} (is the server up and the URL right?)"),
    )
}

/// Headers as stored: a JSON object. Values that other programs wrote as non-strings are kept
/// as their JSON text rather than dropped.
pub(crate) fn parse_headers(json: &str) -> Headers {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json) {
        Ok(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        Err(_) => Headers::new(),
    }
}

/// How old a relay store's own connection must be before it reaps peers by their sessions.
/// After a database restart every recorded session is gone at once, including those of
/// relays that are alive and about to reconnect; waiting this long after connecting lets them
/// record their new sessions first (they do so on connecting, and with every heartbeat, about
/// every second).
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
pub(crate) const REAP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// A relay mode as stored in `outbox_relays.mode`.
pub(crate) fn mode_name(mode: outbox_core::relay::Mode) -> &'static str {
    match mode {
        outbox_core::relay::Mode::Unordered => "unordered",
        outbox_core::relay::Mode::Sharded => "sharded",
        outbox_core::relay::Mode::Leader => "leader",
    }
}

/// Seconds as the databases' interval arithmetic takes them.
#[cfg(feature = "postgres_backend")]
pub(crate) fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// The longest lease, backoff or retention a store adds to a time: a century. Longer
/// durations are clamped so that `now + d` stays within every backend's date range
/// (MySQL's `DATETIME` ends with the year 9999).
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) const MAX_INTERVAL: std::time::Duration =
    std::time::Duration::from_secs(100 * 366 * 24 * 3600);

/// Microseconds, as MySQL's `INTERVAL ? MICROSECOND` takes them (clamped to
/// [`MAX_INTERVAL`]).
#[cfg(feature = "mysql_backend")]
pub(crate) fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.min(MAX_INTERVAL).as_micros()).unwrap_or(i64::MAX)
}

/// Values per `IN (…)` list: far below MySQL's 65,535 placeholders per statement and
/// SQLite's 32,766, and above any sensible batch size, so a batch is one statement.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) const IN_LIST_MAX: usize = 1_000;

/// `?, ?, …, ?`: `n` placeholders for an `IN (…)` list. The values are always bound, never
/// written into the SQL.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) fn placeholders(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// An event id stored as text (MySQL, SQLite). A malformed one is an error naming the row,
/// not a silently invented id.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) fn parse_id(seq: i64, id: &str) -> diesel::QueryResult<uuid::Uuid> {
    uuid::Uuid::parse_str(id).map_err(|e| {
        diesel::result::Error::DeserializationError(
            format!("outbox_events row {seq} has an invalid id {id:?}: {e}").into(),
        )
    })
}

/// `ceil(SHARD_COUNT / live)`: each relay's fair share of shards.
pub(crate) fn fair_share(live: i64) -> i64 {
    let shards = i64::from(outbox_core::SHARD_COUNT);
    let live = live.max(1);
    (shards + live - 1) / live
}

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
    /// The message, given the id and creation time the backend stored in its own types.
    pub(crate) fn into_message(
        self,
        id: uuid::Uuid,
        created_at: chrono::DateTime<chrono::Utc>,
    ) -> outbox_core::relay::OutboxMessage {
        outbox_core::relay::OutboxMessage {
            seq: self.seq,
            id,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event_type,
            event_version: self.event_version,
            headers: parse_headers(&self.headers),
            payload: self.payload,
            topic: self.topic,
            shard: self.shard,
            created_at,
            attempts: self.attempts,
        }
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
