//! The admin statements on PostgreSQL. A filter is `$1`..`$8` (see [`bind`]); a `NULL`
//! parameter disables its condition. `sql_query` statements are planned per execution
//! (unnamed, never cached), so PostgreSQL folds the disabled conditions away and uses the
//! `seq` primary key or the partial indexes as the remaining ones allow.

use std::time::Duration;

use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::pg::relay::cleanup_query;
use crate::relay::admin::connection::server::{clock, stamp};
use crate::relay::admin::connection::{
    AdminConnection, Sealed, admin_connection, filtered_statements,
};
use crate::relay::admin::types::{
    self, AdminError, BoundRow, CountsRow, DeadLetter, DeadRow, Filter, LeaderRow, NRow, RelayRow,
    Sample, Status, StreamRow, db,
};

macro_rules! filter {
    () => {
        " AND ($1::bigint[] IS NULL OR seq = ANY($1)) \
          AND ($2::bigint IS NULL OR seq >= $2) AND ($3::bigint IS NULL OR seq <= $3) \
          AND ($4::timestamptz IS NULL OR created_at >= $4) \
          AND ($5::timestamptz IS NULL OR created_at < $5) \
          AND ($6::text IS NULL OR aggregate_type = $6) \
          AND ($7::text IS NULL OR aggregate_id = $7) \
          AND ($8::text IS NULL OR event_type = $8)"
    };
}
macro_rules! time {
    ($c:literal) => {
        concat!(
            "to_char(",
            $c,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
        )
    };
}

