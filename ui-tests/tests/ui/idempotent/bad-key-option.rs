// `key` is a one-argument closure or a function from `&Envelope<E>` to something `Display`.
use diesel::SqliteConnection;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent(consumer = "a", key = "order_id")]
fn a(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(consumer = "b", key = |e, attempt| e.order_id + attempt)]
fn b(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(consumer = "c", key)]
fn c(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(consumer = "d", key = async |e| e.order_id)]
fn d(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(consumer = "e", key = |e| e.payload)]
fn e(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

fn main() {}
