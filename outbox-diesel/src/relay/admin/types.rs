//! The admin API's public types and the rows its statements return.

use chrono::{DateTime, NaiveDateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double, Integer, Nullable, Text};
use serde::Serialize;

/// Which events an admin operation selects. Every field is optional and they combine with
/// AND; the default selects every row the operation applies to (every dead letter, every
/// published event).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Exactly these `seq`s.
    pub seqs: Option<Vec<i64>>,
    /// `seq >= from_seq`.
    pub from_seq: Option<i64>,
    /// `seq <= to_seq`.
    pub to_seq: Option<i64>,
    /// Written (`created_at`) at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Written (`created_at`) before this time.
    pub until: Option<DateTime<Utc>>,
    /// Of this aggregate type.
    pub aggregate_type: Option<String>,
    /// Of this aggregate id.
    pub aggregate_id: Option<String>,
    /// Of this event type.
    pub event_type: Option<String>,
}

impl Filter {
    /// Whether the filter selects everything (no field set).
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    pub(crate) fn validate(&self) -> Result<(), AdminError> {
        if let (Some(a), Some(b)) = (self.from_seq, self.to_seq)
            && a > b
        {
            return Err(AdminError::InvalidFilter(format!(
                "from_seq {a} is after to_seq {b}"
            )));
        }
        if let (Some(a), Some(b)) = (self.since, self.until)
            && a >= b
        {
            return Err(AdminError::InvalidFilter(format!(
                "since {a} is not before until {b}"
            )));
        }
        Ok(())
    }

    /// `seqs` as a JSON array (MySQL's and SQLite's binding of a list).
    #[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
    pub(crate) fn seqs_json(&self) -> Option<String> {
        self.seqs
            .as_ref()
            .map(|s| serde_json::Value::from(s.clone()).to_string())
    }
}

/// One partition a rotation emptied ([`Admin::rotate_partitions`]; PostgreSQL's partition
/// ring only).
///
/// [`Admin::rotate_partitions`]: super::Admin::rotate_partitions
#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel::QueryableByName)]
pub struct Rotated {
    /// The slot (the partition is `outbox_events_slot_<slot>`).
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub slot: i32,
    /// The bytes it held (heap, indexes and TOAST) before the `TRUNCATE`.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub bytes: i64,
}

/// An error of an admin operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum AdminError {
    /// The database refused or failed a statement.
    Database {
        /// What the operation was doing, e.g. `"count events"`.
        operation: &'static str,
        /// The database's error.
        source: diesel::result::Error,
    },
    /// The connection could not be made.
    Connect(diesel::ConnectionError),
    /// A filter that can select nothing (e.g. `from_seq` after `to_seq`).
    InvalidFilter(String),
    /// An argument out of its range (e.g. `slots` of [`Admin::partition_events`]): names it
    /// and the value.
    ///
    /// [`Admin::partition_events`]: super::Admin::partition_events
    InvalidArgument(String),
    /// A value read back that is not what the schema promises (e.g. a time that does not
    /// parse): names the column and the value.
    Malformed {
        /// The column.
        column: &'static str,
        /// The value as read.
        value: String,
    },
}

impl std::fmt::Display for AdminError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminError::Database { operation, source } => {
                write!(f, "cannot {operation}: {source}")
            }
            AdminError::Connect(e) => write!(f, "cannot connect: {e}"),
            AdminError::InvalidFilter(e) => write!(f, "invalid selection: {e}"),
            AdminError::InvalidArgument(e) => write!(f, "invalid argument: {e}"),
            AdminError::Malformed { column, value } => {
                write!(f, "column `{column}` holds an unexpected value {value:?}")
            }
        }
    }
}

impl std::error::Error for AdminError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AdminError::Database { source, .. } => Some(source),
            AdminError::Connect(e) => Some(e),
            _ => None,
        }
    }
}

impl From<diesel::ConnectionError> for AdminError {
    fn from(e: diesel::ConnectionError) -> Self {
        AdminError::Connect(e)
    }
}

