// Unions cannot be events.
use outbox::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(aggregate = "order")]
union Id {
    number: u64,
    bytes: [u8; 8],
}

fn main() {}
