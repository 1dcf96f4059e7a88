// `upcast_from` needs `From<Source> for Target`: reported at the source path.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
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
    note: Option<String>,
}

fn main() {}
