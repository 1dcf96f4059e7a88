// A tuple struct whose id is not the first field; defaults for event type and version.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "account")]
struct Deposited(i64, #[outbox(aggregate_id)] String);

fn main() {
    let event = Deposited(100, "acc-1".to_owned());
    assert_eq!(event.aggregate_id(), "acc-1");
    assert_eq!(event.event_type(), "Deposited");
    assert_eq!(event.event_version(), 1);
    assert_eq!(event.0, 100);
}
