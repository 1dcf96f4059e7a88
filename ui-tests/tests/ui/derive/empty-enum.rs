// An enum without variants has no event type to publish.
use outbox::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum Never {}

fn main() {}
