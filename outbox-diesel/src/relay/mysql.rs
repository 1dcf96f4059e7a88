//! The MySQL/MariaDB relay store.

use std::time::Duration;

use chrono::NaiveDateTime;
use diesel::mysql::Mysql;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Bool, Datetime, SmallInt, Text};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, TransactionManager};
use outbox_core::relay::{
    Claim, ClaimOrder, Completion, Failure, OutboxMessage, RelayHealth, RelayStore,
    ShardAssignment, StoreError,
};

use super::common::{
    ClaimedColumns, CountRow, HolderRow, IN_LIST_MAX, IdGuard, Malformed, ShardRow, connect_error,
    fair_share, micros, parse_id, placeholders, settle_malformed, split_malformed,
};
use super::mysql_sessions;

/// Session settings of relay connections, one statement each.
///
/// `READ COMMITTED`: a locking read takes no gap locks and lets go of the rows it examined
/// but did not keep, so a claim does not block writers' inserts nor other relays' marks on
/// rows it merely scanned past (under `REPEATABLE READ` it would hold them to the commit),
/// and each statement reads what is committed when it runs.
///
/// `innodb_lock_wait_timeout`: an ordered claim waits for row locks (see
/// [`MysqlRelayStore`]); every relay transaction is a few statements long, so a wait of
/// seconds means something is stuck, and the claim fails and is retried rather than hanging
/// for the server's default 50 s.
const SESSION_SQL: [&str; 2] = [
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET SESSION innodb_lock_wait_timeout = 10",
];

/// Unordered: any pending, unleased rows; rows another relay is claiming are skipped.
const SELECT_UNORDERED: &str = "SELECT seq FROM outbox_events \
     WHERE published_at IS NULL AND dead_at IS NULL AND available_at <= UTC_TIMESTAMP(6) \
       AND (locked_until IS NULL OR locked_until < UTC_TIMESTAMP(6)) \
     ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED";

/// Ordered: the same conditions as PostgreSQL's. A row qualifies only if no earlier pending
/// row of its aggregate is blocked (leased by someone, or waiting for a retry) and, when the
/// fifth bind is true, no earlier one is dead. First bind: only shards this relay holds a
/// live lease on; third: only while it holds the leadership lease. No SKIP LOCKED: skipping a
/// locked earlier row could let a later one of the same aggregate through; a brief wait is
/// the price of order.
const SELECT_ORDERED: &str = "SELECT e.seq FROM outbox_events e \
     WHERE e.published_at IS NULL AND e.dead_at IS NULL AND e.available_at <= UTC_TIMESTAMP(6) \
       AND (e.locked_until IS NULL OR e.locked_until < UTC_TIMESTAMP(6)) \
       AND (NOT ? OR e.shard IN (SELECT s.shard FROM outbox_shard_leases s \
                                 WHERE s.owner = ? AND s.lease_until > UTC_TIMESTAMP(6))) \
       AND (NOT ? OR EXISTS (SELECT 1 FROM outbox_leader l \
                             WHERE l.name = 'relay' AND l.holder = ? \
                               AND l.lease_until > UTC_TIMESTAMP(6))) \
       AND NOT EXISTS (SELECT 1 FROM outbox_events p \
                       WHERE p.aggregate_type = e.aggregate_type \
                         AND p.aggregate_id = e.aggregate_id \
                         AND p.published_at IS NULL AND p.dead_at IS NULL AND p.seq < e.seq \
                         AND (p.available_at > UTC_TIMESTAMP(6) \
                              OR p.locked_until >= UTC_TIMESTAMP(6))) \
       AND (NOT ? OR NOT EXISTS (SELECT 1 FROM outbox_events d \
                                 WHERE d.aggregate_type = e.aggregate_type \
                                   AND d.aggregate_id = e.aggregate_id \
                                   AND d.dead_at IS NOT NULL AND d.published_at IS NULL \
                                   AND d.seq < e.seq)) \
     ORDER BY e.seq LIMIT ? FOR UPDATE";

