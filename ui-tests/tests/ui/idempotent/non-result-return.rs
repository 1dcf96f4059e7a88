// Ok commits and Err rolls back: the function must return a Result.
use diesel::SqliteConnection;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent(consumer = "billing")]
fn charge(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) {
    let _ = (conn, event);
}

#[idempotent(consumer = "billing")]
fn refund(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> Option<i64> {
    let _ = conn;
    Some(event.order_id)
}

#[idempotent(consumer = "billing")]
fn ship(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> i64 {
    let _ = conn;
    event.order_id
}

fn main() {}
