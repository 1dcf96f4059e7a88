//! The PostgreSQL relay store.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Double, SmallInt, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_core::relay::{
    Claim, ClaimOrder, Completion, Failure, OutboxMessage, RelayHealth, RelayStore,
    ShardAssignment, StoreError,
};

use super::pg_sessions;

use super::common::{
    ClaimedColumns, CountRow, HolderRow, IdGuard, Malformed, ShardRow, connect_error, fair_share,
    secs, settle_malformed, split_malformed,
};

/// The channel writers notify and relays listen on.
pub const NOTIFY_CHANNEL: &str = "outbox_events";

/// Session settings of relay connections. `force_custom_plan`: a claim planned once as a
/// generic plan while the table was empty can keep a sequential-scan plan after the table
/// fills (measured: claims of 80–100 s); custom plans are re-planned with the real values.
///
/// `jit = off`: the ordered claim's estimated cost (its `LIMIT` over a filtered scan with two
/// subqueries per candidate) is far above `jit_above_cost`, so PostgreSQL compiled it with
/// LLVM on every claim: 20–25 ms of server CPU for a claim that runs in under 1 ms, found with
/// `EXPLAIN (ANALYZE)` while the benchmark showed ordered drains at 3–17 % of the SQL ceiling
/// with the server burning a core. The claims are short index scans; JIT never pays here.
pub const SESSION_SQL: &str = "SET plan_cache_mode = force_custom_plan; SET jit = off; \
     SET application_name = 'outbox-relay'";

const RETURNING: &str = "RETURNING o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, \
     o.event_version, o.payload::text AS payload, o.headers::text AS headers, o.topic, o.shard, \
     o.created_at, o.attempts";

/// Unordered: any pending, unleased rows; rows another relay is claiming are skipped.
pub const CLAIM_UNORDERED: &str = "UPDATE outbox_events o \
     SET locked_by = $1, locked_until = now() + make_interval(secs => $2), attempts = o.attempts + 1 \
     WHERE o.seq = ANY(ARRAY(SELECT seq FROM outbox_events \
           WHERE published_at IS NULL AND dead_at IS NULL AND available_at <= now() \
             AND (locked_until IS NULL OR locked_until < now()) \
           ORDER BY seq LIMIT $3 FOR UPDATE SKIP LOCKED)) ";

