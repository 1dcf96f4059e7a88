//! What a transaction wrote to the outbox, read back: [`written`], [`written_events`] and the
//! row type [`WrittenEvent`] behind `assert_written!`.

use std::fmt;

use chrono::{DateTime, NaiveDateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use outbox_core::{DecodeError, Envelope, Headers, NewMessage, OutboxEvent};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::OutboxBackend;

/// One outbox row as the tests read it: every backend's columns as text. Not public API.
#[doc(hidden)]
#[derive(Debug, QueryableByName)]
pub struct Row {
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    aggregate_type: String,
    #[diesel(sql_type = Text)]
    aggregate_id: String,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Integer)]
    event_version: i32,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Nullable<Text>)]
    topic: Option<String>,
    #[diesel(sql_type = Text)]
    created_at: String,
    #[diesel(sql_type = Integer)]
    published: i32,
}

/// The columns of [`Row`], per backend: ids, JSON and times as text (UTC,
/// `YYYY-MM-DD HH:MM:SS.ffffff`).
pub(crate) fn select_sql(backend: &str) -> &'static str {
    match backend {
        "postgres" => {
            "SELECT seq, id::text AS id, aggregate_type, aggregate_id, event_type, event_version, \
             payload::text AS payload, headers::text AS headers, topic, \
             to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS created_at, \
             CASE WHEN published_at IS NULL THEN 0 ELSE 1 END AS published FROM outbox_events"
        }
        "mysql" => {
            "SELECT seq, id, aggregate_type, aggregate_id, event_type, event_version, \
             CAST(payload AS CHAR) AS payload, CAST(headers AS CHAR) AS headers, topic, \
             DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f') AS created_at, \
             CASE WHEN published_at IS NULL THEN 0 ELSE 1 END AS published FROM outbox_events"
        }
        _ => {
            "SELECT seq, id, aggregate_type, aggregate_id, event_type, event_version, payload, \
             headers, topic, created_at, CASE WHEN published_at IS NULL THEN 0 ELSE 1 END AS published FROM outbox_events"
        }
    }
}

/// Every row, oldest first.
fn all_sql<B: OutboxBackend>() -> String {
    format!("{} ORDER BY seq", select_sql(B::NAME))
}

/// An event the outbox holds, as written: its metadata and its payload as JSON text.
///
/// [`written_events`] reads them; [`decode`](WrittenEvent::decode) turns one into the
/// [`Envelope`] a consumer would receive. Its `Display` is the one line `assert_written!`
/// lists the events with: `order/OrderPlaced v1 #7 {"order_id":7,…}`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WrittenEvent {
    /// The row's position in the outbox (the order events were written in).
    pub seq: i64,
    /// The event id.
    pub id: Uuid,
    /// The aggregate type, e.g. `"order"`.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event type, e.g. `"OrderPlaced"`.
    pub event_type: String,
    /// The schema version it was written with.
    pub event_version: i32,
    /// The payload, JSON text.
    pub payload: String,
    /// The event's headers.
    pub headers: Headers,
    /// The topic the event names, if any.
    pub topic: Option<String>,
    /// When it was written (UTC, to the microsecond).
    pub created_at: DateTime<Utc>,
    /// Whether a relay (or [`drain`](crate::testing::drain)) has published it.
    pub published: bool,
}

impl WrittenEvent {
    pub(crate) fn from_row(row: Row) -> Result<Self, ReadError> {
        let seq = row.seq;
        let malformed = |reason: String| ReadError::Malformed { seq, reason };
        let id = Uuid::parse_str(&row.id).map_err(|e| malformed(format!("id: {e}")))?;
        let headers: Headers =
            serde_json::from_str(&row.headers).map_err(|e| malformed(format!("headers: {e}")))?;
        let created_at = NaiveDateTime::parse_from_str(&row.created_at, "%Y-%m-%d %H:%M:%S%.f")
            .map_err(|e| malformed(format!("created_at `{}`: {e}", row.created_at)))?
            .and_utc();
        Ok(WrittenEvent {
            seq,
            id,
            aggregate_type: row.aggregate_type,
            aggregate_id: row.aggregate_id,
            event_type: row.event_type,
            event_version: row.event_version,
            payload: row.payload,
            headers,
            topic: row.topic,
            created_at,
            published: row.published != 0,
        })
    }

