// A value of the wrong kind: strings where an integer is needed and the other way round,
// paths where a literal is needed, a value on the `aggregate_id` flag, a key without its value.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = 1, event_type = OrderCreated, version = "2", topic = true)]
struct Kinds {
    #[outbox(aggregate_id = true)]
    id: u64,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 1.5, crate = 5)]
enum MoreKinds {
    #[outbox(version = "two", event_type = 'p')]
    Paid(#[outbox(aggregate_id = x)] u64),
    #[outbox(topic)]
    Shipped(#[outbox(aggregate_id)] u64),
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", crate = "not a path", version = 2f32)]
struct BadCrate(#[outbox(aggregate_id)] u64);

fn main() {}
