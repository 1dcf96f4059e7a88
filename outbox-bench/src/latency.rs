//! Latency from COMMIT to the broker's acknowledgement at a steady write rate, with
//! LISTEN/NOTIFY and with polling only; the latency histogram and the drain-rate plot.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use outbox::prelude::*;
use outbox::relay::{Delivery, Mode, OutboxMessage, PgRelayStore, Publisher, Relay, RelayConfig};

use crate::common::*;
use crate::drain::{Sink, drain_ours, fill_template};
use crate::plot;

/// Events per second the writer commits.
const RATE: u64 = 1_000;
/// Writers (each with its own connection) sharing the schedule: one connection alone cannot
/// hold 1,000 commits/s on a loaded machine (each COMMIT waits for the WAL flush).
const WRITERS: usize = 8;
/// The key of the warm-up event (the measured ones are 0..n).
const WARM_UP: i64 = -1;

/// Ack instants, by event key (`OrderCreated::customer`).
struct Acks {
    at: Vec<Option<Instant>>,
    /// Measured events acknowledged (each counted once).
    acked: usize,
    /// Acknowledgements of an event already acknowledged (at-least-once redeliveries).
    again: usize,
    /// Deliveries that were not `Published`.
    failed: usize,
    /// Published messages whose payload carried no key of this run.
    unknown: usize,
    warm: bool,
}

impl Acks {
    fn new(n: usize) -> Self {
        Acks {
            at: vec![None; n],
            acked: 0,
            again: 0,
            failed: 0,
            unknown: 0,
            warm: false,
        }
    }
}

/// Publishes through `inner` and records, when the call returns, the instant of every message
/// it reports [`Delivery::Published`].
struct Timed<P> {
    inner: P,
    acks: Arc<Mutex<Acks>>,
}

impl<P: Publisher> Publisher for Timed<P> {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let out = self.inner.publish(batch).await;
        let now = Instant::now();
        let mut acks = self.acks.lock().expect("acks");
        for (m, d) in batch.iter().zip(&out) {
            if *d != Delivery::Published {
                acks.failed += 1;
                continue;
            }
            let key = serde_json::from_str::<OrderCreated>(&m.payload).map(|e| e.customer);
            match key {
                Ok(WARM_UP) => acks.warm = true,
                Ok(k) if (0..acks.at.len() as i64).contains(&k) => {
                    let slot = &mut acks.at[k as usize];
                    if slot.is_none() {
                        *slot = Some(now);
                        acks.acked += 1;
                    } else {
                        acks.again += 1;
                    }
                }
                _ => acks.unknown += 1,
            }
        }
        out
    }
}

fn write_one(conn: &mut PgConnection, key: i64) {
    conn.transaction_with_outbox(|tx| {
        tx.publish(&OrderCreated {
            order_id: key.rem_euclid(1000),
            customer: key,
            total_cents: 1250,
        })
    })
    .expect("write");
}

/// One variant's figures.
struct Run {
    listen: bool,
    mode: Mode,
    /// Events committed.
    n: usize,
    /// Events per second from the first scheduled commit to the last commit.
    rate: f64,
    /// How far behind its schedule the writer started a transaction, at worst.
    max_lag: Duration,
    /// Transactions started more than 1 ms behind schedule.
    late: usize,
    /// Events acknowledged before their writer read the clock after COMMIT (latency 0).
    early: usize,
    /// Latencies (ms) of the events acknowledged.
    lat: Vec<f64>,
    acks: Acks,
}

/// Starts one relay in `mode` publishing through `publisher`, timed into `acks`; it stops
/// when the sender returned is used or dropped.
fn spawn_relay<P: Publisher>(
    ctx: &Ctx,
    listen: bool,
    mode: Mode,
    publisher: P,
    acks: &Arc<Mutex<Acks>>,
) -> Result<
    (
        tokio::task::JoinHandle<()>,
        tokio::sync::oneshot::Sender<()>,
    ),
    String,
