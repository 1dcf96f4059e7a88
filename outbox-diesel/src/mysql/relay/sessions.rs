//! MySQL/MariaDB: relay heartbeats with health and session identity, and reaping relays
//! whose session ended.
//!
//! **Identity.** A relay's connection holds a session lock, `GET_LOCK(name, 0)`, named
//! `outbox_relay_` + SHA-1 of the database name and relay id (53 characters: lock names are
//! limited to 64, and the database name keeps relays of two databases on one server apart).
//! The server releases it when the connection ends, so a relay is dead when
//! `IS_USED_LOCK(name) IS NULL`. The lock is taken again with every heartbeat if the
//! connection does not hold it (after a reconnect: a new connection heartbeats before
//! anything else runs on it); while the relay's old connection, not yet closed on the
//! server, still holds it the heartbeat records no lock, so the relay is then subject to the
//! lease rule only, never reaped by mistake, until the old connection is gone and the lock
//! is taken again.
//!
//! **One id, one live relay.** If the lock is held by a connection that is not one of this
//! store's (another live relay uses the id: two replicas configured with one `--relay-id`, a
//! library config cloned for two relays), the heartbeat writes nothing and reports
//! [`RelayIdInUse`], and the store refuses to claim, take shards or lead until a heartbeat
//! takes the lock. Two relays with one id would both own every shard of that id and claim
//! from them at once, which breaks the order (see `CLAIM_ORDERED` in `pg`). Connection ids
//! are unique while the server runs; after a server restart a new connection may get the id
//! of one of this store's old ones, which the store would then take for its own old
//! connection: it records no lock (lease rule) but is not refused. Only a duplicate id can
//! meet that, and only right after a restart.
//!
//! A SIGKILLed relay's connection is closed by its kernel and the server frees its lock at
//! once. A paused or partitioned relay keeps its connection, so it is not reaped and is fenced
//! by its leases as ever. A live relay reaped because its connection dropped (its lock freed)
//! before it reconnected loses its shards, leadership and row leases exactly as if its lease
//! had run out, acts on none of them (claims and settlements are fenced), and takes a fair
//! share again at its next heartbeat and rebalance (see `pg_sessions` for the full argument).
//! After a server restart every lock is gone at once; a relay reaps nobody until its own
//! connection is `REAP_GRACE` old.
//!
//! The statement that expires a reaped relay's row leases reads the whole table by primary
//! key (MySQL has no partial index for the few in-flight rows, and `locked_by` is not indexed,
//! to keep claims and marks cheap). It runs only when a relay died, once, and `release_all`
//! (graceful shutdown) runs the same scan; a backlog of millions would make it take seconds,
//! which still beats the lease. Indexing `locked_by` would make it a lookup at the price of an
//! index write on every claim and mark. A SIGKILLed relay's shards and claimed rows move on
//! within about a second, whatever the lease. Measured: `docs/design/mysql-sqlite.md`,
//! section "Reaping relays whose connection ended".

use std::time::Duration;

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl};
use outbox_core::relay::{RelayHealth, RelayIdInUse};

use crate::relay::common::{IN_LIST_MAX, micros, mode_name, placeholders};

/// Holds the relay's session lock (if this connection does not already): `held` 1 or 0, the
/// lock's name, the connection holding it and this connection's id.
const LOCK: &str = "SELECT CAST(CASE WHEN IS_USED_LOCK(t.name) = CONNECTION_ID() THEN 1 \
                         ELSE COALESCE(GET_LOCK(t.name, 0), 0) END AS SIGNED) AS held, t.name, \
            CAST(IS_USED_LOCK(t.name) AS SIGNED) AS holder, \
            CAST(CONNECTION_ID() AS SIGNED) AS me \
     FROM (SELECT CONCAT('outbox_relay_', SHA1(CONCAT(DATABASE(), '/', ?))) AS name) t";

/// Upserts the relay's row. `state_since` is assigned before `state` (MySQL assigns left to
/// right, so `state` still holds the old value there).
const HEARTBEAT: &str = "INSERT INTO outbox_relays \
     (relay_id, heartbeat_until, mode, state, state_since, last_error, session_lock) \
     VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?, ?, UTC_TIMESTAMP(6), ?, ?) \
     ON DUPLICATE KEY UPDATE heartbeat_until = VALUES(heartbeat_until), mode = VALUES(mode), \
         state_since = IF(state = VALUES(state) AND state_since IS NOT NULL, state_since, \
                          UTC_TIMESTAMP(6)), \
         state = VALUES(state), last_error = VALUES(last_error), \
         session_lock = VALUES(session_lock)";

