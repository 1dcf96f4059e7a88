// `consumer` is required: a name derived from the function would change on a rename.
use diesel::SqliteConnection;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent]
fn charge(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(key = |e| e.order_id)]
fn refund(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

fn main() {
    // The functions are still generated, so callers report nothing more.
    let _ = charge;
    let _ = refund;
}
