//! The PostgreSQL relay store's statements and session settings.

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

/// What a claim returns. `attempts` is the number of the attempt being made: the failed
/// attempts recorded so far, plus this one (a claim does not write `attempts`; see
/// [`CLAIM_UNORDERED`]).
pub(super) const RETURNING: &str = "RETURNING o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, \
     o.event_version, o.payload::text AS payload, o.headers::text AS headers, o.topic, o.shard, \
     o.created_at, o.attempts + 1 AS attempts";

/// Unordered: any pending, unleased rows; rows another relay is claiming are skipped.
///
/// **A claim is a HOT update.** It writes only `locked_by` and `locked_until`, which no index
/// reads (key or predicate), and the table's `fillfactor = 50` leaves room for the new
/// versions on the page (migration `hot_claims`), so PostgreSQL writes the new version next to
/// the old one and no index entry at all. Measured (`EXPLAIN (ANALYZE, WAL)`, claims of 1,000
/// of 20,000 rows after a `CHECKPOINT`): 2.05 WAL records and 354 bytes per row (the row lock
/// and the heap update), against 9.2 records and 1,203 bytes when the claim also set
/// `attempts` and the in-flight index's predicate read the lease (a new entry in each of the
/// table's indexes per claimed row); the claim ran in a fifth of the time.
///
/// `attempts` is not written here: the relay's `fail` counts a failed publish. A claim that
/// takes over an expired lease (the relay that held it lost the database for longer than the
/// lease, or died) therefore costs the event nothing: only its own failures count toward
/// `max_attempts`, never an outage.
pub const CLAIM_UNORDERED: &str = "UPDATE outbox_events o \
     SET locked_by = $1, locked_until = now() + make_interval(secs => $2) \
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
/// The head-of-line checks are scalar subqueries with `LIMIT 1`, not `NOT EXISTS` over the
/// pending rows: on a table whose statistics lag behind its size (a fresh or fast-growing
/// outbox, before autovacuum analyses it) that form was planned as a probe of the `seq` index
/// or of the whole table per candidate, measured at 20 s to over 5 minutes per claim of 1,000
/// rows with 100,000 pending; this one stayed at a few milliseconds, analysed or not. The
/// dead-letter check probes the small `outbox_events_dead_aggregate`. The blocked check walks
/// the aggregate's pending rows (`outbox_events_pending_aggregate`) from its oldest up to the
/// candidate and stops at the first blocked one: no index may read the lease columns, or the
/// claim would not be a HOT update (see [`CLAIM_UNORDERED`]). Every unblocked pending row
/// below a candidate is itself a candidate of the same claim, so the walk is as long as the
/// candidate's aggregate has rows ahead of it in this claim. With many aggregates per batch
/// that is a step or two (1,000 aggregates, batch 1,000, 20,000 rows: 19 ms per claim, it was
/// 47 ms with the in-flight index and a non-HOT claim); with one aggregate filling the whole
/// batch it grows with the square of the batch (measured: 264 ms per claim of 1,000, 28 ms
/// with the in-flight index, which held no fresh rows). An aggregate whose oldest pending row
/// is leased or waiting for a retry is found blocked at the first step.
///
/// The walk starts at the oldest pending row of the whole table (`p.seq >= (SELECT
/// min(m.seq) …)`, computed once per claim): a blocked row is pending, so none is older, and
/// the index entries of the aggregate's rows published since the last `VACUUM`, which the
/// walk would otherwise step over on every probe, are skipped by the descent. Measured on
/// 100,000 rows of which 50,000 published (1,000 aggregates, batch 1,000, sharded): 0.054 ms
/// per probe without the bound, 0.004 ms with it; the claim took 42 ms instead of 99 ms.
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
     SET locked_by = $1, locked_until = now() + make_interval(secs => $2) \
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
                    AND p.seq >= (SELECT min(m.seq) FROM outbox_events m \
                                  WHERE m.published_at IS NULL AND m.dead_at IS NULL) \
                    AND (p.available_at > now() OR p.locked_until >= now()) \
                  LIMIT 1) IS NULL \
             AND (NOT $6 OR (SELECT d.seq FROM outbox_events d \
                  WHERE d.aggregate_type = e.aggregate_type AND d.aggregate_id = e.aggregate_id \
                    AND d.seq < e.seq AND d.dead_at IS NOT NULL AND d.published_at IS NULL \
                  LIMIT 1) IS NULL) \
           ORDER BY e.seq LIMIT $3 FOR UPDATE OF e)) ";

