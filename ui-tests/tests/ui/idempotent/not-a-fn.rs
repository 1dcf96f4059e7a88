// The attribute goes on a function; on anything else it says so, and the item stays as it was.
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent(consumer = "billing")]
struct Billing {
    name: &'static str,
}

#[idempotent(consumer = "billing")]
const LIMIT: u32 = 3;

fn main() {
    let billing = Billing { name: "billing" };
    let _ = (billing.name, LIMIT);
}
