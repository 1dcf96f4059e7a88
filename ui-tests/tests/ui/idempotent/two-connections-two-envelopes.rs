// One connection and one envelope: a second of either is ambiguous.
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
fn charge(
    conn: &mut SqliteConnection,
    audit: &mut SqliteConnection,
    event: Envelope<OrderCreated>,
) -> diesel::QueryResult<()> {
    let _ = (conn, audit, event);
    Ok(())
}

#[idempotent(consumer = "billing")]
fn refund(
    conn: &mut SqliteConnection,
    event: Envelope<OrderCreated>,
    previous: Envelope<OrderCreated>,
) -> diesel::QueryResult<()> {
    let _ = (conn, event, previous);
    Ok(())
}

fn main() {}