const COUNTS: &str = concat!(
    "SELECT \
     COUNT(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL) AS pending, \
     COUNT(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL AND locked_until > now()) AS in_flight, \
     COUNT(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL AND attempts > 0 \
         AND available_at > now() AND (locked_until IS NULL OR locked_until <= now())) AS retrying, \
     COUNT(*) FILTER (WHERE dead_at IS NOT NULL AND published_at IS NULL) AS dead, \
     COUNT(*) FILTER (WHERE published_at IS NOT NULL) AS published, ",
    time!("MIN(created_at) FILTER (WHERE published_at IS NULL AND dead_at IS NULL)"),
    " AS oldest_pending, \
     EXTRACT(EPOCH FROM now() - MIN(created_at) FILTER (WHERE published_at IS NULL AND dead_at IS NULL))::float8 \
         AS oldest_pending_age \
     FROM outbox_events"
);
/// Stream mode's figures (see `StreamRow`): the events beyond the positions (each shard's rows
/// not visible in its last snapshot, nor in the delta being consumed up to its cursor: the
/// `(shard, xid)` index from the snapshot's xmin on, as the relay's claim reads them), and
/// the oldest transaction still open whose xid is a position's xmin (`pg_stat_activity`
/// shows 32-bit xids: the xid8 is taken modulo 2^32).
///
/// And its dead letters (`outbox_stream_dead_letters`, one scan of a table that is empty but
/// while something failed): the dead letters, those whose retry waits for a relay, the parked
/// rows (pending: not published yet) with the oldest one's time, the aggregates they block,
/// and how many of the table's rows still have their event row unmarked in `outbox_events`
/// (by the `seq` primary key: they lie behind the positions, but were not published).
///
/// And, on a partition ring (`outbox_stream_partitioning`), its layout, the slot the next
/// transaction id falls in (`pg_snapshot_xmax` of the current snapshot: no id is taken), the
/// partitions' size, how many hold rows (a size above 0), and the headroom: the transaction
/// ids left before writers reach a partition that still holds rows (the next one round the
/// ring that is not empty, or the current one a turn on).
const STREAM: Option<&str> = Some(concat!(
    "WITH pos AS (SELECT shard, last_snapshot, cur_snapshot, cur_seq, version \
         FROM outbox_stream_positions), \
     un AS (SELECT o.created_at FROM pos p JOIN outbox_events o ON o.shard = p.shard \
         WHERE o.xid >= pg_snapshot_xmin(p.last_snapshot) \
           AND o.published_at IS NULL AND o.dead_at IS NULL \
           AND NOT pg_visible_in_snapshot(o.xid, p.last_snapshot) \
           AND (p.cur_snapshot IS NULL OR o.seq > p.cur_seq \
                OR NOT pg_visible_in_snapshot(o.xid, p.cur_snapshot))), \
     held AS (SELECT a.pid, a.datname::text AS datname, a.application_name::text AS application, \
             a.state::text AS state, EXTRACT(EPOCH FROM now() - a.xact_start)::float8 AS age \
         FROM pg_stat_activity a \
         WHERE a.backend_xid IS NOT NULL \
           AND a.backend_xid::text::bigint IN ( \
               SELECT pg_snapshot_xmin(last_snapshot)::text::bigint % 4294967296 FROM pos) \
         ORDER BY a.xact_start LIMIT 1), \
     dl AS (SELECT count(*) FILTER (WHERE d.parked_behind IS NULL) AS dead_letters, \
             count(*) FILTER (WHERE d.parked_behind IS NULL \
                 AND d.retry_requested_at IS NOT NULL) AS retry_requested, \
             count(*) FILTER (WHERE d.parked_behind IS NOT NULL) AS parked, \
             min(d.created_at) FILTER (WHERE d.parked_behind IS NOT NULL) AS oldest_parked, \
             count(DISTINCT (d.aggregate_type, d.aggregate_id)) \
                 FILTER (WHERE d.parked_behind IS NOT NULL) AS blocked, \
             count(o.seq) AS unmarked \
         FROM outbox_stream_dead_letters d LEFT JOIN outbox_events o ON o.seq = d.seq \
             AND o.published_at IS NULL AND o.dead_at IS NULL), \
     oldest AS (SELECT least((SELECT min(created_at) FROM un), \
         (SELECT oldest_parked FROM dl)) AS t), \
     ring AS (SELECT r.slots, r.slot_xids, (x.x / r.slot_xids % r.slots)::int4 AS slot, \
             (SELECT sum(pg_total_relation_size(('outbox_events_slot_' || k)::regclass)) \
              FROM generate_series(0, r.slots - 1) k)::int8 AS bytes, \
             (SELECT count(*) FROM generate_series(0, r.slots - 1) k \
              WHERE pg_relation_size(('outbox_events_slot_' || k)::regclass) > 0) AS filled, \
             (SELECT min((x.x / r.slot_xids + j) * r.slot_xids - x.x) \
              FROM generate_series(1, r.slots) j \
              WHERE j = r.slots OR pg_relation_size(('outbox_events_slot_' \
                  || ((x.x / r.slot_xids + j) % r.slots))::regclass) > 0) AS headroom \
         FROM outbox_stream_partitioning r \
         CROSS JOIN (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS x) x) \
     SELECT coalesce((SELECT max(version) > 0 FROM pos), false) AS used, \
         (SELECT count(*) FROM un) AS unpublished, ",
    time!("(SELECT t FROM oldest)"),
    " AS oldest_unpublished, \
         EXTRACT(EPOCH FROM now() - (SELECT t FROM oldest))::float8 \
             AS oldest_unpublished_age, \
         h.pid, h.datname, h.application, h.state, h.age, \
         dl.dead_letters, dl.retry_requested, dl.parked, dl.blocked, dl.unmarked, \
         ring.slots AS ring_slots, ring.slot_xids AS ring_slot_xids, ring.slot AS ring_slot, \
         ring.bytes AS ring_bytes, ring.filled AS ring_filled, ring.headroom AS ring_headroom \
     FROM (SELECT 1) one LEFT JOIN held h ON true CROSS JOIN dl LEFT JOIN ring ON true"
));

filtered_statements!(
    now: "now()",
    int: "BIGINT",
    session: "CAST(r.session_pid AS TEXT)",
    id: "id::text",
    retry_now: "now()",
    replay_now: "now()",
    after: "$9",
    limit: "$10",
    last: "$10",
    stream_dead_letters: true,
);

