//! The catalog of every event type the program was compiled with: aggregate, event type,
//! version, Rust type, upcast source and (with the `schema` feature) JSON Schema.
//!
//! Every non-generic `#[derive(OutboxEvent)]` registers itself in a link-time slice
//! ([`linkme`](https://docs.rs/linkme)), so the catalog needs no list to keep up to date and runs
//! no code before `main`: [`Catalog::linked`] reads what the linker gathered. Where that is not
//! wanted (a platform linkme does not support, or a test that declares conflicting types on
//! purpose), [`Catalog::builder`] builds a catalog from an explicit list of types.
//!
//! Two different Rust types declaring the same event (aggregate, event type and version) are
//! an error the first time a catalog is built ([`CatalogError`]), naming both types.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use serde_json::Value;

use crate::{EventType, OutboxEvent};

/// The link-time slice every derived event registers itself in. Not public API.
#[doc(hidden)]
#[linkme::distributed_slice]
pub static REGISTRATIONS: [fn() -> Registration];

/// What one Rust type contributes to the catalog. Not public API: built by the derive.
#[doc(hidden)]
pub struct Registration {
    pub rust_type: &'static str,
    pub event_types: &'static [EventType],
    /// Whether the type is an enum (one event type per variant).
    pub is_enum: bool,
    /// Whether the type is an externally tagged enum (serde's default): the payload on the
    /// wire is then a variant's content, without the wrapper that names the variant, and so
    /// is each variant's schema.
    pub externally_tagged: bool,
    pub upcasts: Vec<UpcastLink>,
    /// The JSON Schema of the whole type, when the `schema` feature is on and the type
    /// implements `schemars::JsonSchema`.
    pub schema: Option<Value>,
}

impl Registration {
    /// The registration of a type implemented by hand: no schema, no upcasts.
    pub fn plain<E: OutboxEvent>() -> Self {
        Registration {
            rust_type: std::any::type_name::<E>(),
            event_types: E::EVENT_TYPES,
            is_enum: E::EVENT_TYPES.len() > 1,
            externally_tagged: false,
            upcasts: Vec::new(),
            schema: None,
        }
    }
}

/// `#[outbox(upcast_from = Source)]` on one event type. Not public API.
#[doc(hidden)]
pub struct UpcastLink {
    pub event_type: &'static str,
    pub source_type: &'static str,
    pub source_version: u32,
}

/// An upcast source's payload did not decode. Not public API: `Envelope` turns it into a
/// `DecodeError::Payload` naming the source type.
#[doc(hidden)]
#[derive(Debug)]
pub struct UpcastFailure {
    pub target: &'static str,
    pub reason: String,
}

/// The type an event version is upcast from: `#[outbox(upcast_from = OrderCreatedV1)]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpcastSource {
    /// The source's Rust type path, e.g. `my_app::events::OrderCreatedV1`.
    pub rust_type: &'static str,
    /// The source's version of the same event type (lower than the target's).
    pub version: u32,
}

/// One event type at one version, as compiled.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CatalogEntry {
    /// The aggregate type, e.g. `"order"`.
    pub aggregate_type: &'static str,
    /// The event type, e.g. `"OrderCreated"`.
    pub event_type: &'static str,
    /// The version this Rust type writes (and the newest it reads).
    pub version: u32,
    /// The topic the event names, if any.
    pub topic: Option<&'static str>,
    /// The Rust type path (for an enum, the enum's), e.g. `my_app::events::OrderCreated`.
    pub rust_type: &'static str,
    /// Where older versions are upcast from, if anywhere.
    pub upcast_from: Option<UpcastSource>,
    /// The JSON Schema of the payload (for an enum variant, of that variant's payload),
    /// following serde's attributes; `None` without the `schema` feature or when the type
    /// does not implement `schemars::JsonSchema`.
    pub schema: Option<Value>,
}

impl CatalogEntry {
    /// `aggregate/EventType vN`, as messages name an event version.
    pub fn name(&self) -> String {
        version_name(self.aggregate_type, self.event_type, self.version)
    }
}

/// `aggregate/EventType vN`: how messages (and schema snapshots) name an event version.
pub(crate) fn version_name(aggregate_type: &str, event_type: &str, version: u32) -> String {
    format!("{aggregate_type}/{event_type} v{version}")
}

