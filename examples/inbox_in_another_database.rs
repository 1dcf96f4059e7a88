//! An inbox in a different database from the effect is not atomic: a crash between the two either loses the effect or applies it twice. SQLite (two files), no services.
//!
//! The consumer keeps its inbox in database A and writes its effect (a shipment) to database
//! B. Crash injected after the inbox commit: the redelivery is recognised as a duplicate and
//! the shipment never happens. Crash injected after the effect, before the inbox: the
//! redelivery ships again. With `#[idempotent]`, the inbox row and the effect share one
//! transaction on one database, so the same crash rolls both back and the redelivery applies
//! the event exactly once.

mod common;

use common::{OrderPlaced, SqliteDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;

#[derive(Clone, Copy, PartialEq)]
enum CrashAt {
    AfterInbox,
    AfterEffect,
    Nowhere,
}

/// Inbox in `inbox_db`, effect in `effect_db`: two commits.
fn split(
    inbox_db: &mut SqliteConnection,
    effect_db: &mut SqliteConnection,
    e: &Envelope<OrderPlaced>,
    crash: CrashAt,
    inbox_first: bool,
) -> Result<&'static str, &'static str> {
    let seen = count!(inbox_db, format!("seen WHERE id = '{}'", e.id)) > 0;
    if seen {
        return Ok("duplicate");
    }
    let record = |c: &mut SqliteConnection| {
        diesel::sql_query(format!("INSERT INTO seen VALUES ('{}')", e.id))
            .execute(c)
            .unwrap()
    };
    let ship = |c: &mut SqliteConnection| {
        diesel::sql_query(format!("INSERT INTO shipments VALUES ({})", e.order_id))
            .execute(c)
            .unwrap()
    };
    if inbox_first {
        record(inbox_db);
    } else {
        ship(effect_db);
    }
    if crash == CrashAt::AfterInbox || crash == CrashAt::AfterEffect {
        return Err("crashed");
    }
    if inbox_first {
        ship(effect_db);
    } else {
        record(inbox_db);
    }
    Ok("applied")
}

#[derive(Debug)]
struct Crashed;
impl From<diesel::result::Error> for Crashed {
    fn from(_: diesel::result::Error) -> Self {
        Crashed
    }
}

/// Inbox and effect in one transaction on one database.
#[idempotent(consumer = "shipping")]
fn together(
    conn: &mut SqliteConnection,
    event: Envelope<OrderPlaced>,
    crash: bool,
) -> Result<(), Crashed> {
    diesel::sql_query(format!("INSERT INTO shipments VALUES ({})", event.order_id))
        .execute(conn)?;
    if crash {
        return Err(Crashed);
    } // dies before COMMIT: the inbox row and the shipment roll back
    Ok(())
}

fn fresh() -> (SqliteDb, SqliteDb) {
    let (a, b) = (SqliteDb::new(), SqliteDb::new());
    diesel::sql_query("CREATE TABLE seen (id TEXT PRIMARY KEY)")
        .execute(&mut a.conn())
        .unwrap();
    diesel::sql_query("CREATE TABLE shipments (order_id BIGINT)")
        .execute(&mut b.conn())
        .unwrap();
    (a, b)
}

fn main() {
    let event = Envelope::new(OrderPlaced {
        order_id: 9,
        total_cents: 300,
    });

    println!("1. Inbox in database A, shipment in database B; record the inbox first.");
    let (a, b) = fresh();
    let (mut ca, mut cb) = (a.conn(), b.conn());
    let first = split(&mut ca, &mut cb, &event, CrashAt::AfterInbox, true);
    let again = split(&mut ca, &mut cb, &event, CrashAt::Nowhere, true);
    let shipped = count!(&mut cb, "shipments");
    println!("   delivery: {first:?}; redelivery: {again:?}; shipments: {shipped} (lost).");
    expect(
        shipped == 0,
        "the effect to be lost when the crash follows the inbox commit",
    );

    println!("\n2. Same split; apply the effect first.");
    let (a, b) = fresh();
    let (mut ca, mut cb) = (a.conn(), b.conn());
    let first = split(&mut ca, &mut cb, &event, CrashAt::AfterEffect, false);
    let again = split(&mut ca, &mut cb, &event, CrashAt::Nowhere, false);
    let shipped = count!(&mut cb, "shipments");
    println!("   delivery: {first:?}; redelivery: {again:?}; shipments: {shipped} (twice).");
    expect(
        shipped == 2,
        "the effect to be applied twice when the crash precedes the inbox commit",
    );

    println!("\n3. #[idempotent]: inbox and shipment in one transaction on database B.");
    let (_, b) = fresh();
    let mut cb = b.conn();
    let first = together(&mut cb, event.clone(), true);
    let again = together(&mut cb, event.clone(), false).unwrap();
    let third = together(&mut cb, event, false).unwrap();
    let shipped = count!(&mut cb, "shipments");
    println!(
        "   delivery: {first:?}; redelivery: {again:?}; another: {third:?}; shipments: {shipped}."
    );
    expect(
        first.is_err() && shipped == 1,
        "exactly one shipment through the crash",
    );
    println!(
        "\nThe inbox only works in the same transaction as the effect: keep it in the effect's database."
    );
}