> {
    let config = RelayConfig {
        relay_id: "bench-latency".into(),
        mode,
        ..RelayConfig::default()
    };
    let relay = Relay::new(
        PgRelayStore::new(&ctx.url).listen(listen),
        Timed {
            inner: publisher,
            acks: acks.clone(),
        },
        config,
    )
    .map_err(|e| e.to_string())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = ctx.rt.spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    Ok((handle, stop))
}

/// One relay (to `sink`'s broker), one writer committing one event per transaction at
/// [`RATE`] for `dur`.
fn run(ctx: &Ctx, sink: Sink, listen: bool, mode: Mode, dur: Duration) -> Result<Run, String> {
    let n = (RATE * dur.as_secs()) as usize;
    let mut conn = PgConnection::establish(&ctx.url).map_err(|e| e.to_string())?;
    crate::drain::clear_outbox(&mut conn);
    outbox::notify::set_interval(listen.then_some(Duration::from_millis(100)));
    let acks = Arc::new(Mutex::new(Acks::new(n)));
    let (handle, stop) = match sink {
        Sink::Kafka => {
            ctx.fresh_broker();
            let kafka = outbox::kafka::KafkaPublisher::builder()
                .brokers(ctx.kafka.as_str())
                .topic_prefix("bench.")
                .build()
                .map_err(|e| e.to_string())?;
            spawn_relay(ctx, listen, mode, kafka, &acks)?
        }
        Sink::Nats => {
            ctx.rt.block_on(crate::brokers::reset_nats(&ctx.nats));
            let nats = ctx
                .rt
                .block_on(
                    outbox::nats::NatsPublisher::builder()
                        .servers(&ctx.nats)
                        .subject_prefix("bench.")
                        .build(),
                )
                .map_err(|e| e.to_string())?;
            spawn_relay(ctx, listen, mode, nats, &acks)?
        }
        Sink::RabbitMq => {
            ctx.rt.block_on(crate::brokers::reset_rabbitmq(&ctx.amqp));
            let rabbitmq = outbox::rabbitmq::RabbitMqPublisher::builder()
                .uri(&ctx.amqp)
                .exchange_prefix("bench.")
                .build()
                .map_err(|e| e.to_string())?;
            spawn_relay(ctx, listen, mode, rabbitmq, &acks)?
        }
        Sink::Null | Sink::Memory => return Err("latency is measured to a broker".into()),
    };
    let finish = |handle| {
        let _ = stop.send(());
        let _ = ctx.rt.block_on(handle);
    };

    // Warm-up: the relay connects, leases its shards, the producer meets the broker.
    write_one(&mut conn, WARM_UP);
    let warm_cap = Instant::now() + Duration::from_secs(15);
    while !acks.lock().expect("acks").warm {
        if Instant::now() > warm_cap {
            finish(handle);
            return Err("the warm-up event was not acknowledged within 15 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    // The paced writers: event i is committed at start + i / RATE (absolute deadlines), by
    // whichever of the writers takes it; a writer that is late commits at once, and its lag is
    // recorded.
    let next = AtomicUsize::new(0);
    let period = Duration::from_nanos(1_000_000_000 / RATE);
    let start = Instant::now() + Duration::from_millis(20);
    let conns = (0..WRITERS)
        .map(|_| PgConnection::establish(&ctx.url))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut commits: Vec<Option<Instant>> = vec![None; n];
    let mut max_lag = Duration::ZERO;
    let mut late = 0;
    std::thread::scope(|s| {
        let writers: Vec<_> = conns
            .into_iter()
            .map(|mut conn| {
                let next = &next;
                s.spawn(move || {
                    let mut done = Vec::new();
                    let mut max_lag = Duration::ZERO;
                    let mut late = 0;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        let due = start + period * i as u32;
                        let now = Instant::now();
                        if now < due {
                            std::thread::sleep(due - now);
                        } else {
                            let lag = now - due;
                            max_lag = max_lag.max(lag);
                            if lag > Duration::from_millis(1) {
                                late += 1;
                            }
                        }
                        write_one(&mut conn, i as i64);
                        done.push((i, Instant::now()));
                    }
                    (done, max_lag, late)
                })
            })
            .collect();
        for w in writers {
            let (done, lag, l) = w.join().expect("writer");
            for (i, at) in done {
                commits[i] = Some(at);
            }
            max_lag = max_lag.max(lag);
            late += l;
        }
    });
    let commits: Vec<Instant> = commits.into_iter().map(|c| c.expect("committed")).collect();
    let last = commits.iter().max().copied().unwrap_or(start);
    let rate = n as f64 / (last - start).as_secs_f64();

    // Every event acknowledged, or 10 s after the last commit.
    let ack_cap = Instant::now() + Duration::from_secs(10);
    while acks.lock().expect("acks").acked < n && Instant::now() < ack_cap {
        std::thread::sleep(Duration::from_millis(5));
    }
    finish(handle);
    let acks = std::mem::replace(&mut *acks.lock().expect("acks"), Acks::new(0));
    let early = commits
        .iter()
        .zip(&acks.at)
        .filter(|(c, a)| a.is_some_and(|a| a < **c))
        .count();
    let lat = commits
        .iter()
        .zip(&acks.at)
        .filter_map(|(c, a)| a.map(|a| a.saturating_duration_since(*c).as_secs_f64() * 1e3))
        .collect();
    Ok(Run {
        listen,
        mode,
        n,
        rate,
        max_lag,
        late,
        early,
        lat,
        acks,
    })
}

/// A run's figures as the last columns of a table row (its latencies sorted): rate, events,
/// acknowledged, p50, p95, p99, max, the writers' lateness.
fn figures(r: &mut Run) -> String {
    r.lat.sort_by(f64::total_cmp);
    let missing = r.n - r.acks.acked;
    let mut acked = fmt_n(r.acks.acked as f64);
    if missing > 0 {
        let _ = write!(acked, " ({} missing)", fmt_n(missing as f64));
    }
    if r.acks.again + r.acks.failed + r.acks.unknown > 0 {
        let _ = write!(
            acked,
            " ({} published again, {} failed deliveries, {} unknown)",
            r.acks.again, r.acks.failed, r.acks.unknown
        );
    }
    if r.early > 0 {
        let _ = write!(
            acked,
            " ({} acked before their writer read the clock after COMMIT: counted as 0 ms)",
            r.early
        );
    }
    let behind = if r.late == 0 {
        format!("never > 1 ms (max {:.2} ms)", r.max_lag.as_secs_f64() * 1e3)
    } else {
        format!(
            "{} tx > 1 ms late, max {:.0} ms",
            fmt_n(r.late as f64),
            r.max_lag.as_secs_f64() * 1e3
        )
    };
    format!(
        "| {} | {} | {acked} | {:.1} | {:.1} | {:.1} | {:.1} | {behind} |",
        fmt_n(r.rate),
        fmt_n(r.n as f64),
        pct(&r.lat, 50.0),
        pct(&r.lat, 95.0),
        pct(&r.lat, 99.0),
        r.lat.last().copied().unwrap_or(f64::NAN),
    )
}

/// The same run (LISTEN/NOTIFY, sharded) to NATS JetStream and RabbitMQ, as a table.
fn other_brokers(ctx: &Ctx, md: &mut String, dur: Duration) {
    let sinks: Vec<(Sink, &str)> = [
        (Sink::Nats, ctx.nats.as_str()),
        (Sink::RabbitMq, ctx.amqp.as_str()),
    ]
    .into_iter()
    .filter(|(_, address)| !address.is_empty())
    .collect();
    if sinks.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n### COMMIT → broker ack, to NATS JetStream and RabbitMQ\n\nThe same writers, schedule \
         and relay (LISTEN/NOTIFY, sharded, {} s each), publishing with \
         `outbox::nats::NatsPublisher` (the ack instant: the stream's publish acknowledgement) \
         and `outbox::rabbitmq::RabbitMqPublisher` (the broker's publisher confirm) to the \
         machine's own servers, in the same run as the Kafka rows above.\n",
        dur.as_secs()
    );
    let _ = writeln!(
        md,
        "| broker | wake-up | mode | rate achieved (events/s) | events | acked | p50 ms | p95 ms | p99 ms | max ms | writer behind schedule |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (sink, address) in sinks {
        eprintln!("latency: {sink:?} at {}", crate::brokers::shown(address));
        let line = match run(ctx, sink, true, Mode::Sharded, dur) {
            Ok(mut r) => format!(
                "| {} | {} | {} {}",
                sink.broker(),
                wake(true),
                mode_name(Mode::Sharded),
                figures(&mut r)
            ),
            Err(e) => format!(
                "| {} | {} | {} | failed: {e} | | | | | | | |",
                sink.broker(),
                wake(true),
                mode_name(Mode::Sharded)
            ),
        };
        println!("{line}");
        let _ = writeln!(md, "{line}");
    }
    outbox::notify::set_interval(Some(Duration::from_millis(100)));
    ctx.rt
        .block_on(crate::brokers::forget(&ctx.nats, &ctx.amqp));
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn wake(listen: bool) -> &'static str {
    if listen {
        "LISTEN/NOTIFY"
    } else {
        "polling only"
    }
}

fn mode_name(mode: Mode) -> String {
    format!("{mode:?}").to_lowercase()
}

/// COMMIT-free floor of the latency: one event at a time through a warmed-up Kafka publisher,
/// 200 times; (median, p99) in ms.
async fn publish_one_floor(kafka: &str) -> (f64, f64) {
    let publisher = crate::drain::warm_kafka_publisher(kafka).await;
    let mut ms = Vec::new();
    for i in 0..200 {
        let msg = OutboxMessage {
            seq: i,
            aggregate_id: (i % 1000).to_string(),
            ..crate::drain::warm_up_message()
        };
        let t0 = Instant::now();
        let outcome = publisher.publish(std::slice::from_ref(&msg)).await;
        assert!(outcome.iter().all(|d| d.error().is_none()), "{outcome:?}");
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    (pct(&ms, 50.0), pct(&ms, 99.0))
}

/// The latency section of the report, and both plots.
pub fn section(ctx: &Ctx, md: &mut String) {
    let quick = ctx.quick;
    // 60 s with LISTEN/NOTIFY in every run; polling only, 10 s in the quick run (at this
    // rate the relay rarely finds the outbox empty, so its tail differs little).
    let dur = Duration::from_secs(60);
    let dur_of = |listen: bool| {
        if quick && !listen {
            Duration::from_secs(10)
        } else {
            dur
        }
    };
    let poll = RelayConfig::default().poll_interval;
    let batch = RelayConfig::default().batch_size;
    let _ = writeln!(
        md,
        "\n## Latency, COMMIT → broker ack (PostgreSQL → Kafka)\n"
    );
    if ctx.kafka.is_empty() {
        let _ = writeln!(md, "Skipped: no Kafka broker given (`--kafka`).\n");
    } else {
        let modes: Vec<Mode> = if quick {
            vec![Mode::Sharded]
        } else {
            vec![Mode::Sharded, Mode::Unordered]
        };
        let _ = writeln!(
            md,
            "{WRITERS} writers (each with its own connection) commit one event per transaction \
             (`transaction_with_outbox`, over 1,000 aggregates) on one shared schedule of {} \
             events/s (event i is due at i ms; absolute deadlines, a late writer catches up at \
             once) for {} s{}; one relay \
             publishes them to Kafka (the broker at {}) with the default `RelayConfig` (batch {batch}, \
             poll interval {} ms). The commit instant is taken when COMMIT returns; the ack \
             instant when the publisher's call returns with the event's delivery report \
             (`Delivery::Published`; the Kafka publisher awaits every report of its batch), on \
             the same monotonic clock. LISTEN/NOTIFY: the relay listens and the writers notify \
             with the default throttle (at most one `NOTIFY` per 100 ms per process); polling \
             only: `PgRelayStore::listen(false)` and `outbox::notify::set_interval(None)`, so the \
             relay finds new events by its {} ms poll. One warm-up event is published and \
             acknowledged before the clock starts; events not acknowledged within 10 s of the \
             last commit are reported as missing, not dropped.\n",
            fmt_n(RATE as f64),
            dur.as_secs(),
            if quick {
                " (polling only: 10 s in the quick run)"
            } else {
                ""
            },
            ctx.kafka,
            poll.as_millis(),
            poll.as_millis(),
        );
        let _ = writeln!(
            md,
            "| wake-up | mode | rate achieved (events/s) | events | acked | p50 ms | p95 ms | p99 ms | max ms | writer behind schedule |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        let mut hist = Vec::new();
        for &mode in &modes {
            for listen in [true, false] {
                eprintln!("latency: {} {}", wake(listen), mode_name(mode));
                match run(ctx, Sink::Kafka, listen, mode, dur_of(listen)) {
                    Ok(mut r) => {
                        let line = format!(
                            "| {} | {} {}",
                            wake(r.listen),
                            mode_name(r.mode),
                            figures(&mut r)
                        );
                        println!("{line}");
                        let _ = writeln!(md, "{line}");
                        let name = format!(
                            "{}, {} (p50 {:.0} ms, p99 {:.0} ms)",
                            wake(r.listen),
                            mode_name(r.mode),
                            pct(&r.lat, 50.0),
                            pct(&r.lat, 99.0)
                        );
                        hist.push((name, r.lat));
                    }
                    Err(e) => {
                        let line = format!(
                            "| {} | {} | failed: {e} | | | | | | | |",
                            wake(listen),
                            mode_name(mode)
                        );
                        println!("{line}");
                        let _ = writeln!(md, "{line}");
                    }
                }
            }
        }
        outbox::notify::set_interval(Some(Duration::from_millis(100)));
        ctx.fresh_broker();
        let (floor_p50, floor_p99) = ctx.rt.block_on(publish_one_floor(&ctx.kafka));
        let _ = writeln!(
            md,
            "\nThe floor under these figures, measured in the same run: one event published \
             alone by a warmed-up publisher (librdkafka's `linger.ms` 1, then the broker's round \
             trip with `acks=all`) takes {floor_p50:.1} ms (median of 200; p99 {floor_p99:.1} ms); \
             after a batch the relay claims again within 2 ms (its re-check interval in the wake \
             window), and the claim and its commit are each a statement of about a millisecond. \
             The writers' lateness is the machine's stalls (a writer is late when its \
             transaction starts after its due time): an event committed during a stall waits \
             for the relay in the same stall."
        );
        let _ = writeln!(
            md,
            "\nHow to read it: the relay waits (for a notification, or for its poll interval) only \
             after a claim came back empty; after a non-empty batch or a notification it claims \
             again every 2 ms for its `wake_window` (150 ms) before it waits. \
             So at a steady rate the wake-up mechanism matters only when the relay has caught up, \
             and it shows in the tail: a polling relay that finds the outbox empty sleeps up to \
             {} ms, a listening one is woken by the next notifying commit (≤ 100 ms apart) or finds \
             the commit within its wake window.{}",
            poll.as_millis(),
            if quick {
                " The quick run measures the sharded mode only; the full run adds unordered."
            } else {
                ""
            }
        );
        let title = format!(
            "COMMIT → Kafka ack at {} events/s, 1 relay (poll interval {} ms)",
            fmt_n(RATE as f64),
            poll.as_millis()
        );
        embed_plot(
            ctx,
            md,
            "latency",
            "Histogram of COMMIT → ack latencies, LISTEN/NOTIFY and polling only",
            |path| plot::latency_histogram(path, &title, &hist),
        );
    }
    other_brokers(ctx, md, if quick { Duration::from_secs(20) } else { dur });
    drain_plot(ctx, md);
}

/// (t, events/s over the trailing `window` seconds) at each sample of (t, published so far).
fn trailing_rate(series: &[(f64, u64)], window: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(t, p) in series.iter().skip(1) {
        while j + 1 < series.len() && series[j + 1].0 <= t - window {
            j += 1;
        }
        let (t0, p0) = series[j];
        if t - t0 >= 0.05 {
            out.push((t, (p - p0) as f64 / (t - t0)));
        }
    }
    out
}

/// Drains of a backlog by one relay of each mode (batch 1000, null publisher), sampled every
/// 100 ms, plotted as events/s per window.
fn drain_plot(ctx: &Ctx, md: &mut String) {
    let backlog: i64 = if ctx.quick { 20_000 } else { 200_000 };
    let cap = Duration::from_secs(if ctx.quick { 8 } else { 120 });
    let _ = writeln!(
        md,
        "\n### Drain rate over time\n\n{} pending events over 1,000 aggregates, drained by one \
         relay (batch 1000, null publisher) in each mode, sampled every 100 ms; the rate is \
         events published over the trailing second (during the first second: since the start).{}\n",
        fmt_n(backlog as f64),
        if ctx.quick {
            format!(" Quick run: a drain is stopped after {} s.", cap.as_secs())
        } else {
            String::new()
        }
    );
    let mut conn = PgConnection::establish(&ctx.url).expect("connect");
    eprintln!("drain plot: filling {backlog} events");
    fill_template(&mut conn, backlog as usize);
    let mut series = Vec::new();
    for mode in [Mode::Unordered, Mode::Sharded, Mode::Leader] {
        let d = ctx.rt.block_on(drain_ours(
            &ctx.url,
            mode,
            1,
            1000,
            Sink::Null,
            &ctx.kafka,
            backlog,
            cap,
        ));
        let rates = trailing_rate(&d.series, 1.0);
        let line = format!(
            "- {}: {} events/s over the drain{}",
            mode_name(mode),
            fmt_n(d.rate),
            d.capped.map_or(String::new(), |p| format!(
                " (stopped at the cap: {} published)",
                fmt_n(p as f64)
            ))
        );
        println!("{line}");
        let _ = writeln!(md, "{line}");
        series.push((mode_name(mode), rates));
    }
    exec(&mut conn, "TRUNCATE outbox_events");
    let title = format!(
        "Drain of {} events, 1 relay, batch 1000, null publisher",
        fmt_n(backlog as f64)
    );
    embed_plot(
        ctx,
        md,
        "drain-rate",
        "Events published per second during the drains, by mode",
        |path| plot::rate_over_time(path, &title, &series),
    );
}

/// Draws `<prefix>-<name>.png` next to the report and links it, or says in the report why it
/// could not be drawn.
fn embed_plot(
    ctx: &Ctx,
    md: &mut String,
    name: &str,
    alt: &str,
    draw: impl FnOnce(&std::path::Path) -> Result<(), String>,
) {
    let file = format!("{}-{name}.png", ctx.plot_prefix);
    match draw(&ctx.out_dir.join(&file)) {
        Ok(()) => {
            let _ = writeln!(md, "\n![{alt}]({file})\n");
        }
        Err(e) => {
            eprintln!("plot {file}: {e}");
            let _ = writeln!(md, "\n(The plot {file} could not be drawn: {e}.)\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 50.0), 50.0);
        assert_eq!(pct(&v, 99.0), 99.0);
        assert_eq!(pct(&v, 100.0), 100.0);
        assert_eq!(pct(&[7.0], 50.0), 7.0);
        assert!(pct(&[], 50.0).is_nan());
    }

    #[test]
    fn rates_are_over_the_trailing_window() {
        let series: Vec<(f64, u64)> = (0..=30).map(|i| (i as f64 / 10.0, i * 100)).collect();
        let rates = trailing_rate(&series, 1.0);
        assert_eq!(rates.len(), 30);
        for (t, r) in rates {
            assert!((r - 1000.0).abs() < 1e-6, "{t}: {r}");
        }
        // A last sample just after the one before it does not spike.
        let series = vec![(0.0, 0), (1.0, 1000), (2.0, 2000), (2.001, 2000)];
        let rates = trailing_rate(&series, 1.0);
        assert!(rates.iter().all(|&(_, r)| r <= 1000.0 + 1e-6), "{rates:?}");
    }
}