/// Binds a filter as `$1`..`$8`.
fn bind<'a>(sql: &'static str, f: &'a Filter) -> BoxedSqlQuery<'a, Pg, SqlQuery> {
    diesel::sql_query(sql)
        .into_boxed::<Pg>()
        .bind::<Nullable<Array<BigInt>>, _>(f.seqs.as_deref())
        .bind::<Nullable<BigInt>, _>(f.from_seq)
        .bind::<Nullable<BigInt>, _>(f.to_seq)
        .bind::<Nullable<Timestamptz>, _>(f.since)
        .bind::<Nullable<Timestamptz>, _>(f.until)
        .bind::<Nullable<Text>, _>(f.aggregate_type.as_deref())
        .bind::<Nullable<Text>, _>(f.aggregate_id.as_deref())
        .bind::<Nullable<Text>, _>(f.event_type.as_deref())
}

/// Empties the partitions whose rows may all go (see `relay::pg::partition`).
async fn rotate(
    conn: &mut AsyncPgConnection,
    keep: Duration,
) -> Result<Vec<crate::relay::admin::Rotated>, AdminError> {
    db(
        "rotate partitions",
        crate::pg::relay::partition::rotate(conn, keep).await,
    )
}

admin_connection!(AsyncPgConnection);

/// The sample's counts (a `CountsRow` without `in_flight`, `retrying` and `published`, which
/// need the whole table): pending and dead through their partial indexes
/// (`outbox_events_pending`, `outbox_events_dead_aggregate`), the oldest pending as the
/// lowest pending `seq` (one index entry).
const SAMPLE: &str = concat!(
    "SELECT \
     (SELECT count(*) FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL) AS pending, \
     0::int8 AS in_flight, 0::int8 AS retrying, \
     (SELECT count(*) FROM outbox_events WHERE dead_at IS NOT NULL AND published_at IS NULL) AS dead, \
     0::int8 AS published, o.oldest_pending, o.oldest_pending_age \
     FROM (SELECT 1) one LEFT JOIN (SELECT ",
    time!("created_at"),
    " AS oldest_pending, EXTRACT(EPOCH FROM now() - created_at)::float8 AS oldest_pending_age \
         FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL \
         ORDER BY seq LIMIT 1) o ON true"
);

/// [`Admin::sample`](crate::relay::admin::Admin::sample) on PostgreSQL: one read-only transaction with
/// `SET LOCAL statement_timeout` (so nothing outlives it, and a pooler in transaction mode
/// sees no session state).
async fn sample(conn: &mut AsyncPgConnection, timeout: Duration) -> Result<Sample, AdminError> {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128);
    let r = diesel_async::AsyncConnection::transaction(conn, async |c| {
        diesel::sql_query(format!("SET LOCAL statement_timeout = {ms}"))
            .execute(c)
            .await?;
        let counts: CountsRow = diesel::sql_query(SAMPLE).get_result(c).await?;
        let blocked: NRow = diesel::sql_query(BLOCKED).get_result(c).await?;
        let stream: Option<StreamRow> = match STREAM {
            Some(sql) => Some(diesel::sql_query(sql).get_result(c).await?),
            None => None,
        };
        Ok::<_, diesel::result::Error>((counts, blocked.n, stream))
    })
    .await;
    let (counts, blocked, stream) = db("sample the backlog", r)?;
    types::sample(counts, blocked, stream)
}

impl crate::relay::admin::Admin<AsyncPgConnection> {
    /// What stream mode left in the table that a relay in a lease mode would mishandle, if
    /// anything: events it published without marking them, and its dead letters and parked
    /// events (see [`hand_over_from_stream`](Self::hand_over_from_stream)). A lease-mode
    /// relay refuses to claim while there is any.
    pub async fn stream_left_behind(
        &mut self,
    ) -> Result<Option<crate::relay::StreamLeftBehind>, AdminError> {
        db(
            "look for what stream mode left",
            crate::pg::relay::handover::left_behind(&mut self.conn).await,
        )
    }

    /// The lease modes' dead letters, if any: a stream relay that keeps dead letters
    /// blocking refuses to claim while there are some, since stream mode would not hold
    /// their aggregates' later events back (retry or purge them first).
    pub async fn lease_dead_letters(
        &mut self,
    ) -> Result<Option<crate::relay::LeaseDeadLetters>, AdminError> {
        db(
            "count the lease modes' dead letters",
            crate::pg::relay::handover::lease_dead_letters(&mut self.conn).await,
        )
    }

