//! The table refuses what the relay cannot publish (migration `row_checks`), fills in what
//! other programs leave out (migration `insert_defaults`), and computes the shard in SQL
//! exactly as `outbox::shard_of` does.

#![allow(unused_imports, dead_code)]

use diesel::{Connection, RunQueryDsl};

use crate::support::*;

/// The rows no relay can publish faithfully, each with the rule that refuses it:
/// `(aggregate_type, aggregate_id, event_type, headers, constraint)`.
const BAD_ROWS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "order",
        "1",
        "E",
        "[]",
        "outbox_events_headers_string_object",
    ),
    (
        "order",
        "1",
        "E",
        "\"text\"",
        "outbox_events_headers_string_object",
    ),
    (
        "order",
        "1",
        "E",
        "null",
        "outbox_events_headers_string_object",
    ),
    (
        "order",
        "1",
        "E",
        "{\"a\":1}",
        "outbox_events_headers_string_object",
    ),
    (
        "order",
        "1",
        "E",
        "{\"a\":\"b\",\"c\":null}",
        "outbox_events_headers_string_object",
    ),
    (
        "order",
        "1",
        "E",
        "{\"a\":{\"b\":\"c\"}}",
        "outbox_events_headers_string_object",
    ),
    (
        "order",
        "",
        "E",
        "{}",
        "outbox_events_aggregate_id_nonempty",
    ),
    ("order", "1", "", "{}", "outbox_events_event_type_nonempty"),
    ("", "1", "E", "{}", "outbox_events_aggregate_type_nonempty"),
];

/// Headers the relay publishes as they are: accepted.
const GOOD_HEADERS: &[&str] = &[
    "{}",
    "{\"traceparent\":\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}",
    "{ \"a\" : \"b\" , \"c\" : \"\" }",
    "{\"q\":\"say \\\"hi\\\"\",\"b\":\"back\\\\slash\"}",
];

/// An INSERT that gives every column (as an older writer would), so only the rule under test
/// can refuse it.
fn full_insert(
    backend: &str,
    t: &str,
    id: &str,
    e: &str,
    headers: &str,
    published: bool,
) -> String {
    let published = if published { "published" } else { "pending" };
    let h = headers.replace('\\', if backend == "mysql" { "\\\\" } else { "\\" });
    match backend {
        "postgres" => format!(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload, headers, shard, published_at) \
             VALUES (gen_random_uuid(), '{t}', '{id}', '{e}', 1, '{{}}', '{h}', 0, {})",
            if published == "published" {
                "now()"
            } else {
                "NULL"
            }
        ),
        "mysql" => format!(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload, headers, shard, created_at, available_at, published_at) \
             VALUES (UUID(), '{t}', '{id}', '{e}', 1, '{{}}', '{h}', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), {})",
            if published == "published" {
                "UTC_TIMESTAMP(6)"
            } else {
                "NULL"
            }
        ),
        _ => format!(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload, headers, shard, created_at, available_at, published_at) \
             VALUES (lower(hex(randomblob(16))), '{t}', '{id}', '{e}', 1, '{{}}', '{h}', 0, '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000', {})",
            if published == "published" {
                "'2026-01-01 00:00:00.000000'"
            } else {
                "NULL"
            }
        ),
    }
}

fn count<C>(conn: &mut C, sql: &str) -> i64
where
    C: diesel::connection::LoadConnection<Backend: 'static>,
    Count: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    diesel::sql_query(sql).get_result::<Count>(conn).unwrap().n
}

