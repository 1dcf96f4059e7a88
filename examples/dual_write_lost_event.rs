//! Dual write, part 1: "commit, then publish" loses the event when the process dies in between. SQLite, no services.
//!
//! The naive service inserts the order, commits, and then sends `OrderPlaced` to the broker. A
//! crash injected between the two (the process dies after `COMMIT`) leaves an order that no
//! other service will ever hear of. The outbox way writes the event as a row in the same
//! transaction; the same crash leaves the event in the outbox, and the relay started after the
//! restart publishes it.

mod common;

use std::time::Duration;

use common::{OrderPlaced, SqliteDb, expect};
use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, SqliteRelayStore};

/// Where the injected crash happens.
struct Crash;

fn naive_place_order(
    conn: &mut SqliteConnection,
    broker: &MemoryBroker,
    id: i64,
) -> Result<(), Crash> {
    conn.transaction::<_, diesel::result::Error, _>(|c| {
        diesel::sql_query(format!("INSERT INTO orders VALUES ({id}, 1250)")).execute(c)?;
        Ok(())
    })
    .expect("insert the order");
    // COMMIT is done. The process dies here (deploy, OOM kill, node lost) ...
    if id == 1 {
        return Err(Crash);
    }
    // ... so this line never runs for order 1.
    common::send_direct(
        broker,
        &OrderPlaced {
            order_id: id,
            total_cents: 1250,
        },
    );
    Ok(())
}

fn outbox_place_order(conn: &mut SqliteConnection, id: i64) -> Result<(), Crash> {
    conn.transaction_with_outbox(|tx| {
        diesel::sql_query(format!("INSERT INTO orders VALUES ({id}, 1250)")).execute(tx.conn())?;
        tx.publish(&OrderPlaced {
            order_id: id,
            total_cents: 1250,
        })?;
        Ok::<_, outbox::Error>(())
    })
    .expect("place the order");
    // The same crash at the same place: nothing is lost, the event is a committed row.
    Err(Crash)
}

fn main() {
    println!("1. The naive way: commit the order, then publish the event.");
    let db = SqliteDb::new();
    let mut conn = db.conn();
    diesel::sql_query(common::ORDERS_DDL)
        .execute(&mut conn)
        .unwrap();
    let broker = MemoryBroker::new();
    let _ = naive_place_order(&mut conn, &broker, 1); // crashes after COMMIT
    let _ = naive_place_order(&mut conn, &broker, 2); // no crash
    let orders = count!(&mut conn, "orders");
    let events = common::records(&broker, "order");
    println!(
        "   {orders} orders committed, {events} events on the broker: order 1's event is lost for good."
    );
    expect(
        orders == 2 && events == 1,
        "the naive way to lose order 1's event",
    );

    println!("\n2. The outbox way: the event is a row in the order's transaction.");
    let db = SqliteDb::new();
    let mut conn = db.conn();
    diesel::sql_query(common::ORDERS_DDL)
        .execute(&mut conn)
        .unwrap();
    let _ = outbox_place_order(&mut conn, 1); // the same crash after COMMIT
    let waiting = count!(&mut conn, "outbox_events WHERE published_at IS NULL");
    println!("   After the crash: 1 order, {waiting} event waiting in the outbox.");
    expect(
        waiting == 1,
        "the event to survive the crash as an outbox row",
    );

    // The process restarts; its relay publishes whatever is committed and unpublished.
    let broker = std::sync::Arc::new(MemoryBroker::new());
    let seen = broker.clone();
    let (done, _) = common::relay_until(
        SqliteRelayStore::new(db.path.clone()),
        broker.clone(),
        common::quick_config(),
        Duration::from_secs(10),
        move || seen.records("order").len() == 1,
    );
    println!(
        "   The relay started after the restart published it: {} event on the broker.",
        broker.records("order").len()
    );
    expect(
        done,
        "the relay to publish the event that survived the crash",
    );
    println!(
        "\nThe outbox turns two writes (database, broker) into one local transaction; the\nrelay retries the second write until it succeeds."
    );
}
