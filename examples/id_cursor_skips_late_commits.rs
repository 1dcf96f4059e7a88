//! Why an `id > last_id` cursor loses events: ids are assigned at insert, rows become visible at commit. Needs PostgreSQL (`DATABASE_URL`).
//!
//! Transaction A inserts event `seq = n` and stays open (held, injected); transaction B inserts
//! `seq = n + 1` and commits. A poller reading `WHERE seq > last_seq` sees B's row and advances
//! its cursor past `n`; when A commits, its row is behind the cursor and is never read. The
//! relay does not use a cursor: it claims rows that are unpublished (`published_at IS NULL`),
//! whatever their position, so A's late commit is published like any other.

mod common;

use std::sync::Arc;
use std::sync::mpsc::channel;
use std::time::Duration;

use common::{OrderPlaced, PgDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, PgRelayStore};

#[derive(QueryableByName)]
struct Seq {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq: i64,
}

fn seqs(conn: &mut PgConnection, sql: &str) -> Vec<i64> {
    diesel::sql_query(sql)
        .load::<Seq>(conn)
        .unwrap()
        .into_iter()
        .map(|s| s.seq)
        .collect()
}

fn main() {
    let db = PgDb::new("id_cursor");
    let (inserted_tx, inserted) = channel();
    let (commit_tx, commit) = channel::<()>();
    let url = db.url.clone();
    println!("1. A naive poller with a cursor, `WHERE seq > last_seq`.");
    let slow = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).unwrap();
        conn.transaction::<_, outbox::Error, _>(|c| {
            outbox::publish(
                c,
                &OrderPlaced {
                    order_id: 1,
                    total_cents: 100,
                },
            )?;
            inserted_tx.send(()).unwrap();
            commit.recv().unwrap(); // held open until told to commit
            Ok(())
        })
        .unwrap();
    });
    inserted.recv().unwrap();
    let mut conn = db.conn();
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderPlaced {
            order_id: 2,
            total_cents: 200,
        })
    })
    .unwrap();

    let mut cursor = 0;
    let mut read = seqs(
        &mut conn,
        &format!("SELECT seq FROM outbox_events WHERE seq > {cursor} ORDER BY seq"),
    );
    println!("   A (order 1) open, B (order 2) committed; the poller reads seqs {read:?}");
    cursor = *read.last().unwrap();
    commit_tx.send(()).unwrap();
    slow.join().unwrap();
    let second = seqs(
        &mut conn,
        &format!("SELECT seq FROM outbox_events WHERE seq > {cursor} ORDER BY seq"),
    );
    read.extend(&second);
    let all = seqs(&mut conn, "SELECT seq FROM outbox_events ORDER BY seq");
    println!(
        "   A commits; the next poll (seq > {cursor}) reads {second:?}. In the table: {all:?}; read in total: {read:?}."
    );
    expect(
        all.len() == 2 && read.len() == 1 && read[0] == all[1],
        "the cursor to skip A's late commit",
    );

    println!("\n2. The relay claims unpublished rows, not rows past a cursor.");
    let broker = Arc::new(MemoryBroker::new());
    let seen = broker.clone();
    let (done, _) = common::relay_until(
        PgRelayStore::new(db.url.clone()),
        broker.clone(),
        common::quick_config(),
        Duration::from_secs(10),
        move || seen.records("order").len() == 2,
    );
    let keys: Vec<String> = broker
        .records("order")
        .iter()
        .map(|r| r.key.clone())
        .collect();
    println!("   The broker received orders {keys:?}.");
    expect(done, "both events published, the late commit included");
    println!(
        "\nSequences and auto-increment ids are handed out at insert, in one order, and become visible\nat commit, in another: a cursor over them skips rows."
    );
}