/// `r` with its error as [`AdminError::Database`] during `operation`.
pub(crate) fn db<T>(operation: &'static str, r: diesel::QueryResult<T>) -> Result<T, AdminError> {
    r.map_err(|source| AdminError::Database { operation, source })
}

/// The figures the relay's gauges show, from [`Admin::sample`](super::Admin::sample): the
/// [`Status`] fields that a few index lookups give, without the scan of the whole table that
/// `published`, `in_flight` and `retrying` need.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct Sample {
    /// As [`Status::pending`].
    pub pending: i64,
    /// The age in seconds of the pending event with the lowest `seq` (the oldest one, but for
    /// transactions that committed out of order), on the database's clock; in stream mode as
    /// [`Status::oldest_pending_age_seconds`].
    pub oldest_pending_age_seconds: Option<f64>,
    /// As [`Status::dead`].
    pub dead: i64,
    /// As [`Status::blocked_aggregates`].
    pub blocked_aggregates: i64,
    /// As [`Status::stream`].
    pub stream: Option<StreamStatus>,
}

impl From<Status> for Sample {
    fn from(s: Status) -> Self {
        Sample {
            pending: s.pending,
            oldest_pending_age_seconds: s.oldest_pending_age_seconds,
            dead: s.dead,
            blocked_aggregates: s.blocked_aggregates,
            stream: s.stream,
        }
    }
}

/// A [`Sample`] from the sample's counts (a [`CountsRow`] whose `in_flight`, `retrying` and
/// `published` are not counted), the blocked aggregates and stream mode's row.
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
pub(crate) fn sample(
    counts: CountsRow,
    blocked: i64,
    stream: Option<StreamRow>,
) -> Result<Sample, AdminError> {
    status(counts, blocked, Vec::new(), None, stream).map(Sample::from)
}

/// The outbox's state, as `outbox status --json` prints it (field names as here).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct Status {
    /// Events not yet published and not dead-lettered (includes `in_flight` and `retrying`).
    /// Once stream mode has run (`stream` is set): the events beyond the stream's positions,
    /// since it publishes without marking rows, and the events parked behind its dead
    /// letters ([`StreamStatus::parked`]).
    pub pending: i64,
    /// Pending events leased by a relay right now (being published).
    pub in_flight: i64,
    /// Pending events that failed at least once and wait for their retry time.
    pub retrying: i64,
    /// Dead letters: failed `max_attempts` times (or malformed); not published. On
    /// PostgreSQL, stream mode's too (in `outbox_stream_dead_letters`), including those whose
    /// retry is asked for and waits for a stream relay ([`StreamStatus::retry_requested`]).
    pub dead: i64,
    /// Published events still in the table (see retention): in stream mode, the rows behind
    /// the positions too, except those of its dead letters and parked events (the row of an
    /// event whose stream dead letter was purged stays, and counts here).
    pub published: i64,
    /// When the oldest pending event was written (UTC), if any.
    pub oldest_pending: Option<DateTime<Utc>>,
    /// Its age in seconds, on the database's clock.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Aggregates with a dead letter and a later pending event: under
    /// `DeadLetterPolicy::Block` these later events wait for `outbox dead retry|purge`. On
    /// PostgreSQL also stream mode's aggregates with a parked event (until a stream relay
    /// has released them).
    pub blocked_aggregates: i64,
    /// Every relay that heartbeats in `outbox_relays`, by id.
    pub relays: Vec<RelayInfo>,
    /// The relay holding the leadership lease (leader mode), if any.
    pub leader: Option<String>,
    /// Stream mode's state (PostgreSQL), once its positions have moved; `None` elsewhere.
    pub stream: Option<StreamStatus>,
}

