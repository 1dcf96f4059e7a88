// Every mistake of an item is reported in one build, and the broken types can still be used
// as events elsewhere without a cascade of secondary errors.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order events", version = 0, colour = "red")]
#[outbox(version = 2)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: Vec<u8>,
    #[outbox(aggregate_id = yes)]
    customer_id: u64,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(event_type = "OrderEvent")]
enum OrderEvent {
    Paid(u64),
    Archived,
    #[outbox(event_type = "Paid", topic = "")]
    Settled(#[outbox(aggregate_id)] u64),
}

fn publish<E: OutboxEvent>(event: &E) -> String {
    format!("{}/{}", event.aggregate_type(), event.aggregate_id())
}

fn main() {
    publish(&OrderCreated { order_id: vec![1], customer_id: 2 });
    publish(&OrderEvent::Paid(1));
    let _ = (OrderCreated::EVENT_TYPES, OrderEvent::AGGREGATE_TYPE);
}
