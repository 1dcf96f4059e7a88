//! [`check_old_payloads`]: every registered version of an event still decodes into today's
//! type.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::DeserializeOwned;

use crate::catalog::{Catalog, CatalogError};
use crate::{DecodeError, Envelope, Headers, NewMessage, OutboxEvent};

/// A payload as an older release wrote it: its event type, version and JSON.
pub type OldPayload<'a> = (&'a str, u32, serde_json::Value);

/// Why [`check_old_payloads`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum OldPayloadError {
    /// The catalog could not be built (two types declare one event version).
    Catalog(CatalogError),
    /// A version the catalog knows of (a type of that version, or an upcast source) has no
    /// sample payload: add one written by that release.
    MissingSample {
        /// The event type.
        event_type: String,
        /// The version without a sample.
        version: u32,
    },
    /// A sample names an event type `E` does not carry, or a version newer than `E` reads.
    UnknownSample {
        /// The event type.
        event_type: String,
        /// Its version.
        version: u32,
    },
    /// A sample no longer decodes into today's type.
    Decode {
        /// The event type.
        event_type: String,
        /// The sample's version.
        version: u32,
        /// Why.
        source: DecodeError,
    },
}

impl fmt::Display for OldPayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OldPayloadError::Catalog(e) => write!(f, "the event catalog is inconsistent: {e}"),
            OldPayloadError::MissingSample {
                event_type,
                version,
            } => write!(
                f,
                "no sample payload of {event_type} v{version}: add one as that version wrote it"
            ),
            OldPayloadError::UnknownSample {
                event_type,
                version,
            } => write!(
                f,
                "the sample {event_type} v{version} is not an event version this type reads"
            ),
            OldPayloadError::Decode {
                event_type,
                version,
                source,
            } => write!(
                f,
                "the sample {event_type} v{version} no longer decodes: {source}"
            ),
        }
    }
}

impl std::error::Error for OldPayloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OldPayloadError::Catalog(e) => Some(e),
            OldPayloadError::Decode { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Checks that a payload of every registered version of `E`'s event types still decodes into
/// `E` (through its upcast chain), as a consumer of today's release must decode what older
/// releases left in the broker (feature `testing`).
///
/// `samples` holds one payload per version, as that release wrote it: keep them in the test
/// and add one with each new version. The versions that need one come from the
/// [linked catalog](Catalog::linked): every version of the event type a Rust type declares,
/// and every upcast source, so adding a version without its sample fails here. Returns the
/// number of samples decoded.
///
/// ```
/// # use outbox_core as outbox;
/// use outbox_core::OutboxEvent;
/// use outbox_core::catalog::Catalog;
/// use outbox_core::testing::{OldPayloadError, check_old_payloads_in};
/// use serde_json::json;
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderCreated")]
/// struct OrderCreatedV1 { #[outbox(aggregate_id)] order_id: u64 }
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order", version = 2, upcast_from = OrderCreatedV1)]
/// struct OrderCreated { #[outbox(aggregate_id)] order_id: u64, total_cents: i64 }
///
/// impl From<OrderCreatedV1> for OrderCreated {
///     fn from(v1: OrderCreatedV1) -> Self { OrderCreated { order_id: v1.order_id, total_cents: 0 } }
/// }
///
/// // `check_old_payloads` reads the linked catalog (every event type of the program); this
/// // example builds its own.
/// let catalog = Catalog::builder().event::<OrderCreatedV1>().event::<OrderCreated>().build().unwrap();
/// let samples = [
///     ("OrderCreated", 1, json!({ "order_id": 7 })),
///     ("OrderCreated", 2, json!({ "order_id": 7, "total_cents": 1250 })),
/// ];
/// assert_eq!(check_old_payloads_in::<OrderCreated>(&catalog, &samples)?, 2);
///
/// // Forgetting the v1 sample is caught, so is a v1 payload today's chain cannot read.
/// let err = check_old_payloads_in::<OrderCreated>(&catalog, &samples[1..]).unwrap_err();
/// assert!(matches!(err, OldPayloadError::MissingSample { version: 1, .. }));
/// let broken = [("OrderCreated", 1, json!({ "id": 7 })), samples[1].clone()];
/// let err = check_old_payloads_in::<OrderCreated>(&catalog, &broken).unwrap_err();
/// assert!(matches!(err, OldPayloadError::Decode { version: 1, .. }));
/// # Ok::<(), OldPayloadError>(())
/// ```
pub fn check_old_payloads<E: OutboxEvent + DeserializeOwned>(
    samples: &[OldPayload<'_>],
) -> Result<usize, OldPayloadError> {
    let catalog = Catalog::linked().map_err(OldPayloadError::Catalog)?;
    check_old_payloads_in::<E>(catalog, samples)
}

/// [`check_old_payloads`] against a catalog of your own (e.g. built with
/// [`Catalog::builder`]) instead of the linked one.
pub fn check_old_payloads_in<E: OutboxEvent + DeserializeOwned>(
    catalog: &Catalog,
    samples: &[OldPayload<'_>],
) -> Result<usize, OldPayloadError> {
    for t in E::EVENT_TYPES {
        for version in versions(catalog, t.aggregate_type, t.event_type, t.version) {
            let covered = samples
                .iter()
                .any(|(event_type, v, _)| *event_type == t.event_type && *v == version);
            if !covered {
                return Err(OldPayloadError::MissingSample {
                    event_type: t.event_type.to_owned(),
                    version,
                });
            }
        }
    }
    for (event_type, version, payload) in samples {
        let Some(t) = E::EVENT_TYPES
            .iter()
            .find(|t| t.event_type == *event_type && *version >= 1 && *version <= t.version)
        else {
            return Err(OldPayloadError::UnknownSample {
                event_type: (*event_type).to_owned(),
                version: *version,
            });
        };
        let message = NewMessage {
            id: uuid::Uuid::now_v7(),
            aggregate_type: t.aggregate_type.into(),
            aggregate_id: "sample".to_owned(),
            event_type: t.event_type.into(),
            event_version: *version as i32,
            payload: payload.to_string(),
            headers: Headers::new(),
            topic: None,
            shard: 0,
            created_at: crate::now_micros(),
        };
        Envelope::<E>::from_new_message(&message).map_err(|source| OldPayloadError::Decode {
            event_type: (*event_type).to_owned(),
            version: *version,
            source,
        })?;
    }
    Ok(samples.len())
}

/// The versions of an event type up to `current` that the catalog knows of: those declared
/// by a type, and the upcast sources of each.
fn versions(catalog: &Catalog, aggregate: &str, event_type: &str, current: u32) -> BTreeSet<u32> {
    let mut versions = BTreeSet::from([current]);
    for entry in catalog.entries() {
        if entry.aggregate_type == aggregate
            && entry.event_type == event_type
            && entry.version <= current
        {
            versions.insert(entry.version);
            if let Some(source) = &entry.upcast_from {
                versions.insert(source.version);
            }
        }
    }
    versions
}