/// Stream mode's state, as [`Status::stream`].
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct StreamStatus {
    /// The oldest transaction still open that the stream's positions have in progress (the
    /// `xmin` of a shard's last snapshot), if any. It loses nothing, but while it is open its
    /// own events wait for its commit and every claim reads again all the rows committed
    /// since it began, so claims slow down the longer it stays open. Seen only where the
    /// status's role may read other sessions' activity (superuser, `pg_read_all_stats`).
    pub oldest_open_transaction: Option<OpenTransaction>,
    /// Events parked behind a dead letter of their aggregate (counted in
    /// [`Status::pending`]): published, in order, once a stream relay releases the aggregate
    /// (its dead letter retried or purged).
    pub parked: i64,
    /// Dead letters whose retry is asked for (`outbox dead retry`) and that wait for a stream
    /// relay to publish them (counted in [`Status::dead`] until then).
    pub retry_requested: i64,
    /// The partition ring, if the table is one ([`Admin::partition_events`]).
    ///
    /// [`Admin::partition_events`]: super::Admin::partition_events
    pub ring: Option<RingStatus>,
}

/// Stream mode's partition ring ([`StreamStatus::ring`]): where writers are, and how far they
/// are from a partition retention has not emptied yet.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct RingStatus {
    /// Partitions in the ring.
    pub slots: i32,
    /// Transaction ids per partition.
    pub slot_xids: i64,
    /// The partition the next transaction id falls in.
    pub current_slot: i32,
    /// Partitions holding rows (a size above 0: not emptied since they were written).
    pub filled: i64,
    /// The partitions' size in bytes (indexes and TOAST included).
    pub bytes: i64,
    /// Transaction ids left before writers reach a partition that still holds rows: the next
    /// one round the ring that is not empty, else the current one a turn on. Every write
    /// transaction on the server takes one, as does a relay about 15 times a second. When it
    /// reaches 0, rows go into a partition retention has not emptied: those older than a turn
    /// are then deleted (`DELETE`, dead tuples) instead of truncated with it. Falling toward 0
    /// means the ring is too small for the retention and the relays' lag, or a partition
    /// cannot be emptied (a position or a transaction holds it back).
    pub headroom_xids: i64,
}

/// A transaction still open, from `pg_stat_activity`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct OpenTransaction {
    /// Its backend's pid.
    pub pid: i32,
    /// Its database.
    pub database: Option<String>,
    /// Its session's `application_name`.
    pub application: Option<String>,
    /// Its session's state, e.g. `idle in transaction`.
    pub state: Option<String>,
    /// How long it has been open, in seconds, on the database's clock.
    pub age_seconds: f64,
}

/// A relay as its heartbeat row shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct RelayInfo {
    /// Its id.
    pub relay_id: String,
    /// `unordered`, `sharded` or `leader`.
    pub mode: String,
    /// `running`, `waiting_for_broker` or `standby`.
    pub state: String,
    /// Since when (UTC), if recorded.
    pub state_since: Option<DateTime<Utc>>,
    /// Whether its heartbeat is current (`false`: it stopped or died, and its row goes away
    /// when a peer reaps it).
    pub live: bool,
    /// Its last outage, if it is in one.
    pub last_error: Option<String>,
    /// Its database session (PostgreSQL backend pid, MySQL lock name), if it records one.
    pub session: Option<String>,
    /// Shards whose lease it holds (sharded mode).
    pub shards: i64,
}

/// A dead-lettered event.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its position in the outbox.
    pub seq: i64,
    /// Its event id, as stored (text: a malformed id is shown as it is).
    pub id: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// Event schema version.
    pub event_version: i32,
    /// Its explicit topic, if any.
    pub topic: Option<String>,
    /// Failed attempts.
    pub attempts: i32,
    /// When it was written (UTC).
    pub created_at: DateTime<Utc>,
    /// When it was dead-lettered (UTC).
    pub dead_at: Option<DateTime<Utc>>,
    /// Why.
    pub last_error: Option<String>,
    /// Whether it is stream mode's (PostgreSQL): a copy in `outbox_stream_dead_letters`, its
    /// event row left as it was; `false`: an event row with `dead_at` set (the lease modes).
    pub stream: bool,
    /// Stream mode: when its retry was asked for, if it was (UTC). It stays a dead letter
    /// until the stream relay holding its shard publishes it (with its aggregate's parked
    /// events after it, once it is its aggregate's first); `None` for the lease modes, whose
    /// retry makes the event pending at once.
    pub retry_requested_at: Option<DateTime<Utc>>,
}

