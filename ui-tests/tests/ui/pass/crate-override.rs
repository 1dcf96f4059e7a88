// `crate = ...` for code that depends on the inner crate only, as a path or a string.
use outbox_core::OutboxEvent;
use serde::Serialize;

#[derive(Serialize, OutboxEvent)]
#[outbox(crate = outbox_core, aggregate = "cart")]
struct CartEmptied(#[outbox(aggregate_id)] u16);

#[derive(Serialize, OutboxEvent)]
#[outbox(aggregate = "cart", crate = "::outbox_core")]
enum CartEvent {
    Filled(#[outbox(aggregate_id)] u16),
}

mod shadowing {
    // The generated code names std and core by absolute paths, so local items cannot shadow them.
    #![allow(dead_code, non_camel_case_types)]
    struct u32;
    struct str;
    struct Option;
    struct String;

    #[derive(serde::Serialize, outbox::OutboxEvent)]
    #[outbox(aggregate = "cart")]
    pub struct CartLocked(#[outbox(aggregate_id)] pub u64);
}

fn main() {
    assert_eq!(CartEmptied(1).aggregate_id(), "1");
    assert_eq!(CartEvent::Filled(2).event_type(), "Filled");
    assert_eq!(outbox::OutboxEvent::event_version(&shadowing::CartLocked(3)), 1);
}
