//! `RelayConfig::validate`.

use super::*;

fn error_of(change: impl FnOnce(&mut RelayConfig)) -> String {
    let mut config = RelayConfig::default();
    change(&mut config);
    config.validate().unwrap_err().to_string()
}

#[test]
fn the_default_is_valid_and_ordered() {
    assert!(RelayConfig::default().validate().is_ok());
    assert_eq!(RelayConfig::default().mode, Mode::Sharded);
}

#[test]
fn every_mode_parses_by_its_name() {
    for (name, mode) in [
        ("unordered", Mode::Unordered),
        ("sharded", Mode::Sharded),
        ("leader", Mode::Leader),
        ("stream", Mode::Stream),
    ] {
        assert_eq!(name.parse::<Mode>(), Ok(mode));
    }
    assert!("streams".parse::<Mode>().unwrap_err().contains("`stream`"));
}

type Change = Box<dyn FnOnce(&mut RelayConfig)>;

#[test]
fn every_setting_out_of_range_is_named() {
    let cases: Vec<(&str, Change)> = vec![
        (
            "lease",
            Box::new(|c| c.lease = Duration::from_secs(75 * 86_400)),
        ),
        ("lease", Box::new(|c| c.lease = Duration::from_millis(99))),
        (
            "publish_timeout",
            Box::new(|c| c.publish_timeout = Duration::ZERO),
        ),
        (
            "poll_interval",
            Box::new(|c| c.poll_interval = Duration::ZERO),
        ),
        (
            "poll_interval",
            Box::new(|c| c.poll_interval = Duration::from_secs(3601)),
        ),
        (
            "backoff.initial",
            Box::new(|c| c.backoff.initial = Duration::ZERO),
        ),
        (
            "backoff.max",
            Box::new(|c| c.backoff.max = Duration::from_millis(10)),
        ),
        (
            "backoff.multiplier",
            Box::new(|c| c.backoff.multiplier = 0.5),
        ),
        (
            "backoff.multiplier",
            Box::new(|c| c.backoff.multiplier = f64::NAN),
        ),
        ("backoff.jitter", Box::new(|c| c.backoff.jitter = -0.1)),
        (
            "outage_backoff.jitter",
            Box::new(|c| c.outage_backoff.jitter = 2.0),
        ),
        ("relay_id", Box::new(|c| c.relay_id = " ".into())),
        // MySQL's PAD SPACE collations compare "r1 " equal to "r1"; GET_LOCK does not.
        ("relay_id", Box::new(|c| c.relay_id = "r1 ".into())),
        ("relay_id", Box::new(|c| c.relay_id = "\tr1".into())),
        ("relay_id", Box::new(|c| c.relay_id = "r\u{0}1".into())),
        ("relay_id", Box::new(|c| c.relay_id = "r\n1".into())),
        (
            "retention.keep",
            Box::new(|c| {
                c.retention = Some(Retention {
                    keep: Duration::from_secs(u64::MAX),
                    batch: 1000,
                    every: Duration::from_secs(60),
                })
            }),
        ),
        (
            "retention.batch",
            Box::new(|c| {
                c.retention = Some(Retention {
                    keep: Duration::from_secs(3600),
                    batch: 0,
                    every: Duration::from_secs(60),
                })
            }),
        ),
        (
            "retention.every",
            Box::new(|c| {
                c.retention = Some(Retention {
                    keep: Duration::from_secs(3600),
                    batch: 10,
                    every: Duration::ZERO,
                })
            }),
        ),
    ];
    for (name, change) in cases {
        let e = error_of(change);
        assert!(e.starts_with(name), "{name}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
