//! Pieces shared by the relay stores.

#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
use diesel::QueryableByName;
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use outbox_core::Headers;
use outbox_core::relay::{Failure, OutboxMessage, StoreError};

pub(crate) use super::created_at::CreatedAt;

/// What a store that records relay sessions keeps to guard its relay's id: the last
/// heartbeat (repeated on every new connection, before anything else runs on it) and whether
/// another live relay holds the id.
#[derive(Default)]
pub(crate) struct IdGuard {
    /// The relay id, lease and health of the last heartbeat that tracks its session.
    pub beat: Option<(String, std::time::Duration, outbox_core::relay::RelayHealth)>,
    /// Set when a heartbeat found the id in use by another live session; cleared by one
    /// that recorded this store's session.
    pub in_use: Option<outbox_core::relay::RelayIdInUse>,
}

impl IdGuard {
    /// Remembers `health` (when it tracks the session) for the next connection.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub fn remember(
        &mut self,
        relay: &str,
        lease: std::time::Duration,
        health: &outbox_core::relay::RelayHealth,
    ) {
        if health.track_session {
            self.beat = Some((relay.to_owned(), lease, health.clone()));
        } else {
            // Nothing recorded, nothing to guard (and nothing detectable).
            self.beat = None;
            self.in_use = None;
        }
    }

    /// `Err` while another live relay holds the id: `op` must not run.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub fn refuse(&self, op: &'static str) -> Result<(), StoreError> {
        match &self.in_use {
            Some(c) => Err(StoreError::new(op, c.clone())),
            None => Ok(()),
        }
    }

    /// Whether a store connected at `connected_at` may reap peers by their sessions now:
    /// not while another live relay holds its id, and not before its own connection is
    /// [`REAP_GRACE`] old.
    #[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
    pub fn may_reap(&self, connected_at: Option<std::time::Instant>) -> bool {
        self.in_use.is_none() && connected_at.is_some_and(|at| at.elapsed() >= REAP_GRACE)
    }
}

/// A store that cannot connect, with what to do about it.
pub type ConnectError = StoreError;

/// A connection failure, worded for the operator.
pub fn connect_error(backend: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::new(
        "connect",
        format!("cannot connect to {backend}: {e} (is the server up and the URL right?)"),
    )
}

/// A store error for `operation`; a missing outbox table (the migrations have not run) says
/// so in one line, naming the table and the command that creates it, instead of the
/// database's own wording.
pub(crate) fn store_error(operation: &'static str, e: diesel::result::Error) -> StoreError {
    match missing_table(&e) {
        Some(table) => StoreError::new(
            operation,
            format!(
                "the table `{table}` does not exist: the outbox's migrations have not run on                  this database; run `outbox migrate --database-url …` (or                  `outbox::migrations::run`) first"
            ),
        ),
        None => StoreError::new(operation, e),
    }
}

/// The outbox table a database error says is missing: PostgreSQL `relation "x" does not
/// exist`, MySQL/MariaDB `Table 'db.x' doesn't exist`, SQLite `no such table: x`.
pub(crate) fn missing_table(e: &diesel::result::Error) -> Option<String> {
    let diesel::result::Error::DatabaseError(_, info) = e else {
        return None;
    };
    let m = info.message();
    let name = if let Some(rest) = m.strip_prefix("relation \"") {
        rest.split('"').next()
    } else if let Some(rest) = m.strip_prefix("Table '") {
        rest.split('\'').next().and_then(|t| t.rsplit('.').next())
    } else {
        m.strip_prefix("no such table: ")
    }?;
    let missing = m.ends_with("does not exist")
        || m.ends_with("doesn't exist")
        || m.starts_with("no such table");
    (missing && name.starts_with("outbox_")).then(|| name.trim().to_owned())
}

/// A claimed row the relay cannot publish as it is: dead-lettered at once (never published
/// with a field dropped or invented), with a `last_error` naming the column and its value.
pub(crate) fn malformed(seq: i64, column: &str, value: &str, why: &str) -> Failure {
    const SHOWN: usize = 120;
    let shown: String = value.chars().take(SHOWN).collect();
    let more = if value.chars().count() > SHOWN {
        "…"
    } else {
        ""
    };
    Failure {
        seq,
        error: format!(
            "malformed outbox row {seq}: column `{column}` {why} (value {shown:?}{more}); \
             dead-lettered, not published"
        ),
        retry_after: None,
    }
}

/// Headers as stored: a JSON object. Values that other programs wrote as non-strings are kept
/// as their JSON text (nothing dropped); anything but an object (an array, a string, `null`,
/// invalid JSON) makes the row malformed.
pub(crate) fn parse_headers(seq: i64, json: &str) -> Result<Headers, Failure> {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => Ok(map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect()),
        Ok(_) => Err(malformed(seq, "headers", json, "is not a JSON object")),
        Err(e) => Err(malformed(
            seq,
            "headers",
            json,
            &format!("is not valid JSON ({e})"),
        )),
    }
}

