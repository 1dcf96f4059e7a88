//! Switching a table between `stream` and the lease modes.
//!
//! To `stream`: the stream skips what the lease modes published or dead-lettered, but a
//! lease-mode dead letter is a row with `dead_at` set, which the stream's parking (by
//! `outbox_stream_dead_letters`) does not see: the later events of its aggregate would be
//! published past it. So a stream claim that keeps dead letters blocking is refused while
//! there are any ([`LeaseDeadLetters`]): retry or purge them first.
//!
//! Back to a lease mode:
//! Stream mode never marks an event row: it leaves `published_at` NULL on what it published
//! (its positions say what is done) and keeps its dead letters and parked events in
//! `outbox_stream_dead_letters`. A lease-mode relay reads rows by their state, so it would
//! publish everything the stream published again, and would never release the stream's dead
//! letters. So a lease-mode claim is refused while the table holds such rows
//! ([`StreamLeftBehind`]), and [`hand_over`] turns them into lease-mode state: rows the
//! positions passed are marked published, the stream's dead letters become dead rows, and its
//! parked or retry-requested events become pending again, in their `seq` order.

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

/// Whether a stream position passed the row of `outbox_events` in scope: its shard's last
/// snapshot shows it, or the delta being consumed does up to the cursor. No position has
/// passed anything until a stream relay has run.
macro_rules! passed {
    () => {
        "EXISTS (SELECT 1 FROM outbox_stream_positions p \
         WHERE p.shard = outbox_events.shard \
           AND (pg_visible_in_snapshot(outbox_events.xid, p.last_snapshot) \
                OR (p.cur_snapshot IS NOT NULL AND outbox_events.seq <= p.cur_seq \
                    AND pg_visible_in_snapshot(outbox_events.xid, p.cur_snapshot))))"
    };
}
pub(crate) use passed;

/// Whether stream mode is in use on the table: a position moved since the migration or the
/// last handover (which resets them), or a live relay runs in stream mode. Then a retry or a
/// replay goes through the stream's dead letters: a row made pending in place could be
/// passed by a position a stream relay is about to write, and never be read.
macro_rules! stream_in_use {
    () => {
        "(EXISTS (SELECT 1 FROM outbox_stream_positions WHERE version > 0) \
          OR EXISTS (SELECT 1 FROM outbox_relays WHERE mode = 'stream' \
                     AND heartbeat_until > now()))"
    };
}
pub(crate) use stream_in_use;

/// Resets the stream's positions as if no stream relay had run: nothing passed (a snapshot
/// in which no transaction is visible), version 0. A stream relay started later reads every
/// pending row from there.
const RESET_POSITIONS: &str = "UPDATE outbox_stream_positions SET last_snapshot = '1:1:', \
     cur_snapshot = NULL, cur_seq = 0, version = 0, updated_at = now()";

/// What stream mode left for a lease-mode relay: rows behind the positions that are not
/// marked (only looked for past positions a stream relay moved, on the stream's own index,
/// up to the first one), and the rows of `outbox_stream_dead_letters`.
const LEFT_BEHIND: &str = "SELECT (SELECT count(*) FROM outbox_stream_dead_letters) AS copies, \
     EXISTS (SELECT 1 FROM outbox_stream_positions p CROSS JOIN LATERAL ( \
         SELECT 1 FROM outbox_events o WHERE o.shard = p.shard \
           AND o.xid < greatest(pg_snapshot_xmax(p.last_snapshot), \
                                coalesce(pg_snapshot_xmax(p.cur_snapshot), \
                                         pg_snapshot_xmax(p.last_snapshot))) \
           AND o.published_at IS NULL AND o.dead_at IS NULL AND o.xid IS NOT NULL \
           AND (pg_visible_in_snapshot(o.xid, p.last_snapshot) \
                OR (p.cur_snapshot IS NOT NULL AND o.seq <= p.cur_seq \
                    AND pg_visible_in_snapshot(o.xid, p.cur_snapshot))) \
         LIMIT 1) x WHERE p.version > 0) AS unmarked";

/// Marks published the rows the positions passed that are not in the stream's dead letters.
const MARK: &str = concat!(
    "UPDATE outbox_events SET published_at = now() \
     WHERE published_at IS NULL AND dead_at IS NULL AND ",
    passed!(),
    " AND NOT EXISTS (SELECT 1 FROM outbox_stream_dead_letters d WHERE d.seq = outbox_events.seq)"
);

/// The lease-mode state of a row of `outbox_stream_dead_letters` `d`: a dead letter not asked
/// to be retried stays dead (its time, attempts and error); a parked or retry-requested one
/// is pending.
macro_rules! restored {
    (dead_at) => {
        "CASE WHEN d.parked_behind IS NULL AND d.retry_requested_at IS NULL THEN d.dead_at END"
    };
    (attempts) => {
        "CASE WHEN d.parked_behind IS NULL AND d.retry_requested_at IS NULL \
         THEN d.attempts ELSE 0 END"
    };
}

/// Deletes the event rows of the copies that are still there, for [`REINSERT`].
const UNWRITE: &str =
    "DELETE FROM outbox_events WHERE seq IN (SELECT seq FROM outbox_stream_dead_letters)";

/// Writes the copies back as event rows, each with its `seq` and in its lease-mode state.
/// Written anew (the copies are whole; retention may have deleted some of the rows): a row
/// keeps the transaction id it was written with, which the positions passed, and a pending
/// row a position passed is what stream mode leaves unmarked; written by this transaction,
/// which no position has passed, each is pending to every mode.
const REINSERT: &str = concat!(
    "INSERT INTO outbox_events (seq, id, aggregate_type, aggregate_id, event_type, \
     event_version, payload, headers, topic, shard, created_at, attempts, dead_at, last_error) \
     OVERRIDING SYSTEM VALUE \
     SELECT d.seq, d.id, d.aggregate_type, d.aggregate_id, d.event_type, d.event_version, \
     d.payload, d.headers, d.topic, d.shard, d.created_at, ",
    restored!(attempts),
    ", ",
    restored!(dead_at),
    ", d.last_error FROM outbox_stream_dead_letters d"
);