    /// The row as it was inserted.
    pub fn to_message(&self) -> NewMessage {
        NewMessage {
            id: self.id,
            aggregate_type: self.aggregate_type.clone().into(),
            aggregate_id: self.aggregate_id.clone(),
            event_type: self.event_type.clone().into(),
            event_version: self.event_version,
            payload: self.payload.clone(),
            headers: self.headers.clone(),
            topic: self.topic.clone().map(Into::into),
            shard: outbox_core::shard_of(&self.aggregate_type, &self.aggregate_id),
            created_at: self.created_at,
        }
    }

    /// The row as a relay claims it, for a [`Publisher`](outbox_core::relay::Publisher).
    pub fn to_outbox_message(&self) -> outbox_core::relay::OutboxMessage {
        let m = self.to_message();
        outbox_core::relay::OutboxMessage {
            seq: self.seq,
            id: m.id,
            aggregate_type: m.aggregate_type.into_owned(),
            aggregate_id: m.aggregate_id,
            event_type: m.event_type.into_owned(),
            event_version: m.event_version,
            payload: m.payload,
            headers: m.headers,
            topic: m.topic.map(|t| t.into_owned()),
            shard: m.shard,
            created_at: m.created_at,
            attempts: 1,
        }
    }

    /// Whether `E` carries this event's aggregate and event type.
    pub fn is<E: OutboxEvent>(&self) -> bool {
        E::EVENT_TYPES
            .iter()
            .any(|t| t.aggregate_type == self.aggregate_type && t.event_type == self.event_type)
    }

    /// Decodes the event as a consumer of `E` would (upcasting an older version).
    pub fn decode<E: OutboxEvent + DeserializeOwned>(&self) -> Result<Envelope<E>, DecodeError> {
        Envelope::from_new_message(&self.to_message())
    }
}

impl fmt::Display for WrittenEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} v{} #{} {}",
            self.aggregate_type,
            self.event_type,
            self.event_version,
            self.aggregate_id,
            self.payload
        )?;
        if self.published {
            f.write_str(" (published)")?;
        }
        Ok(())
    }
}

/// Why the outbox could not be read back.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadError {
    /// The database failed (is the outbox migrated on this connection?).
    Database(diesel::result::Error),
    /// A row's id, headers or time could not be read.
    Malformed {
        /// The row.
        seq: i64,
        /// What was wrong.
        reason: String,
    },
    /// An event of the requested type did not decode as that type.
    Decode {
        /// The row.
        seq: i64,
        /// Why.
        source: DecodeError,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Database(e) => write!(f, "reading the outbox failed: {e}"),
            ReadError::Malformed { seq, reason } => {
                write!(f, "outbox row {seq} is malformed: {reason}")
            }
            ReadError::Decode { seq, source } => {
                write!(f, "outbox row {seq} does not decode: {source}")
            }
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Database(e) => Some(e),
            ReadError::Decode { source, .. } => Some(source),
            ReadError::Malformed { .. } => None,
        }
    }
}

impl From<diesel::result::Error> for ReadError {
    fn from(e: diesel::result::Error) -> Self {
        ReadError::Database(e)
    }
}

fn rows_to_events(rows: Vec<Row>) -> Result<Vec<WrittenEvent>, ReadError> {
    rows.into_iter().map(WrittenEvent::from_row).collect()
}

fn typed<E: OutboxEvent + DeserializeOwned>(
    events: Vec<WrittenEvent>,
) -> Result<Vec<E>, ReadError> {
    events
        .iter()
        .filter(|e| e.is::<E>())
        .map(|e| {
            e.decode::<E>()
                .map(Envelope::into_payload)
                .map_err(|source| ReadError::Decode { seq: e.seq, source })
        })
        .collect()
}

