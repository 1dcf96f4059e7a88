// Each variant of an enum is its own event type, so `event_type` goes on the variants.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderEvent")]
enum OrderEvent {
    Paid(#[outbox(aggregate_id)] u64),
}

fn main() {}
