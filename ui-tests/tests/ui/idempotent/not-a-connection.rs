// The `&mut` parameter must be a synchronous Diesel connection on a supported backend.
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent(consumer = "billing")]
fn charge(conn: &mut String, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    conn.push_str(&event.order_id.to_string());
    Ok(())
}

fn main() {}