/// Times as every backend's admin SQL renders them: `YYYY-MM-DD HH:MM:SS.ffffff`, UTC.
pub(crate) fn parse_time(column: &'static str, s: &str) -> Result<DateTime<Utc>, AdminError> {
    NaiveDateTime::parse_from_str(s.trim(), "%Y-%m-%d %H:%M:%S%.f")
        .map(|t| t.and_utc())
        .map_err(|_| AdminError::Malformed {
            column,
            value: s.to_owned(),
        })
}

fn parse_opt(column: &'static str, s: Option<String>) -> Result<Option<DateTime<Utc>>, AdminError> {
    s.map(|s| parse_time(column, &s)).transpose()
}

#[derive(QueryableByName)]
pub(crate) struct CountsRow {
    #[diesel(sql_type = BigInt)]
    pending: i64,
    #[diesel(sql_type = BigInt)]
    in_flight: i64,
    #[diesel(sql_type = BigInt)]
    retrying: i64,
    #[diesel(sql_type = BigInt)]
    dead: i64,
    #[diesel(sql_type = BigInt)]
    published: i64,
    #[diesel(sql_type = Nullable<Text>)]
    oldest_pending: Option<String>,
    #[diesel(sql_type = Nullable<Double>)]
    oldest_pending_age: Option<f64>,
}

#[derive(QueryableByName)]
pub(crate) struct RelayRow {
    #[diesel(sql_type = Text)]
    relay_id: String,
    #[diesel(sql_type = Text)]
    mode: String,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Nullable<Text>)]
    state_since: Option<String>,
    #[diesel(sql_type = BigInt)]
    live: i64,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    session: Option<String>,
    #[diesel(sql_type = BigInt)]
    shards: i64,
}

/// Stream mode's figures (PostgreSQL): whether its positions ever moved, the events beyond
/// them, the oldest of those and of the parked events, the oldest open transaction the
/// positions have in progress, and its dead letters (`outbox_stream_dead_letters`).
#[derive(QueryableByName)]
pub(crate) struct StreamRow {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub used: bool,
    #[diesel(sql_type = BigInt)]
    unpublished: i64,
    #[diesel(sql_type = Nullable<Text>)]
    oldest_unpublished: Option<String>,
    #[diesel(sql_type = Nullable<Double>)]
    oldest_unpublished_age: Option<f64>,
    #[diesel(sql_type = Nullable<Integer>)]
    pid: Option<i32>,
    #[diesel(sql_type = Nullable<Text>)]
    datname: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    application: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    state: Option<String>,
    #[diesel(sql_type = Nullable<Double>)]
    age: Option<f64>,
    /// Dead letters (`parked_behind IS NULL`).
    #[diesel(sql_type = BigInt)]
    dead_letters: i64,
    /// Dead letters whose retry is asked for.
    #[diesel(sql_type = BigInt)]
    retry_requested: i64,
    /// Parked events.
    #[diesel(sql_type = BigInt)]
    parked: i64,
    /// Aggregates with a parked event.
    #[diesel(sql_type = BigInt)]
    blocked: i64,
    /// The table's rows whose event row is still in `outbox_events`, unmarked.
    #[diesel(sql_type = BigInt)]
    unmarked: i64,
    /// The partition ring, if the table is one (all `None` else).
    #[diesel(sql_type = Nullable<Integer>)]
    ring_slots: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    ring_slot_xids: Option<i64>,
    #[diesel(sql_type = Nullable<Integer>)]
    ring_slot: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    ring_bytes: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    ring_filled: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    ring_headroom: Option<i64>,
}

#[derive(QueryableByName)]
pub(crate) struct LeaderRow {
    #[diesel(sql_type = Text)]
    pub holder: String,
}

