//! `check_old_payloads` against the linked catalog: the service's events at several versions.

use outbox::prelude::*;
use outbox::testing::{OldPayloadError, check_old_payloads};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "shipment", event_type = "Shipped")]
struct ShippedV1 {
    #[outbox(aggregate_id)]
    shipment_id: i64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "shipment", event_type = "Shipped", version = 2, upcast_from = ShippedV1)]
struct ShippedV2 {
    #[outbox(aggregate_id)]
    shipment_id: i64,
    carrier: String,
}

impl From<ShippedV1> for ShippedV2 {
    fn from(v1: ShippedV1) -> Self {
        ShippedV2 {
            shipment_id: v1.shipment_id,
            carrier: "unknown".into(),
        }
    }
}

/// Today's type: v3, whose `carrier` became optional.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "shipment", event_type = "Shipped", version = 3, upcast_from = ShippedV2)]
struct Shipped {
    #[outbox(aggregate_id)]
    shipment_id: i64,
    carrier: Option<String>,
}

impl From<ShippedV2> for Shipped {
    fn from(v2: ShippedV2) -> Self {
        Shipped {
            shipment_id: v2.shipment_id,
            carrier: Some(v2.carrier),
        }
    }
}

fn samples() -> Vec<outbox::testing::OldPayload<'static>> {
    vec![
        ("Shipped", 1, json!({ "shipment_id": 1 })),
        ("Shipped", 2, json!({ "shipment_id": 1, "carrier": "dhl" })),
        ("Shipped", 3, json!({ "shipment_id": 1, "carrier": null })),
    ]
}

#[test]
fn every_registered_version_decodes_into_todays_type() {
    assert_eq!(check_old_payloads::<Shipped>(&samples()).unwrap(), 3);
}

#[test]
fn a_version_without_a_sample_fails() {
    let mut samples = samples();
    samples.remove(1);
    let err = check_old_payloads::<Shipped>(&samples).unwrap_err();
    assert!(
        matches!(err, OldPayloadError::MissingSample { version: 2, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "no sample payload of Shipped v2: add one as that version wrote it"
    );
}

#[test]
fn an_old_payload_that_no_longer_decodes_fails() {
    let mut samples = samples();
    // What v2 wrote had `carrier` as a string; a number is what a broken change would meet.
    samples[1].2 = json!({ "shipment_id": 1, "carrier": 5 });
    let err = check_old_payloads::<Shipped>(&samples).unwrap_err();
    assert!(
        matches!(err, OldPayloadError::Decode { version: 2, .. }),
        "{err:?}"
    );
}

#[test]
fn a_sample_newer_than_the_type_fails() {
    let mut samples = samples();
    samples.push(("Shipped", 4, json!({ "shipment_id": 1 })));
    let err = check_old_payloads::<Shipped>(&samples).unwrap_err();
    assert!(
        matches!(err, OldPayloadError::UnknownSample { version: 4, .. }),
        "{err:?}"
    );
}
