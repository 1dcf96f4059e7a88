//! The fault suite: real services, the real `outbox relay` binary, a real Kafka consumer
//! reading back, and figures for docs/RELIABILITY.md.
//!
//! Each scenario breaks one thing the way production breaks it (a relay SIGKILLed every 2 s
//! while writers run, a broker refusing connections or black-holed for a minute, a consumer's
//! database gone for 20 s, PostgreSQL restarted, relays' sessions terminated, writers starved
//! of pool connections), then counts what arrived against what was committed.
//!
//! - `OUTBOX_CHAOS=full`: the full sizes (100,000 events, 60 s outages); default: the short
//!   form, which runs in the project's test command.
//! - `OUTBOX_CHAOS_REPORT=<file.jsonl>`: each scenario appends its figures as a JSON line;
//!   `scripts/chaos.sh` renders docs/RELIABILITY.md from them ([`render`]).
//!
//! Every form asserts the promises that must hold whatever breaks: nothing committed is lost,
//! nothing rolled back is published (phantom), and each aggregate's events arrive in commit
//! order. The reliability targets (no dead letters from an outage, takeover in seconds) are
//! measured, reported and asserted (timing targets in the full form only).

mod broker;
pub mod brokers;
mod consumer_db;
mod database;
pub mod proxy;
mod reader;
pub mod render;
pub mod services;
mod storm;
mod tally;
pub mod writers;

use std::fmt::Write as _;
use std::io::Write as _;

pub use tally::Tally;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    Relay,
    Consumer,
}

/// Short (the test command) or full (`OUTBOX_CHAOS=full`).
pub fn full() -> bool {
    std::env::var("OUTBOX_CHAOS").is_ok_and(|v| v == "full")
}

/// `short` in the short form, `full` in the full one.
pub fn size<T>(short: T, full_size: T) -> T {
    if full() { full_size } else { short }
}

/// One target of a scenario: what it promises, what was measured, whether it was met.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Target {
    pub what: String,
    pub measured: String,
    pub met: bool,
    /// Timing targets are asserted in the full form only (the short form is too small and
    /// the test machine too shared for a fair figure).
    pub full_only: bool,
}

/// A scenario's figures: one line of the report.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub scenario: String,
    pub title: String,
    pub form: String,
    pub started_at: String,
    pub seconds: f64,
    pub tally: Tally,
    /// Time to recover, seconds: from the fault's end to delivery caught up (see `recover_means`).
    pub recover_s: Option<f64>,
    pub recover_means: String,
    /// Scenario-specific figures, in order.
    pub figures: Vec<(String, String)>,
    pub targets: Vec<Target>,
    /// Verbatim output worth keeping (e.g. `outbox status` during an outage).
    pub captures: Vec<(String, String)>,
    pub area: String,
    /// The code measured: the commit, and `OUTBOX_CHAOS_LABEL` (e.g. "before the fixes").
    pub code: String,
}

impl Row {
    pub fn new(scenario: &str, title: &str, area: Area) -> Row {
        Row {
            scenario: scenario.into(),
            title: title.into(),
            form: if full() { "full" } else { "short" }.into(),
            started_at: chrono::Utc::now()
                .format("%Y-%m-%d %H:%M:%S UTC")
                .to_string(),
            area: format!("{area:?}"),
            code: code(),
            ..Row::default()
        }
    }

    pub fn figure(&mut self, name: &str, value: impl std::fmt::Display) {
        self.figures.push((name.into(), value.to_string()));
    }

    pub fn target(&mut self, what: &str, measured: impl std::fmt::Display, met: bool) {
        self.targets.push(Target {
            what: what.into(),
            measured: measured.to_string(),
            met,
            full_only: false,
        });
    }

    /// The target every scenario has, from [`Row::tally`]: nothing lost, nothing phantom,
    /// nothing out of order.
    pub fn target_intact(&mut self) {
        let t = &self.tally;
        let measured = format!(
            "{} lost, {} phantom, {} out of order",
            t.lost, t.phantom, t.out_of_order
        );
        let met = t.lost == 0 && t.phantom == 0 && t.out_of_order == 0;
        self.target("0 lost, 0 phantom, 0 out of order", measured, met);
    }

    /// A timing target: reported always, asserted in the full form only.
    pub fn timing_target(&mut self, what: &str, measured: impl std::fmt::Display, met: bool) {
        self.target(what, measured, met);
        self.targets.last_mut().unwrap().full_only = true;
    }

    /// Appends the row to `OUTBOX_CHAOS_REPORT`, prints it, then asserts: the promises that
    /// must always hold, then the targets (timing ones in the full form only).
    pub fn finish(mut self, started: std::time::Instant) {
        self.seconds = started.elapsed().as_secs_f64();
        let line = serde_json::to_string(&self).unwrap();
        if let Ok(path) = std::env::var("OUTBOX_CHAOS_REPORT") {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("OUTBOX_CHAOS_REPORT={path}: {e}"));
            writeln!(f, "{line}").unwrap();
        }
        eprintln!("{}", self.summary());
        let t = &self.tally;
        assert_eq!(
            t.lost,
            0,
            "{}: committed events lost\n{}",
            self.scenario,
            self.summary()
        );
        assert_eq!(
            t.phantom,
            0,
            "{}: rolled-back events published\n{}",
            self.scenario,
            self.summary()
        );
        assert_eq!(
            t.out_of_order,
            0,
            "{}: an aggregate's events out of order\n{}",
            self.scenario,
            self.summary()
        );
        let missed: Vec<&Target> = self
            .targets
            .iter()
            .filter(|t| !t.met && (full() || !t.full_only))
            .collect();
        assert!(
            missed.is_empty(),
            "{}: targets missed: {missed:#?}",
            self.scenario
        );
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "chaos {} ({}, {:.0} s): {}",
            self.scenario,
            self.form,
            self.seconds,
            self.tally.line()
        );
        if let Some(r) = self.recover_s {
            let _ = write!(s, ", recovered in {r:.1} s");
        }
        for (k, v) in &self.figures {
            let _ = write!(s, "\n  {k}: {v}");
        }
        for t in &self.targets {
            let _ = write!(
                s,
                "\n  target {}: {} ({})",
                t.what,
                t.measured,
                if t.met { "met" } else { "MISSED" }
            );
        }
        for (k, v) in &self.captures {
            let _ = write!(s, "\n  {k}:\n    {}", v.replace('\n', "\n    "));
        }
        s
    }
}

/// The commit checked out (and whether the work tree differs), with `OUTBOX_CHAOS_LABEL`.
fn code() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let mut code = git(&["rev-parse", "--short", "HEAD"]);
    if !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        code.push_str(" with uncommitted changes");
    }
    if let Ok(label) = std::env::var("OUTBOX_CHAOS_LABEL") {
        let _ = write!(code, ", {label}");
    }
    code
}

/// Milliseconds as seconds with two decimals.
pub fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

/// The `q`-quantile (0..=1) of `v` (sorted here), or `None` when empty.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    Some(v[i])
}
