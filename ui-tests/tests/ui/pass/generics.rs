// Lifetimes, type parameters (the id's among them) and where clauses.
use outbox::{AggregateKey, OutboxEvent};
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "tenant")]
struct Tagged<'a, Id, P: Clone>
where
    P: Default,
{
    #[outbox(aggregate_id)]
    id: Id,
    label: &'a str,
    payload: P,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "tenant")]
enum TenantEvent<'a, T> {
    Created {
        #[outbox(aggregate_id)]
        id: &'a str,
        data: T,
    },
    Renamed(#[outbox(aggregate_id)] Box<str>, T),
}

fn key_of<E: OutboxEvent>(event: &E) -> String {
    event.aggregate_id()
}

fn generic_id<Id: AggregateKey + Serialize>(id: Id) -> String {
    key_of(&Tagged { id, label: "x", payload: 0u8 })
}

fn main() {
    assert_eq!(generic_id(5u64), "5");
    assert_eq!(key_of(&TenantEvent::Created { id: "t", data: () }), "t");
    assert_eq!(key_of(&TenantEvent::Renamed("u".into(), 1)), "u");
}
