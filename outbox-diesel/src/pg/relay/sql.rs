//! The PostgreSQL relay store's statements and session settings.

/// The channel writers notify and relays listen on.
pub const NOTIFY_CHANNEL: &str = "outbox_events";

/// Session settings of relay connections. `force_custom_plan`: a claim planned once as a
/// generic plan while the table was empty can keep a sequential-scan plan after the table
/// fills, and such claims take minutes; custom plans are re-planned with the real values.
///
/// Generic plans would save a third of a claim at batch 100, but a plan made on an empty
/// table keeps scans no full table can afford; what was measured, and what is left to try:
/// `docs/design/postgres-claims.md`.
///
/// `jit = off`: the ordered claim's estimated cost (its `LIMIT` over a filtered scan with two
/// subqueries per candidate) is far above `jit_above_cost`, so PostgreSQL would compile it
/// with LLVM on every claim, at many times the claim's own cost in server CPU. The claims are
/// short index scans; JIT never pays here. Measured: `docs/design/postgres-claims.md`,
/// section "JIT off".
pub const SESSION_SQL: &str = "SET plan_cache_mode = force_custom_plan; SET jit = off";

/// Names the relay's sessions in `pg_stat_activity`, unless the connections come from the
/// application's own factory, whose `application_name` is kept.
pub const APPLICATION_NAME_SQL: &str = "SET application_name = 'outbox-relay'";

