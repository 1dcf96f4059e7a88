//! The fault class of Diesel's errors ([`outbox_core::fault`]): which are an outage of the
//! database (transient: a consumer waits and retries) and which are the message's own
//! (permanent). Registered with the consumer runtime at link time, so a handler that returns
//! these errors (or an error whose `source()` chain holds one) needs nothing more.
//!
//! | error | class |
//! |---|---|
//! | `DatabaseError(SerializationFailure)`: PostgreSQL 40001, MySQL 1213 (deadlock) | transient |
//! | `DatabaseError(ClosedConnection)`, `DatabaseError(UnableToSendCommand)` | transient |
//! | `DatabaseError(ReadOnlyTransaction)`: a failover left us on a replica | transient |
//! | `DatabaseError(Unknown)` whose message is an outage (below) | transient |
//! | `BrokenTransactionManager` (the connection failed mid-transaction) | transient |
//! | `diesel::ConnectionError`, every variant: the database cannot be reached (or not as configured); no message is at fault | transient |
//! | `diesel::r2d2::PoolError` (r2d2's timeout), `diesel::r2d2::Error` | transient (its query error as above) |
//! | diesel-async's deadpool `PoolError` (timeout, closed, backend) and bb8 `RunError` (timeout, backend), features `deadpool`, `bb8` | transient (a query error as above) |
//! | anything else (`NotFound`, constraint violations, deserialization, ...) | not decided here: permanent unless another link of the chain says otherwise |
//!
//! Neither libpq nor diesel-async hands Diesel the SQLSTATE of an error it has no kind for
//! (PostgreSQL's deadlock 40P01, lock timeout 55P03, `the database system is starting up`
//! 57P03, ...), nor does diesel-async keep MySQL's error number for most errors: those are
//! recognised by the server's message, which assumes the server's messages are in English
//! (`lc_messages`), the default.

use std::error::Error;

use diesel::result::{DatabaseErrorKind, Error as QueryError};
use outbox_core::fault::{Classifier, ErrorClass};

#[linkme::distributed_slice(outbox_core::fault::CLASSIFIERS)]
static DIESEL: Classifier = classify;

/// Server and driver messages of an outage, lowercase: PostgreSQL, MySQL/MariaDB, and the io
/// errors the async drivers report as text.
const OUTAGE_MESSAGES: &[&str] = &[
    // PostgreSQL
    "deadlock detected",                        // 40P01
    "canceling statement due to lock timeout",  // 55P03
    "could not obtain lock",                    // 55P03 (NOWAIT)
    "the database system is starting up",       // 57P03
    "the database system is shutting down",     // 57P03
    "the database system is in recovery mode",  // 57P03
    "the database system is not yet accepting", // 57P03
    "terminating connection due to",            // 57P01, 57P02, 57P05
    "sorry, too many clients already",          // 53300
    "remaining connection slots are reserved",  // 53300
    "server closed the connection unexpectedly",
    "connection to server",
    "could not connect to server",
    // MySQL / MariaDB
    "deadlock found when trying to get lock", // 1213
    "lock wait timeout exceeded",             // 1205
    "server has gone away",                   // 2006
    "lost connection to",                     // 2013
    "can't connect to",                       // 2002, 2003
    "server shutdown in progress",            // 1053
    "too many connections",                   // 1040
    "--read-only option",                     // 1290
    // io errors as text (mysql_async, tokio-postgres)
    "connection refused",
    "connection reset",
    "broken pipe",
    "connection aborted",
    "timed out",
    "unexpected eof",
];

