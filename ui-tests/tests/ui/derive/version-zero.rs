// Versions start at 1, on a struct, an enum and a variant.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 0)]
struct Zero(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", version = -1)]
enum Negative {
    #[outbox(version = 0)]
    Paid(#[outbox(aggregate_id)] u64),
}

fn main() {}
