// Versions go down along an upcast chain: a source of the same or a higher version is refused.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 2)]
struct OrderCreatedV2 {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2, upcast_from = OrderCreatedV2)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: u64,
}

impl From<OrderCreatedV2> for OrderCreated {
    fn from(old: OrderCreatedV2) -> Self {
        OrderCreated { order_id: old.order_id }
    }
}

fn main() {}
