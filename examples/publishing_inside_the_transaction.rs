//! Publishing inside the transaction: a slow broker holds row locks and pooled connections until the pool runs dry. Needs PostgreSQL (`DATABASE_URL`).
//!
//! Six requests arrive at once; each reserves stock (an `UPDATE`, which locks the row) and
//! publishes `OrderPlaced`. The broker stops answering (injected black hole; the client's
//! request timeout is 1 s). Sending inside the transaction holds the row lock and the pooled
//! connection for the whole second: with a pool of 2 and a 500 ms checkout timeout, most
//! requests fail without the broker ever being their problem, and the rest queue on the lock.
//! With the outbox the transaction only writes a row: every request commits in milliseconds
//! while the broker is down, and the relay delivers once it is back.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{OrderPlaced, PgDb, expect};
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use outbox::prelude::*;
use outbox::relay::MemoryBroker;

type PgPool = Pool<ConnectionManager<PgConnection>>;

fn reserve(c: &mut PgConnection) -> QueryResult<usize> {
    diesel::sql_query("UPDATE stock SET units = units - 1 WHERE sku = 1").execute(c)
}

/// Runs six concurrent requests; returns (succeeded, pool timeouts, slowest).
fn six_requests(
    pool: &PgPool,
    request: impl Fn(&mut PgConnection, i64) -> bool + Send + Sync + 'static,
) -> (usize, usize, Duration) {
    let request = Arc::new(request);
    let handles: Vec<_> = (1..=6)
        .map(|order_id| {
            let (pool, request) = (pool.clone(), request.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let outcome = match pool.get() {
                    Ok(mut conn) => Some(request(&mut conn, order_id)),
                    Err(_) => None, // the pool ran dry: checkout timed out
                };
                (outcome, start.elapsed())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|(o, _)| *o == Some(true)).count();
    let dry = results.iter().filter(|(o, _)| o.is_none()).count();
    (ok, dry, results.iter().map(|(_, t)| *t).max().unwrap())
}

fn main() {
    let db = PgDb::new("inside_tx");
    diesel::sql_query("CREATE TABLE stock (sku BIGINT PRIMARY KEY, units BIGINT NOT NULL)")
        .execute(&mut db.conn())
        .unwrap();
    diesel::sql_query("INSERT INTO stock VALUES (1, 100)")
        .execute(&mut db.conn())
        .unwrap();
    let pool = Pool::builder()
        .max_size(2)
        .connection_timeout(Duration::from_millis(500))
        .build(ConnectionManager::new(db.url.clone()))
        .unwrap();
    let broker = Arc::new(MemoryBroker::new());
    broker.set_black_hole(true);

    println!("1. Publishing inside the transaction while the broker does not answer.");
    let b = broker.clone();
    let (ok, dry, slowest) = six_requests(&pool, move |conn, order_id| {
        conn.transaction::<_, diesel::result::Error, _>(|c| {
            reserve(c)?;
            let sent = common::send_direct_within(
                &*b,
                &OrderPlaced {
                    order_id,
                    total_cents: 1,
                },
                Duration::from_secs(1),
            );
            if sent.is_none() {
                return Err(diesel::result::Error::RollbackTransaction);
            } // request timed out
            Ok(())
        })
        .is_ok()
    });
    println!(
        "   6 requests: {ok} succeeded, {dry} found the pool dry (500 ms checkout timeout), slowest took {slowest:.1?}."
    );
    expect(
        ok == 0 && dry >= 3 && slowest >= Duration::from_secs(1),
        "the pool to run dry and every request to fail",
    );

    println!("\n2. The outbox: the transaction writes a row; the broker is the relay's business.");
    let (ok, dry, slowest) = six_requests(&pool, |conn, order_id| {
        conn.transaction_with_outbox(|tx| {
            reserve(tx.conn())?;
            tx.publish(&OrderPlaced {
                order_id,
                total_cents: 1,
            })
        })
        .is_ok()
    });
    let waiting = count!(&mut db.conn(), "outbox_events WHERE published_at IS NULL");
    println!(
        "   6 requests: {ok} succeeded, {dry} found the pool dry, slowest took {slowest:.1?}; {waiting} events wait for the relay."
    );
    expect(
        ok == 6 && dry == 0,
        "every request to commit, none finding the pool dry",
    );
    println!(
        "\nNever hold a transaction (locks, a pooled connection) across a network call: write the\nevent as a row and let the relay do the waiting."
    );
}
