// `upcast_from` takes a type path, once, on a struct or a variant.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2, upcast_from = "OrderCreatedV1")]
struct Quoted {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2, upcast_from = 1, upcast_from = Quoted)]
struct Numbered {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", upcast_from = Quoted)]
enum OnTheEnum {
    Paid {
        #[outbox(aggregate_id)]
        #[outbox(upcast_from = Quoted)]
        order_id: u64,
    },
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2, upcast_from = Quoted)]
struct Generic<T> {
    #[outbox(aggregate_id)]
    order_id: u64,
    value: T,
}

fn main() {}
