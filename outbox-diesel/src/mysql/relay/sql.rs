//! The MySQL/MariaDB relay store's statements and session settings.

pub(super) use crate::relay::common::{COMPLETE_DELETE, GIVE_UP_SHARDS, RELEASE};

/// Session settings of relay connections, one statement each (the timeouts follow: see
/// [`session_timeouts`]).
///
/// `READ COMMITTED`: a locking read takes no gap locks and lets go of the rows it examined
/// but did not keep, so a claim does not block writers' inserts nor other relays' marks on
/// rows it merely scanned past (under `REPEATABLE READ` it would hold them to the commit),
/// and each statement reads what is committed when it runs.
pub(super) const SESSION_SQL: [&str; 1] =
    ["SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"];

/// The session's timeouts for a statement timeout of `timeout` (a third of the relay's
/// lease, see `relay::base`), one statement each.
///
/// `innodb_lock_wait_timeout`: an ordered claim waits for row locks (see
/// [`MysqlRelayStore`](super::MysqlRelayStore)); every relay transaction is a few statements long, so a wait of
/// seconds means something is stuck, and the claim fails and is retried rather than hanging
/// for the server's default 50 s. It takes whole seconds: the timeout rounded up, from 1 to
/// 10 s.
///
/// `max_statement_time` (MariaDB only; MySQL's `max_execution_time` covers read-only
/// `SELECT`s, not the claim's locking reads): no statement runs longer than the timeout.
pub(super) fn session_timeouts(timeout: std::time::Duration, mariadb: bool) -> Vec<String> {
    let lock_wait = u64::try_from(timeout.as_millis().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .clamp(1, 10);
    let mut sql = vec![format!(
        "SET SESSION innodb_lock_wait_timeout = {lock_wait}"
    )];
    if mariadb {
        sql.push(format!(
            "SET SESSION max_statement_time = {:.3}",
            timeout.as_secs_f64()
        ));
    }
    sql
}

/// Whether the server is MariaDB (`max_statement_time`) rather than MySQL.
pub(super) const IS_MARIADB: &str = "SELECT CAST(VERSION() LIKE '%MariaDB%' AS SIGNED) AS n";

/// Unordered: any pending, unleased rows; rows another relay is claiming are skipped.
pub(super) const SELECT_UNORDERED: &str = "SELECT seq FROM outbox_events \
     WHERE published_at IS NULL AND dead_at IS NULL AND available_at <= UTC_TIMESTAMP(6) \
       AND (locked_until IS NULL OR locked_until < UTC_TIMESTAMP(6)) \
     ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED";

/// Ordered: the same conditions as PostgreSQL's. A row qualifies only if no earlier pending
/// row of its aggregate is blocked (leased by someone, or waiting for a retry) and, when the
/// fifth bind is true, no earlier one is dead. First bind: only shards this relay holds a
/// live lease on; third: only while it holds the leadership lease. No SKIP LOCKED: skipping a
/// locked earlier row could let a later one of the same aggregate through; a brief wait is
/// the price of order.
pub(super) const SELECT_ORDERED: &str = "SELECT e.seq FROM outbox_events e \
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
/// its own checks are as of its start (see [`MysqlRelayStore`](super::MysqlRelayStore)).
pub(super) const LEASE_ROWS: &str = "UPDATE outbox_events \
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
pub(super) const READ_ROWS: &str = "SELECT seq, id, aggregate_type, aggregate_id, event_type, \
     event_version, CAST(payload AS CHAR) AS payload, CAST(headers AS CHAR) AS headers, topic, \
     shard, created_at, attempts FROM outbox_events WHERE seq IN (";

pub(super) const COMPLETE_MARK: &str = "UPDATE outbox_events \
     SET published_at = UTC_TIMESTAMP(6), locked_by = NULL, locked_until = NULL \
     WHERE locked_by = ? AND seq IN (";

pub(super) const FAIL_RETRY: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, last_error = ?, dead_at = NULL, \
         available_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
     WHERE seq = ? AND locked_by = ?";

pub(super) const FAIL_DEAD: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, last_error = ?, dead_at = UTC_TIMESTAMP(6) \
     WHERE seq = ? AND locked_by = ?";

/// What `release_all` runs, in this order, each with the relay's id bound: it lets go of the
/// relay's claimed rows, its shards and its leadership, and forgets its heartbeat.
pub(super) const RELEASE_ALL: [&str; 4] = [
    "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE locked_by = ? AND published_at IS NULL AND dead_at IS NULL",
    "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL WHERE owner = ?",
    "DELETE FROM outbox_leader WHERE holder = ?",
    "DELETE FROM outbox_relays WHERE relay_id = ?",
];

/// Takes or renews the leadership lease: the row becomes ours if it already was or has
/// expired. `holder` is assigned first, so the second `IF` reads either the new holder, which
/// is us exactly when the first `IF` took or kept the row (the left-to-right assignment MySQL
/// and MariaDB use by default), or the old row, repeating the first test (MariaDB's
/// `SIMULTANEOUS_ASSIGNMENT` mode): either way the lease is extended exactly when the row
/// became or stayed ours.
pub(super) const LEAD: &str = "INSERT INTO outbox_leader (name, holder, lease_until) \
     VALUES ('relay', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
     ON DUPLICATE KEY UPDATE \
       holder = IF(holder = ? OR lease_until < UTC_TIMESTAMP(6), ?, holder), \
       lease_until = IF(holder = ? OR lease_until < UTC_TIMESTAMP(6), \
                        UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, lease_until)";

pub(super) const LEADER: &str = "SELECT holder FROM outbox_leader \
     WHERE name = 'relay' AND lease_until > UTC_TIMESTAMP(6)";

pub(super) const HEARTBEAT: &str = "INSERT INTO outbox_relays (relay_id, heartbeat_until) \
     VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
     ON DUPLICATE KEY UPDATE heartbeat_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
         mode = 'sharded'";

/// Only sharded relays share the shards (relays of every mode heartbeat in this table).
pub(super) const LIVE_RELAYS: &str = "SELECT COUNT(*) AS n FROM outbox_relays \
     WHERE heartbeat_until > UTC_TIMESTAMP(6) AND mode = 'sharded'";

pub(super) const FORGET_DEAD_RELAYS: &str =
    "DELETE FROM outbox_relays WHERE heartbeat_until < UTC_TIMESTAMP(6) - INTERVAL 1 HOUR";

pub(super) const RENEW_SHARDS: &str = "UPDATE outbox_shard_leases \
     SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE owner = ?";

pub(super) const OWNED_SHARDS: &str =
    "SELECT shard FROM outbox_shard_leases WHERE owner = ? ORDER BY shard";

pub(super) const FREE_SHARDS: &str = "SELECT shard FROM outbox_shard_leases \
     WHERE owner IS NULL OR lease_until < UTC_TIMESTAMP(6) \
     ORDER BY shard LIMIT ? FOR UPDATE SKIP LOCKED";

pub(super) const TAKE_SHARDS: &str = "UPDATE outbox_shard_leases \
     SET owner = ?, lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
     WHERE shard IN (";

/// MySQL's single-table `DELETE` takes `ORDER BY … LIMIT` directly.
pub(super) const CLEANUP: &str = "DELETE FROM outbox_events \
     WHERE published_at IS NOT NULL \
       AND published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
     ORDER BY published_at LIMIT ?";