/// Leases the rows the claim's `SELECT … FOR UPDATE` locked; `IN (…)` follows. The
/// ordered modes' fencing is checked again here, on a fresh clock and snapshot: the `SELECT`
/// may have waited for row locks (up to `innodb_lock_wait_timeout`, several times), and
/// its own checks are as of its start (see [`MysqlRelayStore`]).
const LEASE_ROWS: &str = "UPDATE outbox_events \
     SET locked_by = ?, locked_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
         attempts = attempts + 1 \
     WHERE (NOT ? OR shard IN (SELECT s.shard FROM outbox_shard_leases s \
                               WHERE s.owner = ? AND s.lease_until > UTC_TIMESTAMP(6))) \
       AND (NOT ? OR EXISTS (SELECT 1 FROM outbox_leader l \
                             WHERE l.name = 'relay' AND l.holder = ? \
                               AND l.lease_until > UTC_TIMESTAMP(6))) \
       AND seq IN (";

/// Reads the claimed rows back; `IN (…) ORDER BY seq` follows. JSON is read as text (MySQL's
/// JSON type would otherwise come back as its binary form's name).
const READ_ROWS: &str = "SELECT seq, id, aggregate_type, aggregate_id, event_type, \
     event_version, CAST(payload AS CHAR) AS payload, CAST(headers AS CHAR) AS headers, topic, \
     shard, created_at, attempts FROM outbox_events WHERE seq IN (";

const COMPLETE_MARK: &str = "UPDATE outbox_events \
     SET published_at = UTC_TIMESTAMP(6), locked_by = NULL, locked_until = NULL \
     WHERE locked_by = ? AND seq IN (";

const COMPLETE_DELETE: &str = "DELETE FROM outbox_events WHERE locked_by = ? AND seq IN (";

const FAIL_RETRY: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, last_error = ?, dead_at = NULL, \
         available_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
     WHERE seq = ? AND locked_by = ?";

const FAIL_DEAD: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, last_error = ?, dead_at = UTC_TIMESTAMP(6) \
     WHERE seq = ? AND locked_by = ?";

const RELEASE: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE locked_by = ? AND seq IN (";

const RELEASE_ALL_ROWS: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE locked_by = ? AND published_at IS NULL AND dead_at IS NULL";

/// Takes or renews the leadership lease: the row becomes ours if it already was or has
/// expired. `holder` is assigned first, so the second `IF` reads either the new holder, which
/// is us exactly when the first `IF` took or kept the row (the left-to-right assignment MySQL
/// and MariaDB use by default), or the old row, repeating the first test (MariaDB's
/// `SIMULTANEOUS_ASSIGNMENT` mode): either way the lease is extended exactly when the row
/// became or stayed ours.
const LEAD: &str = "INSERT INTO outbox_leader (name, holder, lease_until) \
     VALUES ('relay', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
     ON DUPLICATE KEY UPDATE \
       holder = IF(holder = ? OR lease_until < UTC_TIMESTAMP(6), ?, holder), \
       lease_until = IF(holder = ? OR lease_until < UTC_TIMESTAMP(6), \
                        UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, lease_until)";

const LEADER: &str = "SELECT holder FROM outbox_leader \
     WHERE name = 'relay' AND lease_until > UTC_TIMESTAMP(6)";

const HEARTBEAT: &str = "INSERT INTO outbox_relays (relay_id, heartbeat_until) \
     VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
     ON DUPLICATE KEY UPDATE heartbeat_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
         mode = 'sharded'";

/// Only sharded relays share the shards (relays of every mode heartbeat in this table).
const LIVE_RELAYS: &str = "SELECT COUNT(*) AS n FROM outbox_relays \
     WHERE heartbeat_until > UTC_TIMESTAMP(6) AND mode = 'sharded'";

const FORGET_DEAD_RELAYS: &str =
    "DELETE FROM outbox_relays WHERE heartbeat_until < UTC_TIMESTAMP(6) - INTERVAL 1 HOUR";

const RENEW_SHARDS: &str = "UPDATE outbox_shard_leases \
     SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE owner = ?";

const OWNED_SHARDS: &str = "SELECT shard FROM outbox_shard_leases WHERE owner = ? ORDER BY shard";

const GIVE_UP_SHARDS: &str = "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL \
     WHERE owner = ? AND shard IN (";

const FREE_SHARDS: &str = "SELECT shard FROM outbox_shard_leases \
     WHERE owner IS NULL OR lease_until < UTC_TIMESTAMP(6) \
     ORDER BY shard LIMIT ? FOR UPDATE SKIP LOCKED";

const TAKE_SHARDS: &str = "UPDATE outbox_shard_leases \
     SET owner = ?, lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
     WHERE shard IN (";

const RELEASE_SHARDS: &str =
    "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL WHERE owner = ?";
const RELEASE_LEADER: &str = "DELETE FROM outbox_leader WHERE holder = ?";
const FORGET_RELAY: &str = "DELETE FROM outbox_relays WHERE relay_id = ?";

/// MySQL's single-table `DELETE` takes `ORDER BY … LIMIT` directly.
pub(crate) const CLEANUP: &str = "DELETE FROM outbox_events \
     WHERE published_at IS NOT NULL \
       AND published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
     ORDER BY published_at LIMIT ?";

/// `last_error` is a `TEXT` column: at most 65,535 bytes.
const MAX_ERROR_BYTES: usize = 65_535;

/// How often a unit of work that InnoDB chose as a deadlock victim is run again at once.
const DEADLOCK_RETRIES: u32 = 3;

/// Whether InnoDB rolled the transaction back to break a deadlock (error 1213). diesel-async
/// keeps only the server's message, so this reads it; under a non-English `lc_messages` it
/// misses, and the error goes to the relay, which backs off and retries the same way.
fn is_deadlock(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().starts_with("Deadlock found"))
}

/// Runs `$f` in a transaction on `$conn`, again (up to [`DEADLOCK_RETRIES`] times) when
/// InnoDB aborts it as a deadlock victim. Every unit of work here is safe to rerun whole:
/// the rollback undid all of it. Deadlocks are expected now and then: an ordered claim
/// locks a row's `outbox_events_pending` entry and then the row, while a mark of that row
/// holds the row and then updates the entry (`published_at` is in that index).
macro_rules! in_transaction {
    ($conn:expr, $f:expr) => {{
        let mut tries = 0u32;
        loop {
            match $conn.transaction($f).await {
                Err(e) if tries < DEADLOCK_RETRIES && IsDeadlock::is_deadlock(&e) => {
                    tries += 1;
                    tracing::debug!(tries, "deadlock victim; running the transaction again");
                }
                r => break r,
            }
        }
    }};
}

/// Errors that can say whether they are a deadlock.
trait IsDeadlock {
    fn is_deadlock(&self) -> bool;
}

impl IsDeadlock for diesel::result::Error {
    fn is_deadlock(&self) -> bool {
        is_deadlock(self)
    }
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(embed)]
    columns: ClaimedColumns,
    #[diesel(sql_type = Text)]
    id: String,
    /// Naive UTC: `DATETIME(6)` stores no zone.
    #[diesel(sql_type = Datetime)]
    created_at: NaiveDateTime,
}

impl Row {
    fn into_message(self) -> Result<OutboxMessage, Malformed> {
        let id = parse_id(self.columns.seq, &self.id);
        self.columns.into_message(id, self.created_at.and_utc())
    }
}

#[derive(QueryableByName)]
struct SeqRow {
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// `prefix` + `?, …` for `values` + `suffix`, with `bind` applied to the prefix's own binds
/// and then every value bound in order. No value is ever written into the SQL.
fn in_list<'a, T>(
    prefix: &str,
    values: &'a [T],
    suffix: &str,
    bind: impl FnOnce(BoxedSqlQuery<'a, Mysql, SqlQuery>) -> BoxedSqlQuery<'a, Mysql, SqlQuery>,
    bind_value: impl Fn(BoxedSqlQuery<'a, Mysql, SqlQuery>, &'a T) -> BoxedSqlQuery<'a, Mysql, SqlQuery>,
) -> BoxedSqlQuery<'a, Mysql, SqlQuery> {
    let sql = format!("{prefix}{}){suffix}", placeholders(values.len()));
    values
        .iter()
        .fold(bind(diesel::sql_query(sql).into_boxed()), bind_value)
}

fn bind_seq<'a>(
    q: BoxedSqlQuery<'a, Mysql, SqlQuery>,
    seq: &'a i64,
) -> BoxedSqlQuery<'a, Mysql, SqlQuery> {
    q.bind::<BigInt, _>(*seq)
}

