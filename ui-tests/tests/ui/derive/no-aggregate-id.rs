// A struct needs a field marked `#[outbox(aggregate_id)]`: named, tuple and unit structs.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct Named {
    order_id: u64,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct Tuple(u64, String);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct Unit;

fn main() {}
