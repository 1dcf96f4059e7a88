//! The ways users run the check: [`assert_compatible`] in a test, [`main`] in a binary of
//! their own, [`check_file`] from any code. The `outbox` command-line tool cannot do it: the
//! catalog is what the linker gathered from the program's own event types, and only a program
//! compiled with them has it.

use std::path::Path;
use std::process::ExitCode;

use super::{Mode, Report, SchemaError, Snapshot, check};
use crate::catalog::Catalog;

/// What [`check_file`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckOutcome {
    /// The breaking and the compatible changes.
    pub report: Report,
    /// Whether the file already matches the compiled catalog (with its history).
    pub up_to_date: bool,
    /// Whether the file was written (`update` and compatible, or no file yet and `update`).
    pub written: bool,
}

/// Checks the linked catalog against the snapshot at `path` under `mode`; with `update`, writes
/// the compiled catalog (keeping the older versions the file has) when nothing is breaking.
/// A missing file counts as empty.
pub fn check_file(
    path: impl AsRef<Path>,
    mode: Mode,
    update: bool,
) -> Result<CheckOutcome, SchemaError> {
    let catalog = Catalog::linked().map_err(SchemaError::Catalog)?;
    check_catalog(catalog, path.as_ref(), mode, update)
}

/// [`check_file`] with a catalog of one's own (e.g. [`Catalog::builder`]'s, where the linked
/// one is not wanted).
pub fn check_catalog(
    catalog: &Catalog,
    path: &Path,
    mode: Mode,
    update: bool,
) -> Result<CheckOutcome, SchemaError> {
    let compiled = Snapshot::of(catalog);
    let committed = Snapshot::read(path)?;
    let history = committed.clone().unwrap_or_default();
    let report = check(&history, &compiled, mode);
    let next = compiled.with_history(&history);
    let up_to_date = committed.as_ref() == Some(&next);
    let written = update && report.is_compatible() && !up_to_date;
    if written {
        next.write(path)?;
    }
    Ok(CheckOutcome {
        report,
        up_to_date,
        written,
    })
}

/// Writes the snapshot of the linked catalog to `path`, keeping the older versions the file
/// already has of the event types still compiled. Unlike `check --update` it accepts breaking
/// changes: it is how a deliberate break (or the first snapshot) is recorded.
pub fn dump(path: impl AsRef<Path>) -> Result<Snapshot, SchemaError> {
    let catalog = Catalog::linked().map_err(SchemaError::Catalog)?;
    let path = path.as_ref();
    let history = Snapshot::read(path)?.unwrap_or_default();
    let next = Snapshot::of(catalog).with_history(&history);
    next.write(path)?;
    Ok(next)
}

/// A test that fails when the compiled events are not compatible with the snapshot at `path`
/// (relative to the package, where `cargo test` runs), one line per breaking change.
///
/// The mode is `OUTBOX_SCHEMA_MODE` (default `backward`). With `OUTBOX_SCHEMA_UPDATE=1` a
/// compatible change is written to the file (to commit with the code); without it, the test
/// also fails when the file is not up to date, so that the committed snapshot follows the code.
///
/// # Panics
///
/// That is its job: on a breaking change, an outdated or missing file, a conflict in the
/// catalog, or an unreadable file.
pub fn assert_compatible(path: impl AsRef<Path>) {
    let path = path.as_ref();
    let mode = match std::env::var("OUTBOX_SCHEMA_MODE") {
        Ok(m) => m
            .parse()
            .unwrap_or_else(|e: String| panic!("OUTBOX_SCHEMA_MODE: {e}")),
        Err(_) => Mode::Backward,
    };
    let update = std::env::var("OUTBOX_SCHEMA_UPDATE").is_ok_and(|v| v == "1" || v == "true");
    let outcome = check_file(path, mode, update).unwrap_or_else(|e| panic!("{e}"));
    let file = path.display();
    if !outcome.report.is_compatible() {
        let lines: Vec<String> = outcome
            .report
            .breaking
            .iter()
            .map(ToString::to_string)
            .collect();
        panic!(
            "{} breaking change(s) against {file} ({mode:?}):\n{}\n(a deliberate break is \
             recorded with `outbox::schema::dump`, e.g. `cargo run --bin schema -- dump`)",
            lines.len(),
            lines.join("\n")
        );
    }
    if !outcome.up_to_date && !outcome.written {
        let lines: Vec<String> = outcome
            .report
            .compatible
            .iter()
            .map(ToString::to_string)
            .collect();
        panic!(
            "{file} is not up to date with the compiled events ({}): accept with \
             `OUTBOX_SCHEMA_UPDATE=1 cargo test`",
            if lines.is_empty() {
                "schemas changed".to_owned()
            } else {
                lines.join("; ")
            }
        );
    }
}

/// The command line of a user's own binary, e.g. `src/bin/schema.rs`:
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     outbox_core::schema::main()
/// }
/// ```
///
/// `schema dump [FILE]` writes the snapshot (default `events.schema.json`); `schema check
/// [FILE] [--mode MODE] [--update]` checks it, printing one line per breaking change and
/// exiting with 1 when there is any; `schema list` prints the catalog.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

const USAGE: &str =
    "usage: schema dump [FILE] | schema check [FILE] [--mode MODE] [--update] | schema list";

fn run(args: &[String]) -> Result<ExitCode, String> {
    let (command, rest) = args.split_first().ok_or(USAGE)?;
    let mut file = "events.schema.json".to_owned();
    let mut mode = Mode::Backward;
    let mut update = false;
    let mut iter = rest.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--update" => update = true,
            "--mode" => {
                let value = iter
                    .next()
                    .ok_or("`--mode` needs a value, e.g. `--mode full`")?;
                mode = value.parse()?;
            }
            other if other.starts_with("--mode=") => mode = other["--mode=".len()..].parse()?,
            other if other.starts_with('-') => {
                return Err(format!("unknown flag `{other}`; {USAGE}"));
            }
            other => file = other.to_owned(),
        }
    }
    match command.as_str() {
        "dump" => {
            let snapshot = dump(&file).map_err(|e| e.to_string())?;
            println!(
                "wrote {} event version(s) to {file}",
                snapshot.entries().len()
            );
            Ok(ExitCode::SUCCESS)
        }
        "check" => {
            let outcome = check_file(&file, mode, update).map_err(|e| e.to_string())?;
            for finding in &outcome.report.breaking {
                println!("breaking: {finding}");
            }
            for finding in &outcome.report.compatible {
                println!("compatible: {finding}");
            }
            if !outcome.report.is_compatible() {
                return Ok(ExitCode::FAILURE);
            }
            if outcome.written {
                println!("updated {file}");
            } else if !outcome.up_to_date {
                println!("{file} is not up to date: run `check --update` to accept");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        "list" => {
            let catalog = Catalog::linked().map_err(|e| e.to_string())?;
            for e in catalog.entries() {
                let schema = if e.schema.is_some() {
                    ""
                } else {
                    " (no schema)"
                };
                println!("{}\t{}{schema}", e.name(), e.rust_type);
            }
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!("unknown command `{other}`; {USAGE}")),
    }
}
