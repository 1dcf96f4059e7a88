//! The SQLite relay store.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Bool, Nullable, Text, Timestamp};
use diesel::sqlite::Sqlite;
use diesel::{QueryableByName, RunQueryDsl, SqliteConnection};
use diesel_async::AsyncConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use outbox_core::relay::{
    Claim, ClaimOrder, Completion, Failure, OutboxMessage, RelayHealth, RelayStore,
    ShardAssignment, StoreError,
};

use super::common::{
    ClaimedColumns, CountRow, HolderRow, IN_LIST_MAX, MAX_INTERVAL, Malformed, ShardRow,
    connect_error, fair_share, mode_name, parse_id, placeholders, settle_malformed,
    split_malformed,
};
use crate::backend::sqlite_timestamp;

/// Session settings of relay connections. `busy_timeout`: a writer that finds the database
/// locked by another connection (a second relay, the application) waits up to 5 s instead
/// of failing at once. WAL: readers (the application's) and the relay's writer do not block
/// each other, and commits are cheaper.
const SESSION_SQL: &str = "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL;";

/// `?1` relay, `?2` now, `?3` lease end, `?4` limit.
const CLAIM_UNORDERED: &str = "UPDATE outbox_events \
     SET locked_by = ?1, locked_until = ?3, attempts = attempts + 1 \
     WHERE seq IN (SELECT seq FROM outbox_events \
                   WHERE published_at IS NULL AND dead_at IS NULL AND available_at <= ?2 \
                     AND (locked_until IS NULL OR locked_until < ?2) \
                   ORDER BY seq LIMIT ?4) ";

/// PostgreSQL's ordered claim, with `?5` owned shards only, `?6` leader only, `?7` dead
/// letters block. SQLite has one writer at a time, so no row locks are needed: the
/// statement sees and changes the database alone.
const CLAIM_ORDERED: &str = "UPDATE outbox_events \
     SET locked_by = ?1, locked_until = ?3, attempts = attempts + 1 \
     WHERE seq IN (SELECT e.seq FROM outbox_events e \
           WHERE e.published_at IS NULL AND e.dead_at IS NULL AND e.available_at <= ?2 \
             AND (e.locked_until IS NULL OR e.locked_until < ?2) \
             AND (NOT ?5 OR e.shard IN (SELECT shard FROM outbox_shard_leases \
                                        WHERE owner = ?1 AND lease_until > ?2)) \
             AND (NOT ?6 OR EXISTS (SELECT 1 FROM outbox_leader \
                                    WHERE name = 'relay' AND holder = ?1 AND lease_until > ?2)) \
             AND NOT EXISTS (SELECT 1 FROM outbox_events p \
                             WHERE p.aggregate_type = e.aggregate_type \
                               AND p.aggregate_id = e.aggregate_id AND p.seq < e.seq \
                               AND p.published_at IS NULL AND p.dead_at IS NULL \
                               AND (p.available_at > ?2 OR p.locked_until >= ?2)) \
             AND (NOT ?7 OR NOT EXISTS (SELECT 1 FROM outbox_events d \
                             WHERE d.aggregate_type = e.aggregate_type \
                               AND d.aggregate_id = e.aggregate_id AND d.seq < e.seq \
                               AND d.dead_at IS NOT NULL AND d.published_at IS NULL)) \
           ORDER BY e.seq LIMIT ?4) ";

const RETURNING: &str = "RETURNING seq, id, aggregate_type, aggregate_id, event_type, \
     event_version, payload, headers, topic, shard, created_at, attempts";

/// `now`, relay, then the `IN (…)` list.
const COMPLETE_MARK: &str = "UPDATE outbox_events \
     SET published_at = ?, locked_by = NULL, locked_until = NULL \
     WHERE locked_by = ? AND seq IN (";

/// Relay, then the `IN (…)` list.
const COMPLETE_DELETE: &str = "DELETE FROM outbox_events WHERE locked_by = ? AND seq IN (";