/// A claimed row that cannot be published: its failure (a dead letter) and its ordering key.
pub(crate) struct Malformed {
    pub failure: Failure,
    key: (String, String),
}

impl Malformed {
    /// The row's aggregate: type, id.
    #[cfg(feature = "postgres_backend")]
    pub(crate) fn key(&self) -> &(String, String) {
        &self.key
    }
}

/// What a claim's rows come to: the messages to publish (in `seq` order), the malformed rows
/// to dead-letter, and the rows to give back because an earlier row of their aggregate in
/// the same claim is malformed (publishing them would skip it, breaking the aggregate's
/// order; the next claim decides by the dead-letter policy).
pub(crate) struct Sorted {
    pub publish: Vec<OutboxMessage>,
    pub malformed: Vec<Failure>,
    pub held_back: Vec<i64>,
}

/// Dead-letters a claim's malformed rows and gives back the rows held behind them (both are
/// leased to `relay` by the claim); returns the messages to publish.
pub(crate) async fn settle_malformed<S: outbox_core::relay::RelayStore>(
    store: &mut S,
    relay: &str,
    sorted: Sorted,
) -> Result<Vec<OutboxMessage>, StoreError> {
    if !sorted.malformed.is_empty() {
        store.fail(relay, &sorted.malformed).await?;
    }
    if !sorted.held_back.is_empty() {
        store.release(relay, &sorted.held_back).await?;
    }
    Ok(sorted.publish)
}

/// Sorts converted rows into [`Sorted`].
pub(crate) fn split_malformed(
    rows: impl IntoIterator<Item = Result<OutboxMessage, Malformed>>,
) -> Sorted {
    let mut rows: Vec<_> = rows.into_iter().collect();
    rows.sort_unstable_by_key(|r| match r {
        Ok(m) => m.seq,
        Err(m) => m.failure.seq,
    });
    let mut out = Sorted {
        publish: Vec::new(),
        malformed: Vec::new(),
        held_back: Vec::new(),
    };
    let mut bad_keys = std::collections::HashSet::new();
    for row in rows {
        match row {
            Ok(m) if bad_keys.contains(&(m.aggregate_type.clone(), m.aggregate_id.clone())) => {
                out.held_back.push(m.seq)
            }
            Ok(m) => out.publish.push(m),
            Err(m) => {
                let f = m.failure;
                tracing::error!(seq = f.seq, error = %f.error, "malformed outbox row dead-lettered");
                bad_keys.insert(m.key);
                out.malformed.push(f);
            }
        }
    }
    out
}

/// How old a relay store's own connection must be before it reaps peers by their sessions.
/// After a database restart every recorded session is gone at once, including those of
/// relays that are alive and about to reconnect; waiting this long after connecting lets them
/// record their new sessions first (they do so on connecting, and with every heartbeat, about
/// every second).
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
pub(crate) const REAP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// A relay mode as stored in `outbox_relays.mode`.
pub(crate) fn mode_name(mode: outbox_core::relay::Mode) -> &'static str {
    match mode {
        outbox_core::relay::Mode::Unordered => "unordered",
        outbox_core::relay::Mode::Sharded => "sharded",
        outbox_core::relay::Mode::Leader => "leader",
        outbox_core::relay::Mode::Stream => "stream",
    }
}

/// A statement of the relay's on backend `DB`, its parameters bound.
pub(crate) type Statement<DB> =
    diesel::query_builder::BoxedSqlQuery<'static, DB, diesel::query_builder::SqlQuery>;

/// Runs each of `statements` in order, with the relay's id bound as its one parameter.
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
pub(crate) async fn run_each<C>(
    conn: &mut C,
    statements: &[&'static str],
    relay: &str,
) -> diesel::QueryResult<()>
where
    C: diesel_async::AsyncConnection + Send,
    C::Backend: diesel::sql_types::HasSqlType<diesel::sql_types::Text>,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, C::Backend>,
    for<'a> diesel::query_builder::BoxedSqlQuery<'a, C::Backend, diesel::query_builder::SqlQuery>:
        diesel::query_builder::QueryFragment<C::Backend>,
{
    use diesel_async::RunQueryDsl;
    for sql in statements {
        diesel::sql_query(*sql)
            .into_boxed::<C::Backend>()
            .bind::<diesel::sql_types::Text, _>(relay)
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// Seconds as the databases' interval arithmetic takes them.
#[cfg(feature = "postgres_backend")]
pub(crate) fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// The longest lease, backoff or retention a store adds to a time: a century. Longer
/// durations are clamped so that `now + d` stays within every backend's date range
/// (MySQL's `DATETIME` ends with the year 9999).
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) const MAX_INTERVAL: std::time::Duration =
    std::time::Duration::from_secs(100 * 366 * 24 * 3600);

/// Microseconds, as MySQL's `INTERVAL ? MICROSECOND` takes them (clamped to
/// [`MAX_INTERVAL`]).
#[cfg(feature = "mysql_backend")]
pub(crate) fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.min(MAX_INTERVAL).as_micros()).unwrap_or(i64::MAX)
}

