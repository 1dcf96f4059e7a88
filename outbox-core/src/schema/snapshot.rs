//! The snapshot file: every event version with its normalized JSON Schema, sorted, pretty
//! printed, so that a change to an event shows in review as a small diff.

use std::fmt;
use std::path::Path;

use serde_json::{Map, Value, json};

use super::SchemaError;
use super::normalize::normalize;
use crate::catalog::{Catalog, VersionKey, find_version};

/// The format of the file, written in its `format` key.
const FORMAT: u64 = 1;

/// One event version in a snapshot.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SnapshotEntry {
    /// The aggregate type.
    pub aggregate_type: String,
    /// The event type.
    pub event_type: String,
    /// The version.
    pub version: u32,
    /// The Rust type that declared it (informative: renaming the type changes nothing).
    pub rust_type: String,
    /// The version older versions are upcast from, if any.
    pub upcast_from: Option<u32>,
    /// The normalized JSON Schema; `None` when the type had none.
    pub schema: Option<Value>,
}

impl VersionKey for SnapshotEntry {
    fn version_key(&self) -> (&str, &str, u32) {
        (&self.aggregate_type, &self.event_type, self.version)
    }
}

impl SnapshotEntry {
    /// `aggregate/EventType vN`.
    pub fn name(&self) -> String {
        crate::catalog::version_name(&self.aggregate_type, &self.event_type, self.version)
    }

    pub(crate) fn same_event(&self, other: &SnapshotEntry) -> bool {
        self.aggregate_type == other.aggregate_type && self.event_type == other.event_type
    }
}

/// The event versions of a program at one time: what `dump` writes and `check` compares with.
///
/// ```
/// # use outbox_core as outbox;
/// use outbox_core::{OutboxEvent, catalog::Catalog, schema::Snapshot};
/// #[derive(serde::Serialize, schemars::JsonSchema, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "cart")]
/// struct CartEmptied { #[outbox(aggregate_id)] cart_id: u32 }
///
/// let catalog = Catalog::builder().event::<CartEmptied>().build()?;
/// let text = Snapshot::of(&catalog).to_json();
/// assert!(text.contains(r#""event_type": "CartEmptied""#), "{text}");
/// assert_eq!(Snapshot::parse(&text)?, Snapshot::of(&catalog));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    entries: Vec<SnapshotEntry>,
}

impl Snapshot {
    /// The snapshot of a catalog.
    pub fn of(catalog: &Catalog) -> Snapshot {
        let entries = catalog
            .entries()
            .iter()
            .map(|e| SnapshotEntry {
                aggregate_type: e.aggregate_type.to_owned(),
                event_type: e.event_type.to_owned(),
                version: e.version,
                rust_type: e.rust_type.to_owned(),
                upcast_from: e.upcast_from.as_ref().map(|u| u.version),
                schema: e.schema.as_ref().map(normalize),
            })
            .collect();
        Snapshot::from_entries(entries)
    }

    pub(crate) fn from_entries(mut entries: Vec<SnapshotEntry>) -> Snapshot {
        entries.sort_by(|a, b| {
            (&a.aggregate_type, &a.event_type, a.version).cmp(&(
                &b.aggregate_type,
                &b.event_type,
                b.version,
            ))
        });
        Snapshot { entries }
    }

    /// Every event version, sorted by aggregate, event type and version.
    pub fn entries(&self) -> &[SnapshotEntry] {
        &self.entries
    }

    /// One event version.
    pub fn get(
        &self,
        aggregate_type: &str,
        event_type: &str,
        version: u32,
    ) -> Option<&SnapshotEntry> {
        find_version(&self.entries, aggregate_type, event_type, version)
    }

    /// This snapshot (the compiled one) with the older versions `history` has of the event
    /// types compiled now: what `--update` writes. Event types no longer compiled are dropped.
    pub fn with_history(&self, history: &Snapshot) -> Snapshot {
        let mut entries = self.entries.clone();
        for old in &history.entries {
            let compiled = self.entries.iter().any(|e| e.same_event(old));
            let present = self
                .get(&old.aggregate_type, &old.event_type, old.version)
                .is_some();
            if compiled && !present {
                entries.push(old.clone());
            }
        }
        Snapshot::from_entries(entries)
    }

    /// The file's text: pretty JSON, keys sorted, a newline at the end.
    pub fn to_json(&self) -> String {
        let events: Vec<Value> = self
            .entries
            .iter()
            .map(|e| {
                json!({
                    "aggregate": e.aggregate_type,
                    "event_type": e.event_type,
                    "version": e.version,
                    "rust_type": e.rust_type,
                    "upcast_from": e.upcast_from,
                    "schema": e.schema,
                })
            })
            .collect();
        let doc = json!({ "format": FORMAT, "events": events });
        let mut text = serde_json::to_string_pretty(&doc).expect("a JSON value serializes");
        text.push('\n');
        text
    }

    /// Reads a snapshot from its text.
    pub fn parse(text: &str) -> Result<Snapshot, SnapshotFormatError> {
        let bad = |reason: String| SnapshotFormatError { reason };
        let doc: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        match doc.get("format").and_then(Value::as_u64) {
            Some(FORMAT) => {}
            other => {
                return Err(bad(format!(
                    "unknown `format` {other:?}, expected {FORMAT}"
                )));
            }
        }
        let events = doc
            .get("events")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no `events` list".to_owned()))?;
        let mut entries = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let obj: &Map<String, Value> = e
                .as_object()
                .ok_or_else(|| bad(format!("event {i} is not an object")))?;
            let text = |k: &str| {
                obj.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| bad(format!("event {i} has no string `{k}`")))
            };
            let number = |k: &str| -> Result<Option<u32>, SnapshotFormatError> {
                match obj.get(k) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| *n >= 1)
                        .map(Some)
                        .ok_or_else(|| bad(format!("event {i}: `{k}` is not a version: {v}"))),
                }
            };
            entries.push(SnapshotEntry {
                aggregate_type: text("aggregate")?,
                event_type: text("event_type")?,
                version: number("version")?
                    .ok_or_else(|| bad(format!("event {i} has no `version`")))?,
                rust_type: text("rust_type")?,
                upcast_from: number("upcast_from")?,
                schema: obj.get("schema").filter(|s| !s.is_null()).cloned(),
            });
        }
        Ok(Snapshot::from_entries(entries))
    }

    /// Reads the snapshot file at `path`; `Ok(None)` when there is none.
    pub fn read(path: &Path) -> Result<Option<Snapshot>, SchemaError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Snapshot::parse(&text)
                .map(Some)
                .map_err(|e| SchemaError::Invalid {
                    path: path.to_owned(),
                    reason: e.reason,
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SchemaError::Io {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Writes the snapshot to `path`.
    pub fn write(&self, path: &Path) -> Result<(), SchemaError> {
        std::fs::write(path, self.to_json()).map_err(|source| SchemaError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

/// A snapshot's text is not a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotFormatError {
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for SnapshotFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an outbox schema snapshot: {}", self.reason)
    }
}

impl std::error::Error for SnapshotFormatError {}