/// Other relays whose session lock is free: their connection is gone. Locked, so two relays
/// reaping at once reap each relay once.
const FIND_DEAD: &str = "SELECT relay_id FROM outbox_relays \
     WHERE relay_id <> ? AND session_lock IS NOT NULL AND IS_USED_LOCK(session_lock) IS NULL \
     FOR UPDATE";

/// The client of a connection, if this user may see it.
const CLIENT: &str = "SELECT HOST AS host FROM information_schema.PROCESSLIST WHERE ID = ?";

#[derive(QueryableByName)]
struct Lock {
    #[diesel(sql_type = BigInt)]
    held: i64,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    holder: Option<i64>,
    #[diesel(sql_type = BigInt)]
    me: i64,
}

#[derive(QueryableByName)]
struct Client {
    #[diesel(sql_type = Nullable<Text>)]
    host: Option<String>,
}

/// How many of a store's connection ids it remembers as its own.
const OWN_CONNECTIONS: usize = 16;

#[derive(QueryableByName)]
struct Dead {
    #[diesel(sql_type = Text)]
    relay_id: String,
}

/// Writes the heartbeat row, taking the session lock first when the relay tracks its session;
/// `own` are the ids of this store's connections (this one is added). If another connection
/// holds the lock, nothing is written and the conflict is returned.
pub(super) async fn heartbeat(
    conn: &mut AsyncMysqlConnection,
    relay: &str,
    lease: Duration,
    health: &RelayHealth,
    own: &mut Vec<i64>,
) -> diesel::QueryResult<Option<RelayIdInUse>> {
    let lock = if health.track_session {
        let l = diesel::sql_query(LOCK)
            .bind::<Text, _>(relay)
            .get_result::<Lock>(conn)
            .await?;
        if !own.contains(&l.me) {
            if own.len() >= OWN_CONNECTIONS {
                own.remove(0);
            }
            own.push(l.me);
        }
        match l.holder {
            _ if l.held == 1 => Some(l.name),
            // Another relay's connection holds it.
            Some(holder) if !own.contains(&holder) => {
                let client = diesel::sql_query(CLIENT)
                    .bind::<BigInt, _>(holder)
                    .get_result::<Client>(conn)
                    .await
                    .optional()?
                    .and_then(|c| c.host);
                let described = match client {
                    Some(host) => format!("MySQL connection id {holder}, client {host}"),
                    None => format!("MySQL connection id {holder}"),
                };
                return Ok(Some(RelayIdInUse::new(relay, described)));
            }
            // This store's old connection, not yet gone (or the lock was just freed): the
            // lease rule until a later heartbeat takes the lock.
            _ => None,
        }
    } else {
        None
    };
    diesel::sql_query(HEARTBEAT)
        .bind::<Text, _>(relay)
        .bind::<BigInt, _>(micros(lease))
        .bind::<Text, _>(mode_name(health.mode))
        .bind::<Text, _>(health.state.as_str())
        .bind::<Nullable<Text>, _>(health.last_error.as_deref())
        .bind::<Nullable<Text>, _>(lock)
        .execute(conn)
        .await
        .map(|_| None)
}

/// Reaps dead peers in one transaction; returns their ids.
pub(super) async fn reap(
    conn: &mut AsyncMysqlConnection,
    relay: &str,
) -> diesel::QueryResult<Vec<String>> {
    conn.transaction(async |conn| {
        let mut dead: Vec<String> = diesel::sql_query(FIND_DEAD)
            .bind::<Text, _>(relay)
            .load::<Dead>(conn)
            .await?
            .into_iter()
            .map(|d| d.relay_id)
            .collect();
        dead.truncate(IN_LIST_MAX);
        if dead.is_empty() {
            return Ok(dead);
        }
        let list = placeholders(dead.len());
        for sql in [
            format!(
                "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL \
                 WHERE owner IN ({list})"
            ),
            format!("DELETE FROM outbox_leader WHERE holder IN ({list})"),
            format!(
                "UPDATE outbox_events SET locked_until = UTC_TIMESTAMP(6) \
                 WHERE published_at IS NULL AND dead_at IS NULL AND locked_by IN ({list})"
            ),
            format!("DELETE FROM outbox_relays WHERE relay_id IN ({list})"),
        ] {
            let mut q = diesel::sql_query(sql).into_boxed::<diesel::mysql::Mysql>();
            for id in &dead {
                q = q.bind::<Text, _>(id.clone());
            }
            q.execute(conn).await?;
        }
        Ok(dead)
    })
    .await
}
