// An event type must not be empty or blank, start or end with whitespace, or hold control
// characters.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "")]
struct Empty(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "   ")]
struct Blank(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum Whitespace {
    #[outbox(event_type = " OrderPaid")]
    Paid(#[outbox(aggregate_id)] u64),
    #[outbox(event_type = "OrderShipped\t")]
    Shipped(#[outbox(aggregate_id)] u64),
    #[outbox(event_type = "Order\u{7}Lost")]
    Lost(#[outbox(aggregate_id)] u64),
}

fn main() {}
