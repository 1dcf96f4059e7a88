//! The inbox: which messages each consumer has applied, written in the same transaction as the
//! consumer's effect so that a redelivered message is recognised and not applied twice.
//!
//! Delivery is at least once, so a consumer sees some messages more than once: the relay can
//! publish and die before it marks the row, a Kafka consumer can commit its effect and die
//! before it commits the offset. The inbox turns that into *exactly once in effect*: the
//! consumer's transaction first [claims](claim) `(consumer, key)` (the key is the event id
//! unless chosen otherwise), and runs its effect only if the claim is new. The claim and the
//! effect commit together, or neither does. `#[idempotent]` generates exactly this around a
//! function.
//!
//! The table is `outbox_inbox (consumer, message_id, processed_at)`, primary key
//! `(consumer, message_id)`, created by the outbox migrations. The claim is one statement:
//! `INSERT … ON CONFLICT DO NOTHING` on PostgreSQL, `INSERT IGNORE` on MySQL/MariaDB,
//! `INSERT OR IGNORE` on SQLite. Two consumers racing on one key are serialised by the
//! primary key: the second waits for the first transaction, then sees a duplicate if it
//! committed, or claims the key if it rolled back.
//!
//! # Retention
//!
//! The inbox grows by one row per message and consumer. [`cleanup`] deletes rows older than a
//! window, in bounded batches. **The window must be longer than the broker's redelivery
//! horizon**: the longest time after which a message can still arrive again, e.g. the Kafka
//! topic's retention (a consumer group reset to the earliest offset replays that far back), or
//! the longest a relay can leave a published row unmarked (its lease) plus how long a message
//! can stay in flight. A duplicate that arrives after its inbox row was deleted is applied
//! again. When in doubt, keep rows for as long as the topic keeps messages.
//!
//! # Example
//!
//! ```
//! # include!("doctest_setup.rs");
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut conn = establish();
//! use diesel::Connection;
//! use outbox_diesel::inbox;
//!
//! let first = conn.transaction(|conn| inbox::claim(conn, "billing", "0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a"))?;
//! let again = conn.transaction(|conn| inbox::claim(conn, "billing", "0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a"))?;
//! let other = conn.transaction(|conn| inbox::claim(conn, "shipping", "0190b1f6-5b1c-7cc3-9a4e-3f0e1d2c3b4a"))?;
//! assert_eq!((first, again, other), (true, false, true));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use diesel::Connection;

use crate::OutboxBackend;

/// The longest consumer name or key, in characters (the MySQL columns are `VARCHAR(255)`).
///
/// ```
/// assert_eq!(outbox_diesel::inbox::MAX_KEY_CHARS, 255);
/// ```
pub const MAX_KEY_CHARS: usize = 255;

/// Records that `consumer` applies the message `key`, unless it already did: `Ok(true)` if the
/// claim is new, `Ok(false)` if the inbox already holds it (a duplicate).
///
/// Call it inside the transaction that applies the message, before the effect, and run the
/// effect only on `true`: the claim then commits with the effect or rolls back with it.
/// Outside a transaction the claim commits on its own, and a failure of the effect afterwards
/// would leave the message marked as applied.
///
/// Fails with a [`diesel::result::Error::QueryBuilderError`] holding an [`InvalidInboxKey`] if
/// `consumer` or `key` is empty, longer than [`MAX_KEY_CHARS`], or ends with a space (MySQL
/// compares strings ignoring trailing spaces, so such keys would collide there and not
/// elsewhere); with the database's error otherwise.
///
/// ```
/// # include!("doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = establish();
/// use diesel::Connection;
/// let applied = conn.transaction(|conn| {
///     if !outbox_diesel::inbox::claim(conn, "billing", "order-7")? {
///         return Ok(false); // applied before: nothing to do
///     }
///     // ... the effect, on `conn` ...
///     Ok::<_, diesel::result::Error>(true)
/// })?;
/// assert!(applied);
///
/// let too_long = "k".repeat(256);
/// let err = conn.transaction(|conn| outbox_diesel::inbox::claim(conn, "billing", &too_long));
/// assert!(err.unwrap_err().to_string().contains("longer than 255 characters"));
/// # Ok(())
/// # }
/// ```
pub fn claim<C>(conn: &mut C, consumer: &str, key: &str) -> diesel::QueryResult<bool>
where
    C: Connection<Backend: OutboxBackend>,
{
    check(consumer, key)?;
    let rows = C::Backend::execute(conn, C::Backend::inbox_claim(consumer, key))?;
    Ok(rows == 1)
}

/// The async twin of [`claim`], for diesel-async connections.
///
/// ```
/// # include!("doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = establish_async().await;
/// use diesel_async::AsyncConnection;
/// let new = conn
///     .transaction(async |conn| outbox_diesel::inbox::claim_async(conn, "billing", "order-7").await)
///     .await?;
/// assert!(new);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn claim_async<C>(conn: &mut C, consumer: &str, key: &str) -> diesel::QueryResult<bool>
where
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
{
    check(consumer, key)?;
    let rows = C::Backend::execute_async(conn, C::Backend::inbox_claim(consumer, key)).await?;
    Ok(rows == 1)
}

