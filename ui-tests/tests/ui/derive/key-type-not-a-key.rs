// The aggregate id's type must implement `AggregateKey`; the error points at the field's type.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize)]
struct Customer {
    name: String,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: Vec<u8>,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "customer")]
enum CustomerEvent {
    Joined(#[outbox(aggregate_id)] Customer),
    Scored {
        #[outbox(aggregate_id)]
        score: f64,
    },
}

// With a generic id the bound moves to where the type is used as an event.
#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "tenant")]
struct Tagged<Id> {
    #[outbox(aggregate_id)]
    id: Id,
}

fn publish<E: OutboxEvent>(_: &E) {}

fn main() {
    publish(&Tagged { id: 1.5_f32 });
}
