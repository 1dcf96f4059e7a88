// Two versions upcast from each other: the one whose source is newer is refused, so no chain
// can loop.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 1, upcast_from = OrderCreatedV2)]
struct OrderCreatedV1 {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 2, upcast_from = OrderCreatedV1)]
struct OrderCreatedV2 {
    #[outbox(aggregate_id)]
    order_id: u64,
}

impl From<OrderCreatedV1> for OrderCreatedV2 {
    fn from(old: OrderCreatedV1) -> Self {
        OrderCreatedV2 { order_id: old.order_id }
    }
}

impl From<OrderCreatedV2> for OrderCreatedV1 {
    fn from(new: OrderCreatedV2) -> Self {
        OrderCreatedV1 { order_id: new.order_id }
    }
}

fn main() {}
