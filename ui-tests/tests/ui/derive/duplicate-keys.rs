// A key given twice is an error on its second occurrence, within one attribute or across two.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", aggregate = "order")]
#[outbox(topic = "a")]
#[outbox(topic = "b")]
struct Twice {
    #[outbox(aggregate_id, aggregate_id)]
    id: u64,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", crate = outbox, crate = outbox)]
enum TwiceInVariant {
    #[outbox(version = 2)]
    #[outbox(version = 3)]
    Paid {
        #[outbox(aggregate_id)]
        id: u64,
    },
}

fn main() {}
