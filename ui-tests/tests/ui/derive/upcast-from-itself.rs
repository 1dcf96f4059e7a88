// A type is never its own upcast source, by name or as `Self`.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2, upcast_from = OrderCreated)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(version = 2, upcast_from = Self)]
    Paid {
        #[outbox(aggregate_id)]
        order_id: u64,
    },
}

fn main() {}