/// Every event type of a program, sorted by aggregate, event type and version.
///
/// ```
/// # use outbox_core as outbox;
/// use outbox_core::{OutboxEvent, catalog::Catalog};
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderCreated")]
/// struct OrderCreatedV1 { #[outbox(aggregate_id)] order_id: u64 }
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order", version = 2, upcast_from = OrderCreatedV1)]
/// struct OrderCreated { #[outbox(aggregate_id)] order_id: u64, note: Option<String> }
///
/// impl From<OrderCreatedV1> for OrderCreated {
///     fn from(v1: OrderCreatedV1) -> Self { OrderCreated { order_id: v1.order_id, note: None } }
/// }
///
/// // `Catalog::linked()` has every event type of the program; this example builds its own.
/// let catalog = Catalog::builder().event::<OrderCreatedV1>().event::<OrderCreated>().build()?;
/// let v2 = catalog.get("order", "OrderCreated", 2).unwrap();
/// assert!(v2.rust_type.ends_with("::OrderCreated"));
/// assert_eq!(v2.upcast_from.as_ref().unwrap().version, 1);
/// assert_eq!(catalog.current("order", "OrderCreated").unwrap().version, 2);
/// # Ok::<(), outbox_core::catalog::CatalogError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    entries: Vec<CatalogEntry>,
}

impl Catalog {
    /// The catalog of every event type linked into this program, built (and checked) the
    /// first time it is asked for. Generic event types are not in it (a generic type has no
    /// single schema); use [`Catalog::builder`] for them.
    pub fn linked() -> Result<&'static Catalog, CatalogError> {
        static LINKED: OnceLock<Result<Catalog, CatalogError>> = OnceLock::new();
        LINKED
            .get_or_init(|| Catalog::from_registrations(REGISTRATIONS.iter().map(|f| f())))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// A catalog of the types given to the builder only.
    ///
    /// ```
    /// # use outbox_core as outbox;
    /// use outbox_core::{OutboxEvent, catalog::Catalog};
    /// mod a {
    ///     # use outbox_core as outbox;
    ///     #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    ///     #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderCreated")]
    ///     pub struct OrderCreated { #[outbox(aggregate_id)] pub id: u64 }
    /// }
    /// mod b {
    ///     # use outbox_core as outbox;
    ///     #[derive(serde::Serialize, outbox_core::OutboxEvent)]
    ///     #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderCreated")]
    ///     pub struct Created { #[outbox(aggregate_id)] pub id: u64 }
    /// }
    /// let err = Catalog::builder().event::<a::OrderCreated>().event::<b::Created>().build().unwrap_err();
    /// let msg = err.to_string();
    /// assert!(msg.starts_with("event `order/OrderCreated` v1 is declared by two types"), "{msg}");
    /// assert!(msg.contains("a::OrderCreated` and `") && msg.contains("b::Created`"), "{msg}");
    /// ```
    pub fn builder() -> CatalogBuilder {
        CatalogBuilder {
            registrations: Vec::new(),
        }
    }

    fn from_registrations(
        registrations: impl IntoIterator<Item = Registration>,
    ) -> Result<Catalog, CatalogError> {
        let mut by_key: BTreeMap<(&str, &str, u32), Vec<CatalogEntry>> = BTreeMap::new();
        for reg in registrations {
            for (index, t) in reg.event_types.iter().enumerate() {
                let entry = entry_of(&reg, index, t);
                let same = by_key
                    .entry((t.aggregate_type, t.event_type, t.version))
                    .or_default();
                // The same type registered twice (listed twice, or linked and listed) is one.
                if !same.iter().any(|e| e.rust_type == entry.rust_type) {
                    same.push(entry);
                }
            }
        }
        let mut conflicts = Vec::new();
        let mut entries = Vec::new();
        for (_, mut same) in by_key {
            same.sort_by_key(|e| e.rust_type);
            for other in &same[1..] {
                conflicts.push(Conflict {
                    aggregate_type: same[0].aggregate_type,
                    event_type: same[0].event_type,
                    version: same[0].version,
                    first: same[0].rust_type,
                    second: other.rust_type,
                });
            }
            entries.push(same.swap_remove(0));
        }
        if conflicts.is_empty() {
            Ok(Catalog { entries })
        } else {
            Err(CatalogError { conflicts })
        }
    }

    /// Every event version, sorted by aggregate, event type and version.
    pub fn entries(&self) -> &[CatalogEntry] {
        &self.entries
    }

    /// One event version.
    pub fn get(
        &self,
        aggregate_type: &str,
        event_type: &str,
        version: u32,
    ) -> Option<&CatalogEntry> {
        find_version(&self.entries, aggregate_type, event_type, version)
    }

