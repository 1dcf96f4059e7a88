//! Claimed rows that cannot be published as they are: found, dead-lettered, and the rows of
//! their aggregates held back.

use outbox_core::Headers;
use outbox_core::relay::{Failure, OutboxMessage, StoreError};

/// A claimed row the relay cannot publish as it is: dead-lettered at once (never published
/// with a field dropped or invented), with a `last_error` naming the column and its value.
pub(crate) fn malformed(seq: i64, column: &str, value: &str, why: &str) -> Failure {
    const SHOWN: usize = 120;
    let shown: String = value.chars().take(SHOWN).collect();
    let more = if value.chars().count() > SHOWN {
        "…"
    } else {
        ""
    };
    Failure {
        seq,
        error: format!(
            "malformed outbox row {seq}: column `{column}` {why} (value {shown:?}{more}); \
             dead-lettered, not published"
        ),
        retry_after: None,
    }
}

/// Headers as stored: a JSON object. Values that other programs wrote as non-strings are kept
/// as their JSON text (nothing dropped); anything but an object (an array, a string, `null`,
/// invalid JSON) makes the row malformed.
pub(crate) fn parse_headers(seq: i64, json: &str) -> Result<Headers, Failure> {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => Ok(map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect()),
        Ok(_) => Err(malformed(seq, "headers", json, "is not a JSON object")),
        Err(e) => Err(malformed(
            seq,
            "headers",
            json,
            &format!("is not valid JSON ({e})"),
        )),
    }
}

/// A claimed row that cannot be published: its failure (a dead letter) and its ordering key.
pub(crate) struct Malformed {
    pub failure: Failure,
    pub(super) key: (String, String),
}

impl Malformed {
    /// The row's aggregate: type, id.
    #[cfg(feature = "postgres_backend")]
    pub(crate) fn key(&self) -> &(String, String) {
        &self.key
    }
}

/// What a claim's rows come to: the messages to publish (in `seq` order), the malformed rows
/// to dead-letter, and the rows to give back because an earlier row of their aggregate in
/// the same claim is malformed (publishing them would skip it, breaking the aggregate's
/// order; the next claim decides by the dead-letter policy).
pub(crate) struct Sorted {
    pub publish: Vec<OutboxMessage>,
    pub malformed: Vec<Failure>,
    pub held_back: Vec<i64>,
}

/// Dead-letters a claim's malformed rows and gives back the rows held behind them (both are
/// leased to `relay` by the claim); returns the messages to publish.
pub(crate) async fn settle_malformed<S: outbox_core::relay::RelayStore>(
    store: &mut S,
    relay: &str,
    sorted: Sorted,
) -> Result<Vec<OutboxMessage>, StoreError> {
    if !sorted.malformed.is_empty() {
        store.fail(relay, &sorted.malformed).await?;
    }
    if !sorted.held_back.is_empty() {
        store.release(relay, &sorted.held_back).await?;
    }
    Ok(sorted.publish)
}

/// Sorts converted rows into [`Sorted`].
pub(crate) fn split_malformed(
    rows: impl IntoIterator<Item = Result<OutboxMessage, Malformed>>,
) -> Sorted {
    let mut rows: Vec<_> = rows.into_iter().collect();
    rows.sort_unstable_by_key(|r| match r {
        Ok(m) => m.seq,
        Err(m) => m.failure.seq,
    });
    let mut out = Sorted {
        publish: Vec::new(),
        malformed: Vec::new(),
        held_back: Vec::new(),
    };
    let mut bad_keys = std::collections::HashSet::new();
    for row in rows {
        match row {
            Ok(m) if bad_keys.contains(&(m.aggregate_type.clone(), m.aggregate_id.clone())) => {
                out.held_back.push(m.seq)
            }
            Ok(m) => out.publish.push(m),
            Err(m) => {
                let f = m.failure;
                tracing::error!(seq = f.seq, error = %f.error, "malformed outbox row dead-lettered");
                bad_keys.insert(m.key);
                out.malformed.push(f);
            }
        }
    }
    out
}

/// An event id stored as text (MySQL, SQLite). A malformed one makes the row malformed,
/// never a silently invented id.
#[cfg(any(feature = "mysql_backend", feature = "sqlite"))]
pub(crate) fn parse_id(seq: i64, id: &str) -> Result<uuid::Uuid, Failure> {
    uuid::Uuid::parse_str(id).map_err(|e| malformed(seq, "id", id, &format!("is not a UUID ({e})")))
}