/// Ordered: a row qualifies only if no earlier pending row of its aggregate is blocked
/// (leased by someone, or waiting for a retry) and, when `$6`, no earlier one is dead.
/// `$4`: only shards this relay holds a live lease on; `$5`: only while it holds the
/// leadership lease. No SKIP LOCKED: skipping a locked earlier row could let a later one of
/// the same aggregate through; a brief wait is the price of order.
///
/// The claimed rows are updated through `o.seq = ANY(ARRAY(...))`, which always reads them by
/// primary key; joined as `FROM (...) c WHERE o.seq = c.seq` the update was planned (on a
/// one-row estimate) as a sequential scan per claimed row, measured by the benchmark at 60 ms
/// to 280 ms per claim of 1,000.
///
/// The head-of-line checks are scalar subqueries with `LIMIT 1` on small partial indexes
/// (`outbox_events_inflight_aggregate`: only rows that are or were in flight can block;
/// `outbox_events_dead_aggregate`), not `NOT EXISTS` over the pending rows: on a table whose
/// statistics lag behind its size (a fresh or fast-growing outbox, before autovacuum
/// analyses it) that form was planned as a probe of the `seq` index or of the whole table per
/// candidate, measured at 20 s to over 5 minutes per claim of 1,000 rows with 100,000
/// pending; this one stayed at a few milliseconds, analysed or not.
///
/// **Two claims on one shard must never run at once.** Under READ COMMITTED a claim that
/// waited for a row lock re-checks (EvalPlanQual) only the rows it waited for, not the
/// head-of-line condition of the later rows it keeps: two concurrent claims on one shard can
/// each take part of an aggregate's run, and one can publish a later event while the other
/// still holds an earlier one. Found with two sharded relays that shared one `relay_id` (a
/// config cloned for both): both owned every shard of that id, and an aggregate came out as
/// `[0, 1, 2, 3, 6, 4, 5, 7]`. What ensures one claimant per shard: the shard (or leadership)
/// lease names one relay id, and the heartbeat refuses an id another live session holds
/// (`pg_sessions`), so a second process with the same id claims nothing. A relay whose lease
/// passed to another while its claim waited cannot act on it either: `statement_timeout`
/// stays below a third of the lease, the renewal interval. Every new connection of a store
/// heartbeats before it claims, so no connection claims for an id it was refused. What
/// remains is outside the guard: with session detection off (`session_check: None`, behind a
/// transaction pooler) nothing records sessions, so duplicate ids cannot be detected and the
/// ids must be unique by construction (the default id is).
pub const CLAIM_ORDERED: &str = "UPDATE outbox_events o \
     SET locked_by = $1, locked_until = now() + make_interval(secs => $2), attempts = o.attempts + 1 \
     WHERE o.seq = ANY(ARRAY(SELECT e.seq FROM outbox_events e \
           WHERE e.published_at IS NULL AND e.dead_at IS NULL AND e.available_at <= now() \
             AND (e.locked_until IS NULL OR e.locked_until < now()) \
             AND (NOT $4 OR e.shard IN (SELECT shard FROM outbox_shard_leases \
                                        WHERE owner = $1 AND lease_until > now())) \
             AND (NOT $5 OR EXISTS (SELECT 1 FROM outbox_leader \
                                    WHERE name = 'relay' AND holder = $1 AND lease_until > now())) \
             AND (SELECT p.seq FROM outbox_events p \
                  WHERE p.aggregate_type = e.aggregate_type AND p.aggregate_id = e.aggregate_id \
                    AND p.seq < e.seq AND p.published_at IS NULL AND p.dead_at IS NULL \
                    AND (p.locked_by IS NOT NULL OR p.attempts > 0 OR p.available_at > p.created_at) \
                    AND (p.available_at > now() OR p.locked_until >= now()) \
                  LIMIT 1) IS NULL \
             AND (NOT $6 OR (SELECT d.seq FROM outbox_events d \
                  WHERE d.aggregate_type = e.aggregate_type AND d.aggregate_id = e.aggregate_id \
                    AND d.seq < e.seq AND d.dead_at IS NOT NULL AND d.published_at IS NULL \
                  LIMIT 1) IS NULL) \
           ORDER BY e.seq LIMIT $3 FOR UPDATE OF e)) ";

const COMPLETE_MARK: &str = "UPDATE outbox_events \
     SET published_at = now(), locked_by = NULL, locked_until = NULL \
     WHERE seq = ANY($2) AND locked_by = $1";

const COMPLETE_DELETE: &str = "DELETE FROM outbox_events WHERE seq = ANY($2) AND locked_by = $1";

const FAIL: &str = "UPDATE outbox_events o \
     SET locked_by = NULL, locked_until = NULL, last_error = f.error, \
         available_at = CASE WHEN f.dead THEN o.available_at \
                             ELSE now() + make_interval(secs => f.delay) END, \
         dead_at = CASE WHEN f.dead THEN now() END \
     FROM unnest($2::bigint[], $3::float8[], $4::text[], $5::bool[]) AS f(seq, delay, error, dead) \
     WHERE o.seq = f.seq AND o.locked_by = $1";

const RELEASE: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE seq = ANY($2) AND locked_by = $1";

const RELEASE_ALL_ROWS: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE locked_by = $1 AND published_at IS NULL AND dead_at IS NULL";

const LEAD: &str = "INSERT INTO outbox_leader (name, holder, lease_until) \
     VALUES ('relay', $1, now() + make_interval(secs => $2)) \
     ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until \
     WHERE outbox_leader.holder = EXCLUDED.holder OR outbox_leader.lease_until < now() \
     RETURNING holder";

const HEARTBEAT: &str = "INSERT INTO outbox_relays (relay_id, heartbeat_until, mode) \
     VALUES ($1, now() + make_interval(secs => $2), 'sharded') \
     ON CONFLICT (relay_id) DO UPDATE SET heartbeat_until = EXCLUDED.heartbeat_until, \
         mode = 'sharded'";

/// Only sharded relays share the shards: relays of other modes heartbeat here too (for
/// `outbox status` and session detection) but must not shrink the fair share.
const LIVE_RELAYS: &str = "SELECT COUNT(*) AS n FROM outbox_relays \
     WHERE heartbeat_until > now() AND mode = 'sharded'";

const FORGET_DEAD_RELAYS: &str =
    "DELETE FROM outbox_relays WHERE heartbeat_until < now() - interval '1 hour'";

