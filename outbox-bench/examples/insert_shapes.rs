//! The two shapes of PostgreSQL's outbox `INSERT`, side by side in one run:
//!
//! - `values`: `INSERT ... VALUES (row), (row), ...`, 11 binds per row, at most 1,000 rows per
//!   statement; its SQL changes with the row count, so Diesel caches it only up to 16 rows (the
//!   statement the outbox wrote before it moved to arrays; MySQL and SQLite still write it);
//! - `unnest`: the outbox's own write (`OutboxBackend::write`), which above 16 rows is
//!   `INSERT ... SELECT ... FROM unnest($1, ..., $10)`, ten array binds whatever the row count,
//!   always cached (up to 16 rows it writes the cached `VALUES` statement itself: that is
//!   what this comparison showed to be cheaper there, see outbox-diesel's `pg_unnest.rs`).
//!
//! Each transaction inserts one business row and `n` events (fresh messages each time, built
//! the same way for both shapes); the shapes run interleaved, the tables emptied before every
//! run, and each figure is the median of the rounds.
//!
//! ```text
//! cargo run --release -p outbox-bench --example insert_shapes -- [pg server URL] [rounds] [ms] [sync-off]
//! ```

use std::time::{Duration, Instant};

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::sql_types::{Integer, Nullable, SmallInt, Text, Timestamptz, Uuid};
use outbox::{NewMessage, OutboxBackend};

/// The `VALUES` statement, as the outbox wrote it for PostgreSQL before the arrays.
struct Values<'a> {
    messages: &'a [NewMessage],
    headers: Vec<String>,
}

impl QueryFragment<Pg> for Values<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        if self.messages.len() > 16 {
            out.unsafe_to_cache_prepared();
        }
        out.push_sql(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, \
             event_version, payload, headers, topic, shard, created_at, available_at) VALUES ",
        );
        for (i, (m, h)) in self.messages.iter().zip(&self.headers).enumerate() {
            out.push_sql(if i == 0 { "(" } else { ", (" });
            out.push_bind_param::<Uuid, _>(&m.id)?;
            out.push_sql(", ");
            out.push_bind_param::<Text, _>(&m.aggregate_type)?;
            out.push_sql(", ");
            out.push_bind_param::<Text, _>(&m.aggregate_id)?;
            out.push_sql(", ");
            out.push_bind_param::<Text, _>(&m.event_type)?;
            out.push_sql(", ");
            out.push_bind_param::<Integer, _>(&m.event_version)?;
            out.push_sql(", CAST(");
            out.push_bind_param::<Text, _>(&m.payload)?;
            out.push_sql(" AS jsonb), CAST(");
            out.push_bind_param::<Text, _>(h)?;
            out.push_sql(" AS jsonb), ");
            out.push_bind_param::<Nullable<Text>, _>(&m.topic)?;
            out.push_sql(", ");
            out.push_bind_param::<SmallInt, _>(&m.shard)?;
            out.push_sql(", ");
            out.push_bind_param::<Timestamptz, _>(&m.created_at)?;
            out.push_sql(", ");
            out.push_bind_param::<Timestamptz, _>(&m.created_at)?;
            out.push_sql(")");
        }
        Ok(())
    }
}

impl QueryId for Values<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl RunQueryDsl<PgConnection> for Values<'_> {}

#[derive(serde::Serialize, outbox::OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
    customer: i64,
    total_cents: i64,
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    Values,
    Unnest,
}

fn messages(next: &mut i64, n: usize) -> Vec<NewMessage> {
    (0..n)
        .map(|_| {
            *next += 1;
            let e = OrderCreated {
                order_id: *next % 1000,
                customer: *next,
                total_cents: 1250,
            };
            NewMessage::from_event(&e, Default::default()).expect("message")
        })
        .collect()
}

/// Transactions of `n` events in `shape` for `dur`: events per second.
fn run(conn: &mut PgConnection, shape: Shape, n: usize, dur: Duration, next: &mut i64) -> f64 {
    diesel::sql_query("TRUNCATE bench_orders, outbox_events")
        .execute(conn)
        .expect("truncate");
    let start = Instant::now();
    let mut events = 0usize;
    while start.elapsed() < dur {
        let msgs = messages(next, n);
        let id = *next;
        conn.transaction(|c| {
            diesel::sql_query("INSERT INTO bench_orders (id, total_cents) VALUES ($1, 1250)")
                .bind::<diesel::sql_types::BigInt, _>(id)
                .execute(c)?;
            match shape {
                Shape::Values => {
                    for chunk in msgs.chunks(1000) {
                        Values {
                            messages: chunk,
                            headers: chunk.iter().map(NewMessage::headers_json).collect(),
                        }
                        .execute(c)?;
                    }
                    Ok(())
                }
                Shape::Unnest => Pg::write(c, &msgs),
            }
        })
        .expect("write");
        events += n;
    }
    events as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let server = args
        .next()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432".into());
    let rounds: usize = args.next().map_or(7, |s| s.parse().expect("rounds"));
    let ms: u64 = args.next().map_or(1000, |s| s.parse().expect("ms"));
    // `sync-off`: `synchronous_commit = off`, so that the commit's WAL flush (the same for both
    // shapes, and most of a small transaction's time) does not hide what the statements cost.
    let sync_off = args.next().is_some_and(|s| s == "sync-off");
    let db = format!("outbox_shapes_{}", std::process::id());
    let mut admin = PgConnection::establish(&format!("{server}/postgres")).expect("connect");
    diesel::sql_query(format!("CREATE DATABASE {db}"))
        .execute(&mut admin)
        .expect("create");
    let mut conn = PgConnection::establish(&format!("{server}/{db}")).expect("connect");
    outbox::migrations::run(&mut conn).expect("migrate");
    diesel::sql_query("CREATE TABLE bench_orders (id BIGINT PRIMARY KEY, total_cents BIGINT)")
        .execute(&mut conn)
        .expect("bench_orders");
    if sync_off {
        diesel::sql_query("SET synchronous_commit = off")
            .execute(&mut conn)
            .expect("synchronous_commit");
    }
    outbox::notify::set_interval(None);
    let mut next = 0i64;
    println!("| events per transaction | values events/s | unnest events/s | unnest / values |");
    println!("|---|---|---|---|");
    for n in [1usize, 10, 100, 1000] {
        let mut samples = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            // Each shape goes first in every other round.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let shape = [Shape::Values, Shape::Unnest][i];
                samples[i].push(run(
                    &mut conn,
                    shape,
                    n,
                    Duration::from_millis(ms),
                    &mut next,
                ));
            }
        }
        let [v, u] = samples.map(median);
        println!("| {n} | {v:.0} | {u:.0} | {:.2} |", u / v);
    }
    drop(conn);
    diesel::sql_query(format!("DROP DATABASE {db} WITH (FORCE)"))
        .execute(&mut admin)
        .expect("drop");
}