/// Added to [`SESSION_SQL`] unless the store was asked for synchronous commits
/// ([`PgRelayStore::synchronous_commit`](super::PgRelayStore::synchronous_commit)).
///
/// **The relay's own writes are committed without waiting for their WAL flush.** Every
/// claim, mark, settle and lease renewal is a transaction of its own, and with
/// `synchronous_commit = on` each waits for an `fsync`, many times the cost of the write
/// itself: a relay at batch 100 would spend most of its time waiting for the disk (two commits
/// a batch), and the claim's flush would sit between an event's commit and its publish.
/// Measured: `docs/design/postgres-claims.md`, section "Asynchronous commits".
///
/// What it risks: a crash of the server (or a failover to a replica) may lose the last
/// fraction of a second of the relay's writes (at most three `wal_writer_delay`s, 600 ms by
/// default); recovery restores a prefix of the server's commit order, so the database comes
/// back as it was a moment earlier. Nothing the relay writes is an event: writers' commits
/// keep the server's `synchronous_commit`, and a writer's commit flushes every relay write
/// before it. What the relay loses is bookkeeping the design already recovers from: a lost
/// mark or advanced stream position publishes its events again (at least once; consumers
/// deduplicate by id), a lost claim lets another relay claim the rows too (both publish them
/// in order: the first delivery of each event keeps its aggregate's order), a lost failure
/// costs the event one attempt less, a lost lease renewal or heartbeat looks like a pause
/// (fenced by the leases, as ever: claims and settles read the leases from the database, not
/// from memory). Never a lost event, never one published before an earlier event of its
/// aggregate is first published, never an uncommitted one.
pub const ASYNC_COMMIT_SQL: &str = "SET synchronous_commit = off";

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
/// the old one and no index entry at all: a claimed row costs the WAL its row lock and heap
/// update only, where a claim that also wrote an indexed column would add a new entry in each
/// of the table's indexes per claimed row, and take several times as long. Measured:
/// `docs/design/postgres-claims.md`, section "HOT claims".
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
/// one-row estimate) as a sequential scan per claimed row. Measured:
/// `docs/design/postgres-claims.md`, section "Updating the claimed rows by primary key".
///
/// **Head of line: a window over the first batch of pending rows.** `b` reads the first `$3`
/// pending rows of the relay's shards in `seq` order, blocked or not (one walk of the pending
/// index, as long as the batch), each with whether it is blocked (leased by someone, or
/// waiting for a retry). No pending row is older than `b`'s first, and every pending row of
/// the relay's shards up to `b`'s last is in `b` (an aggregate's rows share one shard, a
/// function of the aggregate; sharded order rests on that already). So for a candidate up to
/// there: when no row of `b` is blocked (a relay draining a backlog one batch at a time),
/// nothing blocks it, decided once per claim; else `w` marks a row `held` when it or an
/// earlier row of its aggregate in `b` is blocked (a window partitioned by aggregate, sorted
/// over `b` only: as long as the batch, whatever the backlog; evaluated only then), and the
/// candidate qualifies if it is not `held`, a hashed lookup. This is exact wherever the
/// blocked rows are, including after `outbox replay` made an old event pending again ahead of
/// a leased later one (the aggregate's head is free, the rows behind the leased one are held;
/// a "the head is blocked" shortcut would release those). No index may read the lease
/// columns, or the claim would not be a HOT update (see [`CLAIM_UNORDERED`]), so the blocked
/// state is read from the rows.
///
/// Candidates beyond `b` (the batch was not filled from it: some of its rows are blocked)
/// keep the walk: a scalar subquery with `LIMIT 1` over the
/// aggregate's pending rows (`outbox_events_pending_aggregate`) from the oldest pending row
/// of the table (`p.seq >= (SELECT min(m.seq) …)`, computed once: the index entries of rows
/// published since the last `VACUUM` are skipped by the descent) up to the candidate,
/// stopping at the first blocked one. (Scalar subqueries, not `NOT EXISTS`: on a table whose
/// statistics lag behind its size that form is planned as a probe of the `seq` index or of the
/// whole table per candidate.) Measured: `docs/design/postgres-claims.md`, section "The
/// walk's lower bound and its scalar subqueries". That
/// walk alone steps over every unblocked earlier row of the candidate's aggregate, which are
/// candidates of the same claim: quadratic in one aggregate's rows per batch.
///
/// What the window gained over the walk alone, per claim and in the drain:
/// `docs/design/postgres-claims.md`.
///
/// The dead-letter check probes the small `outbox_events_dead_aggregate` per candidate only
/// while a dead letter exists (an uncorrelated `NOT EXISTS`, evaluated once per claim): without
/// a dead letter, probes per candidate find nothing and cost a good part of the claim's reads.
/// Measured: `docs/design/postgres-claims.md`, section "The dead-letter check".
///
/// `$7` ([`Claim::look_ahead`](outbox_core::relay::Claim::look_ahead)), when not null,
/// bounds the candidates to the first `$7` pending rows of the relay's shards: the relay sets
/// it on a claim made beside batches in flight, which otherwise walks the whole backlog when
/// every aggregate near the head is held back by a batch in flight. Null, it is folded away
/// when the statement is planned (custom plans, [`SESSION_SQL`]).
///
/// `$8` ([`Claim::settling`](outbox_core::relay::Claim::settling)): rows of this relay that the
/// broker acknowledged, whose mark the relay's settler writes beside this claim. Those still
/// leased by `$1` are left out of `b`, as the published rows are: they hold back nothing there
/// (each was published before any later row of its aggregate will be). Without it, a claim made
/// while the last batch is being marked would find that batch's aggregates leased in `b` and
/// take the walk. Nowhere else: a candidate that is one of them is leased (not claimable), and the
/// walk, which runs only for candidates beyond `b`, counts them as leased, which holds back
/// more than it must but never less. A row whose lease passed to another relay (`locked_by` is
/// theirs) or was given back (`NULL`) counts as what it is. Under custom plans the array is a
/// constant: `= ANY` of one is a hashed lookup (PostgreSQL 14 and later, from 9 elements), but
/// the planner estimates it element by element, which costs planning time in each place it
/// appears, so it appears once. Measured: `docs/design/postgres-claims.md`, section "The
/// settling rows' array".
///
/// **Two claims on one shard must never run at once.** Under READ COMMITTED a claim that
/// waited for a row lock re-checks (EvalPlanQual) only the rows it waited for, not the
/// head-of-line condition of the later rows it keeps: two concurrent claims on one shard can
/// each take part of an aggregate's run, and one can publish a later event while the other
/// still holds an earlier one. Two sharded relays sharing one `relay_id` (a config cloned for
/// both) would both own every shard of that id and publish aggregates out of order (see
/// `docs/design/postgres-claims.md`, section "One claimant per shard"). What ensures one
/// claimant per shard: the shard (or leadership)
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
     WHERE o.seq = ANY(ARRAY( \
         WITH b AS MATERIALIZED ( \
             SELECT seq, aggregate_type, aggregate_id, \
                    available_at > now() OR coalesce(locked_until >= now(), false) AS blocked \
             FROM outbox_events \
             WHERE published_at IS NULL AND dead_at IS NULL \
               AND NOT (seq = ANY($8) AND coalesce(locked_by = $1, false)) \
               AND (NOT $4 OR shard IN (SELECT shard FROM outbox_shard_leases \
                                        WHERE owner = $1 AND lease_until > now())) \
             ORDER BY seq LIMIT $3), \
         w AS MATERIALIZED ( \
             SELECT seq, bool_or(blocked) \
                        OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY seq) AS held \
             FROM b) \
         SELECT e.seq FROM outbox_events e \
           WHERE e.published_at IS NULL AND e.dead_at IS NULL AND e.available_at <= now() \
             AND (e.locked_until IS NULL OR e.locked_until < now()) \
             AND (NOT $4 OR e.shard IN (SELECT shard FROM outbox_shard_leases \
                                        WHERE owner = $1 AND lease_until > now())) \
             AND (NOT $5 OR EXISTS (SELECT 1 FROM outbox_leader \
                                    WHERE name = 'relay' AND holder = $1 AND lease_until > now())) \
             AND ($7::bigint IS NULL OR e.seq <= (SELECT max(la.seq) FROM ( \
                  SELECT seq FROM outbox_events \
                  WHERE published_at IS NULL AND dead_at IS NULL \
                    AND (NOT $4 OR shard IN (SELECT shard FROM outbox_shard_leases \
                                             WHERE owner = $1 AND lease_until > now())) \
                  ORDER BY seq LIMIT $7) la)) \
             AND CASE WHEN e.seq <= (SELECT max(b.seq) FROM b) \
                 THEN (SELECT NOT bool_or(b.blocked) FROM b) \
                      OR e.seq IN (SELECT w.seq FROM w WHERE NOT w.held) \
                 ELSE (SELECT p.seq FROM outbox_events p \
                  WHERE p.aggregate_type = e.aggregate_type AND p.aggregate_id = e.aggregate_id \
                    AND p.seq < e.seq AND p.published_at IS NULL AND p.dead_at IS NULL \
                    AND p.seq >= (SELECT min(m.seq) FROM outbox_events m \
                                  WHERE m.published_at IS NULL AND m.dead_at IS NULL) \
                    AND (p.available_at > now() OR p.locked_until >= now()) \
                  LIMIT 1) IS NULL END \
             AND (NOT $6 \
                  OR NOT EXISTS (SELECT 1 FROM outbox_events x \
                                 WHERE x.dead_at IS NOT NULL AND x.published_at IS NULL) \
                  OR (SELECT d.seq FROM outbox_events d \
                  WHERE d.aggregate_type = e.aggregate_type AND d.aggregate_id = e.aggregate_id \
                    AND d.seq < e.seq AND d.dead_at IS NOT NULL AND d.published_at IS NULL \
                  LIMIT 1) IS NULL) \
           ORDER BY e.seq LIMIT $3 FOR UPDATE OF e)) ";

