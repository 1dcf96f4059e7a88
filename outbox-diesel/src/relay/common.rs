//! Pieces shared by the relay stores.

use outbox_core::Headers;
use outbox_core::relay::StoreError;

/// A store that cannot connect, with what to do about it.
pub type ConnectError = StoreError;

/// A connection failure, worded for the operator.
pub fn connect_error(backend: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::new(
        "connect",
        format!("cannot connect to {backend}: {e} (is the server up and the URL right?)"),
    )
}

/// Headers as stored: a JSON object. Values that other programs wrote as non-strings are kept
/// as their JSON text rather than dropped.
pub(crate) fn parse_headers(json: &str) -> Headers {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json) {
        Ok(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        Err(_) => Headers::new(),
    }
}

/// Seconds as the databases' interval arithmetic takes them.
pub(crate) fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// `ceil(SHARD_COUNT / live)`: each relay's fair share of shards.
pub(crate) fn fair_share(live: i64) -> i64 {
    let shards = i64::from(outbox_core::SHARD_COUNT);
    let live = live.max(1);
    (shards + live - 1) / live
}
