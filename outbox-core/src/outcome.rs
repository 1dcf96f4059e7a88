//! [`Outcome`]: what an idempotent consumer did with a message.

/// What an idempotent consumer did with a message: applied it, or recognised it as one it had
/// already applied.
///
/// `#[idempotent]` functions return `Result<Outcome<T>, E>`: `Ok(Applied(v))` when the body ran
/// and its transaction committed together with the inbox row, `Ok(Duplicate)` when the inbox
/// already held the message's key and the body did not run. Both mean the message is done (a
/// Kafka consumer may commit its offset); only `Err` means it should be retried.
///
/// ```
/// use outbox_core::Outcome;
/// let applied: Outcome<u32> = Outcome::Applied(7);
/// assert!(applied.is_applied());
/// assert_eq!(applied.applied(), Some(7));
/// assert_eq!(Outcome::<u32>::Duplicate.map(|v| v + 1), Outcome::Duplicate);
/// ```
#[must_use = "an `Outcome` says whether the message was applied or was a duplicate"]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome<T> {
    /// The body ran and its effects committed, with the inbox row, in one transaction.
    Applied(T),
    /// The inbox already held this message's key for this consumer: it was applied before
    /// (by an earlier delivery or by a concurrent consumer), and the body did not run.
    Duplicate,
}

impl<T> Outcome<T> {
    /// Whether the body ran.
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied(_))
    }

    /// Whether the message was recognised as already applied.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate)
    }

    /// The body's value, if it ran.
    pub fn applied(self) -> Option<T> {
        match self {
            Outcome::Applied(v) => Some(v),
            Outcome::Duplicate => None,
        }
    }

    /// Maps the body's value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Applied(v) => Outcome::Applied(f(v)),
            Outcome::Duplicate => Outcome::Duplicate,
        }
    }
}
