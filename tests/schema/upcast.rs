//! Upcasting: `#[outbox(upcast_from = ...)]` chains V1 -> V2 -> V3; `Envelope<V3>` decodes
//! every older version through the chain, and the check counts an upcast version as decoded
//! by its own type.

use outbox::catalog::Catalog;
use outbox::schema::{Mode, Snapshot, check};
use outbox::{DecodeError, Envelope, OutboxEvent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "Placed", version = 1)]
pub struct PlacedV1 {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub total: i64,
}

/// v2 renamed `total` (a breaking change, made safe by the upcast).
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "Placed", version = 2, upcast_from = PlacedV1)]
pub struct PlacedV2 {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub total_cents: i64,
}

/// v3 added a required currency.
#[derive(Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "Placed", version = 3, upcast_from = PlacedV2)]
pub struct Placed {
    #[outbox(aggregate_id)]
    pub order_id: i64,
    pub total_cents: i64,
    pub currency: String,
}

impl From<PlacedV1> for PlacedV2 {
    fn from(v1: PlacedV1) -> Self {
        PlacedV2 {
            order_id: v1.order_id,
            total_cents: v1.total,
        }
    }
}

impl From<PlacedV2> for Placed {
    fn from(v2: PlacedV2) -> Self {
        Placed {
            order_id: v2.order_id,
            total_cents: v2.total_cents,
            currency: "EUR".into(),
        }
    }
}

fn decode<E: OutboxEvent + serde::de::DeserializeOwned>(
    version: u32,
    payload: &str,
) -> Result<Envelope<E>, DecodeError> {
    let version = version.to_string();
    let headers = [
        ("id", "0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a"),
        ("event_type", "Placed"),
        ("event_version", version.as_str()),
        ("aggregate_type", "order"),
        ("created_at", "2025-01-31T09:30:00.123456Z"),
    ];
    Envelope::decode(
        headers.iter().map(|(k, v)| (*k, Some(v.as_bytes()))),
        Some(payload.as_bytes()),
    )
}

#[test]
fn every_older_version_decodes_as_the_current_type() {
    let v1 = decode::<Placed>(1, r#"{"order_id":1,"total":100}"#).unwrap();
    assert_eq!(
        v1.version, 1,
        "the envelope keeps the version the event was written with"
    );
    assert_eq!(
        v1.payload,
        Placed {
            order_id: 1,
            total_cents: 100,
            currency: "EUR".into()
        }
    );
    let v2 = decode::<Placed>(2, r#"{"order_id":2,"total_cents":200}"#).unwrap();
    assert_eq!((v2.total_cents, v2.currency.as_str()), (200, "EUR"));
    let v3 = decode::<Placed>(3, r#"{"order_id":3,"total_cents":300,"currency":"CHF"}"#).unwrap();
    assert_eq!(v3.currency, "CHF");
    // The middle of the chain decodes its own older versions too.
    assert_eq!(
        decode::<PlacedV2>(1, r#"{"order_id":4,"total":4}"#)
            .unwrap()
            .total_cents,
        4
    );
}

#[test]
fn an_old_payload_that_does_not_decode_names_the_source_type() {
    let err = decode::<Placed>(1, r#"{"order_id":1,"total_cents":100}"#).unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("the payload of event `Placed` does not decode as `schema::upcast::PlacedV1`: version 1 is upcast from `schema::upcast::PlacedV1`: missing field `total`"),
        "{message}"
    );
    assert!(matches!(err, DecodeError::Payload { .. }));
    assert!(matches!(
        decode::<Placed>(4, "{}").unwrap_err(),
        DecodeError::VersionTooNew {
            version: 4,
            supported: 3,
            ..
        }
    ));
}

#[test]
fn the_catalog_records_each_upcast_source() {
    let catalog = Catalog::builder()
        .event::<PlacedV1>()
        .event::<PlacedV2>()
        .event::<Placed>()
        .build()
        .unwrap();
    let v3 = catalog.current("order", "Placed").unwrap();
    assert_eq!(v3.version, 3);
    let source = v3.upcast_from.as_ref().unwrap();
    assert_eq!(
        (source.rust_type, source.version),
        ("schema::upcast::PlacedV2", 2)
    );
    assert!(
        catalog
            .get("order", "Placed", 1)
            .unwrap()
            .upcast_from
            .is_none()
    );
}

/// Each step breaks direct decoding (a rename, then a required field), but the versions it
/// upcasts from decode as their own types: compatible, even transitively.
#[test]
fn an_upcast_version_is_checked_against_its_own_type() {
    let committed = Snapshot::of(
        &Catalog::builder()
            .event::<PlacedV1>()
            .event::<PlacedV2>()
            .build()
            .unwrap(),
    );
    let compiled = Snapshot::of(
        &Catalog::builder()
            .event::<PlacedV1>()
            .event::<PlacedV2>()
            .event::<Placed>()
            .build()
            .unwrap(),
    );
    let report = check(&committed, &compiled, Mode::BackwardTransitive);
    assert!(report.breaking.is_empty(), "{:?}", report.breaking);
    assert_eq!(
        report.compatible[0].to_string(),
        "order/Placed v3: new version, compatible under BackwardTransitive (was v2)"
    );

    // Without the v2 type (and so without its upcast), v2 payloads must decode as v3.
    let without_v2 = Snapshot::of(&Catalog::builder().event::<Placed>().build().unwrap());
    let report = check(&committed, &without_v2, Mode::Backward);
    let lines: Vec<String> = report.breaking.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "order/Placed v3: v2 payloads no longer decode: required field `currency` added without a default; old payloads do not have it (make it an `Option` or give it `#[serde(default)]`)"
        ]
    );
}
