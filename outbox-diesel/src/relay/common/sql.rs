//! Statement helpers: prepared statements, `IN (…)` lists, intervals, and the statements whose
//! text MySQL and SQLite share.

#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};

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

/// What a rebalance returns: the shards held (sorted) and how many relays share them.
pub(crate) fn assignment(owned: Vec<i16>, live: i64) -> outbox_core::relay::ShardAssignment {
    outbox_core::relay::ShardAssignment {
        owned,
        live_relays: usize::try_from(live).unwrap_or(1),
    }
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