/// Each bad row is refused, the error names the rule, and nothing is stored; good headers and
/// our own writes pass.
fn bad_rows_are_refused<C>(conn: &mut C, backend: &str)
where
    C: diesel::connection::LoadConnection<Backend: outbox::OutboxBackend + 'static>,
    Count: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    for &(t, id, e, headers, rule) in BAD_ROWS {
        let err = diesel::sql_query(full_insert(backend, t, id, e, headers, false))
            .execute(conn)
            .expect_err(&format!(
                "{backend}: {t:?} {id:?} {e:?} {headers} must be refused"
            ));
        assert!(
            err.to_string().contains(rule),
            "{backend}: {t:?} {id:?} {e:?} {headers}: the error names {rule}: {err}"
        );
    }
    assert_eq!(count(conn, "SELECT COUNT(*) AS n FROM outbox_events"), 0);
    for headers in GOOD_HEADERS {
        diesel::sql_query(full_insert(backend, "order", "1", "E", headers, false))
            .execute(conn)
            .unwrap_or_else(|e| panic!("{backend}: {headers} is accepted: {e}"));
    }
    assert_eq!(
        count(conn, "SELECT COUNT(*) AS n FROM outbox_events"),
        GOOD_HEADERS.len() as i64
    );
}

/// Bad rows stored before the migration: pending ones are dead-lettered with the reason,
/// published ones are left alone, and the migration succeeds.
fn existing_rows_before_the_migration<C>(conn: &mut C, backend: &str)
where
    C: diesel::connection::LoadConnection<Backend: outbox::OutboxBackend + 'static>,
    Count: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    // Back to the schema before `row_checks`.
    for m in outbox::migrations::list::<C::Backend>().iter().rev() {
        if m.version.as_bytes() < b"20261130000004".as_slice() {
            break;
        }
        conn.batch_execute(m.down).unwrap();
        conn.batch_execute(&format!(
            "DELETE FROM __diesel_schema_migrations WHERE version = '{}'",
            m.version
        ))
        .unwrap();
    }
    for &(t, id, e, headers, _) in BAD_ROWS {
        for published in [false, true] {
            diesel::sql_query(full_insert(backend, t, id, e, headers, published))
                .execute(conn)
                .unwrap();
        }
    }
    diesel::sql_query(full_insert(backend, "order", "1", "E", "{}", false))
        .execute(conn)
        .unwrap();
    let applied = outbox::migrations::run(conn).unwrap();
    assert!(applied.contains(&"20261130000004"), "{applied:?}");
    let n = BAD_ROWS.len() as i64;
    assert_eq!(
        count(
            conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE dead_at IS NOT NULL \
             AND last_error LIKE 'refused by migration row_checks: %'"
        ),
        n,
        "{backend}: every pending bad row is a dead letter saying why"
    );
    assert_eq!(
        count(
            conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NOT NULL AND dead_at IS NULL"
        ),
        n,
        "{backend}: published rows are kept as they were"
    );
    assert_eq!(
        count(
            conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL"
        ),
        1,
        "{backend}: the good pending row stays pending"
    );
}

#[derive(diesel::QueryableByName)]
struct Shard {
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    shard: i16,
}

#[derive(diesel::QueryableByName)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    shard: i16,
    #[diesel(sql_type = diesel::sql_types::Text)]
    headers: String,
}

/// `outbox_shard_of` in SQL agrees with `shard_of` on every test vector.
fn sql_shard_of_agrees<C>(conn: &mut C, quote: impl Fn(&str) -> String)
where
    C: diesel::connection::LoadConnection<Backend: 'static>,
    Shard: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    for &(t, id, want) in outbox::SHARD_TEST_VECTORS {
        assert_eq!(outbox::shard_of(t, id), want);
        let got = diesel::sql_query(format!(
            "SELECT outbox_shard_of({}, {}) AS shard",
            quote(t),
            quote(id)
        ))
        .get_result::<Shard>(conn)
        .unwrap()
        .shard;
        assert_eq!(got, want, "outbox_shard_of({t:?}, {id:?})");
    }
}

/// The INSERT of `docs/relaying.md` ("Events from other programs"): the event's own
/// columns only.
const FOREIGN_INSERT: &str = "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload) \
     VALUES ('order', '42', 'OrderPlaced', 1, '{\"total_cents\": 1250}')";

/// The same as `INSERT ... SELECT` (MariaDB checks omitted columns earlier for this form).
const FOREIGN_INSERT_SELECT: &str = "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload) \
     SELECT 'order', '42', 'OrderPlaced', 1, '{}'";

