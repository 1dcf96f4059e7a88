// The source of an upcast is an older version of an event, not any type.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct LegacyOrder {
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2, upcast_from = LegacyOrder)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: u64,
}

impl From<LegacyOrder> for OrderCreated {
    fn from(old: LegacyOrder) -> Self {
        OrderCreated { order_id: old.order_id }
    }
}

fn main() {}
