//! `outbox status`, `outbox dead list|retry|purge`, `outbox replay`, `outbox cleanup`: each
//! maps its flags to one call of the library's admin API (`outbox::relay::admin`).
//!
//! Destructive commands (`dead retry`, `dead purge`, `replay`, `cleanup`) change nothing
//! without `--yes`: they print what they would do and exit with status 2.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::relay::admin::{
    Admin, DEFAULT_CLEANUP_BATCH, DEFAULT_REPLAY_BATCH, DeadLetter, Filter, Status,
};

use super::{Backend, Fatal, backend_of, check_migrated, describe, with_connection};

/// Exit status of a destructive command run without `--yes`.
const NOT_CONFIRMED: u8 = 2;

/// Which events a command selects (they combine with AND).
#[derive(clap::Args, Debug, Default)]
pub struct FilterArgs {
    /// Exactly these seqs (repeatable, or comma-separated).
    #[arg(long = "seq", value_delimiter = ',')]
    seq: Vec<i64>,
    /// Seqs from this one (inclusive).
    #[arg(long)]
    from_seq: Option<i64>,
    /// Seqs up to this one (inclusive).
    #[arg(long)]
    to_seq: Option<i64>,
    /// Written at or after this time: RFC 3339 (`2026-11-30T08:00:00Z`) or a duration ago
    /// (`2h`, `3days`).
    #[arg(long, value_parser = parse_time)]
    since: Option<DateTime<Utc>>,
    /// Written before this time: RFC 3339 or a duration ago.
    #[arg(long, value_parser = parse_time)]
    until: Option<DateTime<Utc>>,
    /// Of this aggregate type.
    #[arg(long)]
    aggregate_type: Option<String>,
    /// Of this aggregate id.
    #[arg(long)]
    aggregate_id: Option<String>,
    /// Of this event type.
    #[arg(long)]
    event_type: Option<String>,
}

impl FilterArgs {
    fn filter(&self) -> Filter {
        Filter {
            seqs: (!self.seq.is_empty()).then(|| self.seq.clone()),
            from_seq: self.from_seq,
            to_seq: self.to_seq,
            since: self.since,
            until: self.until,
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            event_type: self.event_type.clone(),
        }
    }
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = humantime::parse_duration(s).map_err(|_| {
        format!("`{s}` is neither an RFC 3339 time (2026-11-30T08:00:00Z) nor a duration (2h)")
    })?;
    let ago = chrono::Duration::from_std(ago).map_err(|_| format!("`{s}` is too long ago"))?;
    Utc::now()
        .checked_sub_signed(ago)
        .ok_or_else(|| format!("`{s}` is too long ago"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration such as 30d, 12h or 90m: {e}"))
}

/// `outbox dead …`.
#[derive(clap::Subcommand, Debug)]
pub enum DeadCommand {
    /// List dead letters, oldest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Show dead letters after this seq (the last seq of the previous page).
        #[arg(long, default_value_t = 0)]
        after_seq: i64,
        /// At most this many (at least 1).
        #[arg(long, default_value_t = 100, value_parser = crate::inputs::at_least_one)]
        limit: usize,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make dead letters pending again (attempts 0, due now): the relay publishes them, and
    /// an ordered aggregate's later events follow in order. Stream mode's dead letters get
    /// their retry asked for: the stream relay publishes them, then their parked events.
    Retry(SettleArgs),
    /// Delete dead letters (only dead rows): an ordered aggregate's later events move on
    /// without them (in stream mode, its parked events are published).
    Purge(SettleArgs),
}

/// The dead letters `outbox dead retry` and `outbox dead purge` act on, and whether to act.
#[derive(clap::Args, Debug)]
pub struct SettleArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Select every dead letter (needed when no filter is given).
    #[arg(long)]
    all: bool,
    /// Do it (without: print what would be done and exit 2).
    #[arg(long)]
    yes: bool,
}

/// `outbox replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    #[command(flatten)]
    filter: FilterArgs,
    /// Select every published event (needed when no filter is given).
    #[arg(long)]
    all: bool,
    /// Rows per statement (1-100000).
    #[arg(long, default_value_t = DEFAULT_REPLAY_BATCH, value_parser = crate::inputs::batch_rows)]
    batch: usize,
    /// Do it (without: print what would be done and exit 2).
    #[arg(long)]
    yes: bool,
}

