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
