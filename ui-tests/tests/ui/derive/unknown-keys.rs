// Keys the derive does not know, at each position; each message lists what is valid there.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", colour = "red", aggregate_type = "order")]
struct OnStruct {
    #[outbox(aggregate_id)]
    id: u64,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", serde::rename = "x")]
enum OnEnum {
    #[outbox(name = "OrderPaid", verison = 2)]
    Paid {
        #[outbox(aggregate_id, key)]
        id: u64,
        #[outbox(id)]
        other: u64,
    },
}

fn main() {}
