//! How change data capture avoids phantom events: a logical replication slot decodes only committed transactions. Starts a private PostgreSQL cluster (`wal_level = logical`; server binaries under /usr/lib/postgresql).
//!
//! Three transactions write orders and their outbox rows: one commits, one is still open when
//! the slot is read, one rolls back after its row was inserted. The naive service that sends
//! the event from inside its transaction has announced all three. The slot, read with
//! `pg_logical_slot_get_changes` (test_decoding), shows the committed one; the open one
//! appears only once it commits; the rolled-back one never appears.

mod common;

use std::sync::mpsc::channel;

use common::{OrderPlaced, PrivatePg, expect};
use diesel::prelude::*;
use outbox::relay::MemoryBroker;

fn place(conn: &mut PgConnection, broker: &MemoryBroker, order_id: i64) -> QueryResult<()> {
    diesel::sql_query(format!("INSERT INTO orders VALUES ({order_id}, 100)")).execute(conn)?;
    outbox::publish(
        conn,
        &OrderPlaced {
            order_id,
            total_cents: 100,
        },
    )
    .map_err(diesel::result::Error::from)?;
    common::send_direct(
        broker,
        &OrderPlaced {
            order_id,
            total_cents: 100,
        },
    ); // the naive send
    Ok(())
}

fn orders_in(changes: &[String]) -> Vec<String> {
    changes
        .iter()
        .filter(|c| c.starts_with("table public.orders: INSERT"))
        .map(|c| c.split_whitespace().nth(3).unwrap_or("").to_owned())
        .collect()
}

fn main() {
    let pg = PrivatePg::start();
    let mut conn = PgConnection::establish(&pg.url()).unwrap();
    outbox::migrations::run(&mut conn).unwrap();
    diesel::sql_query(common::ORDERS_DDL)
        .execute(&mut conn)
        .unwrap();
    diesel::sql_query("SELECT pg_create_logical_replication_slot('cdc', 'test_decoding')")
        .execute(&mut conn)
        .unwrap();
    let broker = MemoryBroker::new();

    println!("Order 1 commits; order 2's transaction is held open; order 3 rolls back.");
    conn.transaction(|c| place(c, &broker, 1)).unwrap();
    let (held_tx, held) = channel();
    let (commit_tx, commit) = channel::<()>();
    let url = pg.url();
    let open = std::thread::spawn(move || {
        let mut c = PgConnection::establish(&url).unwrap();
        let b = MemoryBroker::new();
        c.transaction(|c| {
            place(c, &b, 2)?;
            held_tx.send(()).unwrap();
            commit.recv().unwrap();
            Ok::<_, diesel::result::Error>(())
        })
        .unwrap();
    });
    held.recv().unwrap();
    let rolled_back = conn.transaction(|c| {
        place(c, &broker, 3)?;
        Err::<(), _>(diesel::result::Error::RollbackTransaction)
    });
    expect(rolled_back.is_err(), "order 3's transaction to roll back");

    println!("\n1. The naive service sent each event from inside its transaction.");
    println!(
        "   events on the broker: {} (orders 1 and 3; order 3 does not exist)",
        broker.all_records().len()
    );
    expect(
        broker.all_records().len() == 2,
        "a phantom event for the rolled-back order 3",
    );

    println!("\n2. The slot while order 2 is still open.");
    let changes = common::slot_changes(&mut conn, "cdc");
    let seen = orders_in(&changes);
    println!("   {} change lines; orders seen: {seen:?}", changes.len());
    expect(
        seen.len() == 1 && seen[0].contains("id[bigint]:1"),
        "only the committed order 1",
    );

    commit_tx.send(()).unwrap();
    open.join().unwrap();
    let changes = common::slot_changes(&mut conn, "cdc");
    let later = orders_in(&changes);
    println!("   after order 2 commits: orders seen: {later:?}");
    expect(
        later.len() == 1 && later[0].contains("id[bigint]:2"),
        "order 2 once committed, and never order 3",
    );
    let outbox_rows = changes
        .iter()
        .filter(|c| c.starts_with("table public.outbox_events: INSERT"))
        .count();
    println!("   with its outbox row ({outbox_rows}), in one transaction: BEGIN .. COMMIT.");
    println!(
        "\nThe WAL holds what was written; logical decoding hands out a transaction at its COMMIT\nand drops an aborted one, so a CDC relay cannot publish a phantom."
    );
}
