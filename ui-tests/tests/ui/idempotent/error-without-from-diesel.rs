// The transaction and the inbox can fail: the error type must hold a diesel::result::Error.
use diesel::SqliteConnection;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[derive(Debug)]
enum BillingError {
    Declined,
}

#[idempotent(consumer = "billing")]
fn charge(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> Result<(), BillingError> {
    let _ = (conn, event);
    Err(BillingError::Declined)
}

fn main() {}
