// `aggregate` (the default topic) and `topic` must be valid Kafka topic names.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "", topic = "orders/eu")]
struct Empty(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order events", topic = ".")]
struct Space(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "commande-réglée", topic = "..")]
struct NotAscii(#[outbox(aggregate_id)] u64);

#[derive(Serialize, OutboxEvent)]
#[outbox(
    aggregate = "order",
    topic = "tttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt"
)]
enum TooLong {
    #[outbox(topic = "orders\n")]
    Paid(#[outbox(aggregate_id)] u64),
}

fn main() {}
