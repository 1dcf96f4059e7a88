// The source must carry the same event type, of the same aggregate.
use outbox::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderPaid", version = 1)]
struct OrderPaid {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "invoice", event_type = "OrderCreated", version = 1)]
struct InvoiceOrderCreated {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", version = 2, upcast_from = OrderPaid)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 3, upcast_from = InvoiceOrderCreated)]
struct OrderCreatedV3 {
    #[outbox(aggregate_id)]
    order_id: u64,
}

impl From<OrderPaid> for OrderCreated {
    fn from(old: OrderPaid) -> Self {
        OrderCreated { order_id: old.order_id }
    }
}

impl From<InvoiceOrderCreated> for OrderCreatedV3 {
    fn from(old: InvoiceOrderCreated) -> Self {
        OrderCreatedV3 { order_id: old.order_id }
    }
}

fn main() {}
