//! docs/RELIABILITY.md from the scenarios' JSON lines (`scripts/chaos.sh` runs this after the
//! scenarios). The newest row of each scenario is shown, with its form and date; the notes
//! below the marker are written by hand and kept when the tables are rewritten.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::Row;

pub const NOTES_MARKER: &str = "<!-- Notes below are written by hand; scripts/chaos.sh keeps them when it rewrites the figures above. -->";

/// The order scenarios appear in.
const ORDER: [&str; 8] = [
    "relay_sigkill_storm",
    "stream_relay_sigkill_storm",
    "broker_outage_refused",
    "broker_outage_black_hole",
    "consumer_database_outage",
    "postgres_restart_mid_drain",
    "killed_database_sessions",
    "writer_pool_exhaustion",
];

/// Where and how the figures were measured.
pub struct Setting {
    pub command: String,
    pub date: String,
    pub machine: String,
    pub postgres: String,
    pub commit: String,
    pub label: String,
}

/// The newest row of each scenario among `lines` (JSON lines, oldest first).
pub fn newest(lines: &str) -> Vec<Row> {
    let mut by: BTreeMap<String, Row> = BTreeMap::new();
    for line in lines.lines().filter(|l| !l.trim().is_empty()) {
        let row: Row =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("a report line: {e}: {line}"));
        by.insert(row.scenario.clone(), row);
    }
    let mut rows: Vec<Row> = by.into_values().collect();
    rows.sort_by_key(|r| {
        ORDER
            .iter()
            .position(|s| *s == r.scenario)
            .unwrap_or(ORDER.len())
    });
    rows
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The report; `old` is the current file, whose notes below [`NOTES_MARKER`] are kept.
pub fn render(rows: &[Row], setting: &Setting, old: Option<&str>) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Reliability\n");
    let _ = writeln!(
        md,
        "What the fault suite (tests/e2e/chaos) measured: real PostgreSQL, real brokers, the \
         real `outbox relay` binary, and each broker's own client reading everything back. \
         Kafka: Kafka-protocol brokers (noida-db; a private tansu behind a TCP proxy where the \
         broker is broken). NATS JetStream and RabbitMQ: the machine's servers, behind a TCP \
         proxy of the scenario's where the broker is broken (rows named after them).\n"
    );
    let _ = writeln!(
        md,
        "Command: `{}`  \nDate: {}  \nCode: {}{}  \nMachine: {}  \nPostgreSQL: {}  \n",
        setting.command,
        setting.date,
        setting.commit,
        if setting.label.is_empty() {
            String::new()
        } else {
            format!(" ({})", setting.label)
        },
        setting.machine,
        setting.postgres
    );
    let _ = writeln!(
        md,
        "The short form (the default) runs in the project's test command; the full form is \
         `OUTBOX_CHAOS=full`. Each scenario asserts in every form that nothing committed is \
         lost, nothing rolled back is published and every aggregate's events arrive in order; \
         the targets below are measured and asserted too (the timing ones in the full form only).\n"
    );
    let _ = writeln!(
        md,
        "- **written**: committed events (the rows of the outbox table; the suite never deletes them); \
         **delivered**: of those, read back at least once; **lost**: committed and neither \
         delivered, dead-lettered nor held behind a dead letter when the scenario ended; \
         **phantom**: delivered but rolled back (every tenth writer transaction is rolled back, \
         half of them after inserting their rows); **duplicated**: deliveries beyond the first; \
         **out of order**: per aggregate, an event first delivered after a later one; \
         **dead-lettered** (of which delivered anyway); **blocked**: pending behind a dead letter \
         of its aggregate.\n\
         - **commit → publish**: from the writer's clock when `COMMIT` returned to the \
         broker's time of the event's first delivery. Kafka: the record's CreateTime, set by \
         the relay's librdkafka producer when it sends the record (the brokers here do not \
         offer LogAppendTime); with a healthy broker the acknowledgement follows within \
         milliseconds. NATS: the time the stream stored the message. RabbitMQ (which stamps no \
         time of its own): the time a reader of a queue bound to the exchange received it, \
         the broker's queueing included. Same machine, same clock.\n"
    );
    let _ = writeln!(
        md,
        "| scenario | form | written | delivered | lost | phantom | duplicated | out of order | dead-lettered | blocked | recovery | targets met |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let t = &r.tally;
        let met = r.targets.iter().filter(|t| t.met).count();
        let _ = writeln!(
            md,
            "| [{}](#{}) | {} | {} | {} | {} | {} | {} | {} | {} ({} delivered) | {} | {} | {} of {} |",
            r.title,
            anchor(&r.title),
            r.form,
            t.written,
            t.delivered,
            t.lost,
            t.phantom,
            t.duplicated,
            t.out_of_order,
            t.dead_lettered,
            t.dead_but_delivered,
            t.blocked,
            r.recover_s.map_or("never".into(), |s| format!("{s:.1} s")),
            met,
            r.targets.len()
        );
    }
    for r in rows {
        let _ = writeln!(md, "\n## {}\n", r.title);
        let _ = writeln!(
            md,
            "Form: {}; run {}, {:.0} s; code {}; test `chaos_{}`.\n",
            r.form, r.started_at, r.seconds, r.code, r.scenario
        );
        let _ = writeln!(md, "| figure | value |\n|---|---|");
        let _ = writeln!(md, "| events | {} |", cell(&r.tally.line()));
        let _ = writeln!(
            md,
            "| recovery ({}) | {} |",
            cell(&r.recover_means),
            r.recover_s.map_or("never".into(), |s| format!("{s:.1} s"))
        );
        for (k, v) in &r.figures {
            let _ = writeln!(md, "| {} | {} |", cell(k), cell(v));
        }
        if !r.targets.is_empty() {
            let _ = writeln!(md, "\n| target | measured | met |\n|---|---|---|");
            for t in &r.targets {
                let _ = writeln!(
                    md,
                    "| {}{} | {} | {} |",
                    cell(&t.what),
                    if t.full_only { " (full form)" } else { "" },
                    cell(&t.measured),
                    if t.met { "yes" } else { "**no**" }
                );
            }
        }
        for (k, v) in &r.captures {
            let _ = writeln!(md, "\n{k}:\n\n```\n{v}\n```");
        }
    }
    md.push('\n');
    match old.and_then(|o| o.find(NOTES_MARKER).map(|at| &o[at..])) {
        Some(notes) => md.push_str(notes),
        None => {
            let _ = writeln!(md, "{NOTES_MARKER}");
        }
    }
    md
}

fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_default();
    format!("{cores} cores, {mem} memory (shared with other work: timings are indicative)")
}

fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Renders `OUTBOX_CHAOS_RENDER` (the markdown file) from `OUTBOX_CHAOS_REPORT` (the JSON
/// lines); without them, does nothing: `scripts/chaos.sh` sets them.
#[test]
fn chaos_render_report() {
    let (Ok(out), Ok(report)) = (
        std::env::var("OUTBOX_CHAOS_RENDER"),
        std::env::var("OUTBOX_CHAOS_REPORT"),
    ) else {
        return;
    };
    use diesel::{Connection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct V {
        #[diesel(sql_type = diesel::sql_types::Text)]
        v: String,
    }
    let postgres = diesel::PgConnection::establish(&crate::support::postgres_admin_url())
        .ok()
        .and_then(|mut c| {
            diesel::sql_query("SELECT version() AS v")
                .get_result::<V>(&mut c)
                .ok()
        })
        .map_or("unknown".into(), |v| v.v);
    let dirty = !sh("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let setting = Setting {
        command: std::env::var("OUTBOX_CHAOS_COMMAND")
            .unwrap_or_else(|_| "scripts/chaos.sh".into()),
        date: sh("date", &["-u"]),
        machine: machine(),
        postgres,
        commit: format!(
            "{}{}",
            sh("git", &["rev-parse", "--short", "HEAD"]),
            if dirty {
                ", with uncommitted changes"
            } else {
                ""
            }
        ),
        label: std::env::var("OUTBOX_CHAOS_LABEL").unwrap_or_default(),
    };
    let lines = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{report}: {e}"));
    let rows = newest(&lines);
    // Keep only the rows shown, so the file does not grow with every run.
    let kept: String = rows
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(&report, kept).unwrap();
    let old = std::fs::read_to_string(&out).ok();
    std::fs::write(&out, render(&rows, &setting, old.as_deref())).unwrap();
    eprintln!("wrote {out} ({} scenarios)", rows.len());
}

/// The newest row of a scenario wins, scenarios keep their order, and the hand-written notes
/// survive a re-render.
#[test]
fn chaos_report_keeps_the_notes_and_the_newest_rows() {
    let mut a = Row::new(
        "broker_outage_refused",
        "Broker outage: refused connections",
        super::Area::Relay,
    );
    a.tally.written = 1;
    let mut b = a.clone();
    b.tally.written = 2;
    b.target("0 dead letters", 3, false);
    let mut c = Row::new(
        "relay_sigkill_storm",
        "Relay SIGKILL storm while writers run",
        super::Area::Relay,
    );
    c.captures.push(("status".into(), "pending: 1".into()));
    let lines = [&a, &c, &b]
        .map(|r| serde_json::to_string(r).unwrap())
        .join("\n");
    let rows = newest(&lines);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].scenario, "relay_sigkill_storm");
    assert_eq!(rows[1].tally.written, 2);
    let setting = Setting {
        command: "c".into(),
        date: "d".into(),
        machine: "m".into(),
        postgres: "p".into(),
        commit: "x".into(),
        label: "before".into(),
    };
    let first = render(&rows, &setting, None);
    assert!(first.contains("| 0 dead letters | 3 | **no** |"), "{first}");
    assert!(
        first.contains("(#relay-sigkill-storm-while-writers-run)"),
        "{first}"
    );
    let edited = format!("{first}\nThe storm's figures are before the fix.\n");
    let second = render(&rows, &setting, Some(&edited));
    assert!(
        second.ends_with(&format!(
            "{NOTES_MARKER}\n\nThe storm's figures are before the fix.\n"
        )),
        "{second}"
    );
}