    /// Hands the table over from `stream` to a lease mode, in one transaction: the events
    /// the stream relays published (behind their positions, unmarked) are marked published,
    /// their dead letters become dead rows again (attempts and error kept), and the events
    /// parked behind them or whose retry was asked for become pending, each with its `seq`
    /// (written back if retention deleted its row), so the lease relays keep every
    /// aggregate's order. Refused while a relay in stream mode is live (stop them first: a
    /// killed one counts until its heartbeat expires, a lease after).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_diesel::relay::admin::AdminError> {
    /// use diesel_async::{AsyncConnection, AsyncPgConnection};
    /// use outbox_diesel::relay::admin::Admin;
    /// let conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1/app").await?;
    /// let done = Admin::new(conn).hand_over_from_stream().await?;
    /// println!("{} marked published, {} given back", done.marked, done.restored);
    /// # Ok(()) }
    /// ```
    pub async fn hand_over_from_stream(&mut self) -> Result<crate::relay::Handover, AdminError> {
        let live = db(
            "look for live stream relays",
            crate::pg::relay::handover::live_stream_relays(&mut self.conn).await,
        )?;
        if live > 0 {
            return Err(AdminError::InvalidArgument(format!(
                "{live} relays in stream mode are live: stop them before the handover (a \
                 killed one counts until its heartbeat expires)"
            )));
        }
        db(
            "hand the table over from stream mode",
            crate::pg::relay::handover::hand_over(&mut self.conn).await,
        )
    }

    /// Converts `outbox_events` into a ring of `slots` partitions of `slot_xids` transaction
    /// ids each, so that stream mode's retention empties whole partitions with `TRUNCATE`
    /// instead of deleting rows (no dead tuples, no `VACUUM`): see
    /// [`partitions`](crate::relay::partitions) and the migration
    /// `20261202000003_stream_partitions` for the layout and its lock levels. Every row is
    /// copied, with its `seq`, id and transaction id, under an `ACCESS EXCLUSIVE` lock on the
    /// table for the whole conversion (writers and relays wait): convert at install, or after
    /// a cleanup. Returns how many rows were copied.
    ///
    /// Refused, with nothing changed, on a table already partitioned, `slots` outside 2–64,
    /// or `slot_xids` of 0 or above `i64::MAX`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_diesel::relay::admin::AdminError> {
    /// use diesel_async::{AsyncConnection, AsyncPgConnection};
    /// use outbox_diesel::relay::admin::Admin;
    /// use outbox_diesel::relay::partitions::{DEFAULT_SLOTS, DEFAULT_SLOT_XIDS};
    /// let conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1/app").await?;
    /// let copied = Admin::new(conn).partition_events(DEFAULT_SLOTS, DEFAULT_SLOT_XIDS).await?;
    /// println!("{copied} rows copied into the partitions");
    /// # Ok(()) }
    /// ```
    pub async fn partition_events(
        &mut self,
        slots: u16,
        slot_xids: u64,
    ) -> Result<i64, AdminError> {
        use crate::pg::relay::partition::{MAX_RING_XIDS, MAX_SLOTS, MIN_SLOTS, max_slot_xids};
        if !(MIN_SLOTS..=MAX_SLOTS).contains(&slots) {
            return Err(AdminError::InvalidArgument(format!(
                "slots must be between {MIN_SLOTS} and {MAX_SLOTS}, got {slots}"
            )));
        }
        let max = max_slot_xids(slots);
        if slot_xids == 0 || slot_xids > max {
            return Err(AdminError::InvalidArgument(format!(
                "slot_xids must be between 1 and {max} with {slots} slots (a turn of the ring, \
                 slots × slot_xids, at most {MAX_RING_XIDS}), got {slot_xids}"
            )));
        }
        db(
            "partition the event table",
            crate::pg::relay::partition::partition_events(&mut self.conn, slots, slot_xids).await,
        )
    }
}
