// An enum with struct and tuple variants, container defaults and per-variant overrides.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 3, topic = "orders")]
enum OrderEvent {
    Paid {
        #[outbox(aggregate_id)]
        order_id: Uuid,
        amount: i64,
    },
    #[outbox(event_type = "OrderCancelled", version = 2)]
    Cancelled {
        reason: String,
        #[outbox(aggregate_id)]
        order_id: Uuid,
    },
    #[outbox(topic = "shipping")]
    Shipped(#[outbox(aggregate_id)] Uuid, String),
    Noted(String, #[outbox(aggregate_id)] u32),
}

fn main() {
    assert_eq!(OrderEvent::EVENT_TYPES.len(), 4);
    let event = OrderEvent::Noted("hello".to_owned(), 7);
    assert_eq!(event.aggregate_id(), "7");
    assert_eq!(event.event_version(), 3);
    assert_eq!(event.topic(), Some("orders"));
}
