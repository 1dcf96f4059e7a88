// A unit variant has no field that could be the aggregate id.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    Paid(#[outbox(aggregate_id)] u64),
    Archived,
    #[outbox(event_type = "OrderForgotten")]
    Forgotten {},
}

fn main() {}