const RENEW_SHARDS: &str = "UPDATE outbox_shard_leases \
     SET lease_until = now() + make_interval(secs => $2) WHERE owner = $1 RETURNING shard";

const GIVE_UP_SHARDS: &str = "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL \
     WHERE owner = $1 AND shard = ANY($2)";

const TAKE_SHARDS: &str = "UPDATE outbox_shard_leases \
     SET owner = $1, lease_until = now() + make_interval(secs => $2) \
     WHERE shard IN (SELECT shard FROM outbox_shard_leases \
                     WHERE owner IS NULL OR lease_until < now() \
                     ORDER BY shard LIMIT $3 FOR UPDATE SKIP LOCKED) \
     RETURNING shard";

const RELEASE_SHARDS: &str =
    "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL WHERE owner = $1";
const RELEASE_LEADER: &str = "DELETE FROM outbox_leader WHERE holder = $1";
const FORGET_RELAY: &str = "DELETE FROM outbox_relays WHERE relay_id = $1";

pub(crate) const CLEANUP: &str = "DELETE FROM outbox_events WHERE seq IN ( \
     SELECT seq FROM outbox_events \
     WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1) \
     ORDER BY published_at LIMIT $2)";

#[derive(QueryableByName)]
struct Row {
    #[diesel(embed)]
    columns: ClaimedColumns,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: uuid::Uuid,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
}

impl Row {
    fn into_message(self) -> Result<OutboxMessage, Malformed> {
        self.columns.into_message(Ok(self.id), self.created_at)
    }
}

/// The relay store on PostgreSQL: `FOR UPDATE SKIP LOCKED` claims for unordered mode,
/// head-of-line ordered claims fenced by shard or leadership leases for the ordered modes,
/// set-based marks (`= ANY($seqs)`, `unnest` for failures), and `LISTEN outbox_events` on a
/// second connection to wake up early.
///
/// ```no_run
/// # async fn run() {
/// use outbox_diesel::relay::PgRelayStore;
/// let store = PgRelayStore::new("postgres://postgres@127.0.0.1/app");
/// # }
/// ```
pub struct PgRelayStore {
    url: String,
    conn: Option<AsyncPgConnection>,
    listener: Option<AsyncPgConnection>,
    listen: bool,
    statement_timeout: Duration,
    /// When the current connection was made (reaping waits `REAP_GRACE` after it).
    connected_at: Option<std::time::Instant>,
    /// The relay id this store heartbeats for, and whether another live relay holds it.
    guard: IdGuard,
    /// The session the last heartbeat recorded.
    session: Option<pg_sessions::Session>,
}

impl PgRelayStore {
    /// A store for the database at `url`; it connects on first use and after errors.
    pub fn new(url: impl Into<String>) -> Self {
        PgRelayStore {
            url: url.into(),
            conn: None,
            listener: None,
            listen: true,
            statement_timeout: Duration::from_secs(10),
            connected_at: None,
            guard: IdGuard::default(),
            session: None,
        }
    }

    /// The longest any statement of the store may run (default 10 s). Keep it below a third
    /// of the relay's lease: the relay renews its shard or leadership lease every third of a
    /// lease, so a claim that cannot outlast this never acts on a lease that ran out while
    /// it waited for a lock.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Whether to `LISTEN` for writers' notifications (default `true`); without it the relay
    /// polls at its poll interval.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Connects now (otherwise the first call does), so that a bad URL or an unreachable
    /// server is reported at start-up.
    pub async fn connect(&mut self) -> Result<(), StoreError> {
        self.conn().await.map(|_| ())
    }

    async fn conn(&mut self) -> Result<&mut AsyncPgConnection, StoreError> {
        if self.conn.is_none() {
            let mut conn = AsyncPgConnection::establish(&self.url)
                .await
                .map_err(|e| connect_error("PostgreSQL", e))?;
            let timeout = format!(
                "{SESSION_SQL}; SET statement_timeout = {}",
                self.statement_timeout.as_millis()
            );
            conn.batch_execute(&timeout)
                .await
                .map_err(|e| StoreError::new("configure the session", e))?;
            if let Some((relay, lease, health)) = &self.guard.beat {
                // A new backend: record it at once, before a peer takes the old one's exit
                // for this relay's death, and before anything else runs on it, so that this
                // connection never claims for an id another live relay holds (see
                // `pg_sessions`).
                let beat =
                    pg_sessions::heartbeat(&mut conn, relay, *lease, health, self.session.as_ref())
                        .await
                        .map_err(|e| StoreError::new("record the relay's session", e))?;
                self.record(beat);
            }
            self.connected_at = Some(std::time::Instant::now());
            self.conn = Some(conn);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::new("connect", "no connection"))
    }

