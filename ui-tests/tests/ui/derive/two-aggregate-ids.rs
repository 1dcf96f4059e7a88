// Exactly one field is the aggregate id; every extra one is reported.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct Named {
    #[outbox(aggregate_id)]
    order_id: u64,
    #[outbox(aggregate_id)]
    customer_id: u64,
    #[outbox(aggregate_id)]
    shop_id: u64,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct Tuple(#[outbox(aggregate_id)] u64, #[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum InVariant {
    Paid {
        #[outbox(aggregate_id)]
        order_id: u64,
        #[outbox(aggregate_id)]
        payment_id: u64,
    },
}

fn main() {}
