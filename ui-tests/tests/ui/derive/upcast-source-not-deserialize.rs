// An upcast source is decoded from old payloads, so it must implement `Deserialize`.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 1)]
struct OrderCreatedV1 {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2, upcast_from = OrderCreatedV1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: u64,
}

impl From<OrderCreatedV1> for OrderCreated {
    fn from(old: OrderCreatedV1) -> Self {
        OrderCreated { order_id: old.order_id }
    }
}

fn main() {}
