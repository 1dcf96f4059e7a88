//! Event schemas across releases (feature `schema`): a committed [`Snapshot`] of every event
//! version's JSON Schema, and a [`check`] of the compiled catalog against it under a
//! compatibility [`Mode`], failing with one line per breaking change.
//!
//! Each event version's schema comes from `schemars::JsonSchema` (derive it next to
//! `Serialize`/`Deserialize`: it follows the same `#[serde(...)]` attributes, so renames, skips,
//! defaults and enum tagging are what the payload is). In a test:
//!
//! ```no_run
//! #[test]
//! fn events_are_compatible() {
//!     outbox_core::schema::assert_compatible("events.schema.json");
//! }
//! ```
//!
//! `OUTBOX_SCHEMA_UPDATE=1 cargo test` accepts compatible changes (and creates the file);
//! `OUTBOX_SCHEMA_MODE=full` picks another mode. From the command line, a two-line
//! `src/bin/schema.rs` calling [`main`] gives `cargo run --bin schema -- dump|check`.
//!
//! # The rules
//!
//! - A version in the snapshot keeps its shape: changing it is breaking (bump the version).
//! - The newest version never goes down.
//! - A new version (or a changed upcast source) must be compatible with the older versions
//!   under the mode: BACKWARD (default) asks that the new type decodes payloads of the last
//!   older version, FORWARD that the last older type decodes the new payloads, FULL both, and the
//!   `_TRANSITIVE` forms the same against every older version in the snapshot. An older version
//!   the type upcasts from is decoded as that version's own type (`upcast_from`), so its
//!   payloads need not decode as the new type.
//! - An event type that is no longer compiled is breaking under BACKWARD and FULL (its events
//!   may still be in topics); `dump` accepts it.

mod compat;
mod main;
mod normalize;
mod snapshot;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

pub use main::{CheckOutcome, assert_compatible, check_catalog, check_file, dump, main};
pub use snapshot::{Snapshot, SnapshotEntry, SnapshotFormatError};

use crate::catalog::CatalogError;
use compat::Dir;

/// Which readers must decode which payloads (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Only the version rules (same version, same shape; versions never go down).
    None,
    /// The new type decodes the payloads of the last older version (consumers upgrade first).
    #[default]
    Backward,
    /// The new type decodes the payloads of every older version in the snapshot.
    BackwardTransitive,
    /// The last older type decodes the new payloads (producers upgrade first; for readers that
    /// decode by payload: outbox's own `Envelope` refuses a version newer than it knows).
    Forward,
    /// Every older type in the snapshot decodes the new payloads.
    ForwardTransitive,
    /// Backward and forward against the last older version.
    Full,
    /// Backward and forward against every older version.
    FullTransitive,
}

impl Mode {
    fn backward(self) -> bool {
        matches!(
            self,
            Mode::Backward | Mode::BackwardTransitive | Mode::Full | Mode::FullTransitive
        )
    }
    fn forward(self) -> bool {
        matches!(
            self,
            Mode::Forward | Mode::ForwardTransitive | Mode::Full | Mode::FullTransitive
        )
    }
    fn transitive(self) -> bool {
        matches!(
            self,
            Mode::BackwardTransitive | Mode::ForwardTransitive | Mode::FullTransitive
        )
    }
}

impl FromStr for Mode {
    type Err = String;

    /// `backward`, `forward_transitive`, `FULL`, … (case and `-`/`_` do not matter).
    fn from_str(s: &str) -> Result<Mode, String> {
        Ok(match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "none" => Mode::None,
            "backward" => Mode::Backward,
            "backward_transitive" => Mode::BackwardTransitive,
            "forward" => Mode::Forward,
            "forward_transitive" => Mode::ForwardTransitive,
            "full" => Mode::Full,
            "full_transitive" => Mode::FullTransitive,
            _ => {
                return Err(format!(
                    "unknown compatibility mode `{s}`, expected one of none, backward, \
                     backward_transitive, forward, forward_transitive, full, full_transitive"
                ));
            }
        })
    }
}

/// One line of a check: an event version and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// `aggregate/EventType vN`.
    pub event: String,
    /// What changed.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.event, self.message)
    }
}

/// What [`check`] found: the breaking changes (the check fails if there is any) and the
/// compatible ones (accepted by `--update`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Report {
    /// One line per breaking change.
    pub breaking: Vec<Finding>,
    /// One line per compatible change (a new event type, a new compatible version).
    pub compatible: Vec<Finding>,
}

impl Report {
    /// Whether nothing is breaking.
    pub fn is_compatible(&self) -> bool {
        self.breaking.is_empty()
    }
}