    /// Takes in what a heartbeat found.
    fn record(&mut self, beat: pg_sessions::Beat) {
        match beat {
            pg_sessions::Beat::Ours(session) => {
                self.session = Some(session);
                self.guard.in_use = None;
            }
            pg_sessions::Beat::InUse(conflict) => self.guard.in_use = Some(conflict),
        }
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

impl RelayStore for PgRelayStore {
    async fn claim(&mut self, claim: &Claim<'_>) -> Result<Vec<OutboxMessage>, StoreError> {
        let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX);
        self.conn().await?;
        self.guard.refuse("claim")?;
        let conn = self.conn().await?;
        let r = match claim.order {
            ClaimOrder::Unordered => {
                diesel::sql_query(format!("{CLAIM_UNORDERED}{RETURNING}"))
                    .bind::<Text, _>(claim.relay)
                    .bind::<Double, _>(secs(claim.lease))
                    .bind::<BigInt, _>(limit)
                    .load::<Row>(conn)
                    .await
            }
            ClaimOrder::Ordered {
                owned_shards_only,
                leader_only,
                dead_letters_block,
            } => {
                diesel::sql_query(format!("{CLAIM_ORDERED}{RETURNING}"))
                    .bind::<Text, _>(claim.relay)
                    .bind::<Double, _>(secs(claim.lease))
                    .bind::<BigInt, _>(limit)
                    .bind::<Bool, _>(owned_shards_only)
                    .bind::<Bool, _>(leader_only)
                    .bind::<Bool, _>(dead_letters_block)
                    .load::<Row>(conn)
                    .await
            }
        };
        let sorted = split_malformed(self.check("claim", r)?.into_iter().map(Row::into_message));
        settle_malformed(self, claim.relay, sorted).await
    }

    async fn complete(
        &mut self,
        relay: &str,
        seqs: &[i64],
        completion: Completion,
    ) -> Result<u64, StoreError> {
        let sql = match completion {
            Completion::MarkPublished => COMPLETE_MARK,
            Completion::Delete => COMPLETE_DELETE,
        };
        let conn = self.conn().await?;
        let r = diesel::sql_query(sql)
            .bind::<Text, _>(relay)
            .bind::<Array<BigInt>, _>(seqs)
            .execute(conn)
            .await;
        self.check("mark published", r).map(|n| n as u64)
    }

    async fn fail(&mut self, relay: &str, failures: &[Failure]) -> Result<u64, StoreError> {
        let seqs: Vec<i64> = failures.iter().map(|f| f.seq).collect();
        let delays: Vec<f64> = failures
            .iter()
            .map(|f| f.retry_after.map(secs).unwrap_or(0.0))
            .collect();
        let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
        let dead: Vec<bool> = failures.iter().map(|f| f.retry_after.is_none()).collect();
        let conn = self.conn().await?;
        let r = diesel::sql_query(FAIL)
            .bind::<Text, _>(relay)
            .bind::<Array<BigInt>, _>(&seqs)
            .bind::<Array<Double>, _>(&delays)
            .bind::<Array<Text>, _>(&errors)
            .bind::<Array<Bool>, _>(&dead)
            .execute(conn)
            .await;
        self.check("record failures", r).map(|n| n as u64)
    }

    async fn release(&mut self, relay: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        let conn = self.conn().await?;
        let r = diesel::sql_query(RELEASE)
            .bind::<Text, _>(relay)
            .bind::<Array<BigInt>, _>(seqs)
            .execute(conn)
            .await;
        self.check("release", r).map(|n| n as u64)
    }

    async fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.conn().await?;
        self.guard.refuse("acquire leadership")?;
        let conn = self.conn().await?;
        let r = diesel::sql_query(LEAD)
            .bind::<Text, _>(relay)
            .bind::<Double, _>(secs(lease))
            .load::<HolderRow>(conn)
            .await;
        self.check("acquire leadership", r)
            .map(|rows| !rows.is_empty())
    }

