//! Ending a transaction on an error while keeping that error.

/// The error to report once a transaction that failed with `kept` (the closure's, the body's,
/// or the inbox claim's error) has been rolled back: `kept`, unless the rollback failed too in
/// a way that leaves the connection unusable, which the caller must hear about instead.
/// A rollback that finds the transaction manager broken is most likely a consequence of `kept`,
/// which says more: `kept` is reported then too, as Diesel's own `transaction` does.
pub(crate) fn keep_error<E: From<diesel::result::Error>>(
    rollback: diesel::QueryResult<()>,
    kept: E,
) -> E {
    match rollback {
        Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => kept,
        Err(rollback) => rollback.into(),
    }
}