/// Deletes the inbox rows processed more than `older_than` ago, `batch` rows per statement
/// (oldest first), until none is left; returns how many it deleted.
///
/// Each batch is its own short statement, so that locks are held briefly and the database's
/// log grows by one batch at a time: run it outside any transaction (inside one, every batch
/// stays locked until that transaction ends). Times are the database's clock (SQLite: this
/// process's), in UTC. `batch` is at least 1.
///
/// **Choose `older_than` longer than the broker's redelivery horizon** (see the
/// [module docs](self#retention)): a message redelivered after its row was deleted is applied
/// again.
///
/// ```
/// # include!("doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = establish();
/// use std::time::Duration;
/// use outbox_diesel::inbox;
///
/// for key in ["a", "b", "c"] {
///     inbox::claim(&mut conn, "billing", key)?;
/// }
/// // Nothing is a week old yet.
/// assert_eq!(inbox::cleanup(&mut conn, Duration::from_secs(7 * 24 * 3600), 1000)?, 0);
/// # std::thread::sleep(Duration::from_millis(5));
/// // Everything is older than a millisecond: deleted two rows at a time.
/// assert_eq!(inbox::cleanup(&mut conn, Duration::from_millis(1), 2)?, 3);
/// # Ok(())
/// # }
/// ```
pub fn cleanup<C>(conn: &mut C, older_than: Duration, batch: usize) -> diesel::QueryResult<u64>
where
    C: Connection<Backend: OutboxBackend>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let n = C::Backend::execute(conn, C::Backend::inbox_cleanup(older_than, batch))?;
        total += n as u64;
        if n < batch {
            return Ok(total);
        }
    }
}

/// The async twin of [`cleanup`].
///
/// ```
/// # include!("doctest_setup.rs");
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = establish_async().await;
/// use std::time::Duration;
/// let deleted = outbox_diesel::inbox::cleanup_async(&mut conn, Duration::from_secs(30 * 24 * 3600), 1000).await?;
/// assert_eq!(deleted, 0);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn cleanup_async<C>(
    conn: &mut C,
    older_than: Duration,
    batch: usize,
) -> diesel::QueryResult<u64>
where
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let n =
            C::Backend::execute_async(conn, C::Backend::inbox_cleanup(older_than, batch)).await?;
        total += n as u64;
        if n < batch {
            return Ok(total);
        }
    }
}

/// A consumer name or inbox key the inbox refuses (see [`claim`]).
///
/// ```
/// use outbox_diesel::inbox::InvalidInboxKey;
/// # include!("doctest_setup.rs");
/// # fn main() {
/// # let mut conn = establish();
/// let err = outbox_diesel::inbox::claim(&mut conn, "billing", "").unwrap_err();
/// let diesel::result::Error::QueryBuilderError(source) = err else { panic!() };
/// let invalid = source.downcast_ref::<InvalidInboxKey>().unwrap();
/// assert_eq!(invalid.to_string(), "invalid inbox key `` of consumer `billing`: it is empty");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidInboxKey {
    consumer: String,
    key: String,
    what: &'static str,
    reason: &'static str,
}

impl fmt::Display for InvalidInboxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if self.what == "key" {
            &self.key
        } else {
            &self.consumer
        };
        let shown: String = value.chars().take(80).collect();
        let ellipsis = if value.chars().count() > 80 {
            "…"
        } else {
            ""
        };
        match self.what {
            "key" => write!(
                f,
                "invalid inbox key `{shown}{ellipsis}` of consumer `{}`: {}",
                self.consumer, self.reason
            ),
            _ => write!(
                f,
                "invalid inbox consumer name `{shown}{ellipsis}`: {}",
                self.reason
            ),
        }
    }
}

impl std::error::Error for InvalidInboxKey {}

fn check(consumer: &str, key: &str) -> diesel::QueryResult<()> {
    for (what, value) in [("consumer", consumer), ("key", key)] {
        let reason = if value.is_empty() {
            "it is empty"
        } else if value.chars().count() > MAX_KEY_CHARS {
            "it is longer than 255 characters"
        } else if value.ends_with(' ') {
            "it ends with a space, which MySQL ignores when comparing"
        } else {
            continue;
        };
        return Err(diesel::result::Error::QueryBuilderError(Box::new(
            InvalidInboxKey {
                consumer: consumer.to_owned(),
                key: key.to_owned(),
                what,
                reason,
            },
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(consumer: &str, key: &str) -> String {
        match check(consumer, key) {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn keys_are_checked() {
        assert_eq!(message("billing", "k"), "ok");
        assert_eq!(message("billing", &"k".repeat(255)), "ok");
        assert_eq!(message("billing", &"é".repeat(255)), "ok");
        assert_eq!(
            message("billing", ""),
            "invalid inbox key `` of consumer `billing`: it is empty"
        );
        assert_eq!(
            message("", "k"),
            "invalid inbox consumer name ``: it is empty"
        );
        assert_eq!(
            message("billing", "k "),
            "invalid inbox key `k ` of consumer `billing`: it ends with a space, which MySQL \
             ignores when comparing"
        );
        let long = message("billing", &"k".repeat(256));
        assert_eq!(
            long,
            format!(
                "invalid inbox key `{}…` of consumer `billing`: it is longer than 255 characters",
                "k".repeat(80)
            )
        );
    }
}
