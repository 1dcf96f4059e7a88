// Each option is given once.
use diesel::SqliteConnection;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent(consumer = "billing", key = |e| e.order_id, consumer = "shipping", key = |e| e.id)]
fn charge(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

fn main() {}
