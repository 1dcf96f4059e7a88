// `#[outbox]` needs a parenthesised list of keys.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox]
#[outbox = "order"]
#[outbox(aggregate = "order")]
struct Bare(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order" "order")]
struct TwoValues(#[outbox(aggregate_id)] u64);

fn main() {}