    async fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> Result<ShardAssignment, StoreError> {
        self.conn().await?;
        self.guard.refuse("rebalance shards")?;
        let conn = self.conn().await?;
        let r = async {
            diesel::sql_query(HEARTBEAT)
                .bind::<Text, _>(relay)
                .bind::<Double, _>(secs(lease))
                .execute(conn)
                .await?;
            diesel::sql_query(FORGET_DEAD_RELAYS).execute(conn).await?;
            let live = diesel::sql_query(LIVE_RELAYS)
                .get_result::<CountRow>(conn)
                .await?
                .n;
            let fair = fair_share(live);
            let mut owned: Vec<i16> = diesel::sql_query(RENEW_SHARDS)
                .bind::<Text, _>(relay)
                .bind::<Double, _>(secs(lease))
                .load::<ShardRow>(conn)
                .await?
                .into_iter()
                .map(|r| r.shard)
                .collect();
            owned.sort_unstable();
            let fair_usize = usize::try_from(fair).unwrap_or(usize::MAX);
            if owned.len() > fair_usize {
                let surplus = owned.split_off(fair_usize);
                diesel::sql_query(GIVE_UP_SHARDS)
                    .bind::<Text, _>(relay)
                    .bind::<Array<SmallInt>, _>(&surplus)
                    .execute(conn)
                    .await?;
            } else if owned.len() < fair_usize {
                let want = fair - owned.len() as i64;
                let taken = diesel::sql_query(TAKE_SHARDS)
                    .bind::<Text, _>(relay)
                    .bind::<Double, _>(secs(lease))
                    .bind::<BigInt, _>(want)
                    .load::<ShardRow>(conn)
                    .await?;
                owned.extend(taken.into_iter().map(|r| r.shard));
                owned.sort_unstable();
            }
            Ok(ShardAssignment {
                owned,
                live_relays: usize::try_from(live).unwrap_or(1),
            })
        }
        .await;
        self.check("rebalance shards", r)
    }

    async fn release_all(&mut self, relay: &str) -> Result<(), StoreError> {
        if self.guard.in_use.is_some() {
            // The leases of this id are the other relay's: leave them alone.
            return Ok(());
        }
        let conn = self.conn().await?;
        let r = async {
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
            Ok(())
        }
        .await;
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
        let previous = self.session.clone();
        let conn = self.conn().await?;
        if !fresh {
            let r = pg_sessions::heartbeat(conn, relay, lease, health, previous.as_ref()).await;
            let beat = self.check("heartbeat", r)?;
            self.record(beat);
        }
        self.guard.refuse("heartbeat")
    }

    async fn reap_dead_relays(&mut self, relay: &str) -> Result<Vec<String>, StoreError> {
        self.conn().await?;
        if !self.guard.may_reap(self.connected_at) {
            return Ok(Vec::new());
        }
        let conn = self.conn().await?;
        let r = pg_sessions::reap(conn, relay).await;
        self.check("reap dead relays", r)
    }

    async fn cleanup(&mut self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let conn = self.conn().await?;
        let r = diesel::sql_query(CLEANUP)
            .bind::<Double, _>(secs(older_than))
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(conn)
            .await;
        self.check("clean up", r).map(|n| n as u64)
    }

    async fn wait_for_work(&mut self, timeout: Duration) {
        if !self.listen {
            tokio::time::sleep(timeout).await;
            return;
        }
        if self.listener.is_none() {
            match AsyncPgConnection::establish(&self.url).await {
                Ok(mut l) => match l.batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}")).await {
                    Ok(()) => self.listener = Some(l),
                    Err(e) => tracing::warn!(error = %e, "LISTEN failed; polling"),
                },
                Err(e) => tracing::warn!(error = %e, "listener connection failed; polling"),
            }
        }
        let Some(listener) = self.listener.as_mut() else {
            tokio::time::sleep(timeout).await;
            return;
        };
        use futures_util::StreamExt;
        let lost = {
            let mut stream = std::pin::pin!(listener.notifications_stream());
            match tokio::time::timeout(timeout, stream.next()).await {
                // A notification only wakes the relay; it never carries data.
                Ok(Some(Ok(_))) | Err(_) => false,
                Ok(Some(Err(e))) => {
                    tracing::warn!(error = %e, "listener connection lost; reconnecting later");
                    true
                }
                Ok(None) => true,
            }
        };
        if lost {
            self.listener = None;
        }
    }
}