/// `outbox cleanup`.
#[derive(clap::Args, Debug)]
pub struct CleanupArgs {
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Delete published events published longer ago than this (`30d`, `12h`).
    #[arg(long, value_parser = parse_duration)]
    older_than: Duration,
    /// Rows per statement, each its own short transaction (1-100000).
    #[arg(long, default_value_t = DEFAULT_CLEANUP_BATCH, value_parser = crate::inputs::batch_rows)]
    batch: usize,
    /// Do it (without: print what would be done and exit 2).
    #[arg(long)]
    yes: bool,
}

/// `outbox partition`.
#[derive(clap::Args, Debug)]
pub struct PartitionArgs {
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Partitions in the ring (2-64).
    #[arg(long, default_value_t = outbox::relay::partitions::DEFAULT_SLOTS)]
    slots: u16,
    /// Transaction ids per partition: a turn of the ring (slots x this) should outlast the
    /// retention plus the relays' lag.
    #[arg(long, default_value_t = outbox::relay::partitions::DEFAULT_SLOT_XIDS)]
    slot_xids: u64,
    /// Do it (without: print what would be done and exit 2).
    #[arg(long)]
    yes: bool,
}

/// `outbox stream-handover`.
#[derive(clap::Args)]
pub struct HandoverArgs {
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Do it (without: print what would be done and exit 2).
    #[arg(long)]
    yes: bool,
}

/// Runs `$body` with `$admin` bound to an [`Admin`] on the URL's backend.
macro_rules! with_admin {
    ($url:expr, |$admin:ident| $body:expr) => {{
        let url: &str = $url;
        check_migrated(url).await?;
        let (backend, url) = backend_of(url)?;
        with_connection!(
            backend,
            &url,
            false,
            |c| {
                let mut $admin = Admin::new(c);
                $body
            },
            |e| return Err(Fatal(e))
        )
    }};
}