/// The mark: not a HOT update (the pending indexes' predicates read `published_at`), but its
/// new version lands on the same page once the page is pruned of the claim's old versions
/// (`fillfactor = 50`), so the table does not grow: measured 4.1 WAL records and 370 bytes
/// per row, against 5.1 and 528 before the claim became HOT.
pub(super) const COMPLETE_MARK: &str = "UPDATE outbox_events \
     SET published_at = now(), locked_by = NULL, locked_until = NULL \
     WHERE seq = ANY($2) AND locked_by = $1";

pub(super) const COMPLETE_DELETE: &str =
    "DELETE FROM outbox_events WHERE seq = ANY($2) AND locked_by = $1";

/// Records failed publishes: each counts one attempt (the claim counts none).
pub(super) const FAIL: &str = "UPDATE outbox_events o \
     SET locked_by = NULL, locked_until = NULL, last_error = f.error, attempts = o.attempts + 1, \
         available_at = CASE WHEN f.dead THEN o.available_at \
                             ELSE now() + make_interval(secs => f.delay) END, \
         dead_at = CASE WHEN f.dead THEN now() END \
     FROM unnest($2::bigint[], $3::float8[], $4::text[], $5::bool[]) AS f(seq, delay, error, dead) \
     WHERE o.seq = f.seq AND o.locked_by = $1";

/// Gives rows back: the claim counted no attempt, so there is none to give back.
pub(super) const RELEASE: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL \
     WHERE seq = ANY($2) AND locked_by = $1";

/// What `release_all` runs, in this order, each with the relay's id bound: it lets go of the
/// relay's claimed rows, its shards and its leadership, and forgets its heartbeat.
pub(super) const RELEASE_ALL: [&str; 4] = [
    "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL \
     WHERE locked_by = $1 AND published_at IS NULL AND dead_at IS NULL",
    "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL WHERE owner = $1",
    "DELETE FROM outbox_leader WHERE holder = $1",
    "DELETE FROM outbox_relays WHERE relay_id = $1",
];

pub(super) const LEAD: &str = "INSERT INTO outbox_leader (name, holder, lease_until) \
     VALUES ('relay', $1, now() + make_interval(secs => $2)) \
     ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until \
     WHERE outbox_leader.holder = EXCLUDED.holder OR outbox_leader.lease_until < now() \
     RETURNING holder";

pub(super) const HEARTBEAT: &str = "INSERT INTO outbox_relays (relay_id, heartbeat_until, mode) \
     VALUES ($1, now() + make_interval(secs => $2), 'sharded') \
     ON CONFLICT (relay_id) DO UPDATE SET heartbeat_until = EXCLUDED.heartbeat_until, \
         mode = CASE outbox_relays.mode WHEN 'stream' THEN 'stream' ELSE 'sharded' END";

/// Only sharded (and stream) relays share the shards: relays of other modes heartbeat here
/// too (for `outbox status` and session detection) but must not shrink the fair share.
pub(super) const LIVE_RELAYS: &str = "SELECT COUNT(*) AS n FROM outbox_relays \
     WHERE heartbeat_until > now() AND mode IN ('sharded', 'stream')";

pub(super) const FORGET_DEAD_RELAYS: &str =
    "DELETE FROM outbox_relays WHERE heartbeat_until < now() - interval '1 hour'";

pub(super) const RENEW_SHARDS: &str = "UPDATE outbox_shard_leases \
     SET lease_until = now() + make_interval(secs => $2) WHERE owner = $1 RETURNING shard";

pub(super) const GIVE_UP_SHARDS: &str = "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL \
     WHERE owner = $1 AND shard = ANY($2)";

pub(super) const TAKE_SHARDS: &str = "UPDATE outbox_shard_leases \
     SET owner = $1, lease_until = now() + make_interval(secs => $2) \
     WHERE shard IN (SELECT shard FROM outbox_shard_leases \
                     WHERE owner IS NULL OR lease_until < now() \
                     ORDER BY shard LIMIT $3 FOR UPDATE SKIP LOCKED) \
     RETURNING shard";

pub(super) const CLEANUP: &str = "DELETE FROM outbox_events WHERE seq IN ( \
     SELECT seq FROM outbox_events \
     WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1) \
     ORDER BY published_at LIMIT $2)";