    /// The newest compiled version of an event type.
    pub fn current(&self, aggregate_type: &str, event_type: &str) -> Option<&CatalogEntry> {
        self.entries
            .iter()
            .filter(|e| e.aggregate_type == aggregate_type && e.event_type == event_type)
            .max_by_key(|e| e.version)
    }
}

/// An entry of a list of event versions: the [`Catalog`]'s or a schema snapshot's.
pub(crate) trait VersionKey {
    /// Its aggregate type, event type and version.
    fn version_key(&self) -> (&str, &str, u32);
}

impl VersionKey for CatalogEntry {
    fn version_key(&self) -> (&str, &str, u32) {
        (self.aggregate_type, self.event_type, self.version)
    }
}

/// The entry of `entries` for one event version.
pub(crate) fn find_version<'a, T: VersionKey>(
    entries: &'a [T],
    aggregate_type: &str,
    event_type: &str,
    version: u32,
) -> Option<&'a T> {
    entries
        .iter()
        .find(|e| e.version_key() == (aggregate_type, event_type, version))
}

fn entry_of(reg: &Registration, index: usize, t: &EventType) -> CatalogEntry {
    let upcast_from = reg
        .upcasts
        .iter()
        .find(|u| u.event_type == t.event_type)
        .map(|u| UpcastSource {
            rust_type: u.source_type,
            version: u.source_version,
        });
    let schema = reg.schema.as_ref().map(|s| {
        if reg.is_enum {
            variant_schema(s, index, reg.event_types.len(), reg.externally_tagged)
        } else {
            s.clone()
        }
    });
    CatalogEntry {
        aggregate_type: t.aggregate_type,
        event_type: t.event_type,
        version: t.version,
        topic: t.topic,
        rust_type: reg.rust_type,
        upcast_from,
        schema,
    }
}

/// The schema of variant `index` of an enum's schema: schemars describes an enum (externally,
/// internally or adjacently tagged, or untagged) as `oneOf`/`anyOf` with one alternative per
/// variant, in declaration order. The root's `$defs` go along, so that references resolve.
/// An externally tagged variant's alternative is an object whose one property, named after
/// the variant, holds its content: the schema is that content's, as the payload on the wire
/// is (see [`OutboxEvent`]). When the shape is not that (e.g. a variant is `#[serde(skip)]`),
/// the whole enum's schema stands for each variant: a change then shows on every variant,
/// never on none.
fn variant_schema(schema: &Value, index: usize, count: usize, externally_tagged: bool) -> Value {
    let alternatives = ["oneOf", "anyOf"]
        .iter()
        .find_map(|k| schema.get(*k).and_then(Value::as_array))
        .filter(|alts| alts.len() == count);
    let Some(alternatives) = alternatives else {
        return schema.clone();
    };
    let mut variant = alternatives[index].clone();
    if externally_tagged
        && let Some(props) = variant.get("properties").and_then(Value::as_object)
        && let [(_, content)] = props.iter().collect::<Vec<_>>().as_slice()
    {
        variant = (*content).clone();
    }
    if let (Some(defs), Some(obj)) = (schema.get("$defs"), variant.as_object_mut()) {
        obj.insert("$defs".to_owned(), defs.clone());
    }
    variant
}

/// Builds a [`Catalog`] from an explicit list of types ([`Catalog::builder`]).
pub struct CatalogBuilder {
    registrations: Vec<Registration>,
}

impl CatalogBuilder {
    /// Adds every event type `E` carries.
    pub fn event<E: OutboxEvent>(mut self) -> Self {
        self.registrations.push(E::__outbox_registration());
        self
    }

    /// The catalog, or every conflict between the types given.
    pub fn build(self) -> Result<Catalog, CatalogError> {
        Catalog::from_registrations(self.registrations)
    }
}

/// Two Rust types declare the same event version.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Conflict {
    /// The aggregate type both declare.
    pub aggregate_type: &'static str,
    /// The event type both declare.
    pub event_type: &'static str,
    /// The version both declare.
    pub version: u32,
    /// One type (the first by path).
    pub first: &'static str,
    /// The other.
    pub second: &'static str,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event `{}/{}` v{} is declared by two types, `{}` and `{}`: a consumer could not \
             tell which one a message is; give one of them another event type or version",
            self.aggregate_type, self.event_type, self.version, self.first, self.second
        )
    }
}

/// The catalog could not be built: some event versions are declared by more than one type.
/// Its message has one line per conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CatalogError {
    /// Every conflict, sorted by event.
    pub conflicts: Vec<Conflict>,
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.conflicts.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CatalogError {}