/// `outbox status [--json]`.
pub async fn status(url: &str, json: bool) -> Result<ExitCode, Fatal> {
    let status = with_admin!(url, |admin| admin.status().await?);
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print_status(&status);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(s: &Status) {
    println!("pending:            {}", s.pending);
    println!("  in flight:        {}", s.in_flight);
    println!("  waiting to retry: {}", s.retrying);
    println!("dead letters:       {}", s.dead);
    println!("blocked aggregates: {}", s.blocked_aggregates);
    println!("published (kept):   {}", s.published);
    match (s.oldest_pending, s.oldest_pending_age_seconds) {
        (Some(at), Some(age)) => println!("oldest pending:     {at} ({age:.1} s ago)"),
        _ => println!("oldest pending:     -"),
    }
    println!("leader:             {}", s.leader.as_deref().unwrap_or("-"));
    if let Some(stream) = &s.stream {
        println!(
            "stream:             pending counts the events beyond the stream's positions \
             and the parked ones"
        );
        match &stream.oldest_open_transaction {
            Some(t) => println!(
                "  open transaction: {:.1} s, pid {}{}{}{} (its events wait for its commit; \
                 every claim rereads what committed since it began)",
                t.age_seconds,
                t.pid,
                t.database
                    .as_deref()
                    .map_or(String::new(), |d| format!(", database {d}")),
                t.application
                    .as_deref()
                    .filter(|a| !a.is_empty())
                    .map_or(String::new(), |a| format!(", application {a}")),
                t.state
                    .as_deref()
                    .map_or(String::new(), |st| format!(", {st}")),
            ),
            None => println!("  open transaction: none held by the positions"),
        }
        println!(
            "  parked:           {} (behind their aggregate's dead letter; counted as pending)",
            stream.parked
        );
        println!(
            "  retry requested:  {} (dead letters waiting for a stream relay to publish them)",
            stream.retry_requested
        );
        if let Some(r) = &stream.ring {
            println!(
                "  partition ring:   {} slots of {} transaction ids, writing slot {}; {} of \
                 them hold rows, {:.1} MB",
                r.slots,
                r.slot_xids,
                r.current_slot,
                r.filled,
                r.bytes as f64 / 1_048_576.0
            );
            println!(
                "  ring headroom:    {} transaction ids before writers reach a partition not \
                 emptied yet (at 0, rows older than a turn are deleted instead)",
                r.headroom_xids
            );
        }
    }
    if s.relays.is_empty() {
        println!("relays:             none");
    }
    for r in &s.relays {
        print!(
            "relay:              {} ({}): {}",
            r.relay_id, r.mode, r.state
        );
        if let Some(since) = r.state_since {
            print!(" since {since}");
        }
        if r.shards > 0 {
            print!(", {} shards", r.shards);
        }
        if !r.live {
            print!(", heartbeat expired");
        }
        if let Some(session) = &r.session {
            print!(", session {session}");
        }
        println!();
        if let Some(error) = &r.last_error {
            println!("                    last outage: {error}");
        }
    }
}

fn print_dead(d: &DeadLetter) {
    // A stream dead letter whose retry was asked for is still one until a stream relay
    // publishes it: say so, so that a second `dead retry` is not taken for a failure.
    let retry = d.retry_requested_at.map_or(String::new(), |t| {
        format!("  retry requested {t} (waits for a stream relay)")
    });
    println!(
        "{:>8}  {}  {}/{}  {} v{}  attempts {}  dead {}{}  {}",
        d.seq,
        d.id,
        d.aggregate_type,
        d.aggregate_id,
        d.event_type,
        d.event_version,
        d.attempts,
        d.dead_at.map(|t| t.to_string()).unwrap_or_default(),
        retry,
        d.last_error.as_deref().unwrap_or("")
    );
}

/// A selection that needs `--all` when it is empty.
fn selection(filter: &FilterArgs, all: bool, what: &str) -> Result<Filter, Fatal> {
    let f = filter.filter();
    match (f.is_empty(), all) {
        (true, false) => Err(Fatal(format!(
            "select the {what} (--seq, --from-seq, --to-seq, --since, --until, --aggregate-type, --aggregate-id, --event-type) or pass --all"
        ))),
        (false, true) => Err(Fatal(format!(
            "--all selects every {what}: do not combine it with a filter"
        ))),
        _ => Ok(f),
    }
}

fn not_confirmed(message: String) -> ExitCode {
    println!("{message}; nothing changed: pass --yes to do it");
    ExitCode::from(NOT_CONFIRMED)
}

/// `outbox dead …`.
pub async fn dead(url: &str, command: DeadCommand) -> Result<ExitCode, Fatal> {
    match command {
        DeadCommand::List {
            filter,
            after_seq,
            limit,
            json,
        } => {
            let filter = filter.filter();
            let rows = with_admin!(url, |admin| admin
                .dead_letters(&filter, after_seq, limit)
                .await?);
            for d in &rows {
                if json {
                    println!("{}", serde_json::to_string(d)?);
                } else {
                    print_dead(d);
                }
            }
            if !json && rows.len() == limit {
                eprintln!(
                    "(more may follow: --after-seq {})",
                    rows[rows.len() - 1].seq
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadCommand::Retry(args) => settle_dead(url, &args, Settle::Retry).await,
        DeadCommand::Purge(args) => settle_dead(url, &args, Settle::Purge).await,
    }
}

/// What `outbox dead retry` and `outbox dead purge` do to the dead letters they select.
#[derive(Clone, Copy)]
enum Settle {
    Retry,
    Purge,
}

/// `outbox dead retry` and `outbox dead purge`: without `--yes`, only the count of what
/// would change.
async fn settle_dead(url: &str, args: &SettleArgs, how: Settle) -> Result<ExitCode, Fatal> {
    let filter = selection(&args.filter, args.all, "dead letters")?;
    let (verb, done) = match how {
        Settle::Retry => ("retry", "retried"),
        Settle::Purge => ("delete", "deleted"),
    };
    with_admin!(url, |admin| {
        if !args.yes {
            let n = admin.count(&filter, true).await?;
            return Ok(not_confirmed(format!("would {verb} {n} dead letters")));
        }
        let n = match how {
            Settle::Retry => admin.retry_dead(&filter).await?,
            Settle::Purge => admin.purge_dead(&filter).await?,
        };
        println!("{done} {n} dead letters");
    });
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on a terminal, nothing otherwise.
fn progress(total: u64, what: &'static str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what);
    bar
}

/// `outbox replay`.
pub async fn replay(args: ReplayArgs) -> Result<ExitCode, Fatal> {
    let filter = selection(&args.filter, args.all, "published events")?;
    with_admin!(&args.database_url, |admin| {
        let n = admin.count(&filter, false).await?;
        if !args.yes {
            return Ok(not_confirmed(format!(
                "would publish {n} events again, with their original ids"
            )));
        }
        let bar = progress(n.max(0) as u64, "replaying");
        let done = admin
            .replay(&filter, args.batch, |d| bar.set_position(d))
            .await?;
        bar.finish_and_clear();
        println!("replayed {done} events: the relay publishes them again");
    });
    Ok(ExitCode::SUCCESS)
}

/// `outbox partition`: PostgreSQL only.
pub async fn partition(args: PartitionArgs) -> Result<ExitCode, Fatal> {
    crate::inputs::check_ring(args.slots, args.slot_xids)?;
    let mut admin = pg_admin(&args.database_url, "partition").await?;
    if !args.yes {
        return Ok(not_confirmed(format!(
            "would convert outbox_events into {} partitions of {} transaction ids each, copying \
             every row under an exclusive lock (writers and relays wait until it is done)",
            args.slots, args.slot_xids
        )));
    }
    let copied = admin.partition_events(args.slots, args.slot_xids).await?;
    println!(
        "outbox_events is now {} partitions of {} transaction ids each ({copied} rows copied); \
         retention empties them with TRUNCATE",
        args.slots, args.slot_xids
    );
    Ok(ExitCode::SUCCESS)
}

/// An admin connection to a PostgreSQL database, for the stream mode commands (`what`
/// names the command in the refusal of another backend).
async fn pg_admin(
    database_url: &str,
    what: &str,
) -> Result<Admin<diesel_async::AsyncPgConnection>, Fatal> {
    check_migrated(database_url).await?;
    let (backend, url) = backend_of(database_url)?;
    if !matches!(backend, Backend::Postgres) {
        return Err(Fatal(format!(
            "outbox {what}: stream mode runs on PostgreSQL only; {} is not",
            describe(&url)
        )));
    }
    let c = outbox::connect::postgres(&url)
        .await
        .map_err(|e| Fatal(e.to_string()))?;
    Ok(Admin::new(c))
}

/// `outbox stream-handover`.
pub async fn stream_handover(args: HandoverArgs) -> Result<ExitCode, Fatal> {
    let mut admin = pg_admin(&args.database_url, "stream-handover").await?;
    let Some(left) = admin.stream_left_behind().await? else {
        println!("stream mode left nothing behind: relays in any mode may run");
        return Ok(ExitCode::SUCCESS);
    };
    if !args.yes {
        return Ok(not_confirmed(format!(
            "would mark published the events the stream relays published{}, and give {} \
             events of their dead letters back to the lease modes (dead letters stay dead, \
             parked events become pending); stop the stream relays first",
            if left.unmarked { "" } else { " (none)" },
            left.stream_dead_letters
        )));
    }
    let done = admin.hand_over_from_stream().await?;
    println!(
        "handed over from stream mode: {} events marked published, {} given back from its \
         dead letters; relays in a lease mode may run",
        done.marked, done.restored
    );
    Ok(ExitCode::SUCCESS)
}

/// Refuses to start a relay on a PostgreSQL table the other kind of mode left rows in: a
/// lease-mode relay where stream mode left published rows unmarked or dead letters (it would
/// publish them again or never release them), a stream relay that keeps dead letters
/// blocking where the lease modes left dead letters (it would publish their aggregates'
/// later events past them). The store refuses its claims too; this says so before anything
/// starts. A database that cannot be asked now (down, not migrated yet) is left to the
/// relay, which waits for it and asks again.
pub async fn refuse_mode_switch(
    url: &str,
    stream: bool,
    dead_letters_block: bool,
) -> Result<(), Fatal> {
    let Ok(c) = outbox::connect::postgres(url).await else {
        return Ok(());
    };
    let mut admin = Admin::new(c);
    let refused = match (stream, dead_letters_block) {
        (false, _) => admin
            .stream_left_behind()
            .await
            .ok()
            .flatten()
            .map(|l| l.to_string()),
        (true, true) => admin
            .lease_dead_letters()
            .await
            .ok()
            .flatten()
            .map(|l| l.to_string()),
        (true, false) => None,
    };
    match refused {
        Some(why) => Err(Fatal(format!("outbox relay: {why}"))),
        None => Ok(()),
    }
}

/// `outbox cleanup`.
pub async fn cleanup(args: CleanupArgs) -> Result<ExitCode, Fatal> {
    crate::inputs::check_older_than(args.older_than)?;
    if !args.yes {
        return Ok(not_confirmed(format!(
            "would delete the events published more than {} ago, {} per statement",
            humantime::format_duration(args.older_than),
            args.batch
        )));
    }
    with_admin!(&args.database_url, |admin| {
        let bar = if std::io::stderr().is_terminal() {
            indicatif::ProgressBar::new_spinner()
        } else {
            indicatif::ProgressBar::hidden()
        };
        let done = admin
            .cleanup(args.older_than, args.batch, |d| {
                bar.set_message(format!("deleted {d}"))
            })
            .await?;
        bar.finish_and_clear();
        println!("deleted {done} published events");
    });
    Ok(ExitCode::SUCCESS)
}
