//! Before/after pairs of event types, one per kind of breaking change and several compatible
//! ones, each checked with the verdict and the exact lines the check prints.
//!
//! Each pair is a module with `Before` and `After` declaring the same event type; the check
//! compares a snapshot of `Before` (the committed one) with one of `After` (the compiled one).

use outbox::OutboxEvent;
use outbox::catalog::Catalog;
use outbox::schema::{Mode, Report, Snapshot, check};

fn snapshot(catalog: Result<Catalog, outbox::catalog::CatalogError>) -> Snapshot {
    Snapshot::of(&catalog.unwrap())
}

/// The check of `After` against a snapshot of `Before`, as lines.
fn verdict<Before: OutboxEvent, After: OutboxEvent>(mode: Mode) -> (Vec<String>, Vec<String>) {
    let before = snapshot(Catalog::builder().event::<Before>().build());
    let after = snapshot(Catalog::builder().event::<After>().build());
    lines(check(&before, &after, mode))
}

fn lines(report: Report) -> (Vec<String>, Vec<String>) {
    let show = |f: &Vec<outbox::schema::Finding>| f.iter().map(ToString::to_string).collect();
    (show(&report.breaking), show(&report.compatible))
}

/// Declares `Before` and `After` in a module: `pair!(name, "Event", before_attrs { fields }, after_attrs { fields })`.
macro_rules! pair {
    ($name:ident, $et:literal, [$($b:tt)*] { $($bf:tt)* }, [$($a:tt)*] { $($af:tt)* }) => {
        mod $name {
            #![allow(dead_code)]
            #[allow(unused_imports)]
            use super::*;
            #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, outbox::OutboxEvent)]
            #[outbox(aggregate = "order", event_type = $et, $($b)*)]
            pub struct Before { #[outbox(aggregate_id)] pub order_id: i64, $($bf)* }
            #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, outbox::OutboxEvent)]
            #[outbox(aggregate = "order", event_type = $et, $($a)*)]
            pub struct After { #[outbox(aggregate_id)] pub order_id: i64, $($af)* }
        }
    };
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub enum ShippingV1 {
    Standard,
    Express { days: u8 },
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub enum ShippingV2 {
    Standard,
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub enum ShippingV3 {
    Standard,
    Express { days: u8 },
    Drone,
}

pair!(removed, "Removed", [version = 1] { pub note: String }, [version = 2] {});
pair!(renamed, "Renamed", [version = 1] { pub total: i64 }, [version = 2] { pub total_cents: i64 });
pair!(retyped, "Retyped", [version = 1] { pub total: i64 }, [version = 2] { pub total: String });
pair!(narrowed, "Narrowed", [version = 1] { pub total: i64 }, [version = 2] { pub total: i32 });
pair!(required, "Required", [version = 1] {}, [version = 2] { pub currency: String });
pair!(became_required, "BecameRequired", [version = 1] { pub note: Option<String> }, [version = 2] { pub note: String });
pair!(variant_removed, "VariantRemoved", [version = 1] { pub shipping: ShippingV1 }, [version = 2] { pub shipping: ShippingV2 });
pair!(same_version, "SameVersion", [version = 1] {}, [version = 1] { pub note: Option<String> });
pair!(version_down, "VersionDown", [version = 2] {}, [version = 1] {});
pair!(optional_added, "OptionalAdded", [version = 1] {}, [version = 2] { pub note: Option<String> });
pair!(defaulted_added, "DefaultedAdded", [version = 1] {}, [version = 2] { #[serde(default)] pub tags: Vec<String> });
pair!(widened, "Widened", [version = 1] { pub total: i32 }, [version = 2] { pub total: i64, });
pair!(variant_added, "VariantAdded", [version = 1] { pub shipping: ShippingV1 }, [version = 2] { pub shipping: ShippingV3 });
pair!(
    renamed_in_rust_only,
    "RenamedInRustOnly",
    [version = 1] { pub total: i64 },
    [version = 1] {
        /// Doc comments and Rust names are not on the wire.
        #[serde(rename = "total")]
        pub total_cents: i64
    }
);
pair!(
    denied_removed,
    "DeniedRemoved",
    [version = 1] { pub note: String },
    [version = 2] {}
);

mod denied {
    #![allow(dead_code)]
    #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, outbox::OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "Denied", version = 1)]
    pub struct Before {
        #[outbox(aggregate_id)]
        pub order_id: i64,
        pub note: String,
    }
    #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, outbox::OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "Denied", version = 2)]
    #[serde(deny_unknown_fields)]
    pub struct After {
        #[outbox(aggregate_id)]
        pub order_id: i64,
    }
}

fn breaking(lines: &[&str]) -> (Vec<String>, Vec<String>) {
    (lines.iter().map(|l| l.to_string()).collect(), Vec::new())
}

fn compatible(line: &str) -> (Vec<String>, Vec<String>) {
    (Vec::new(), vec![line.to_owned()])
}

#[test]
fn a_removed_field_breaks_old_readers_only() {
    assert_eq!(
        verdict::<removed::Before, removed::After>(Mode::Full),
        breaking(&[
            "order/Removed v2: v1 readers cannot decode it: field `note` removed; old readers require it"
        ])
    );
    assert_eq!(
        verdict::<removed::Before, removed::After>(Mode::Backward),
        compatible("order/Removed v2: new version, compatible under Backward (was v1)")
    );
}

#[test]
fn a_removed_field_breaks_a_type_that_denies_unknown_fields() {
    assert_eq!(
        verdict::<denied::Before, denied::After>(Mode::Backward),
        breaking(&[
            "order/Denied v2: v1 payloads no longer decode: field `note` removed, and the new type refuses unknown fields (`deny_unknown_fields`), so old payloads that have it are refused"
        ])
    );
    // Without `deny_unknown_fields` the old field is ignored.
    assert!(
        verdict::<denied_removed::Before, denied_removed::After>(Mode::Backward)
            .0
            .is_empty()
    );
}

#[test]
fn a_renamed_field_is_named_as_a_rename() {
    assert_eq!(
        verdict::<renamed::Before, renamed::After>(Mode::Backward),
        breaking(&[
            "order/Renamed v2: v1 payloads no longer decode: field `total` renamed to `total_cents`; old payloads have no `total_cents` (keep the old name with `#[serde(alias = \"total\")]`, or upcast from the old version's type)"
        ])
    );
    assert_eq!(
        verdict::<renamed::Before, renamed::After>(Mode::Forward),
        breaking(&[
            "order/Renamed v2: v1 readers cannot decode it: field `total` renamed to `total_cents`; old readers require `total`"
        ])
    );
}

#[test]
fn a_changed_type_is_breaking() {
    assert_eq!(
        verdict::<retyped::Before, retyped::After>(Mode::Backward),
        breaking(&[
            "order/Retyped v2: v1 payloads no longer decode: field `total`: type changed from integer (int64) to string"
        ])
    );
    assert_eq!(
        verdict::<narrowed::Before, narrowed::After>(Mode::Backward),
        breaking(&[
            "order/Narrowed v2: v1 payloads no longer decode: field `total`: type changed from integer (int64) to integer (int32)"
        ])
    );
}

#[test]
fn a_required_field_without_a_default_is_breaking() {
    assert_eq!(
        verdict::<required::Before, required::After>(Mode::Backward),
        breaking(&[
            "order/Required v2: v1 payloads no longer decode: required field `currency` added without a default; old payloads do not have it (make it an `Option` or give it `#[serde(default)]`)"
        ])
    );
    assert_eq!(
        verdict::<became_required::Before, became_required::After>(Mode::Backward),
        breaking(&[
            "order/BecameRequired v2: v1 payloads no longer decode: field `note` became required; old payloads may lack it (make it an `Option` or give it `#[serde(default)]`)"
        ])
    );
}

#[test]
fn a_removed_enum_variant_is_breaking() {
    assert_eq!(
        verdict::<variant_removed::Before, variant_removed::After>(Mode::Backward),
        breaking(&[
            "order/VariantRemoved v2: v1 payloads no longer decode: enum variant `Express` of field `shipping` removed; old payloads may hold it"
        ])
    );
    // Adding one is fine for new readers, not for old ones.
    assert_eq!(
        verdict::<variant_added::Before, variant_added::After>(Mode::Backward),
        compatible("order/VariantAdded v2: new version, compatible under Backward (was v1)")
    );
    assert_eq!(
        verdict::<variant_added::Before, variant_added::After>(Mode::Forward).0,
        [
            "order/VariantAdded v2: v1 readers cannot decode it: enum variant `Drone` of field `shipping` added; old readers refuse it"
        ]
    );
}

#[test]
fn the_same_version_with_another_shape_must_be_bumped() {
    assert_eq!(
        verdict::<same_version::Before, same_version::After>(Mode::Backward),
        breaking(&[
            "order/SameVersion v1: same version, different shape (bump the version): /properties/note added"
        ])
    );
    // Only the wire counts: Rust names, `serde(rename)` back to the old name, doc comments.
    assert_eq!(
        verdict::<renamed_in_rust_only::Before, renamed_in_rust_only::After>(Mode::FullTransitive),
        (Vec::new(), Vec::new())
    );
}

#[test]
fn a_version_going_down_is_breaking() {
    assert_eq!(
        verdict::<version_down::Before, version_down::After>(Mode::None),
        breaking(&["order/VersionDown v1: version went down from 2 to 1: versions only go up"])
    );
}

#[test]
fn compatible_changes_pass() {
    assert_eq!(
        verdict::<optional_added::Before, optional_added::After>(Mode::Full),
        compatible("order/OptionalAdded v2: new version, compatible under Full (was v1)")
    );
    assert_eq!(
        verdict::<defaulted_added::Before, defaulted_added::After>(Mode::Backward),
        compatible("order/DefaultedAdded v2: new version, compatible under Backward (was v1)")
    );
    assert_eq!(
        verdict::<widened::Before, widened::After>(Mode::Backward),
        compatible("order/Widened v2: new version, compatible under Backward (was v1)")
    );
    // Widening is not forward compatible: an old reader may get a value it cannot hold.
    assert_eq!(
        verdict::<widened::Before, widened::After>(Mode::Forward).0,
        [
            "order/Widened v2: v1 readers cannot decode it: field `total`: type changed from integer (int32) to integer (int64)"
        ]
    );
}
