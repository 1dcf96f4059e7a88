// Keys that exist, but not where they were written.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", aggregate_id)]
struct IdOnStruct {
    #[outbox(aggregate_id, aggregate = "order", version = 2)]
    id: u64,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", aggregate_id)]
enum OrderEvent {
    #[outbox(aggregate_id, aggregate = "order", crate = outbox)]
    Paid {
        #[outbox(aggregate_id, event_type = "OrderPaid", topic = "orders")]
        order_id: u64,
    },
}

fn main() {}
