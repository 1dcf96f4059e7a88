//! PostgreSQL: relay heartbeats with health and session identity, and reaping relays whose
//! session ended.
//!
//! **Identity.** A relay records `pg_backend_pid()` and that backend's `backend_start`
//! (from `pg_stat_activity`): pids are reused, the pair is not. It is dead when no backend
//! with that pid and start time exists. This was chosen over a session-level advisory lock
//! because it needs no lock-key scheme shared with applications, shows in `outbox status`,
//! and reads the same view an operator would. A backend whose `backend_start` is hidden
//! (another role without `pg_read_all_stats`) counts as alive: then only the lease rule
//! applies, the safe side.
//!
//! **How fast.** A SIGKILLed relay's socket is closed by its kernel, its backend sees the
//! end of file at once and exits, and its `pg_stat_activity` row is gone: peers checking
//! every second reap it within about a second, whatever the lease. Measured:
//! `docs/design/postgres-claims.md`, section "Reaping relays whose session ended". A relay
//! whose host vanished (no FIN) keeps its backend until TCP keepalive gives up; its lease is
//! the rule then.
//!
//! **Paused or partitioned relays** (SIGSTOP, a network partition) keep their backend, so
//! they are not reaped; they lose their work only by their leases and are fenced as ever
//! (`complete`/`fail`/`release` only `WHERE locked_by = us`; claims only on shards and
//! leadership whose lease is still theirs).
//!
//! **A live relay that reconnects** (its connection dropped, a new backend) repeats its last
//! heartbeat on the new connection before anything else runs there, recording its new
//! session. Between the old backend's
//! exit and that, a peer may reap it: its shards and leadership are freed and its row leases
//! expire, exactly what its lease running out would do, only sooner. It then acts on nothing
//! it lost: its next claims are fenced by the shard and leadership leases in the claim
//! statement, and it can settle only rows still `locked_by` it (a row re-claimed by a peer is
//! fenced; one nobody re-claimed is still correctly marked). Its heartbeat re-inserts
//! its row and its next rebalance takes a fair share again. So a spurious reap costs a
//! rebalance and maybe a duplicate publish (at least once), never order or an event.
//! After a database restart every recorded session is gone at once; a relay does not reap
//! anyone until its own connection is [`REAP_GRACE`](crate::relay::common::REAP_GRACE) old, which
//! gives every live relay time to reconnect and record its new session first.
//!
//! **One id, one live relay.** The heartbeat takes over an existing row only if the session
//! it names is this one, this store's previous one (its old backend may outlive a reconnect
//! for a moment), none, or no longer alive. Otherwise another live relay uses the id (two
//! replicas configured with one `--relay-id`, a library config cloned for two relays): the
//! heartbeat writes nothing and reports [`RelayIdInUse`], and the store refuses to claim,
//! take shards or lead until a heartbeat succeeds (a holder whose `backend_start` is hidden
//! counts as alive, as for reaping: the safe side, the duplicate waits). Two relays with one
//! id would both own
//! every shard of that id and claim from them at once, which breaks the order (see
//! `CLAIM_ORDERED`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::sql_types::{Bool, Double, Integer, Nullable, Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_core::relay::{RelayHealth, RelayIdInUse};

use crate::relay::common::{Prepared, mode_name, secs};

/// Upserts the relay's row: liveness, mode, state (and since when it holds), last outage
/// error and, when `$6`, the session identity (else NULL: lease rule only). With `$6` an
/// existing row is taken over only if its session is this backend, this store's previous
/// session (`$7`, `$8`), none, or gone; otherwise nothing is written and no row returned:
/// another live relay uses the id.
pub(super) const HEARTBEAT: &str = "INSERT INTO outbox_relays \
     (relay_id, heartbeat_until, mode, state, state_since, last_error, session_pid, session_start) \
     SELECT $1, now() + make_interval(secs => $2), $3, $4, now(), $5, \
            CASE WHEN $6 THEN pg_backend_pid() END, \
            CASE WHEN $6 THEN (SELECT backend_start FROM pg_stat_activity \
                               WHERE pid = pg_backend_pid()) END \
     ON CONFLICT (relay_id) DO UPDATE SET heartbeat_until = EXCLUDED.heartbeat_until, \
         mode = EXCLUDED.mode, state = EXCLUDED.state, \
         state_since = CASE WHEN outbox_relays.state = EXCLUDED.state \
                            THEN outbox_relays.state_since ELSE now() END, \
         last_error = EXCLUDED.last_error, session_pid = EXCLUDED.session_pid, \
         session_start = EXCLUDED.session_start \
     WHERE NOT $6 OR outbox_relays.session_pid IS NULL \
        OR outbox_relays.session_pid = pg_backend_pid() \
        OR (outbox_relays.session_pid = $7 \
            AND outbox_relays.session_start IS NOT DISTINCT FROM $8) \
        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = outbox_relays.session_pid \
                       AND (a.backend_start = outbox_relays.session_start \
                            OR a.backend_start IS NULL OR outbox_relays.session_start IS NULL)) \
     RETURNING session_pid, session_start";