/// Values per `IN (…)` list: far below MySQL's 65,535 placeholders per statement and
/// SQLite's 32,766, and above any sensible batch size, so a batch is one statement.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) const IN_LIST_MAX: usize = 1_000;

/// `?, ?, …, ?`: `n` placeholders for an `IN (…)` list. The values are always bound, never
/// written into the SQL.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) fn placeholders(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// `prefix` + `?, …` for `values` + `)` + `suffix`, with `bind` applied to the prefix's own
/// binds and then every value bound in order by `bind_value`. No value is ever written into
/// the SQL.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) fn in_list<'a, DB, T, B, V>(
    prefix: &str,
    values: &'a [T],
    suffix: &str,
    bind: B,
    bind_value: V,
) -> BoxedSqlQuery<'a, DB, SqlQuery>
where
    DB: diesel::backend::Backend,
    B: FnOnce(BoxedSqlQuery<'a, DB, SqlQuery>) -> BoxedSqlQuery<'a, DB, SqlQuery>,
    V: Fn(BoxedSqlQuery<'a, DB, SqlQuery>, &'a T) -> BoxedSqlQuery<'a, DB, SqlQuery>,
{
    let sql = format!("{prefix}{}){suffix}", placeholders(values.len()));
    values
        .iter()
        .fold(bind(diesel::sql_query(sql).into_boxed()), bind_value)
}

// The [`seq_lists`] prefixes whose text is the same on MySQL and SQLite.

/// The relay, then the `IN (…)` list.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) const COMPLETE_DELETE: &str =
    "DELETE FROM outbox_events WHERE locked_by = ? AND seq IN (";
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
/// The relay, then the `IN (…)` list.
pub(crate) const RELEASE: &str = "UPDATE outbox_events \
     SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1 \
     WHERE locked_by = ? AND seq IN (";
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
/// The relay, then the `IN (…)` list of shards.
pub(crate) const GIVE_UP_SHARDS: &str = "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL \
     WHERE owner = ? AND shard IN (";

/// One `prefix(?, …)suffix` statement per [`IN_LIST_MAX`] of `seqs`, `bind` binding the
/// prefix's own parameters before the `seq`s.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) fn seq_lists<'a, DB, B>(
    prefix: &'a str,
    suffix: &'a str,
    seqs: &'a [i64],
    bind: B,
) -> impl Iterator<Item = BoxedSqlQuery<'a, DB, SqlQuery>> + 'a
where
    DB: diesel::backend::Backend + diesel::sql_types::HasSqlType<diesel::sql_types::BigInt>,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, DB>,
    B: Fn(BoxedSqlQuery<'a, DB, SqlQuery>) -> BoxedSqlQuery<'a, DB, SqlQuery> + 'a,
{
    seqs.chunks(IN_LIST_MAX).map(move |chunk| {
        in_list(prefix, chunk, suffix, &bind, |q, seq| {
            q.bind::<diesel::sql_types::BigInt, _>(*seq)
        })
    })
}

/// An event id stored as text (MySQL, SQLite). A malformed one makes the row malformed,
/// never a silently invented id.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) fn parse_id(seq: i64, id: &str) -> Result<uuid::Uuid, Failure> {
    uuid::Uuid::parse_str(id).map_err(|e| malformed(seq, "id", id, &format!("is not a UUID ({e})")))
}

/// What a rebalance returns: the shards held (sorted) and how many relays share them.
pub(crate) fn assignment(owned: Vec<i16>, live: i64) -> outbox_core::relay::ShardAssignment {
    outbox_core::relay::ShardAssignment {
        owned,
        live_relays: usize::try_from(live).unwrap_or(1),
    }
}

/// The columns of a claimed row that every backend reads the same way; each store's row
/// embeds it and adds the id and `created_at` in its own types.
#[derive(diesel::QueryableByName)]
pub(crate) struct ClaimedColumns {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub seq: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    aggregate_type: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    aggregate_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_type: String,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    event_version: i32,
    #[diesel(sql_type = diesel::sql_types::Text)]
    payload: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    headers: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    topic: Option<String>,
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    shard: i16,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    attempts: i32,
}

