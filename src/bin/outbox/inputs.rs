//! Range checks of `outbox relay`'s flags, before anything connects.
//!
//! Every number the relay is given becomes a duration, an interval in SQL or a librdkafka
//! setting somewhere; each has a range in which all of those stay valid (for example
//! PostgreSQL's `statement_timeout`, which the store sets to a third of the lease, takes at most `i32::MAX` ms,
//! and `now() - retention` must stay a valid timestamp on MySQL). A value outside its range is
//! refused with one line that names the flag, its environment variable, the range and the
//! value, rather than wrapped, clamped or left to fail later.

use std::time::Duration;

use outbox::relay::limits::{self, Limit};

use super::{Fatal, RelayArgs};

/// A limit of the library's table ([`outbox::relay::limits`]) in whole milliseconds.
fn ms(limit: Limit<Duration>) -> (u64, u64) {
    (
        limit.min.as_millis().max(1) as u64,
        limit.max.as_millis() as u64,
    )
}

/// A count's limit as `u64`.
fn count<T: Into<u64>>(limit: Limit<T>) -> (u64, u64) {
    (limit.min.into(), limit.max.into())
}

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
    let (min, max) = (limits::BATCH_SIZE.min as u64, limits::BATCH_SIZE.max as u64);
    in_range(
        "--batch-size / OUTBOX_BATCH_SIZE",
        args.batch_size as u64,
        min,
        max,
        "",
    )?;
    // A setting of the PostgreSQL store, not of the relay's configuration.
    in_range(
        "--stream-read-ahead / OUTBOX_STREAM_READ_AHEAD",
        args.stream_read_ahead,
        0,
        100_000,
        " rows",
    )?;
    let (min, max) = (
        limits::MAX_IN_FLIGHT.min as u64,
        limits::MAX_IN_FLIGHT.max as u64,
    );
    in_range(
        "--max-in-flight / OUTBOX_MAX_IN_FLIGHT",
        args.max_in_flight as u64,
        min,
        max,
        "",
    )?;
    let (min, max) = ms(limits::POLL_INTERVAL);
    in_range(
        "--poll-interval / OUTBOX_POLL_INTERVAL_MS",
        args.poll_interval,
        min,
        max,
        " ms",
    )?;
    let (min, max) = ms(limits::LEASE);
    in_range("--lease / OUTBOX_LEASE_MS", args.lease, min, max, " ms")?;
    let (min, max) = ms(limits::PUBLISH_TIMEOUT);
    in_range(
        "--message-timeout / OUTBOX_MESSAGE_TIMEOUT_MS",
        args.message_timeout,
        min,
        max,
        " ms",
    )?;
    let (min, max) = count(limits::MAX_ATTEMPTS);
    in_range(
        "--max-attempts / OUTBOX_MAX_ATTEMPTS",
        u64::from(args.max_attempts),
        min,
        max,
        "",
    )?;
    let (min, max) = ms(limits::BACKOFF_DELAY);
    in_range(
        "--retry-initial / OUTBOX_RETRY_INITIAL_MS",
        args.retry_initial,
        min,
        max,
        " ms",
    )?;
    in_range(
        "--retry-max / OUTBOX_RETRY_MAX_MS",
        args.retry_max,
        args.retry_initial,
        max,
        " ms (at least --retry-initial / OUTBOX_RETRY_INITIAL_MS)",
    )?;
    if let Some(hours) = args.retention_hours {
        let keep = limits::RETENTION_KEEP;
        in_range(
            "--retention-hours / OUTBOX_RETENTION_HOURS",
            hours,
            keep.min.as_secs().div_ceil(3_600),
            keep.max.as_secs() / 3_600,
            " hours",
        )?;
    }
    if let Some(id) = &args.relay_id
        && let Err(reason) = outbox::relay::check_relay_id(id)
    {
        return Err(Fatal(format!("--relay-id / OUTBOX_RELAY_ID {reason}")));
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

/// A count that must be at least 1 (`--limit`), for clap: `0` would select nothing and was
/// read as "no page", so it is refused naming the flag.
pub(crate) fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number: {e}")),
    }
}

/// Rows per statement of `outbox replay` and `outbox cleanup`: 1 to 100,000, the range of the
/// relay's own retention batch (`RelayConfig::validate`), whose statement `cleanup` runs.
pub(crate) fn batch_rows(s: &str) -> Result<usize, String> {
    match at_least_one(s)? {
        n if n > 100_000 => Err(format!("must be between 1 and 100000, got {n}")),
        n => Ok(n),
    }
}

