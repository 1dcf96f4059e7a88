//! The SQLite relay store's statements and session settings.

pub(super) use crate::relay::common::{COMPLETE_DELETE, GIVE_UP_SHARDS, RELEASE};

/// Session settings of relay connections. `busy_timeout` (set by [`busy_timeout`]): a
/// writer that finds the database locked by another connection (a second relay, the
/// application) waits up to 5 s instead of failing at once. WAL: readers (the application's)
/// and the relay's writer do not block each other, and commits are cheaper.
pub(super) const SESSION_SQL: &str = "PRAGMA journal_mode = WAL;";

/// `PRAGMA busy_timeout` for a statement timeout of `timeout` (a third of the relay's lease,
/// see `relay::base`): SQLite has no statement timeout, and the wait for the write lock is
/// the only wait of the store's statements, so that wait is kept within it (and within
/// 5 s).
pub(super) fn busy_timeout(timeout: std::time::Duration) -> String {
    let ms = timeout.as_millis().min(5_000);
    format!("PRAGMA busy_timeout = {ms};")
}

/// `?1` relay, `?2` now, `?3` lease end, `?4` limit.
pub(super) const CLAIM_UNORDERED: &str = "UPDATE outbox_events \
     SET locked_by = ?1, locked_until = ?3, attempts = attempts + 1 \
     WHERE seq IN (SELECT seq FROM outbox_events \
                   WHERE published_at IS NULL AND dead_at IS NULL AND available_at <= ?2 \
                     AND (locked_until IS NULL OR locked_until < ?2) \
                   ORDER BY seq LIMIT ?4) ";

/// PostgreSQL's ordered claim, with `?5` owned shards only, `?6` leader only, `?7` dead
/// letters block. SQLite has one writer at a time, so no row locks are needed: the
/// statement sees and changes the database alone.
pub(super) const CLAIM_ORDERED: &str = "UPDATE outbox_events \
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

pub(super) const RETURNING: &str = "RETURNING seq, id, aggregate_type, aggregate_id, event_type, \
     event_version, payload, headers, topic, shard, created_at, attempts";

/// `now`, relay, then the `IN (…)` list.
pub(super) const COMPLETE_MARK: &str = "UPDATE outbox_events \
     SET published_at = ?, locked_by = NULL, locked_until = NULL \
     WHERE locked_by = ? AND seq IN (";

/// `?1` error, `?2` retry at, `?3` seq, `?4` relay.
pub(super) const FAIL_RETRY: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, last_error = ?1, dead_at = NULL, \
         available_at = ?2 \
     WHERE seq = ?3 AND locked_by = ?4";

/// `?1` error, `?2` now, `?3` seq, `?4` relay.
pub(super) const FAIL_DEAD: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, last_error = ?1, dead_at = ?2 \
     WHERE seq = ?3 AND locked_by = ?4";

/// What `release_all` runs, in this order, each with the relay's id bound: it lets go of the
/// relay's claimed rows, its shards and its leadership, and forgets its heartbeat.
pub(super) const RELEASE_ALL: [&str; 4] = [
    "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE locked_by = ?1 AND published_at IS NULL AND dead_at IS NULL",
    "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL WHERE owner = ?1",
    "DELETE FROM outbox_leader WHERE holder = ?1",
    "DELETE FROM outbox_relays WHERE relay_id = ?1",
];

/// `?1` relay, `?2` lease end, `?3` now.
pub(super) const LEAD: &str = "INSERT INTO outbox_leader (name, holder, lease_until) VALUES ('relay', ?1, ?2) \
     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until \
     WHERE outbox_leader.holder = excluded.holder OR outbox_leader.lease_until < ?3 \
     RETURNING holder";

/// `?1` relay, `?2` heartbeat end.
pub(super) const HEARTBEAT: &str = "INSERT INTO outbox_relays (relay_id, heartbeat_until) VALUES (?1, ?2) \
     ON CONFLICT (relay_id) DO UPDATE SET heartbeat_until = excluded.heartbeat_until, \
         mode = 'sharded'";

/// `?1` now.
pub(super) const LIVE_RELAYS: &str = "SELECT COUNT(*) AS n FROM outbox_relays \
     WHERE heartbeat_until > ?1 AND mode = 'sharded'";

/// `?1` relay, `?2` heartbeat until, `?3` now, `?4` mode, `?5` state, `?6` last error. No
/// session: SQLite runs in the relay's process, and its single relay is replaced only when
/// its lease runs out.
pub(super) const HEALTH: &str = "INSERT INTO outbox_relays \
     (relay_id, heartbeat_until, mode, state, state_since, last_error) \
     VALUES (?1, ?2, ?4, ?5, ?3, ?6) \
     ON CONFLICT (relay_id) DO UPDATE SET heartbeat_until = excluded.heartbeat_until, \
         mode = excluded.mode, state = excluded.state, \
         state_since = CASE WHEN outbox_relays.state = excluded.state \
                             AND outbox_relays.state_since IS NOT NULL \
                            THEN outbox_relays.state_since ELSE excluded.state_since END, \
         last_error = excluded.last_error";

/// `?1` an hour ago.
pub(super) const FORGET_DEAD_RELAYS: &str = "DELETE FROM outbox_relays WHERE heartbeat_until < ?1";

/// `?1` relay, `?2` lease end.
pub(super) const RENEW_SHARDS: &str = "UPDATE outbox_shard_leases SET lease_until = ?2 WHERE owner = ?1 \
     RETURNING shard";

/// `?1` relay, `?2` lease end, `?3` now, `?4` how many.
pub(super) const TAKE_SHARDS: &str = "UPDATE outbox_shard_leases SET owner = ?1, lease_until = ?2 \
     WHERE shard IN (SELECT shard FROM outbox_shard_leases \
                     WHERE owner IS NULL OR lease_until < ?3 \
                     ORDER BY shard LIMIT ?4) \
     RETURNING shard";

/// `?1` cut-off, `?2` limit.
pub(super) const CLEANUP: &str = "DELETE FROM outbox_events WHERE seq IN ( \
     SELECT seq FROM outbox_events \
     WHERE published_at IS NOT NULL AND published_at < ?1 \
     ORDER BY published_at LIMIT ?2)";
