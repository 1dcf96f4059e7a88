// A consumer name is 1 to 255 characters, without surrounding whitespace or control characters.
use diesel::SqliteConnection;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent(consumer = "")]
fn a(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(consumer = " billing")]
fn b(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(consumer = "bill\ting")]
fn c(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(consumer = "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345")]
fn d(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

fn main() {}
