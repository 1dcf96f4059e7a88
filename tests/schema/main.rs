#![allow(missing_docs)]
//! `outbox::schema` and upcasting: before/after pairs of event types checked with their
//! verdict and message (`pairs`), the catalog's conflicts, and decoding old versions through
//! upcast chains (`upcast`). Run with `cargo test --features schema --test schema`.

mod pairs;
mod upcast;

/// The pairs declare the same event version in two types on purpose: the linked catalog of
/// this test binary refuses them, naming both types, one line per conflict.
#[test]
fn the_linked_catalog_names_both_types_of_a_conflict() {
    let err = outbox::catalog::Catalog::linked().unwrap_err();
    let message = err.to_string();
    assert!(
        message.lines().any(|l| l
            == "event `order/SameVersion` v1 is declared by two types, \
                `schema::pairs::same_version::After` and `schema::pairs::same_version::Before`: \
                a consumer could not tell which one a message is; give one of them another \
                event type or version"),
        "{message}"
    );
    assert_eq!(message.lines().count(), err.conflicts.len());
    // Distinct versions of one event type are no conflict.
    assert!(!message.contains("order/Placed"), "{message}");
}

/// An enum's variant is written as its own content (no wrapper naming the variant), and its
/// catalog schema describes exactly that: the payload validates as the variant's schema, the
/// wrapped form does not.
#[test]
fn an_enum_variants_schema_is_its_payloads() {
    use outbox::OutboxEvent;
    use outbox::schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(aggregate = "parcel")]
    enum ParcelEvent {
        ParcelSent {
            #[outbox(aggregate_id)]
            parcel_id: u64,
            weight_grams: u32,
        },
        ParcelLost {
            #[outbox(aggregate_id)]
            parcel_id: u64,
        },
    }

    let catalog = outbox::catalog::Catalog::builder()
        .event::<ParcelEvent>()
        .build()
        .unwrap();
    let sent = catalog.current("parcel", "ParcelSent").unwrap();
    let schema = sent.schema.as_ref().expect("a schema");
    let properties = schema["properties"].as_object().unwrap();
    let mut names: Vec<&str> = properties.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["parcel_id", "weight_grams"], "{schema}");
    assert_eq!(
        schema["required"],
        serde_json::json!(["parcel_id", "weight_grams"])
    );

    let row = outbox::NewMessage::from_event(
        &ParcelEvent::ParcelSent {
            parcel_id: 1,
            weight_grams: 900,
        },
        Default::default(),
    )
    .unwrap();
    let payload: serde_json::Value = serde_json::from_str(&row.payload).unwrap();
    let keys: Vec<&String> = payload.as_object().unwrap().keys().collect();
    assert!(
        keys.iter().all(|k| properties.contains_key(*k)),
        "{payload}"
    );
    let lost = catalog.current("parcel", "ParcelLost").unwrap();
    let lost = lost.schema.as_ref().unwrap();
    assert_eq!(lost["required"], serde_json::json!(["parcel_id"]), "{lost}");
}