impl ClaimedColumns {
    /// The message, given the id and creation time the backend stored in its own types; a
    /// row that cannot be published as it is (empty aggregate type, aggregate id or event
    /// type, headers not a JSON object, an invalid id, a creation time no `DateTime<Utc>`
    /// represents) is a [`malformed`] failure instead.
    pub(crate) fn into_message(
        self,
        id: Result<uuid::Uuid, Failure>,
        created_at: CreatedAt,
    ) -> Result<OutboxMessage, Malformed> {
        let key = (self.aggregate_type.clone(), self.aggregate_id.clone());
        let bad = |failure| Malformed { failure, key };
        let seq = self.seq;
        for (column, value) in [
            ("aggregate_type", &self.aggregate_type),
            ("aggregate_id", &self.aggregate_id),
            ("event_type", &self.event_type),
        ] {
            if value.is_empty() {
                return Err(bad(malformed(seq, column, value, "is empty")));
            }
        }
        let created_at = created_at.0.map_err(|value| {
            malformed(
                seq,
                "created_at",
                &value,
                "is not a time the relay can represent",
            )
        });
        let (id, headers, created_at) = match (id, parse_headers(seq, &self.headers), created_at) {
            (Ok(id), Ok(headers), Ok(created_at)) => (id, headers, created_at),
            (Err(f), _, _) | (_, Err(f), _) | (_, _, Err(f)) => return Err(bad(f)),
        };
        Ok(OutboxMessage {
            seq,
            id,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event_type,
            event_version: self.event_version,
            headers,
            payload: self.payload,
            topic: self.topic,
            shard: self.shard,
            created_at,
            attempts: self.attempts,
        })
    }
}

/// A claimed row where the id is stored as text and the creation time as naive UTC
/// (MySQL's `DATETIME(6)`, SQLite's `YYYY-MM-DD HH:MM:SS.ffffff` text).
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
#[derive(QueryableByName)]
pub(crate) struct TextIdRow {
    #[diesel(embed)]
    columns: ClaimedColumns,
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
    #[diesel(sql_type = diesel::sql_types::Timestamp)]
    created_at: CreatedAt,
}

#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
impl TextIdRow {
    /// The message, or the row's [`malformed`] failure (an invalid id among them).
    pub(crate) fn into_message(self) -> Result<OutboxMessage, Malformed> {
        let id = parse_id(self.columns.seq, &self.id);
        self.columns.into_message(id, self.created_at)
    }
}

/// One shard number, as the shard statements return it.
#[derive(diesel::QueryableByName)]
pub(crate) struct ShardRow {
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    pub shard: i16,
}

/// `SELECT COUNT(*) AS n`.
#[derive(diesel::QueryableByName)]
pub(crate) struct CountRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

/// The holder of the leadership lease.
#[derive(diesel::QueryableByName)]
pub(crate) struct HolderRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    #[allow(dead_code)] // PostgreSQL and SQLite only test that a row came back
    pub holder: String,
}

/// A relay statement that Diesel keeps prepared on its connection, keyed by its SQL text and
/// bind types: `Prepared(diesel::sql_query(SQL).bind(…)…)`.
///
/// Diesel never caches a `diesel::sql_query` (`SqlQuery::walk_ast` calls
/// `unsafe_to_cache_prepared`, since its text could be built from values). With
/// diesel-async's tokio-postgres connection an uncached statement costs a round trip of its
/// own before it runs: it is prepared (`Parse`, `Describe`, parsed and analysed by the
/// server), executed, then closed. The relay's statements are constants whose values all
/// travel as binds, so they are safe to cache; cached, each runs as one `Bind`/`Execute`.
/// PostgreSQL still plans every execution with its parameters: the relay's sessions set
/// `plan_cache_mode = force_custom_plan` (see `SESSION_SQL`), which is what keeps a claim
/// prepared while the table was empty from keeping that plan.
#[cfg(feature = "postgres_backend")]
pub struct Prepared<Q>(pub Q);

#[cfg(feature = "postgres_backend")]
impl<Q, DB> diesel::query_builder::QueryFragment<DB> for Prepared<Q>
where
    DB: diesel::backend::Backend,
    Q: diesel::query_builder::QueryFragment<DB>,
{
    fn walk_ast<'b>(
        &'b self,
        pass: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> diesel::QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

#[cfg(feature = "postgres_backend")]
impl<Q> diesel::query_builder::QueryId for Prepared<Q> {
    type QueryId = ();
    // Keyed by its SQL text and bind types, not by its Rust type.
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(feature = "postgres_backend")]
impl<Q: diesel::query_builder::Query> diesel::query_builder::Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}
