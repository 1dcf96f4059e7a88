// A chain V1 -> V2 -> V3 on structs and on an enum variant compiles and decodes.
use outbox::{Envelope, OutboxEvent};
use serde::{Deserialize, Serialize};

mod v1 {
    use super::*;
    #[derive(Serialize, Deserialize, OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "OrderCreated", version = 1)]
    pub struct OrderCreated {
        #[outbox(aggregate_id)]
        pub order_id: u64,
    }
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderCreated", version = 2, upcast_from = v1::OrderCreated)]
struct OrderCreatedV2 {
    #[outbox(aggregate_id)]
    order_id: u64,
    total: i64,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "OrderCreated", version = 3, upcast_from = OrderCreatedV2)]
    Created {
        #[outbox(aggregate_id)]
        order_id: u64,
        total: i64,
    },
}

impl From<v1::OrderCreated> for OrderCreatedV2 {
    fn from(old: v1::OrderCreated) -> Self {
        OrderCreatedV2 { order_id: old.order_id, total: 0 }
    }
}

impl From<OrderCreatedV2> for OrderEvent {
    fn from(old: OrderCreatedV2) -> Self {
        OrderEvent::Created { order_id: old.order_id, total: old.total }
    }
}

fn main() {
    let headers = [
        ("id", "0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a"),
        ("event_type", "OrderCreated"),
        ("event_version", "1"),
        ("aggregate_type", "order"),
        ("created_at", "2025-01-31T09:30:00Z"),
    ];
    let env = Envelope::<OrderEvent>::decode(
        headers.iter().map(|(k, v)| (*k, Some(v.as_bytes()))),
        Some(br#"{"order_id":7}"#),
    )
    .unwrap();
    assert!(matches!(env.payload, OrderEvent::Created { order_id: 7, total: 0 }));
}
