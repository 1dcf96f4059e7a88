// Every variant is an event and needs its own `aggregate_id` field.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    Paid {
        #[outbox(aggregate_id)]
        order_id: u64,
    },
    Cancelled {
        order_id: u64,
        reason: String,
    },
    Shipped(u64, String),
}

fn main() {}
