// `aggregate` is required: the error points at the type's name.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(event_type = "OrderCreated")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    id: u64,
}

#[derive(Serialize, OutboxEvent)]
enum OrderEvent {
    Paid(#[outbox(aggregate_id)] u64),
}

fn main() {}