/// Whether the stream's tables are there (a database whose migrations were partly reverted,
/// as some tests do, has none and so nothing stream mode left).
const STREAM_TABLES: &str = "SELECT to_regclass('outbox_stream_dead_letters') IS NOT NULL \
     AND to_regclass('outbox_stream_positions') IS NOT NULL AS present";

#[derive(QueryableByName)]
struct PresentRow {
    #[diesel(sql_type = Bool)]
    present: bool,
}

#[derive(QueryableByName)]
struct LeftBehindRow {
    #[diesel(sql_type = BigInt)]
    copies: i64,
    #[diesel(sql_type = Bool)]
    unmarked: bool,
}

/// A lease-mode relay refused on a table that stream mode left rows in (see the
/// module): it would publish again what the stream published, or never release the
/// stream's dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamLeftBehind {
    /// Rows in `outbox_stream_dead_letters` (dead letters and the events parked behind them).
    pub stream_dead_letters: i64,
    /// Whether rows the stream published are unmarked (`published_at` NULL).
    pub unmarked: bool,
}

impl std::fmt::Display for StreamLeftBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut what = Vec::new();
        if self.unmarked {
            what.push("published events without marking them".to_owned());
        }
        if self.stream_dead_letters > 0 {
            what.push(format!(
                "{} events in its dead letters",
                self.stream_dead_letters
            ));
        }
        write!(
            f,
            "stream relays left {} in this table: a relay in a lease mode would publish them \
             again or never release them; stop the stream relays, then run `outbox \
             stream-handover --yes` (`Admin::hand_over_from_stream`)",
            what.join(" and ")
        )
    }
}

impl std::error::Error for StreamLeftBehind {}

/// What stream mode left for a lease-mode relay, if anything.
pub(crate) async fn left_behind(
    conn: &mut AsyncPgConnection,
) -> diesel::QueryResult<Option<StreamLeftBehind>> {
    let tables: PresentRow = diesel::sql_query(STREAM_TABLES).get_result(conn).await?;
    if !tables.present {
        return Ok(None);
    }
    let row: LeftBehindRow = diesel::sql_query(LEFT_BEHIND).get_result(conn).await?;
    Ok(
        (row.unmarked || row.copies > 0).then_some(StreamLeftBehind {
            stream_dead_letters: row.copies,
            unmarked: row.unmarked,
        }),
    )
}

/// Dead rows of the lease modes (`dead_at` set, not published), on the dead rows' index.
const LEASE_DEAD: &str = "SELECT COUNT(*) AS n FROM outbox_events \
     WHERE dead_at IS NOT NULL AND published_at IS NULL";

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// A stream claim refused on a table that holds dead letters of the lease modes: stream mode
/// would not hold their aggregates' later events back (see the module).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseDeadLetters {
    /// How many.
    pub count: i64,
}

impl std::fmt::Display for LeaseDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the table holds {} dead letters of a lease mode, whose aggregates stream mode \
             would not hold back: retry or purge them first (`outbox dead list`, `outbox dead \
             retry --all --yes` with the lease-mode relays running, or `outbox dead purge`), or \
             run the stream relay with --skip-dead-letters",
            self.count
        )
    }
}

impl std::error::Error for LeaseDeadLetters {}

/// The lease modes' dead letters, if any.
pub(crate) async fn lease_dead_letters(
    conn: &mut AsyncPgConnection,
) -> diesel::QueryResult<Option<LeaseDeadLetters>> {
    let row: CountRow = diesel::sql_query(LEASE_DEAD).get_result(conn).await?;
    Ok((row.n > 0).then_some(LeaseDeadLetters { count: row.n }))
}

/// The live relays in stream mode, by id: a handover waits for none.
const LIVE_STREAM_RELAYS: &str = "SELECT COUNT(*) AS n FROM outbox_relays \
     WHERE mode = 'stream' AND heartbeat_until > now()";

/// How many relays run in stream mode now.
pub(crate) async fn live_stream_relays(conn: &mut AsyncPgConnection) -> diesel::QueryResult<i64> {
    let row: CountRow = diesel::sql_query(LIVE_STREAM_RELAYS)
        .get_result(conn)
        .await?;
    Ok(row.n)
}

/// What [`Admin::hand_over_from_stream`](crate::relay::admin::Admin::hand_over_from_stream) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Handover {
    /// Rows the stream published, now marked published.
    pub marked: u64,
    /// Rows of the stream's dead letters given back to the lease modes: dead letters stay
    /// dead, parked and retry-requested events are pending.
    pub restored: u64,
}

/// Turns what stream mode left into lease-mode state, in one transaction (see the
/// module). Run it with no stream relay running.
pub(crate) async fn hand_over(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Handover> {
    conn.transaction(async |conn| {
        let marked = diesel::sql_query(MARK).execute(conn).await?;
        diesel::sql_query(UNWRITE).execute(conn).await?;
        let restored = diesel::sql_query(REINSERT).execute(conn).await?;
        diesel::sql_query("DELETE FROM outbox_stream_dead_letters")
            .execute(conn)
            .await?;
        diesel::sql_query(RESET_POSITIONS).execute(conn).await?;
        Ok(Handover {
            marked: marked as u64,
            restored: restored as u64,
        })
    })
    .await
}