/// `outbox cleanup --older-than`: at most the relay's retention limit (ten years), so that
/// `now() - older_than` stays a valid time on every backend (PostgreSQL failed with
/// "timestamp out of range" beyond a few thousand years).
pub(crate) fn check_older_than(older_than: std::time::Duration) -> Result<(), Fatal> {
    let max = outbox::relay::MAX_RETENTION;
    if older_than > max {
        return Err(Fatal(format!(
            "--older-than must be at most {} days (ten years), got {} days",
            max.as_secs() / 86_400,
            older_than.as_secs() / 86_400
        )));
    }
    Ok(())
}

/// `outbox partition`'s ring: `--slots` 2-64, and `--slot-xids` at most what keeps a turn of
/// the ring (`slots × slot_xids`) within the ring's `bigint` arithmetic (the library's
/// [`max_slot_xids`](outbox::relay::partitions::max_slot_xids)).
pub(crate) fn check_ring(slots: u16, slot_xids: u64) -> Result<(), Fatal> {
    use outbox::relay::partitions::{MAX_RING_XIDS, MAX_SLOTS, MIN_SLOTS, max_slot_xids};
    in_range(
        "--slots",
        u64::from(slots),
        u64::from(MIN_SLOTS),
        u64::from(MAX_SLOTS),
        "",
    )?;
    let max = max_slot_xids(slots);
    if slot_xids == 0 || slot_xids > max {
        return Err(Fatal(format!(
            "--slot-xids must be between 1 and {max} with --slots {slots} (--slots × --slot-xids, \
             a turn of the ring, at most {MAX_RING_XIDS}), got {slot_xids}"
        )));
    }
    Ok(())
}

/// The librdkafka settings of `outbox relay`, in the order they apply (a later one wins): the
/// lines of `--kafka-config-file`, then the entries of `OUTBOX_KAFKA_CONFIG`, then each
/// `--kafka-config`. A malformed entry is refused naming where it is (file and line, variable
/// and entry, flag and occurrence), never its text: it may be a secret.
pub(crate) fn kafka_settings(
    file: Option<&std::path::Path>,
    env: Option<&str>,
    flags: &[String],
) -> Result<Vec<(String, String)>, Fatal> {
    let mut settings = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Fatal(format!(
                "cannot read --kafka-config-file / OUTBOX_KAFKA_CONFIG_FILE {}: {e}",
                path.display()
            ))
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            settings.push(setting(line).ok_or_else(|| {
                Fatal(format!(
                    "--kafka-config-file {} line {}: expected `key=value`",
                    path.display(),
                    n + 1
                ))
            })?);
        }
    }
    if let Some(env) = env {
        for (n, entry) in config_list(env).into_iter().enumerate() {
            settings.push(setting(entry).ok_or_else(|| {
                Fatal(format!(
                    "OUTBOX_KAFKA_CONFIG entry {}: expected `key=value`",
                    n + 1
                ))
            })?);
        }
    }
    for (n, entry) in flags.iter().enumerate() {
        settings.push(setting(entry).ok_or_else(|| {
            Fatal(format!(
                "--kafka-config occurrence {}: expected `key=value`",
                n + 1
            ))
        })?);
    }
    Ok(settings)
}

/// `key=value`, both trimmed; the key non-empty and without whitespace.
fn setting(entry: &str) -> Option<(String, String)> {
    let (key, value) = entry.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.contains(char::is_whitespace))
        .then(|| (key.to_owned(), value.trim().to_owned()))
}