/// `error`, cut at a character boundary to fit `last_error`.
fn truncate_error(error: &str) -> &str {
    if error.len() <= MAX_ERROR_BYTES {
        return error;
    }
    let mut end = MAX_ERROR_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    &error[..end]
}

/// The relay store on MySQL 8 and MariaDB ≥ 10.6 (InnoDB): `FOR UPDATE SKIP LOCKED` claims
/// for unordered mode, head-of-line ordered claims fenced by shard or leadership leases for
/// the ordered modes, set-based marks (`IN (?, …)`), and no wake-up notifications: the relay
/// polls at its poll interval.
///
/// Same semantics as `PgRelayStore`, with these differences of means:
///
/// - **Claims are one short transaction**, as MySQL has no `UPDATE … RETURNING`:
///   `SELECT seq … ORDER BY seq LIMIT n FOR UPDATE [SKIP LOCKED]` (with the same conditions
///   as PostgreSQL's claim, the shard-lease and leadership checks included), `UPDATE … WHERE
///   seq IN (…)` on exactly the rows it locked (checking the shard or leadership lease
///   again, see below), `SELECT` them back, `COMMIT`. Nothing else happens inside that
///   transaction, and no transaction is ever open across a publish.
/// - **Times are the database's clock in UTC**: `UTC_TIMESTAMP(6)` and
///   `+ INTERVAL ? MICROSECOND`; the `DATETIME(6)` columns hold naive UTC, whatever the
///   session's `time_zone`.
/// - **Sessions run at `READ COMMITTED`** with `innodb_lock_wait_timeout = 10`, so that a
///   locking read neither takes gap locks nor keeps the rows it only scanned past.
/// - **Leadership is a lease row** in `outbox_leader` (`INSERT … ON DUPLICATE KEY UPDATE`
///   that takes the row if it is ours or expired, then a read of who holds it, in one
///   transaction), not `GET_LOCK`. `GET_LOCK` belongs to the server session that took it:
///   it is lost silently when a pooler or proxy hands the relay another server connection,
///   and released when the relay reconnects after an error; and as long as that session
///   lives it never expires, so a hung leader whose connection stays open keeps it. Fencing
///   needs the lease where the claim can read it, from whatever connection it runs on: the
///   lease row is on the database clock, survives reconnects, and the ordered claim checks
///   it in its own statements, which is what fences a deposed leader.
/// - **Failures** are recorded with one `UPDATE` per failed row, in one transaction.
/// - **Shard rebalancing** is pg.rs's algorithm: the heartbeat and the removal of long-dead
///   relays as statements of their own, then the count of live relays, the renewal, and
///   giving up surplus or taking free shards (`FOR UPDATE SKIP LOCKED`) in one transaction.
///
/// **Ordered modes and InnoDB locking.** The ordering guarantee is PostgreSQL's, but InnoDB
/// gets there differently, and it costs more waiting:
///
/// - InnoDB locks every row a locking read examines *before* the conditions outside the
///   index (shard, lease, head-of-line) are tested, and lets go of the rejected ones at once
///   (`READ COMMITTED`). An ordered claim therefore cannot use `SKIP LOCKED`: another
///   relay scanning past the head of an aggregate holds its lock for an instant, and a claim
///   that skipped it would take the aggregate's next event. So ordered claims wait for
///   every lock on a pending row they scan in `seq` order, in any shard: other relays'
///   claims and marks in flight (milliseconds).
/// - InnoDB's locking reads also wait for *uncommitted inserts*. An ordered claim that
///   reaches a row an application transaction has inserted but not committed waits for that
///   transaction, up to `innodb_lock_wait_timeout` (10 s; then the claim fails, and the
///   relay backs off and retries). A long application transaction that writes to the outbox
///   thus stalls the ordered relays; PostgreSQL's claim does not see uncommitted rows and
///   does not wait. (The other side of it: a MariaDB ordered claim never overtakes an
///   earlier event whose transaction commits late.) Unordered claims skip such rows.
/// - The `SELECT`'s checks (leases, head-of-line) are as of its start: its clock is
///   `UTC_TIMESTAMP(6)` at the statement's start, and its subqueries are consistent reads.
///   A claim that waited long enough for its shard or leadership lease to run out and pass
///   to another relay could otherwise claim rows of an aggregate the other relay is already
///   publishing. So the `UPDATE` that leases the locked rows checks the shard or leadership
///   lease again, on a fresh clock and snapshot, and if it cannot lease every locked row the
///   whole claim is rolled back and returns nothing. What remains is the instant between
///   that `UPDATE` and the `COMMIT`, as on PostgreSQL, where the claim is one statement.
///
/// ```no_run
/// # async fn run() -> Result<(), outbox_core::relay::StoreError> {
/// use outbox_diesel::relay::MysqlRelayStore;
/// let mut store = MysqlRelayStore::new("mysql://relay@127.0.0.1/app");
/// store.connect().await?; // optional: report a bad URL at start-up
/// # Ok(())
/// # }
/// ```
pub struct MysqlRelayStore {
    url: String,
    conn: Option<AsyncMysqlConnection>,
    /// When the current connection was made (reaping waits `REAP_GRACE` after it).
    connected_at: Option<std::time::Instant>,
    /// The relay id this store heartbeats for, and whether another live relay holds it.
    guard: IdGuard,
    /// The ids of this store's connections, the current and recent ones.
    own_connections: Vec<i64>,
}