/// Classifies Diesel's error types (see the [module documentation](self)); `None` for any
/// other error, or for a Diesel error that is not an outage.
///
/// ```
/// use diesel::result::{DatabaseErrorKind, Error};
/// use outbox_core::fault::ErrorClass;
/// use outbox_diesel::fault::classify;
///
/// let deadlock = Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new("deadlock detected".to_owned()));
/// assert_eq!(classify(&deadlock), Some(ErrorClass::Transient));
/// assert_eq!(classify(&Error::NotFound), None);
/// // Registered: the consumer runtime's `classify` knows it.
/// assert_eq!(outbox_core::fault::classify(&deadlock, &[]), ErrorClass::Transient);
/// ```
pub fn classify(e: &(dyn Error + 'static)) -> Option<ErrorClass> {
    if let Some(e) = e.downcast_ref::<QueryError>() {
        return query_error_class(e);
    }
    if e.is::<diesel::ConnectionError>() {
        return Some(ErrorClass::Transient);
    }
    #[cfg(feature = "r2d2")]
    {
        if e.is::<diesel::r2d2::PoolError>() {
            return Some(ErrorClass::Transient);
        }
        if let Some(e) = e.downcast_ref::<diesel::r2d2::Error>() {
            return match e {
                diesel::r2d2::Error::ConnectionError(_) => Some(ErrorClass::Transient),
                diesel::r2d2::Error::QueryError(e) => query_error_class(e),
            };
        }
    }
    #[cfg(feature = "deadpool")]
    if let Some(e) = e.downcast_ref::<diesel_async::pooled_connection::deadpool::PoolError>() {
        use diesel_async::pooled_connection::deadpool::PoolError;
        return match e {
            PoolError::Backend(e) => async_pool_error_class(e),
            // Post-create hooks are the user's: let their error decide.
            PoolError::PostCreateHook(_) => None,
            _ => Some(ErrorClass::Transient),
        };
    }
    #[cfg(feature = "bb8")]
    if let Some(e) = e.downcast_ref::<diesel_async::pooled_connection::bb8::RunError>() {
        use diesel_async::pooled_connection::bb8::RunError;
        return match e {
            RunError::User(e) => async_pool_error_class(e),
            RunError::TimedOut => Some(ErrorClass::Transient),
        };
    }
    #[cfg(any(feature = "deadpool", feature = "bb8"))]
    if let Some(e) = e.downcast_ref::<diesel_async::pooled_connection::PoolError>() {
        return async_pool_error_class(e);
    }
    None
}

#[cfg(any(feature = "deadpool", feature = "bb8"))]
fn async_pool_error_class(e: &diesel_async::pooled_connection::PoolError) -> Option<ErrorClass> {
    use diesel_async::pooled_connection::PoolError;
    match e {
        PoolError::ConnectionError(_) => Some(ErrorClass::Transient),
        PoolError::QueryError(e) => query_error_class(e),
    }
}

fn query_error_class(e: &QueryError) -> Option<ErrorClass> {
    match e {
        QueryError::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::SerializationFailure
            | DatabaseErrorKind::ClosedConnection
            | DatabaseErrorKind::UnableToSendCommand
            | DatabaseErrorKind::ReadOnlyTransaction => Some(ErrorClass::Transient),
            DatabaseErrorKind::UniqueViolation
            | DatabaseErrorKind::ForeignKeyViolation
            | DatabaseErrorKind::NotNullViolation
            | DatabaseErrorKind::CheckViolation
            | DatabaseErrorKind::RestrictViolation
            | DatabaseErrorKind::ExclusionViolation => None,
            _ => message_class(info.message()),
        },
        QueryError::BrokenTransactionManager => Some(ErrorClass::Transient),
        _ => None,
    }
}