/// The session that holds a relay id, described for the operator.
const HOLDER: &str = "SELECT r.session_pid, host(a.client_addr) AS client \
     FROM outbox_relays r LEFT JOIN pg_stat_activity a ON a.pid = r.session_pid \
     WHERE r.relay_id = $1";

/// Reaps, in one statement, every other relay whose recorded session is gone: deletes its
/// row, frees its shard leases and leadership, and expires its row leases (`locked_until =
/// now()`, keeping `locked_by` and the attempt: as when a lease runs out). The `DELETE`
/// locks each dead relay's row, so two relays reaping at once reap each relay once.
///
/// The row leases are found among the pending rows (`published_at IS NULL AND dead_at IS
/// NULL`, the pending indexes' predicate): no index reads `locked_by`, so that a claim is a
/// HOT update (see `CLAIM_UNORDERED`). That is a pass over the backlog, paid only when a
/// relay died, not per claim; an index on the lease would make the reap a lookup, but cost
/// every claim an index entry per row. Measured: `docs/design/postgres-claims.md`, section
/// "Reaping relays whose session ended".
pub const REAP: &str = "WITH dead AS ( \
       DELETE FROM outbox_relays r \
       WHERE r.relay_id <> $1 AND r.session_pid IS NOT NULL \
         AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.session_pid \
                         AND (a.backend_start = r.session_start OR a.backend_start IS NULL \
                              OR r.session_start IS NULL)) \
       RETURNING r.relay_id), \
     shards AS (UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL \
                WHERE owner IN (SELECT relay_id FROM dead) RETURNING 1), \
     leader AS (DELETE FROM outbox_leader WHERE holder IN (SELECT relay_id FROM dead) \
                RETURNING 1), \
     leases AS (UPDATE outbox_events SET locked_until = now() \
                WHERE locked_by IN (SELECT relay_id FROM dead) \
                  AND published_at IS NULL AND dead_at IS NULL RETURNING 1) \
     SELECT relay_id FROM dead";

/// A recorded session: backend pid and start time.
#[derive(QueryableByName, Clone, Debug, PartialEq, Eq)]
pub(super) struct Session {
    #[diesel(sql_type = Nullable<Integer>)]
    session_pid: Option<i32>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    session_start: Option<DateTime<Utc>>,
}

#[derive(QueryableByName)]
struct Holder {
    #[diesel(sql_type = Nullable<Integer>)]
    session_pid: Option<i32>,
    #[diesel(sql_type = Nullable<Text>)]
    client: Option<String>,
}

/// What a heartbeat found.
pub(super) enum Beat {
    /// The row is this relay's; the session it now records.
    Ours(Session),
    /// Another live session holds the id; nothing was written.
    InUse(RelayIdInUse),
}

#[derive(QueryableByName)]
struct Reaped {
    #[diesel(sql_type = Text)]
    relay_id: String,
}

/// Writes the heartbeat row, unless another live relay holds the id; `previous` is the
/// session this store recorded last.
pub(super) async fn heartbeat(
    conn: &mut AsyncPgConnection,
    relay: &str,
    lease: Duration,
    health: &RelayHealth,
    previous: Option<&Session>,
) -> diesel::QueryResult<Beat> {
    let recorded = Prepared(
        diesel::sql_query(HEARTBEAT)
            .bind::<Text, _>(relay)
            .bind::<Double, _>(secs(lease))
            .bind::<Text, _>(mode_name(health.mode))
            .bind::<Text, _>(health.state.as_str())
            .bind::<Nullable<Text>, _>(health.last_error.as_deref())
            .bind::<Bool, _>(health.track_session)
            .bind::<Nullable<Integer>, _>(previous.and_then(|s| s.session_pid))
            .bind::<Nullable<Timestamptz>, _>(previous.and_then(|s| s.session_start)),
    )
    .get_result::<Session>(conn)
    .await
    .optional()?;
    if let Some(session) = recorded {
        return Ok(Beat::Ours(session));
    }
    let holder = Prepared(diesel::sql_query(HOLDER).bind::<Text, _>(relay))
        .get_result::<Holder>(conn)
        .await
        .optional()?;
    let described = match holder {
        Some(Holder {
            session_pid: Some(pid),
            client,
        }) => match client {
            Some(client) => format!("PostgreSQL backend pid {pid}, client {client}"),
            None => format!("PostgreSQL backend pid {pid}"),
        },
        // It went away between the two statements: the next heartbeat takes the id.
        _ => "a PostgreSQL session that just ended".to_owned(),
    };
    Ok(Beat::InUse(RelayIdInUse::new(relay, described)))
}

/// Reaps dead peers; returns their ids.
pub(super) async fn reap(
    conn: &mut AsyncPgConnection,
    relay: &str,
) -> diesel::QueryResult<Vec<String>> {
    let rows = Prepared(diesel::sql_query(REAP).bind::<Text, _>(relay))
        .load::<Reaped>(conn)
        .await?;
    Ok(rows.into_iter().map(|r| r.relay_id).collect())
}