impl MysqlRelayStore {
    /// A store for the database at `url` (`mysql://user:password@host:port/database`); it
    /// connects on first use and after errors.
    pub fn new(url: impl Into<String>) -> Self {
        MysqlRelayStore {
            url: url.into(),
            conn: None,
            connected_at: None,
            guard: IdGuard::default(),
            own_connections: Vec::new(),
        }
    }

    /// Connects now (otherwise the first call does), so that a bad URL or an unreachable
    /// server is reported at start-up.
    pub async fn connect(&mut self) -> Result<(), StoreError> {
        self.conn().await.map(|_| ())
    }

    async fn conn(&mut self) -> Result<&mut AsyncMysqlConnection, StoreError> {
        // A call whose future was dropped mid-transaction leaves the connection inside it:
        // start over rather than run the next unit of work in someone else's transaction.
        if let Some(conn) = self.conn.as_mut() {
            let status =
                <AsyncMysqlConnection as AsyncConnection>::TransactionManager::transaction_manager_status_mut(conn);
            if !matches!(status.transaction_depth(), Ok(None)) {
                self.conn = None;
            }
        }
        if self.conn.is_none() {
            let mut conn = AsyncMysqlConnection::establish(&self.url)
                .await
                .map_err(|e| connect_error("MySQL", e))?;
            for sql in SESSION_SQL {
                diesel::sql_query(sql)
                    .execute(&mut conn)
                    .await
                    .map_err(|e| StoreError::new("configure the session", e))?;
            }
            if let Some((relay, lease, health)) = &self.guard.beat {
                // A new connection: take the relay's session lock at once, before a peer
                // takes the old connection's end for this relay's death, and before anything
                // else runs on it, so that it never claims for an id another live relay
                // holds.
                self.guard.in_use = mysql_sessions::heartbeat(
                    &mut conn,
                    relay,
                    *lease,
                    health,
                    &mut self.own_connections,
                )
                .await
                .map_err(|e| StoreError::new("take the relay's session lock", e))?;
            }
            self.connected_at = Some(std::time::Instant::now());
            self.conn = Some(conn);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::new("connect", "no connection"))
    }

