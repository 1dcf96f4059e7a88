// A struct with named fields, every container attribute given.
use outbox::OutboxEvent;
use serde::Serialize;
use uuid::Uuid;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 1, topic = "orders.v1")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: Uuid,
    total_cents: i64,
}

fn main() {
    let event = OrderCreated { order_id: Uuid::nil(), total_cents: 5 };
    assert_eq!(event.aggregate_id(), "00000000-0000-0000-0000-000000000000");
    assert_eq!(event.event_type(), "OrderCreated");
    assert_eq!(event.topic(), Some("orders.v1"));
    assert_eq!(event.total_cents, 5);
}