/// `?1` error, `?2` retry at, `?3` seq, `?4` relay.
const FAIL_RETRY: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, last_error = ?1, dead_at = NULL, \
         available_at = ?2 \
     WHERE seq = ?3 AND locked_by = ?4";

/// `?1` error, `?2` now, `?3` seq, `?4` relay.
const FAIL_DEAD: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, last_error = ?1, dead_at = ?2 \
     WHERE seq = ?3 AND locked_by = ?4";

/// Relay, then the `IN (…)` list.
const RELEASE: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE locked_by = ? AND seq IN (";

const RELEASE_ALL_ROWS: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE locked_by = ?1 AND published_at IS NULL AND dead_at IS NULL";

/// `?1` relay, `?2` lease end, `?3` now.
const LEAD: &str = "INSERT INTO outbox_leader (name, holder, lease_until) VALUES ('relay', ?1, ?2) \
     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until \
     WHERE outbox_leader.holder = excluded.holder OR outbox_leader.lease_until < ?3 \
     RETURNING holder";

/// `?1` relay, `?2` heartbeat end.
const HEARTBEAT: &str = "INSERT INTO outbox_relays (relay_id, heartbeat_until) VALUES (?1, ?2) \
     ON CONFLICT (relay_id) DO UPDATE SET heartbeat_until = excluded.heartbeat_until, \
         mode = 'sharded'";

/// `?1` now.
const LIVE_RELAYS: &str = "SELECT COUNT(*) AS n FROM outbox_relays \
     WHERE heartbeat_until > ?1 AND mode = 'sharded'";

/// `?1` relay, `?2` heartbeat until, `?3` now, `?4` mode, `?5` state, `?6` last error. No
/// session: SQLite runs in the relay's process, and its single relay is replaced only when
/// its lease runs out.
const HEALTH: &str = "INSERT INTO outbox_relays \
     (relay_id, heartbeat_until, mode, state, state_since, last_error) \
     VALUES (?1, ?2, ?4, ?5, ?3, ?6) \
     ON CONFLICT (relay_id) DO UPDATE SET heartbeat_until = excluded.heartbeat_until, \
         mode = excluded.mode, state = excluded.state, \
         state_since = CASE WHEN outbox_relays.state = excluded.state \
                             AND outbox_relays.state_since IS NOT NULL \
                            THEN outbox_relays.state_since ELSE excluded.state_since END, \
         last_error = excluded.last_error";

/// `?1` an hour ago.
const FORGET_DEAD_RELAYS: &str = "DELETE FROM outbox_relays WHERE heartbeat_until < ?1";

/// `?1` relay, `?2` lease end.
const RENEW_SHARDS: &str = "UPDATE outbox_shard_leases SET lease_until = ?2 WHERE owner = ?1 \
     RETURNING shard";

/// Relay, then the `IN (…)` list.
const GIVE_UP_SHARDS: &str = "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL \
     WHERE owner = ? AND shard IN (";

/// `?1` relay, `?2` lease end, `?3` now, `?4` how many.
const TAKE_SHARDS: &str = "UPDATE outbox_shard_leases SET owner = ?1, lease_until = ?2 \
     WHERE shard IN (SELECT shard FROM outbox_shard_leases \
                     WHERE owner IS NULL OR lease_until < ?3 \
                     ORDER BY shard LIMIT ?4) \
     RETURNING shard";

const RELEASE_SHARDS: &str =
    "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL WHERE owner = ?1";
const RELEASE_LEADER: &str = "DELETE FROM outbox_leader WHERE holder = ?1";
const FORGET_RELAY: &str = "DELETE FROM outbox_relays WHERE relay_id = ?1";

/// `?1` cut-off, `?2` limit.
pub(crate) const CLEANUP: &str = "DELETE FROM outbox_events WHERE seq IN ( \
     SELECT seq FROM outbox_events \
     WHERE published_at IS NOT NULL AND published_at < ?1 \
     ORDER BY published_at LIMIT ?2)";

#[derive(QueryableByName)]
struct Row {
    #[diesel(embed)]
    columns: ClaimedColumns,
    #[diesel(sql_type = Text)]
    id: String,
    /// UTC text, `YYYY-MM-DD HH:MM:SS.ffffff`.
    #[diesel(sql_type = Timestamp)]
    created_at: NaiveDateTime,
}

impl Row {
    fn into_message(self) -> Result<OutboxMessage, Malformed> {
        let id = parse_id(self.columns.seq, &self.id);
        self.columns.into_message(id, self.created_at.and_utc())
    }
}

/// `at + d` as stored (`d` clamped to a century).
fn after(at: DateTime<Utc>, d: Duration) -> String {
    let d = chrono::Duration::from_std(d.min(MAX_INTERVAL)).unwrap_or(chrono::Duration::MAX);
    sqlite_timestamp(at.checked_add_signed(d).unwrap_or(at))
}

/// `at - d` as stored (`d` clamped to a century).
fn before(at: DateTime<Utc>, d: Duration) -> String {
    let d = chrono::Duration::from_std(d.min(MAX_INTERVAL)).unwrap_or(chrono::Duration::MAX);
    sqlite_timestamp(at.checked_sub_signed(d).unwrap_or(at))
}

/// Runs `prefix(?, …)` over `seqs` in chunks, `bind` binding the prefix's own parameters;
/// returns the rows changed. The values are bound, never written into the SQL.
fn for_each_chunk<'a>(
    conn: &mut SqliteConnection,
    prefix: &str,
    seqs: &[i64],
    bind: impl Fn(BoxedSqlQuery<'a, Sqlite, SqlQuery>) -> BoxedSqlQuery<'a, Sqlite, SqlQuery>,
) -> diesel::QueryResult<u64> {
    let mut n = 0;
    for chunk in seqs.chunks(IN_LIST_MAX) {
        let sql = format!("{prefix}{})", placeholders(chunk.len()));
        let q = bind(diesel::sql_query(sql).into_boxed());
        n += chunk
            .iter()
            .fold(q, |q, seq| q.bind::<BigInt, _>(*seq))
            .execute(conn)?;
    }
    Ok(n as u64)
}

fn claim_in(
    conn: &mut SqliteConnection,
    relay: &str,
    limit: i64,
    lease: Duration,
    order: ClaimOrder,
) -> diesel::QueryResult<Vec<Result<OutboxMessage, Malformed>>> {
    let now = Utc::now();
    let (at, until) = (sqlite_timestamp(now), after(now, lease));
    let rows = match order {
        ClaimOrder::Unordered => diesel::sql_query(format!("{CLAIM_UNORDERED}{RETURNING}"))
            .bind::<Text, _>(relay)
            .bind::<Text, _>(&at)
            .bind::<Text, _>(&until)
            .bind::<BigInt, _>(limit)
            .load::<Row>(conn)?,
        ClaimOrder::Ordered {
            owned_shards_only,
            leader_only,
            dead_letters_block,
        } => diesel::sql_query(format!("{CLAIM_ORDERED}{RETURNING}"))
            .bind::<Text, _>(relay)
            .bind::<Text, _>(&at)
            .bind::<Text, _>(&until)
            .bind::<BigInt, _>(limit)
            .bind::<Bool, _>(owned_shards_only)
            .bind::<Bool, _>(leader_only)
            .bind::<Bool, _>(dead_letters_block)
            .load::<Row>(conn)?,
    };
    Ok(rows.into_iter().map(Row::into_message).collect())
}

fn rebalance_in(
    conn: &mut SqliteConnection,
    relay: &str,
    lease: Duration,
) -> diesel::QueryResult<ShardAssignment> {
    let now = Utc::now();
    let (at, until) = (sqlite_timestamp(now), after(now, lease));
    diesel::sql_query(HEARTBEAT)
        .bind::<Text, _>(relay)
        .bind::<Text, _>(&until)
        .execute(conn)?;
    diesel::sql_query(FORGET_DEAD_RELAYS)
        .bind::<Text, _>(before(now, Duration::from_secs(3600)))
        .execute(conn)?;
    let live = diesel::sql_query(LIVE_RELAYS)
        .bind::<Text, _>(&at)
        .get_result::<CountRow>(conn)?
        .n;
    let fair = fair_share(live);
    let mut owned: Vec<i16> = diesel::sql_query(RENEW_SHARDS)
        .bind::<Text, _>(relay)
        .bind::<Text, _>(&until)
        .load::<ShardRow>(conn)?
        .into_iter()
        .map(|r| r.shard)
        .collect();
    owned.sort_unstable();
    let fair_usize = usize::try_from(fair).unwrap_or(usize::MAX);
    if owned.len() > fair_usize {
        let surplus: Vec<i64> = owned
            .split_off(fair_usize)
            .into_iter()
            .map(i64::from)
            .collect();
        for_each_chunk(conn, GIVE_UP_SHARDS, &surplus, |q| q.bind::<Text, _>(relay))?;
    } else if owned.len() < fair_usize {
        let want = fair - owned.len() as i64;
        let taken = diesel::sql_query(TAKE_SHARDS)
            .bind::<Text, _>(relay)
            .bind::<Text, _>(&until)
            .bind::<Text, _>(&at)
            .bind::<BigInt, _>(want)
            .load::<ShardRow>(conn)?;
        owned.extend(taken.into_iter().map(|r| r.shard));
        owned.sort_unstable();
    }
    Ok(ShardAssignment {
        owned,
        live_relays: usize::try_from(live).unwrap_or(1),
    })
}

/// The relay store on SQLite: one `UPDATE … WHERE seq IN (SELECT …) RETURNING …` per claim
/// (SQLite ≥ 3.35; the bundled library is newer), with the same conditions as PostgreSQL's
/// in every mode, set-based marks (`IN (?, …)`), and no wake-up notifications: the relay
/// polls at its poll interval.
///
/// **SQLite is for one relay.** It has one writer at a time for the whole database, so
/// several relays on one file take turns rather than work in parallel (and compete with the
/// application's writes). Every mode works, and several relays stay correct (each waits
/// for the lock up to `busy_timeout`, 5 s, then fails the call and retries), but a second
/// relay only makes sense as a standby in leader mode.
///
/// Differences of means from `PgRelayStore`:
///
/// - **Times are the relay's clock**, not the database's: SQLite runs in-process. They are
///   computed in Rust and bound in the stored format, `YYYY-MM-DD HH:MM:SS.ffffff` UTC
///   (six fraction digits, so text order is time order); SQLite's own `datetime('now')` is
///   never compared with them, as its text has another format. Relays sharing one file are
///   on one host, so they share that clock.
/// - **No row locks**: a statement runs alone on the database, so a claim cannot race
///   another. Its `now` is taken before it waits for the write lock; a late clock only makes
///   leases and backoffs look longer, and the statement reads the database as it is once it
///   runs, so a lease another relay took meanwhile is seen. Multi-statement units (shard rebalance, failures, release on shutdown) run in
///   `BEGIN IMMEDIATE` transactions, which take the write lock up front: a deferred
///   transaction that read first could fail to upgrade, and SQLite reports that at once
///   instead of waiting.
/// - **The connection** runs with `PRAGMA busy_timeout = 5000` and `journal_mode = WAL`.
///   Each call runs on Tokio's blocking pool (diesel-async's `SyncConnectionWrapper`), and
///   a call's unit of work runs to its end even if the relay stops waiting for it.
///
/// The database must be a file (or a shared-cache URI): `:memory:` would give the store a
/// database of its own, without the application's outbox.
///
/// ```
/// # include!("../doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use diesel::Connection;
/// use outbox_core::relay::{MemoryBroker, Relay, RelayConfig};
/// use outbox_diesel::OutboxConnection;
/// use outbox_diesel::relay::SqliteRelayStore;
///
/// let dir = std::env::temp_dir().join(format!("outbox-sqlite-relay-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("app.db").to_string_lossy().into_owned();
///
/// // The application commits an event with its business rows.
/// let mut conn = diesel::SqliteConnection::establish(&path)?;
/// outbox_diesel::migrations::run(&mut conn)?;
/// conn.transaction_with_outbox(|tx| {
///     tx.publish(&OrderCreated { order_id: 1, total_cents: 1250 })?;
///     Ok::<_, outbox_diesel::Error>(())
/// })?;
///
/// // The relay publishes it, then shuts down gracefully.
/// let broker = Arc::new(MemoryBroker::new());
/// let config = RelayConfig { poll_interval: Duration::from_millis(20), ..RelayConfig::default() };
/// let relay = Relay::new(SqliteRelayStore::new(&path), broker.clone(), config)?;
/// let published = broker.clone();
/// relay
///     .run(async move {
///         while published.all_records().is_empty() {
///             tokio::time::sleep(Duration::from_millis(10)).await;
///         }
///     })
///     .await;
/// assert_eq!(broker.records("order").len(), 1);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
pub struct SqliteRelayStore {
    url: String,
    conn: Option<SyncConnectionWrapper<SqliteConnection>>,
}

impl SqliteRelayStore {
    /// A store for the database at `url` (a file path, or a `file:` URI); it connects on
    /// first use and after errors.
    pub fn new(url: impl Into<String>) -> Self {
        SqliteRelayStore {
            url: url.into(),
            conn: None,
        }
    }

    /// Connects now (otherwise the first call does), so that an unusable path is reported
    /// at start-up.
    pub async fn connect(&mut self) -> Result<(), StoreError> {
        self.conn().await.map(|_| ())
    }

    async fn conn(&mut self) -> Result<&mut SyncConnectionWrapper<SqliteConnection>, StoreError> {
        if self.conn.is_none() {
            let mut conn = SyncConnectionWrapper::<SqliteConnection>::establish(&self.url)
                .await
                .map_err(|e| connect_error("SQLite", e))?;
            conn.spawn_blocking(|c| {
                diesel::connection::SimpleConnection::batch_execute(c, SESSION_SQL)
            })
            .await
            .map_err(|e| StoreError::new("configure the session", e))?;
            self.conn = Some(conn);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::new("connect", "no connection"))
    }

    /// Runs `f` on the connection in Tokio's blocking pool. After an error the connection is
    /// dropped and the next call reconnects.
    async fn run<T: Send + 'static>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&mut SqliteConnection) -> diesel::QueryResult<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn().await?;
        let r = conn.spawn_blocking(f).await;
        r.map_err(|e| {
            self.conn = None;
            super::common::store_error(op, e)
        })
    }
}