/// Compares the `compiled` snapshot (`Snapshot::of(catalog)`) with the committed one under
/// `mode`.
pub fn check(committed: &Snapshot, compiled: &Snapshot, mode: Mode) -> Report {
    let mut report = Report::default();
    let mut breaking = |event: String, message: String| {
        report.breaking.push(Finding { event, message });
    };
    let entries = compiled.entries();
    let mut i = 0;
    let mut compatible = Vec::new();
    while i < entries.len() {
        let group: Vec<&SnapshotEntry> = entries[i..]
            .iter()
            .take_while(|e| e.same_event(&entries[i]))
            .collect();
        i += group.len();
        let current = *group.last().expect("a group has an entry");
        let older: Vec<&SnapshotEntry> = committed
            .entries()
            .iter()
            .filter(|e| e.same_event(current))
            .collect();
        for e in &group {
            if e.schema.is_none() {
                breaking(
                    e.name(),
                    format!(
                        "no JSON Schema: derive `schemars::JsonSchema` for `{}` (with the \
                         `schema` feature on)",
                        e.rust_type
                    ),
                );
            }
        }
        if older.is_empty() {
            compatible.push(Finding {
                event: current.name(),
                message: "new event type".into(),
            });
            continue;
        }
        let newest = older.iter().map(|e| e.version).max().unwrap_or(0);
        if newest > current.version {
            breaking(
                current.name(),
                format!(
                    "version went down from {newest} to {}: versions only go up",
                    current.version
                ),
            );
        }
        for e in &group {
            let Some(old) = older.iter().find(|o| o.version == e.version) else {
                continue;
            };
            let (Some(a), Some(b)) = (&old.schema, &e.schema) else {
                continue;
            };
            if a == b {
                continue;
            }
            let mut issues = compat::check(b, a, Dir::Backward);
            issues.extend(compat::check(a, b, Dir::Forward));
            if issues.is_empty() {
                issues.push(normalize::differences(a, b, 3).join(", "));
            }
            issues.dedup();
            for issue in issues {
                breaking(
                    e.name(),
                    format!("same version, different shape (bump the version): {issue}"),
                );
            }
        }
        if newest > current.version {
            continue;
        }
        let pinned = older.iter().find(|o| o.version == current.version);
        if pinned.is_some_and(|p| p.upcast_from == current.upcast_from) {
            continue;
        }
        let before: Vec<&&SnapshotEntry> = older
            .iter()
            .filter(|o| o.version < current.version)
            .collect();
        let targets: Vec<&&SnapshotEntry> = if mode.transitive() {
            before
        } else {
            before.into_iter().last().into_iter().collect()
        };
        let mut found = false;
        for old in targets {
            let Some(old_schema) = &old.schema else {
                continue;
            };
            if mode.backward() {
                let reader = reader_for(&group, current, old.version);
                if reader.version != old.version
                    && let Some(schema) = &reader.schema
                {
                    for issue in compat::check(schema, old_schema, Dir::Backward) {
                        found = true;
                        breaking(
                            current.name(),
                            format!("v{} payloads no longer decode: {issue}", old.version),
                        );
                    }
                }
            }
            if let (true, Some(schema)) = (mode.forward(), &current.schema) {
                for issue in compat::check(old_schema, schema, Dir::Forward) {
                    found = true;
                    breaking(
                        current.name(),
                        format!("v{} readers cannot decode it: {issue}", old.version),
                    );
                }
            }
        }
        if !found && pinned.is_none() {
            compatible.push(Finding {
                event: current.name(),
                message: format!("new version, compatible under {mode:?} (was v{newest})"),
            });
        }
    }
    if mode.backward() {
        for old in committed.entries() {
            let gone = !entries.iter().any(|e| e.same_event(old));
            let newest = committed.entries().iter().rfind(|e| e.same_event(old));
            if gone && newest == Some(old) {
                breaking(
                    old.name(),
                    "event type no longer compiled: its events in topics and outboxes would not \
                     decode (`dump` accepts the removal)"
                        .to_owned(),
                );
            }
        }
    }
    report.compatible = compatible;
    report.breaking.sort_by(|a, b| a.event.cmp(&b.event));
    report
}

/// The type that decodes payloads of `version`: following the current type's upcast chain,
/// the oldest type whose version is at least `version`.
fn reader_for<'a>(
    group: &[&'a SnapshotEntry],
    current: &'a SnapshotEntry,
    version: u32,
) -> &'a SnapshotEntry {
    let mut reader = current;
    while let Some(source) = reader.upcast_from {
        match group.iter().find(|e| e.version == source) {
            Some(next) if version <= source => reader = next,
            _ => break,
        }
    }
    reader
}

/// Why a schema command could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum SchemaError {
    /// The snapshot file could not be read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The snapshot file is not a snapshot.
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The catalog has conflicting event types.
    Catalog(CatalogError),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            SchemaError::Invalid { path, reason } => {
                write!(
                    f,
                    "{}: not an outbox schema snapshot: {reason}",
                    path.display()
                )
            }
            SchemaError::Catalog(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SchemaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SchemaError::Io { source, .. } => Some(source),
            SchemaError::Catalog(e) => Some(e),
            SchemaError::Invalid { .. } => None,
        }
    }
}
