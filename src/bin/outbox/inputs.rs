//! Range checks of `outbox relay`'s flags, before anything connects.
//!
//! Every number the relay is given becomes a duration, an interval in SQL or a librdkafka
//! setting somewhere; each has a range in which all of those stay valid (for example
//! PostgreSQL's `statement_timeout`, which the store sets to a third of the lease, takes at most `i32::MAX` ms,
//! and `now() - retention` must stay a valid timestamp on MySQL). A value outside its range is
//! refused with one line that names the flag, its environment variable, the range and the
//! value, rather than wrapped, clamped or left to fail later.

use super::{Fatal, RelayArgs};

/// A day in milliseconds: the longest lease, message timeout and retry delay.
const DAY_MS: u64 = 86_400_000;

/// `--flag / ENV must be between min and max unit, got value`, unless `value` is in range.
fn in_range(flag_env: &str, value: u64, min: u64, max: u64, unit: &str) -> Result<(), Fatal> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(Fatal(format!(
            "{flag_env} must be between {min} and {max}{unit}, got {value}"
        )))
    }
}

/// Checks every number and string of `outbox relay` against its range, and the ones that
/// depend on each other.
pub(crate) fn check_relay_args(args: &RelayArgs) -> Result<(), Fatal> {
    if args.brokers.trim().is_empty() {
        return Err(Fatal(
            "--brokers / KAFKA_BROKERS is empty: give the Kafka bootstrap servers, host:port[,host:port…]"
                .into(),
        ));
    }
    in_range(
        "--batch-size / OUTBOX_BATCH_SIZE",
        args.batch_size as u64,
        1,
        10_000,
        "",
    )?;
    in_range(
        "--stream-read-ahead / OUTBOX_STREAM_READ_AHEAD",
        args.stream_read_ahead,
        0,
        100_000,
        " rows",
    )?;
    in_range(
        "--max-in-flight / OUTBOX_MAX_IN_FLIGHT",
        args.max_in_flight as u64,
        1,
        outbox::relay::MAX_IN_FLIGHT as u64,
        "",
    )?;
    in_range(
        "--poll-interval / OUTBOX_POLL_INTERVAL_MS",
        args.poll_interval,
        1,
        3_600_000,
        " ms",
    )?;
    in_range(
        "--lease / OUTBOX_LEASE_MS",
        args.lease,
        1_000,
        DAY_MS,
        " ms",
    )?;
    in_range(
        "--message-timeout / OUTBOX_MESSAGE_TIMEOUT_MS",
        args.message_timeout,
        1,
        DAY_MS,
        " ms",
    )?;
    in_range(
        "--max-attempts / OUTBOX_MAX_ATTEMPTS",
        u64::from(args.max_attempts),
        1,
        1_000_000,
        "",
    )?;
    in_range(
        "--retry-initial / OUTBOX_RETRY_INITIAL_MS",
        args.retry_initial,
        1,
        DAY_MS,
        " ms",
    )?;
    in_range(
        "--retry-max / OUTBOX_RETRY_MAX_MS",
        args.retry_max,
        args.retry_initial,
        DAY_MS,
        " ms (at least --retry-initial / OUTBOX_RETRY_INITIAL_MS)",
    )?;
    if let Some(hours) = args.retention_hours {
        // Ten years: `now() - retention` stays a valid time on every backend.
        in_range(
            "--retention-hours / OUTBOX_RETENTION_HOURS",
            hours,
            1,
            87_600,
            " hours",
        )?;
    }
    if let Some(id) = &args.relay_id
        && (id.trim().is_empty() || id.len() > 200)
    {
        return Err(Fatal(format!(
            "--relay-id / OUTBOX_RELAY_ID must be 1 to 200 characters, got {} characters",
            id.len()
        )));
    }
    Ok(())
}

/// The retention in seconds, checked (the range check above keeps it far from overflowing).
pub(crate) fn retention_secs(hours: u64) -> Result<u64, Fatal> {
    hours.checked_mul(3_600).ok_or_else(|| {
        Fatal(format!(
            "--retention-hours / OUTBOX_RETENTION_HOURS {hours} is too large"
        ))
    })
}
