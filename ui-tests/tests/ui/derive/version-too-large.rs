// A version must fit the outbox's signed 32-bit column: at most 2147483647.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2147483647)]
struct Largest(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2147483648)]
struct TooLarge(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 99999999999999999999999999)]
enum WayTooLarge {
    #[outbox(version = 4294967296)]
    Paid(#[outbox(aggregate_id)] u64),
}

fn main() {}