fn message_class(message: &str) -> Option<ErrorClass> {
    let message = message.to_lowercase();
    OUTAGE_MESSAGES
        .iter()
        .any(|m| message.contains(m))
        .then_some(ErrorClass::Transient)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(kind: DatabaseErrorKind, message: &str) -> QueryError {
        QueryError::DatabaseError(kind, Box::new(message.to_owned()))
    }

    #[test]
    fn outages_of_the_database_are_transient() {
        use DatabaseErrorKind::*;
        let transient = [
            db(
                SerializationFailure,
                "could not serialize access due to concurrent update",
            ),
            db(
                SerializationFailure,
                "Deadlock found when trying to get lock; try restarting transaction",
            ),
            db(
                ClosedConnection,
                "server closed the connection unexpectedly",
            ),
            db(
                UnableToSendCommand,
                "error communicating with the server: Connection refused",
            ),
            db(
                ReadOnlyTransaction,
                "cannot execute INSERT in a read-only transaction",
            ),
            db(Unknown, "deadlock detected"),
            db(Unknown, "canceling statement due to lock timeout"),
            db(Unknown, "FATAL:  the database system is starting up"),
            db(Unknown, "the database system is shutting down"),
            db(
                Unknown,
                "terminating connection due to administrator command",
            ),
            db(
                Unknown,
                "Lock wait timeout exceeded; try restarting transaction",
            ),
            db(Unknown, "MySQL server has gone away"),
            db(Unknown, "Lost connection to MySQL server during query"),
            db(
                Unknown,
                "Input/output error: Connection reset by peer (os error 104)",
            ),
            db(
                Unknown,
                "The MySQL server is running with the --read-only option",
            ),
            QueryError::BrokenTransactionManager,
        ];
        for e in &transient {
            assert_eq!(classify(e), Some(ErrorClass::Transient), "{e:?}");
        }
        for e in [
            diesel::ConnectionError::BadConnection("connection refused".into()),
            diesel::ConnectionError::InvalidConnectionUrl("nope".into()),
        ] {
            assert_eq!(classify(&e), Some(ErrorClass::Transient), "{e:?}");
        }
    }

    #[test]
    fn the_messages_own_faults_are_left_to_the_default() {
        use DatabaseErrorKind::*;
        for e in [
            QueryError::NotFound,
            db(
                UniqueViolation,
                "duplicate key value violates unique constraint",
            ),
            db(CheckViolation, "new row violates check constraint"),
            db(
                ForeignKeyViolation,
                "insert or update violates foreign key constraint",
            ),
            db(NotNullViolation, "null value in column"),
            db(Unknown, "division by zero"),
            db(Unknown, "relation \"invoices\" does not exist"),
            QueryError::RollbackTransaction,
        ] {
            assert_eq!(classify(&e), None, "{e:?}");
            assert_eq!(
                outbox_core::fault::classify(&e, &[]),
                ErrorClass::Permanent,
                "{e:?}"
            );
        }
    }

    #[test]
    fn the_classifier_is_registered_and_reached_through_a_users_error() {
        #[derive(Debug)]
        struct BillingError(QueryError);
        impl std::fmt::Display for BillingError {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("billing failed")
            }
        }
        impl Error for BillingError {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = BillingError(db(DatabaseErrorKind::Unknown, "deadlock detected"));
        assert_eq!(outbox_core::fault::classify(&e, &[]), ErrorClass::Transient);
        let e = BillingError(QueryError::NotFound);
        assert_eq!(outbox_core::fault::classify(&e, &[]), ErrorClass::Permanent);
    }

    #[cfg(feature = "r2d2")]
    #[test]
    fn r2d2s_errors_are_classified() {
        let e = diesel::r2d2::Error::QueryError(db(DatabaseErrorKind::SerializationFailure, "x"));
        assert_eq!(classify(&e), Some(ErrorClass::Transient));
        let e = diesel::r2d2::Error::ConnectionError(diesel::ConnectionError::BadConnection(
            "refused".into(),
        ));
        assert_eq!(classify(&e), Some(ErrorClass::Transient));
    }

    #[cfg(feature = "bb8")]
    #[test]
    fn bb8s_errors_are_classified() {
        use diesel_async::pooled_connection::PoolError;
        use diesel_async::pooled_connection::bb8::RunError;
        assert_eq!(classify(&RunError::TimedOut), Some(ErrorClass::Transient));
        let user = RunError::User(PoolError::QueryError(QueryError::NotFound));
        assert_eq!(classify(&user), None);
        let refused = RunError::User(PoolError::ConnectionError(
            diesel::ConnectionError::BadConnection("refused".into()),
        ));
        assert_eq!(classify(&refused), Some(ErrorClass::Transient));
    }
}
