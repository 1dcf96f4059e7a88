//! The write path: business-only, + a hand-written outbox INSERT, and `transaction_with_outbox`
//! with 1 and 10 events, at 1, 4 and 16 writers.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use outbox::prelude::*;

use crate::common::schema::{bench_orders, outbox_events};
use crate::common::*;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Write {
    Business,
    HandWritten,
    Ours1,
    Ours10,
}

impl Write {
    fn label(self) -> &'static str {
        match self {
            Write::Business => "(a) business only",
            Write::HandWritten => "(b) + hand-written outbox INSERT",
            Write::Ours1 => "(c) transaction_with_outbox, 1 event",
            Write::Ours10 => "(d) transaction_with_outbox, 10 events",
        }
    }
    fn events(self) -> u64 {
        match self {
            Write::Business => 0,
            Write::HandWritten | Write::Ours1 => 1,
            Write::Ours10 => 10,
        }
    }
}

fn insert_order(conn: &mut PgConnection) -> QueryResult<i64> {
    let id = next_id();
    diesel::insert_into(bench_orders::table)
        .values((
            bench_orders::id.eq(id),
            bench_orders::customer.eq(id % 1000),
            bench_orders::total_cents.eq(1250),
        ))
        .execute(conn)?;
    Ok(id)
}

fn one_write(conn: &mut PgConnection, w: Write) -> Result<(), outbox::Error> {
    match w {
        Write::Business => conn.transaction(|c| insert_order(c).map(|_| ()))?,
        Write::HandWritten => conn.transaction(|c| {
            let id = insert_order(c)?;
            let ev = OrderCreated {
                order_id: id,
                customer: id % 1000,
                total_cents: 1250,
            };
            let payload = serde_json::to_value(&ev).expect("serialise");
            let key = id.to_string();
            diesel::insert_into(outbox_events::table)
                .values((
                    outbox_events::id.eq(uuid::Uuid::now_v7()),
                    outbox_events::aggregate_type.eq("order"),
                    outbox_events::shard.eq(outbox::shard_of("order", &key)),
                    outbox_events::aggregate_id.eq(key),
                    outbox_events::event_type.eq("OrderCreated"),
                    outbox_events::event_version.eq(1),
                    outbox_events::payload.eq(payload),
                ))
                .execute(c)
                .map(|_| ())
        })?,
        Write::Ours1 | Write::Ours10 => conn.transaction_with_outbox(|tx| {
            let id = insert_order(tx.conn())?;
            for _ in 0..w.events() {
                tx.publish(&OrderCreated {
                    order_id: id,
                    customer: id % 1000,
                    total_cents: 1250,
                })?;
            }
            Ok::<_, outbox::Error>(())
        })?,
    }
    Ok(())
}

/// Transactions per second of `writers` threads for `secs`.
fn write_run(url: &str, w: Write, writers: usize, dur: Duration) -> f64 {
    let mut conns: Vec<PgConnection> = (0..writers)
        .map(|_| PgConnection::establish(url).expect("connect"))
        .collect();
    let start = Instant::now();
    let deadline = start + dur;
    let count = std::thread::scope(|s| {
        let hs: Vec<_> = conns
            .iter_mut()
            .map(|c| {
                s.spawn(move || {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        one_write(c, w).expect("write");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("writer"))
            .sum::<u64>()
    });
    count as f64 / start.elapsed().as_secs_f64()
}

/// The write-path section of the report.
pub fn section(ctx: &Ctx, md: &mut String) {
    let quick = ctx.quick;
    let url = &ctx.url;
    let runs = 3;
    let dur = Duration::from_secs(if quick { 2 } else { 15 });
    let mut conn = PgConnection::establish(url).expect("connect");
    // ---- write path ----
    let variants: Vec<(Write, Option<bool>)> = vec![
        (Write::Business, None),
        (Write::HandWritten, None),
        (Write::Ours1, Some(false)),
        (Write::Ours1, Some(true)),
        (Write::Ours10, Some(false)),
        (Write::Ours10, Some(true)),
    ];
    let _ = writeln!(md, "## Write path (PostgreSQL)\n");
    let _ = writeln!(
        md,
        "Each figure is the median of {runs} runs of {} s each; the variants run interleaved \
         (a, b, c, d, a, b, …) so they share the machine's noise. NOTIFY off: \
         `outbox::notify::set_interval(None)`; on: the default (at most one `pg_notify` per \
         100 ms per process). (a) and (b) never notify.\n",
        dur.as_secs()
    );
    let _ = writeln!(
        md,
        "| writers | variant | NOTIFY | tx/s | events/s | ours / hand-written | ours / business-only |\n|---|---|---|---|---|---|---|"
    );
    for writers in [1usize, 4, 16] {
        let mut samples = vec![Vec::new(); variants.len()];
        for _ in 0..runs {
            for (i, (w, notify)) in variants.iter().enumerate() {
                exec(&mut conn, "TRUNCATE bench_orders, outbox_events");
                outbox::notify::set_interval(match notify {
                    Some(true) => Some(Duration::from_millis(100)),
                    _ => None,
                });
                samples[i].push(write_run(url, *w, writers, dur));
            }
        }
        let med: Vec<f64> = samples.into_iter().map(median).collect();
        for (i, (w, notify)) in variants.iter().enumerate() {
            let tps = med[i];
            let (vs_hand, vs_biz) = match w {
                Write::Ours1 => (
                    format!("{:.2}", tps / med[1]),
                    format!("{:.2}", tps / med[0]),
                ),
                Write::Ours10 => ("–".into(), format!("{:.2}", tps / med[0])),
                Write::HandWritten => ("–".into(), format!("{:.2}", tps / med[0])),
                Write::Business => ("–".into(), "1.00".into()),
            };
            let line = format!(
                "| {writers} | {} | {} | {} | {} | {vs_hand} | {vs_biz} |",
                w.label(),
                match notify {
                    None => "–",
                    Some(true) => "on",
                    Some(false) => "off",
                },
                fmt_n(tps),
                fmt_n(tps * w.events() as f64),
            );
            println!("{line}");
            let _ = writeln!(md, "{line}");
        }
    }
    outbox::notify::set_interval(Some(Duration::from_millis(100)));
}
