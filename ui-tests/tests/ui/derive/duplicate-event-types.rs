// Event types are unique within an enum, whether explicit or defaulted to the variant's name;
// the second use is the error.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "OrderPaid")]
    Paid(#[outbox(aggregate_id)] u64),
    #[outbox(event_type = "OrderPaid", version = 2)]
    PaidAgain(#[outbox(aggregate_id)] u64),
    #[outbox(event_type = "Shipped")]
    Sent(#[outbox(aggregate_id)] u64),
    Shipped(#[outbox(aggregate_id)] u64),
    Cancelled(#[outbox(aggregate_id)] u64),
    #[outbox(event_type = "Cancelled")]
    Voided(#[outbox(aggregate_id)] u64),
}

fn main() {}