fn foreign_row_is_completed<C>(conn: &mut C, select: &str)
where
    C: diesel::connection::LoadConnection<Backend: 'static>,
    Row: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    diesel::sql_query(FOREIGN_INSERT).execute(conn).unwrap();
    diesel::sql_query(FOREIGN_INSERT_SELECT)
        .execute(conn)
        .unwrap();
    let rows: Vec<Row> = diesel::sql_query(select).load(conn).unwrap();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        let id = uuid::Uuid::parse_str(&r.id).unwrap();
        assert_eq!(id.get_version_num(), 7, "{}", r.id);
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(r.id, id.hyphenated().to_string(), "lowercase, hyphenated");
        assert_eq!(r.shard, outbox::shard_of("order", "42"));
        assert_eq!(r.headers.replace(' ', ""), "{}");
    }
    assert_ne!(rows[0].id, rows[1].id);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_row_checks() {
    let db = TestDatabase::postgres("row_checks");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    bad_rows_are_refused(&mut conn, "postgres");
    let select = "SELECT id::text AS id, shard, headers::text AS headers FROM outbox_events \
                  WHERE aggregate_id = '42' ORDER BY seq";
    foreign_row_is_completed(&mut conn, select);
    sql_shard_of_agrees(&mut conn, |s| format!("'{}'", s.replace('\'', "''")));
    let db = TestDatabase::postgres("row_checks_old");
    let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
    existing_rows_before_the_migration(&mut conn, "postgres");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_row_checks() {
    let db = TestDatabase::mysql("row_checks");
    let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
    bad_rows_are_refused(&mut conn, "mysql");
    let select = "SELECT CAST(id AS CHAR) AS id, shard, CAST(headers AS CHAR) AS headers \
                  FROM outbox_events WHERE aggregate_id = '42' ORDER BY seq";
    foreign_row_is_completed(&mut conn, select);
    sql_shard_of_agrees(&mut conn, |s| {
        format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    });
    let db = TestDatabase::mysql("row_checks_old");
    let mut conn = diesel::MysqlConnection::establish(&db.url).unwrap();
    existing_rows_before_the_migration(&mut conn, "mysql");
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_row_checks() {
    let db = TestDatabase::sqlite("row_checks");
    let mut conn = diesel::SqliteConnection::establish(&db.url).unwrap();
    bad_rows_are_refused(&mut conn, "sqlite");
    // No SQL shard function on SQLite: a row without one is refused, saying what to do.
    let err = diesel::sql_query(FOREIGN_INSERT)
        .execute(&mut conn)
        .unwrap_err();
    assert!(err.to_string().contains("shard is required"), "{err}");
    let with_shard = format!(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload, shard) \
         VALUES ('order', '42', 'OrderPlaced', 1, '{{}}', {})",
        outbox::shard_of("order", "42")
    );
    diesel::sql_query(&with_shard).execute(&mut conn).unwrap();
    diesel::sql_query(&with_shard).execute(&mut conn).unwrap();
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT id, shard, headers FROM outbox_events WHERE aggregate_id = '42' ORDER BY seq",
    )
    .load(&mut conn)
    .unwrap();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        let id = uuid::Uuid::parse_str(&r.id).unwrap();
        assert_eq!(id.get_version_num(), 7, "{}", r.id);
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(r.id, id.hyphenated().to_string());
    }
    assert_ne!(rows[0].id, rows[1].id);
    let times = count(
        &mut conn,
        "SELECT COUNT(*) AS n FROM outbox_events WHERE aggregate_id = '42' \
         AND created_at LIKE '____-__-__ __:__:__.______' AND available_at = created_at",
    );
    assert_eq!(times, 2, "times in the table's format");
    let db = TestDatabase::sqlite("row_checks_old");
    let mut conn = diesel::SqliteConnection::establish(&db.url).unwrap();
    existing_rows_before_the_migration(&mut conn, "sqlite");
}
