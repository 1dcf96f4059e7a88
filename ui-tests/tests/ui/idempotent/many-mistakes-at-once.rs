// Every mistake of one attribute and signature is reported in one build.
use diesel::SqliteConnection;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent(consumer = "", key = 3, retry = true, consumer = "x")]
fn charge(conn: &SqliteConnection, event: &Envelope<OrderCreated>) -> u32 {
    let _ = (conn, event);
    0
}

fn main() {}