    /// Passes a result through; after an error the connection is dropped and the next call
    /// reconnects (the error may be a lost connection).
    fn check<T>(&mut self, op: &'static str, r: diesel::QueryResult<T>) -> Result<T, StoreError> {
        r.map_err(|e| {
            self.conn = None;
            super::common::store_error(op, e)
        })
    }
}

/// Why a claim's transaction rolled back.
enum ClaimError {
    Db(diesel::result::Error),
    /// The relay lost its shard or leadership lease while the claim waited for row locks.
    Fenced,
}

impl From<diesel::result::Error> for ClaimError {
    fn from(e: diesel::result::Error) -> Self {
        ClaimError::Db(e)
    }
}

impl IsDeadlock for ClaimError {
    fn is_deadlock(&self) -> bool {
        matches!(self, ClaimError::Db(e) if is_deadlock(e))
    }
}

async fn claim_in(
    conn: &mut AsyncMysqlConnection,
    claim: &Claim<'_>,
) -> Result<Vec<Result<OutboxMessage, Malformed>>, ClaimError> {
    let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX);
    let (shards_only, leader_only) = match claim.order {
        ClaimOrder::Unordered => (false, false),
        ClaimOrder::Ordered {
            owned_shards_only,
            leader_only,
            ..
        } => (owned_shards_only, leader_only),
    };
    let locked = match claim.order {
        ClaimOrder::Unordered => {
            diesel::sql_query(SELECT_UNORDERED)
                .bind::<BigInt, _>(limit)
                .load::<SeqRow>(conn)
                .await?
        }
        ClaimOrder::Ordered {
            dead_letters_block, ..
        } => {
            diesel::sql_query(SELECT_ORDERED)
                .bind::<Bool, _>(shards_only)
                .bind::<Text, _>(claim.relay)
                .bind::<Bool, _>(leader_only)
                .bind::<Text, _>(claim.relay)
                .bind::<Bool, _>(dead_letters_block)
                .bind::<BigInt, _>(limit)
                .load::<SeqRow>(conn)
                .await?
        }
    };
    let seqs: Vec<i64> = locked.into_iter().map(|r| r.seq).collect();
    let until = micros(claim.lease);
    let mut leased = 0;
    for chunk in seqs.chunks(IN_LIST_MAX) {
        leased += in_list(
            LEASE_ROWS,
            chunk,
            "",
            |q| {
                q.bind::<Text, _>(claim.relay)
                    .bind::<BigInt, _>(until)
                    .bind::<Bool, _>(shards_only)
                    .bind::<Text, _>(claim.relay)
                    .bind::<Bool, _>(leader_only)
                    .bind::<Text, _>(claim.relay)
            },
            bind_seq,
        )
        .execute(conn)
        .await?;
    }
    if leased != seqs.len() {
        // All or nothing: a part of the batch could miss an earlier event of an aggregate.
        return Err(ClaimError::Fenced);
    }
    let mut out = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(IN_LIST_MAX) {
        let rows = in_list(READ_ROWS, chunk, " ORDER BY seq", |q| q, bind_seq)
            .load::<Row>(conn)
            .await?;
        for row in rows {
            out.push(row.into_message());
        }
    }
    Ok(out)
}