/// Every event in the outbox, in the order it was written (published ones included).
///
/// ```
/// # include!("../doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_diesel::OutboxConnection;
/// use outbox_diesel::testing::written_events;
///
/// let mut conn = establish();
/// conn.transaction_with_outbox(|tx| {
///     tx.publish(&OrderCreated { order_id: 7, total_cents: 1250 })?;
///     Ok::<_, outbox_diesel::Error>(())
/// })?;
/// let events = written_events(&mut conn)?;
/// assert_eq!(events.len(), 1);
/// assert_eq!(events[0].event_type, "OrderCreated");
/// assert_eq!(events[0].to_string(), r#"order/OrderCreated v1 #7 {"order_id":7,"total_cents":1250}"#);
/// # Ok(())
/// # }
/// ```
pub fn written_events<C>(conn: &mut C) -> Result<Vec<WrittenEvent>, ReadError>
where
    C: diesel::connection::LoadConnection<Backend: OutboxBackend>,
{
    let rows = <C::Backend as OutboxBackend>::testing_load(conn, all_sql::<C::Backend>())?;
    rows_to_events(rows)
}

/// The events of type `E` in the outbox, decoded, in the order they were written. Events of
/// other types are left out; an event of `E`'s types that does not decode as `E` is an error.
///
/// For a test of what a transaction wrote, with no relay and no broker:
///
/// ```
/// # include!("../doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_diesel::OutboxConnection;
///
/// let mut conn = establish();
/// conn.transaction_with_outbox(|tx| {
///     tx.publish(&OrderCreated { order_id: 7, total_cents: 1250 })?;
///     Ok::<_, outbox_diesel::Error>(())
/// })?;
/// let placed = outbox_diesel::testing::written::<OrderCreated, _>(&mut conn)?;
/// assert_eq!(placed, [OrderCreated { order_id: 7, total_cents: 1250 }]);
/// # Ok(())
/// # }
/// ```
pub fn written<E, C>(conn: &mut C) -> Result<Vec<E>, ReadError>
where
    E: OutboxEvent + DeserializeOwned,
    C: diesel::connection::LoadConnection<Backend: OutboxBackend>,
{
    typed(written_events(conn)?)
}

/// [`written_events`] on a diesel-async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn written_events_async<C>(conn: &mut C) -> Result<Vec<WrittenEvent>, ReadError>
where
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
{
    let rows =
        <C::Backend as OutboxBackend>::testing_load_async(conn, all_sql::<C::Backend>()).await?;
    rows_to_events(rows)
}

/// [`written`] on a diesel-async connection.
///
/// ```
/// # include!("../doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_diesel::AsyncOutboxConnection;
///
/// let mut conn = establish_async().await;
/// conn.transaction_with_outbox(async |tx| {
///     tx.publish(&OrderCreated { order_id: 7, total_cents: 1250 })?;
///     Ok::<_, outbox_diesel::Error>(())
/// })
/// .await?;
/// let events = outbox_diesel::testing::written_events_async(&mut conn).await?;
/// assert_eq!(events[0].aggregate_id, "7");
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn written_async<E, C>(conn: &mut C) -> Result<Vec<E>, ReadError>
where
    E: OutboxEvent + DeserializeOwned,
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
{
    typed(written_events_async(conn).await?)
}

/// What `assert_written!` does with the events it read. Not public API.
#[doc(hidden)]
pub fn assert_failed(pattern: &str, target: &str, events: &[WrittenEvent], matched: usize) -> ! {
    let mut message = format!(
        "assert_written!: no event written matches `{pattern}`\n\
         {} of the {} events written decode as `{target}`; the outbox holds:\n",
        matched,
        events.len()
    );
    if events.is_empty() {
        message.push_str("  (nothing)\n");
    }
    for (i, event) in events.iter().enumerate() {
        message.push_str(&format!("  {}. {event}\n", i + 1));
    }
    panic!("{message}")
}
