// The connection is the one `&mut` parameter; a shared reference or a value is not one.
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
fn charge(event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = event;
    Ok(())
}

#[idempotent(consumer = "billing")]
fn refund(conn: &SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

fn main() {}