/// Heartbeats `relay` and forgets relays dead for an hour: two statements, each its own
/// transaction. Inside one transaction they deadlock: each relay's heartbeat holds its own
/// row, and each `DELETE` scans (and waits for) every row, uncommitted inserts included.
async fn heartbeat(
    conn: &mut AsyncMysqlConnection,
    relay: &str,
    lease: i64,
) -> diesel::QueryResult<()> {
    diesel::sql_query(HEARTBEAT)
        .bind::<Text, _>(relay)
        .bind::<BigInt, _>(lease)
        .bind::<BigInt, _>(lease)
        .execute(conn)
        .await?;
    diesel::sql_query(FORGET_DEAD_RELAYS).execute(conn).await?;
    Ok(())
}

/// Counts live relays, renews `relay`'s shard leases, gives up its surplus or takes free
/// shards: one transaction. It waits for no lock another rebalance holds while waiting
/// itself: the renewal's `UPDATE` reads locked rows semi-consistently (it waits only for a
/// row whose committed owner is `relay`, which another relay is taking over, and that one
/// waits for nothing), and free shards are taken with `SKIP LOCKED`.
async fn rebalance_in(
    conn: &mut AsyncMysqlConnection,
    relay: &str,
    lease: i64,
) -> diesel::QueryResult<ShardAssignment> {
    let live = diesel::sql_query(LIVE_RELAYS)
        .get_result::<CountRow>(conn)
        .await?
        .n;
    let fair = fair_share(live);
    diesel::sql_query(RENEW_SHARDS)
        .bind::<BigInt, _>(lease)
        .bind::<Text, _>(relay)
        .execute(conn)
        .await?;
    let mut owned: Vec<i16> = diesel::sql_query(OWNED_SHARDS)
        .bind::<Text, _>(relay)
        .load::<ShardRow>(conn)
        .await?
        .into_iter()
        .map(|r| r.shard)
        .collect();
    let fair_usize = usize::try_from(fair).unwrap_or(usize::MAX);
    if owned.len() > fair_usize {
        let surplus = owned.split_off(fair_usize);
        in_list(
            GIVE_UP_SHARDS,
            &surplus,
            "",
            |q| q.bind::<Text, _>(relay),
            |q, s| q.bind::<SmallInt, _>(*s),
        )
        .execute(conn)
        .await?;
    } else if owned.len() < fair_usize {
        let want = fair - owned.len() as i64;
        let free: Vec<i16> = diesel::sql_query(FREE_SHARDS)
            .bind::<BigInt, _>(want)
            .load::<ShardRow>(conn)
            .await?
            .into_iter()
            .map(|r| r.shard)
            .collect();
        if !free.is_empty() {
            in_list(
                TAKE_SHARDS,
                &free,
                "",
                |q| q.bind::<Text, _>(relay).bind::<BigInt, _>(lease),
                |q, s| q.bind::<SmallInt, _>(*s),
            )
            .execute(conn)
            .await?;
            owned.extend(free);
            owned.sort_unstable();
        }
    }
    Ok(ShardAssignment {
        owned,
        live_relays: usize::try_from(live).unwrap_or(1),
    })
}