impl RelayStore for SqliteRelayStore {
    async fn claim(&mut self, claim: &Claim<'_>) -> Result<Vec<OutboxMessage>, StoreError> {
        let relay = claim.relay.to_owned();
        let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX);
        let (lease, order) = (claim.lease, claim.order);
        let rows = self
            .run("claim", move |c| claim_in(c, &relay, limit, lease, order))
            .await?;
        settle_malformed(self, claim.relay, split_malformed(rows)).await
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
        let (relay, seqs) = (relay.to_owned(), seqs.to_vec());
        self.run("mark published", move |c| {
            let at = sqlite_timestamp(Utc::now());
            c.immediate_transaction(|c| match completion {
                Completion::MarkPublished => for_each_chunk(c, COMPLETE_MARK, &seqs, |q| {
                    q.bind::<Text, _>(at.as_str())
                        .bind::<Text, _>(relay.as_str())
                }),
                Completion::Delete => for_each_chunk(c, COMPLETE_DELETE, &seqs, |q| {
                    q.bind::<Text, _>(relay.as_str())
                }),
            })
        })
        .await
    }

    async fn fail(&mut self, relay: &str, failures: &[Failure]) -> Result<u64, StoreError> {
        if failures.is_empty() {
            return Ok(0);
        }
        let (relay, failures) = (relay.to_owned(), failures.to_vec());
        self.run("record failures", move |c| {
            let now = Utc::now();
            let at = sqlite_timestamp(now);
            c.immediate_transaction(|c| {
                let mut n = 0;
                for f in &failures {
                    let (sql, when) = match f.retry_after {
                        Some(delay) => (FAIL_RETRY, after(now, delay)),
                        None => (FAIL_DEAD, at.clone()),
                    };
                    n += diesel::sql_query(sql)
                        .bind::<Text, _>(&f.error)
                        .bind::<Text, _>(when)
                        .bind::<BigInt, _>(f.seq)
                        .bind::<Text, _>(&relay)
                        .execute(c)?;
                }
                Ok(n as u64)
            })
        })
        .await
    }

    async fn release(&mut self, relay: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let (relay, seqs) = (relay.to_owned(), seqs.to_vec());
        self.run("release", move |c| {
            c.immediate_transaction(|c| {
                for_each_chunk(c, RELEASE, &seqs, |q| q.bind::<Text, _>(relay.as_str()))
            })
        })
        .await
    }

    async fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let relay = relay.to_owned();
        self.run("acquire leadership", move |c| {
            let now = Utc::now();
            let rows = diesel::sql_query(LEAD)
                .bind::<Text, _>(&relay)
                .bind::<Text, _>(after(now, lease))
                .bind::<Text, _>(sqlite_timestamp(now))
                .load::<HolderRow>(c)?;
            Ok(!rows.is_empty())
        })
        .await
    }

    async fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<ShardAssignment, StoreError> {
        let relay = relay.to_owned();
        self.run("rebalance shards", move |c| {
            c.immediate_transaction(|c| rebalance_in(c, &relay, lease))
        })
        .await
    }

    async fn heartbeat(
        &mut self,
        relay: &str,
        lease: Duration,
        health: &RelayHealth,
    ) -> Result<(), StoreError> {
        let (relay, health) = (relay.to_owned(), health.clone());
        self.run("heartbeat", move |c| {
            let now = Utc::now();
            diesel::sql_query(HEALTH)
                .bind::<Text, _>(&relay)
                .bind::<Text, _>(after(now, lease))
                .bind::<Text, _>(sqlite_timestamp(now))
                .bind::<Text, _>(mode_name(health.mode))
                .bind::<Text, _>(health.state.as_str())
                .bind::<Nullable<Text>, _>(health.last_error.as_deref())
                .execute(c)
                .map(|_| ())
        })
        .await
    }

    async fn release_all(&mut self, relay: &str) -> Result<(), StoreError> {
        let relay = relay.to_owned();
        self.run("release leases", move |c| {
            c.immediate_transaction(|c| {
                for sql in [
                    RELEASE_ALL_ROWS,
                    RELEASE_SHARDS,
                    RELEASE_LEADER,
                    FORGET_RELAY,
                ] {
                    diesel::sql_query(sql).bind::<Text, _>(&relay).execute(c)?;
                }
                Ok(())
            })
        })
        .await
    }

    async fn cleanup(&mut self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run("clean up", move |c| {
            let n = diesel::sql_query(CLEANUP)
                .bind::<Text, _>(before(Utc::now(), older_than))
                .bind::<BigInt, _>(limit)
                .execute(c)?;
            Ok(n as u64)
        })
        .await
    }
}