/// The mark: not a HOT update (the pending indexes' predicates read `published_at`), but its
/// new version lands on the same page once the page is pruned of the claim's old versions
/// (`fillfactor = 50`), so the table does not grow, and it writes less WAL per row than when
/// the claim was not a HOT update. Measured: `docs/design/postgres-claims.md`, section "HOT
/// claims".
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

/// Retention: deletes up to `$2` rows published more than `$1` seconds ago, first those a
/// lease mode marked published (oldest `published_at` first), then those stream mode
/// published.
///
/// Stream mode writes nothing on a row it publishes, so neither its publication nor its age
/// can be read from a row without a scan. The statement records a *tick* (the time and
/// `pg_current_snapshot()`, at most one a second) in `outbox_stream_ticks` and takes as its
/// bound the newest tick at least `$1` old: a row goes when its transaction is visible in
/// that tick (it committed before it, so it is at least `$1` old) and in its shard's
/// `last_snapshot` (published, or passed as a dead letter or parked event: those are copies
/// in `outbox_stream_dead_letters`). Per shard that is a range scan of the stream index
/// `(shard, xid)` up to the lower of the two snapshots' `xmax`, visibility a filter: the work
/// is what it deletes (and the rows of transactions open at the tick), never the rows kept
/// for retention, and a transaction left open holds back only its own rows. Ticks older
/// than the bound are deleted (the shortest retention in use decides what is left anyway).
/// A table never relayed in stream mode pays 256 index probes that find nothing (its
/// positions are the migration's snapshot). The rows are deleted, so their space is reused
/// only after a `VACUUM` (autovacuum). On a table partitioned into a ring
/// (`Admin::partition_events`, see `partition.rs`) whole partitions are emptied by
/// `TRUNCATE` before this runs, and the stream rows this deletes are only those older than a
/// turn of the ring (`ring.floor`): rows a partition could not be emptied of because newer
/// ones share it.
///
/// A shard's rows are spread over the whole heap (the lease mode's oldest `published_at` are
/// neighbours), so each stream row deleted costs a page of its own: several times what a lease
/// mode's row costs. Taking the oldest `⌈$2 / 256⌉` of every shard instead (neighbours again)
/// gains too little to pay for what it needs (a second pass for the batches one shard holds
/// most of). Measured: `docs/design/postgres-claims.md`, section "Retention of stream rows".
pub(super) const CLEANUP: &str = "WITH tick AS ( \
         INSERT INTO outbox_stream_ticks (tick_at, snapshot) \
         SELECT now(), pg_current_snapshot() \
         WHERE NOT EXISTS (SELECT 1 FROM outbox_stream_ticks \
                           WHERE tick_at > now() - interval '1 second') \
         ON CONFLICT DO NOTHING), \
     bound AS MATERIALIZED ( \
         SELECT tick_at, snapshot FROM outbox_stream_ticks \
         WHERE tick_at <= now() - make_interval(secs => $1) \
         ORDER BY tick_at DESC LIMIT 1), \
     pruned AS (DELETE FROM outbox_stream_ticks \
         WHERE tick_at < (SELECT tick_at FROM bound)), \
     ring AS MATERIALIZED ( \
         SELECT coalesce((SELECT greatest(pg_snapshot_xmax(pg_current_snapshot())::text::bigint \
                                          - slots * slot_xids, 0) \
                          FROM outbox_stream_partitioning), \
                         9223372036854775807)::text::xid8 AS floor) \
     DELETE FROM outbox_events WHERE seq = ANY(ARRAY( \
     SELECT c.seq FROM ( \
         (SELECT seq FROM outbox_events \
          WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1) \
          ORDER BY published_at LIMIT $2) \
         UNION ALL \
         (SELECT h.seq FROM bound CROSS JOIN ring CROSS JOIN outbox_stream_positions p \
          CROSS JOIN LATERAL ( \
              SELECT o.seq FROM outbox_events o \
              WHERE o.shard = p.shard \
                AND o.xid < least(pg_snapshot_xmax(bound.snapshot), \
                                  pg_snapshot_xmax(p.last_snapshot), ring.floor) \
                AND o.published_at IS NULL AND o.dead_at IS NULL \
                AND pg_visible_in_snapshot(o.xid, bound.snapshot) \
                AND pg_visible_in_snapshot(o.xid, p.last_snapshot) \
              LIMIT $2) h)) c \
     LIMIT $2))";