#[derive(QueryableByName)]
pub(crate) struct NRow {
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

#[derive(QueryableByName)]
pub(crate) struct BoundRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last: Option<i64>,
}

#[derive(QueryableByName)]
pub(crate) struct DeadRow {
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
    #[diesel(sql_type = Nullable<Text>)]
    topic: Option<String>,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Text)]
    created_at: String,
    #[diesel(sql_type = Nullable<Text>)]
    dead_at: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    retry_requested_at: Option<String>,
    #[diesel(sql_type = BigInt)]
    stream: i64,
}

impl DeadRow {
    pub(crate) fn into_dead_letter(self) -> Result<DeadLetter, AdminError> {
        Ok(DeadLetter {
            created_at: parse_time("created_at", &self.created_at)?,
            dead_at: parse_opt("dead_at", self.dead_at)?,
            seq: self.seq,
            id: self.id,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event_type,
            event_version: self.event_version,
            topic: self.topic,
            attempts: self.attempts,
            last_error: self.last_error,
            stream: self.stream != 0,
            retry_requested_at: parse_opt("retry_requested_at", self.retry_requested_at)?,
        })
    }
}

/// Puts a status together from its queries' rows.
pub(crate) fn status(
    c: CountsRow,
    blocked: i64,
    relays: Vec<RelayRow>,
    leader: Option<String>,
    stream: Option<StreamRow>,
) -> Result<Status, AdminError> {
    let relays = relays
        .into_iter()
        .map(|r| {
            Ok(RelayInfo {
                state_since: parse_opt("state_since", r.state_since)?,
                relay_id: r.relay_id,
                mode: r.mode,
                state: r.state,
                live: r.live != 0,
                last_error: r.last_error,
                session: r.session,
                shards: r.shards,
            })
        })
        .collect::<Result<_, AdminError>>()?;
    let mut status = Status {
        pending: c.pending,
        in_flight: c.in_flight,
        retrying: c.retrying,
        dead: c.dead,
        published: c.published,
        oldest_pending: parse_opt("created_at", c.oldest_pending)?,
        oldest_pending_age_seconds: c.oldest_pending_age.map(|a| a.max(0.0)),
        blocked_aggregates: blocked,
        relays,
        leader,
        stream: None,
    };
    if let Some(s) = &stream {
        // Stream mode's dead letters and the aggregates they block, whether or not the
        // positions moved (the table fills only as they do).
        status.dead += s.dead_letters;
        status.blocked_aggregates += s.blocked;
    }
    if let Some(s) = stream.filter(|s| s.used) {
        // Stream mode leaves `published_at` NULL: what is pending is what lies beyond the
        // positions and what is parked behind a dead letter; the rest of the rows it left
        // unmarked is published, but for the dead letters' and parked events' own rows.
        status.published += (status.pending - s.unpublished - s.unmarked).max(0);
        status.pending = s.unpublished + s.parked;
        status.oldest_pending = parse_opt("created_at", s.oldest_unpublished)?;
        status.oldest_pending_age_seconds = s.oldest_unpublished_age.map(|a| a.max(0.0));
        status.stream = Some(StreamStatus {
            oldest_open_transaction: s.pid.map(|pid| OpenTransaction {
                pid,
                database: s.datname,
                application: s.application,
                state: s.state,
                age_seconds: s.age.unwrap_or(0.0).max(0.0),
            }),
            parked: s.parked,
            retry_requested: s.retry_requested,
            ring: match (s.ring_slots, s.ring_slot_xids, s.ring_slot) {
                (Some(slots), Some(slot_xids), Some(current_slot)) => Some(RingStatus {
                    slots,
                    slot_xids,
                    current_slot,
                    filled: s.ring_filled.unwrap_or(0),
                    bytes: s.ring_bytes.unwrap_or(0),
                    headroom_xids: s.ring_headroom.unwrap_or(0),
                }),
                _ => None,
            },
        });
    }
    Ok(status)
}