/// The entries of an `OUTBOX_KAFKA_CONFIG` list: split at line ends, and at commas followed by
/// `key=` (a comma followed by anything else belongs to the value, as in
/// `bootstrap.servers=a:9092,b:9092`). Blank entries are dropped.
fn config_list(list: &str) -> Vec<&str> {
    let starts_setting = |rest: &str| {
        let rest = rest.trim_start();
        let key_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
            .unwrap_or(rest.len());
        key_len > 0 && rest[key_len..].starts_with('=')
    };
    let mut entries = Vec::new();
    for line in list.lines() {
        let mut start = 0;
        for (i, c) in line.char_indices() {
            if c == ',' && starts_setting(&line[i + 1..]) {
                entries.push(&line[start..i]);
                start = i + 1;
            }
        }
        entries.push(&line[start..]);
    }
    entries.retain(|e| !e.trim().is_empty());
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(String, String)]) -> Vec<(&str, &str)> {
        v.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    #[test]
    fn ring_product_must_fit_bigint() {
        use outbox::relay::partitions::{DEFAULT_SLOT_XIDS, MAX_RING_XIDS};
        assert!(check_ring(4, DEFAULT_SLOT_XIDS).is_ok());
        assert!(check_ring(4, MAX_RING_XIDS / 4).is_ok());
        // Accepted before: its product with --slots overflows bigint.
        let Err(Fatal(e)) = check_ring(4, i64::MAX as u64) else {
            panic!("an overflowing ring must be refused")
        };
        assert!(e.contains("--slot-xids") && e.contains("--slots"), "{e}");
        assert!(e.contains(&(MAX_RING_XIDS / 4).to_string()), "{e}");
        assert!(check_ring(4, MAX_RING_XIDS / 4 + 1).is_err());
        assert!(check_ring(1, 10).is_err() && check_ring(65, 10).is_err());
        assert!(check_ring(4, 0).is_err());
    }

    #[test]
    fn older_than_at_most_ten_years() {
        let day = std::time::Duration::from_secs(86_400);
        assert!(check_older_than(day * 3650).is_ok());
        let Err(Fatal(e)) = check_older_than(day * 365 * 300_000) else {
            panic!("300,000 years must be refused")
        };
        assert!(e.contains("--older-than"), "{e}");
    }

    #[test]
    fn counts_refuse_zero() {
        assert_eq!(at_least_one("3"), Ok(3));
        assert!(at_least_one("0").is_err());
        assert!(batch_rows("100001").is_err());
        assert_eq!(batch_rows("100000"), Ok(100_000));
    }

    #[test]
    fn kafka_config_env_splits_entries_but_not_values() {
        let got = kafka_settings(
            None,
            Some("bootstrap.servers=a:9092,b:9092, sasl.username=u\nsasl.password=p,w=x,y"),
            &[],
        )
        .unwrap_or_else(|Fatal(e)| panic!("{e}"));
        assert_eq!(
            pairs(&got),
            [
                ("bootstrap.servers", "a:9092,b:9092"),
                ("sasl.username", "u"),
                ("sasl.password", "p"),
                ("w", "x,y"),
            ]
        );
    }

    #[test]
    fn kafka_config_file_then_env_then_flags() {
        let dir = std::env::temp_dir().join(format!("outbox-kafka-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kafka.properties");
        std::fs::write(
            &path,
            "# the cluster\n\nsasl.password = from-file\nlinger.ms=5\n  # indented comment\nacks=all\n",
        )
        .unwrap();
        let got = kafka_settings(
            Some(&path),
            Some("linger.ms=10"),
            &["linger.ms=20".to_owned()],
        )
        .unwrap_or_else(|Fatal(e)| panic!("{e}"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            pairs(&got),
            [
                ("sasl.password", "from-file"),
                ("linger.ms", "5"),
                ("acks", "all"),
                ("linger.ms", "10"),
                ("linger.ms", "20"),
            ]
        );
    }

    #[test]
    fn kafka_config_bad_entries_name_their_place_not_their_text() {
        let dir = std::env::temp_dir().join(format!("outbox-kafka-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kafka.properties");
        std::fs::write(&path, "linger.ms=5\n# ok\nhunter2-secret\n").unwrap();
        let Err(Fatal(e)) = kafka_settings(Some(&path), None, &[]) else {
            panic!("a line without `=` must be refused")
        };
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            e.contains("line 3") && e.contains("kafka.properties"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");

        let Err(Fatal(e)) = kafka_settings(None, Some("acks=all\nhunter2-secret"), &[]) else {
            panic!("an entry without `=` must be refused")
        };
        assert!(
            e.contains("OUTBOX_KAFKA_CONFIG entry 2") && !e.contains("hunter2"),
            "{e}"
        );

        let flags = ["acks=all".to_owned(), "hunter2-secret".to_owned()];
        let Err(Fatal(e)) = kafka_settings(None, None, &flags) else {
            panic!("a flag without `=` must be refused")
        };
        assert!(
            e.contains("--kafka-config occurrence 2") && !e.contains("hunter2"),
            "{e}"
        );

        let Err(Fatal(e)) = kafka_settings(Some(std::path::Path::new("/nonexistent/k")), None, &[])
        else {
            panic!("a missing file must be refused")
        };
        assert!(e.contains("/nonexistent/k"), "{e}");
    }
}