impl RelayStore for MysqlRelayStore {
    async fn claim(&mut self, claim: &Claim<'_>) -> Result<Vec<OutboxMessage>, StoreError> {
        self.conn().await?;
        self.guard.refuse("claim")?;
        let conn = self.conn().await?;
        match in_transaction!(conn, async |conn| claim_in(conn, claim).await) {
            Ok(rows) => {
                let sorted = split_malformed(rows);
                settle_malformed(self, claim.relay, sorted).await
            }
            Err(ClaimError::Fenced) => {
                tracing::warn!(
                    relay = claim.relay,
                    "lease lost while claiming (the claim waited for row locks); claimed nothing"
                );
                Ok(Vec::new())
            }
            Err(ClaimError::Db(e)) => self.check("claim", Err(e)),
        }
    }

    async fn complete(
        &mut self,
        relay: &str,
        seqs: &[i64],
        completion: Completion,
    ) -> Result<u64, StoreError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let sql = match completion {
            Completion::MarkPublished => COMPLETE_MARK,
            Completion::Delete => COMPLETE_DELETE,
        };
        let conn = self.conn().await?;
        let r = in_transaction!(conn, async |conn| {
            let mut n = 0;
            for chunk in seqs.chunks(IN_LIST_MAX) {
                n += in_list(sql, chunk, "", |q| q.bind::<Text, _>(relay), bind_seq)
                    .execute(conn)
                    .await?;
            }
            Ok::<_, diesel::result::Error>(n as u64)
        });
        self.check("mark published", r)
    }

    async fn fail(&mut self, relay: &str, failures: &[Failure]) -> Result<u64, StoreError> {
        if failures.is_empty() {
            return Ok(0);
        }
        // Rows are locked in `seq` order, as claims and marks lock them.
        let mut sorted: Vec<&Failure> = failures.iter().collect();
        sorted.sort_unstable_by_key(|f| f.seq);
        let conn = self.conn().await?;
        let r = in_transaction!(conn, async |conn| {
            let mut n = 0;
            for f in &sorted {
                let error = truncate_error(&f.error);
                n += match f.retry_after {
                    Some(delay) => {
                        diesel::sql_query(FAIL_RETRY)
                            .bind::<Text, _>(error)
                            .bind::<BigInt, _>(micros(delay))
                            .bind::<BigInt, _>(f.seq)
                            .bind::<Text, _>(relay)
                            .execute(conn)
                            .await?
                    }
                    None => {
                        diesel::sql_query(FAIL_DEAD)
                            .bind::<Text, _>(error)
                            .bind::<BigInt, _>(f.seq)
                            .bind::<Text, _>(relay)
                            .execute(conn)
                            .await?
                    }
                };
            }
            Ok::<_, diesel::result::Error>(n as u64)
        });
        self.check("record failures", r)
    }

    async fn release(&mut self, relay: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let conn = self.conn().await?;
        let r = in_transaction!(conn, async |conn| {
            let mut n = 0;
            for chunk in seqs.chunks(IN_LIST_MAX) {
                n += in_list(RELEASE, chunk, "", |q| q.bind::<Text, _>(relay), bind_seq)
                    .execute(conn)
                    .await?;
            }
            Ok::<_, diesel::result::Error>(n as u64)
        });
        self.check("release", r)
    }

    async fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let lease = micros(lease);
        self.conn().await?;
        self.guard.refuse("acquire leadership")?;
        let conn = self.conn().await?;
        let r = in_transaction!(conn, async |conn| {
            diesel::sql_query(LEAD)
                .bind::<Text, _>(relay)
                .bind::<BigInt, _>(lease)
                .bind::<Text, _>(relay)
                .bind::<Text, _>(relay)
                .bind::<Text, _>(relay)
                .bind::<BigInt, _>(lease)
                .execute(conn)
                .await?;
            let holder = diesel::sql_query(LEADER)
                .get_result::<HolderRow>(conn)
                .await
                .optional()?;
            Ok::<_, diesel::result::Error>(holder.is_some_and(|h| h.holder == relay))
        });
        self.check("acquire leadership", r)
    }

    async fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<ShardAssignment, StoreError> {
        let lease = micros(lease);
        self.conn().await?;
        self.guard.refuse("rebalance shards")?;
        let conn = self.conn().await?;
        let r = match heartbeat(conn, relay, lease).await {
            Ok(()) => {
                in_transaction!(conn, async |conn| rebalance_in(conn, relay, lease).await)
            }
            Err(e) => Err(e),
        };
        self.check("rebalance shards", r)
    }

    async fn release_all(&mut self, relay: &str) -> Result<(), StoreError> {
        if self.guard.in_use.is_some() {
            // The leases of this id are the other relay's: leave them alone.
            return Ok(());
        }
        let conn = self.conn().await?;
        let r = in_transaction!(conn, async |conn| {
            for sql in [
                RELEASE_ALL_ROWS,
                RELEASE_SHARDS,
                RELEASE_LEADER,
                FORGET_RELAY,
            ] {
                diesel::sql_query(sql)
                    .bind::<Text, _>(relay)
                    .execute(conn)
                    .await?;
            }
            Ok::<_, diesel::result::Error>(())
        });
        self.check("release leases", r)
    }

    async fn heartbeat(
        &mut self,
        relay: &str,
        lease: Duration,
        health: &RelayHealth,
    ) -> Result<(), StoreError> {
        self.guard.remember(relay, lease, health);
        // A new connection repeats the heartbeat just remembered as it connects.
        let fresh = self.conn.is_none() && self.guard.beat.is_some();
        self.conn().await?;
        if !fresh {
            let conn = self
                .conn
                .as_mut()
                .ok_or_else(|| StoreError::new("connect", "no connection"))?;
            let r =
                mysql_sessions::heartbeat(conn, relay, lease, health, &mut self.own_connections)
                    .await;
            self.guard.in_use = self.check("heartbeat", r)?;
        }
        self.guard.refuse("heartbeat")
    }

    async fn reap_dead_relays(&mut self, relay: &str) -> Result<Vec<String>, StoreError> {
        self.conn().await?;
        if !self.guard.may_reap(self.connected_at) {
            return Ok(Vec::new());
        }
        let conn = self.conn().await?;
        let r = mysql_sessions::reap(conn, relay).await;
        self.check("reap dead relays", r)
    }

    async fn cleanup(&mut self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let conn = self.conn().await?;
        let r = diesel::sql_query(CLEANUP)
            .bind::<BigInt, _>(micros(older_than))
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(conn)
            .await;
        self.check("clean up", r).map(|n| n as u64)
    }
}
