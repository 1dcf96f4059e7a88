//! The fault class of Diesel's errors ([`outbox_core::fault`]): which are an outage of the
//! database (transient: a consumer waits and retries, for as long as it takes) and which are
//! the message's own (left to the default: permanent). Registered with the consumer runtime at
//! link time, so a handler that returns these errors (or an error whose `source()` chain holds
//! one) needs nothing more, and no feature of this crate has to be turned on for it.
//!
//! | error | class |
//! |---|---|
//! | `DatabaseError(SerializationFailure)`: PostgreSQL 40001, MySQL 1213 (deadlock) | transient |
//! | `DatabaseError(ClosedConnection)` (PostgreSQL 08000, 08001, 08004, 08006, or libpq's connection gone bad), `DatabaseError(UnableToSendCommand)` (the query never reached the server) | transient |
//! | `DatabaseError(ReadOnlyTransaction)`: a failover left us on a replica | transient |
//! | `DatabaseError` of another kind whose server message is one of [the outage messages](#the-outage-messages) | transient |
//! | `BrokenTransactionManager` (the connection failed mid-transaction) | transient |
//! | `diesel::ConnectionError`, every variant: the database cannot be reached (or not as configured); no message is at fault | transient |
//! | `connect::ConnectError` (feature `async`), every variant: the same, for connections opened by `connect::postgres` | transient |
//! | r2d2's `diesel::r2d2::PoolError` (its timeout) and its manager's `diesel::r2d2::Error` | transient |
//! | diesel-async's deadpool `PoolError` (timeout, closed, backend), bb8 `RunError` (timeout, backend) and `pooled_connection::PoolError` | transient (a post-create hook's error is the user's: left to its own chain) |
//! | anything else (`NotFound`, constraint violations, invalid input, deserialization, ...) | not decided here: permanent unless another link of the chain says otherwise |
//!
//! An error of a pool or of its connection manager comes from getting, making or checking a
//! connection, which involves no message: whatever it wraps, it is transient. The pools are
//! recognised whenever the connections they hold can exist: diesel-async's with
//! the `async` feature (which always builds diesel-async's `deadpool` and `bb8` support for
//! this), r2d2's with `r2d2` or `kafka` on the `outbox` crate (the consumer runtime needs it).
//!
//! # The outage messages
//!
//! Diesel keeps an error's SQLSTATE or MySQL error number only as its [`DatabaseErrorKind`]:
//! libpq's and mysqlclient's codes and diesel-async's `tokio_postgres::Error` and
//! `mysql_async::ServerError` are turned into a kind and a boxed
//! [`DatabaseErrorInformation`](diesel::result::DatabaseErrorInformation), which has no code
//! and cannot be downcast. Every code Diesel has no kind for is `Unknown`, with the server's
//! primary message (PostgreSQL's `MESSAGE_PRIMARY`, without `ERROR:`; MySQL's message text).
//! So the outages below are recognised by that message, and only where the message is one the
//! server writes in full, or begins with a fixed text the server writes before any value: the
//! whole message equals the text (`=`), begins with it (`^`), or begins with the first text and
//! ends with the second (`^ … $`). A message that quotes a value (`invalid input syntax for
//! type integer: "timed out"`, `Incorrect integer value: 'timed out' for column ...`) never
//! matches, whatever the value says. The texts are the servers' English ones (`lc_messages`,
//! the default): a server speaking another language has its outages taken for the message's
//! fault. A function of yours that raises (`RAISE EXCEPTION '%'`, `SIGNAL ... MESSAGE_TEXT`)
//! a message equal to one of these is taken for that outage too.
//!
//! | code | text |
//! |---|---|
//! | PG 57014 query_canceled | `= canceling statement due to statement timeout`, `= canceling statement due to user request` |
//! | PG 55P03 lock_not_available | `= canceling statement due to lock timeout`, `^ could not obtain lock on ` |
//! | PG 40P01 deadlock_detected | `= deadlock detected` |
//! | PG 53100 disk_full | `^ could not extend file `, `^ could not write to file … $ No space left on device` |
//! | PG 53200 out_of_memory | `= out of memory` |
//! | PG 53300 too_many_connections | `= sorry, too many clients already`, `^ remaining connection slots are reserved for `, `^ too many connections for role `, `^ too many connections for database ` |
//! | PG 57P01, 57P02, 57P04, 57P05, 25P03, 25P04 (the server ends the session) | `^ terminating connection ` |
//! | PG 57P03 cannot_connect_now | `^ the database system is ` |
//! | PG 55000, `ALLOW_CONNECTIONS false` | `^ database " … $ " is not currently accepting connections` |
//! | libpq, connection lost (08xxx without a server message) | `^ server closed the connection unexpectedly`, `= no connection to the server`, `^ could not receive data from server`, `^ could not send data to server`, `^ SSL SYSCALL error`, `^ SSL connection has been closed unexpectedly` |
//! | MySQL 1205 | `= Lock wait timeout exceeded; try restarting transaction` |
//! | MySQL 1213 (diesel-async has no kind for it) | `= Deadlock found when trying to get lock; try restarting transaction` |
//! | MySQL 1040 | `= Too many connections` |
//! | MySQL 1053 | `= Server shutdown in progress` |
//! | MySQL 1290 (read-only) | `^ The MySQL server is running with the --read-only option`, `^ The MySQL server is running with the --super-read-only option`, `^ The MariaDB server is running with the --read-only option` |
//! | MySQL 1021, 1114 (disk or table full) | `^ Disk full (`, `^ The table ' … $ ' is full` |
//! | MySQL 1037, 1041, 1038 (out of memory) | `^ Out of memory; `, `^ Out of sort memory` |
//! | MySQL 3024, MariaDB 1969, 1317 (statement time exceeded, query interrupted) | `= Query execution was interrupted, maximum statement execution time exceeded`, `= Query execution was interrupted (max_statement_time exceeded)`, `= Query execution was interrupted` |
//! | MariaDB 1927, MySQL 4031 (connection killed, idle timeout) | `= Connection was killed`, `^ The client was disconnected by the server because of inactivity` |
//! | client 2002, 2003 (MySQL's and MariaDB's client libraries) | `^ Can't connect to local `, `^ Can't connect to MySQL server on `, `^ Can't connect to server on ` |
//! | client 2006, 2013, 2055 | `= MySQL server has gone away`, `= Server has gone away`, `^ Lost connection to ` |
//! | SQLite `SQLITE_BUSY`, `SQLITE_LOCKED` (another connection's lock, past the busy timeout) | `= database is locked`, `^ database table is locked` |
//! | mysql_async (diesel-async), io and closed connections | `^ Input/output error: `, ``= Driver error: `Connection to the server is closed.'`` |
//!
//! Not recognised (so permanent, which dead-letters): an outage whose message is translated,
//! and any other code Diesel has no kind for, e.g. PostgreSQL's 58xxx system errors.

use std::error::Error;

use diesel::result::{DatabaseErrorKind, Error as QueryError};
use outbox_core::fault::{Classifier, ErrorClass};

#[linkme::distributed_slice(outbox_core::fault::CLASSIFIERS)]
static DIESEL: Classifier = classify;

/// How a server message is matched: never as a substring, so that a value quoted inside a
/// message cannot decide.
#[derive(Debug, Clone, Copy)]
enum Text {
    /// The whole message.
    Is(&'static str),
    /// The message begins with this text, which the server writes before any value.
    StartsWith(&'static str),
    /// The message begins with the first text and ends with the second.
    Around(&'static str, &'static str),
}

impl Text {
    fn matches(self, message: &str) -> bool {
        match self {
            Text::Is(text) => message == text,
            Text::StartsWith(prefix) => message.starts_with(prefix),
            Text::Around(prefix, suffix) => {
                message.len() >= prefix.len() + suffix.len()
                    && message.starts_with(prefix)
                    && message.ends_with(suffix)
            }
        }
    }
}

/// The outage messages, each with the code it stands for (see the module documentation).
const OUTAGES: &[(&str, Text)] = {
    use Text::*;
    &[
        // PostgreSQL
        ("57014", Is("canceling statement due to statement timeout")),
        ("57014", Is("canceling statement due to user request")),
        ("55P03", Is("canceling statement due to lock timeout")),
        ("55P03", StartsWith("could not obtain lock on ")),
        ("40P01", Is("deadlock detected")),
        ("53100", StartsWith("could not extend file ")),
        (
            "53100",
            Around("could not write to file ", "No space left on device"),
        ),
        ("53200", Is("out of memory")),
        ("53300", Is("sorry, too many clients already")),
        (
            "53300",
            StartsWith("remaining connection slots are reserved for "),
        ),
        ("53300", StartsWith("too many connections for role ")),
        ("53300", StartsWith("too many connections for database ")),
        ("57P01", StartsWith("terminating connection ")),
        ("57P03", StartsWith("the database system is ")),
        (
            "55000",
            Around("database \"", "\" is not currently accepting connections"),
        ),
        // libpq, the connection lost before or without a server message
        (
            "08006",
            StartsWith("server closed the connection unexpectedly"),
        ),
        ("08003", Is("no connection to the server")),
        ("08006", StartsWith("could not receive data from server")),
        ("08006", StartsWith("could not send data to server")),
        ("08006", StartsWith("SSL SYSCALL error")),
        (
            "08006",
            StartsWith("SSL connection has been closed unexpectedly"),
        ),
        // MySQL / MariaDB server
        (
            "1205",
            Is("Lock wait timeout exceeded; try restarting transaction"),
        ),
        (
            "1213",
            Is("Deadlock found when trying to get lock; try restarting transaction"),
        ),
        ("1040", Is("Too many connections")),
        ("1053", Is("Server shutdown in progress")),
        (
            "1290",
            StartsWith("The MySQL server is running with the --read-only option"),
        ),
        (
            "1290",
            StartsWith("The MySQL server is running with the --super-read-only option"),
        ),
        (
            "1290",
            StartsWith("The MariaDB server is running with the --read-only option"),
        ),
        ("1021", StartsWith("Disk full (")),
        ("1114", Around("The table '", "' is full")),
        ("1037", StartsWith("Out of memory; ")),
        ("1038", StartsWith("Out of sort memory")),
        (
            "3024",
            Is("Query execution was interrupted, maximum statement execution time exceeded"),
        ),
        (
            "1969",
            Is("Query execution was interrupted (max_statement_time exceeded)"),
        ),
        ("1317", Is("Query execution was interrupted")),
        ("1927", Is("Connection was killed")),
        (
            "4031",
            StartsWith("The client was disconnected by the server because of inactivity"),
        ),
        // MySQL / MariaDB client libraries (mysqlclient)
        ("2002", StartsWith("Can't connect to local ")),
        ("2003", StartsWith("Can't connect to MySQL server on ")),
        ("2003", StartsWith("Can't connect to server on ")),
        ("2006", Is("MySQL server has gone away")),
        ("2006", Is("Server has gone away")),
        ("2013", StartsWith("Lost connection to ")),
        // SQLite: another connection holds the lock past the busy timeout
        ("SQLITE_BUSY", Is("database is locked")),
        ("SQLITE_LOCKED", StartsWith("database table is locked")),
        // mysql_async (diesel-async): its own errors as text, never a server message
        ("io", StartsWith("Input/output error: ")),
        (
            "closed",
            Is("Driver error: `Connection to the server is closed.'"),
        ),
    ]
};

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
/// // A value quoted in a message decides nothing.
/// let invalid = Error::DatabaseError(
///     DatabaseErrorKind::Unknown,
///     Box::new(r#"invalid input syntax for type integer: "deadlock detected""#.to_owned()),
/// );
/// assert_eq!(classify(&invalid), None);
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
    // `connect::postgres`'s: the database cannot be reached, or not as the URL says.
    #[cfg(feature = "async")]
    if e.is::<crate::connect::ConnectError>() {
        return Some(ErrorClass::Transient);
    }
    #[cfg(feature = "r2d2")]
    {
        if e.is::<diesel::r2d2::PoolError>() {
            return Some(ErrorClass::Transient);
        }
        // The manager's: connecting, or the ping that checks a connection.
        if e.is::<diesel::r2d2::Error>() {
            return Some(ErrorClass::Transient);
        }
    }
    #[cfg(feature = "async")]
    if let Some(class) = async_pool_class(e) {
        return class;
    }
    None
}

/// diesel-async's pools: `Some(class)` for one of their errors.
#[cfg(feature = "async")]
fn async_pool_class(e: &(dyn Error + 'static)) -> Option<Option<ErrorClass>> {
    use diesel_async::pooled_connection::{PoolError, bb8, deadpool};
    if let Some(e) = e.downcast_ref::<deadpool::PoolError>() {
        return Some(match e {
            // Post-create hooks are the user's: let their error decide.
            deadpool::PoolError::PostCreateHook(_) => None,
            _ => Some(ErrorClass::Transient),
        });
    }
    (e.is::<bb8::RunError>() || e.is::<PoolError>()).then_some(Some(ErrorClass::Transient))
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
            _ => outage_code(info.message()).map(|_| ErrorClass::Transient),
        },
        QueryError::BrokenTransactionManager => Some(ErrorClass::Transient),
        _ => None,
    }
}

/// The code of the outage `message` is the message of (see [`OUTAGES`]), if it is one.
fn outage_code(message: &str) -> Option<&'static str> {
    OUTAGES
        .iter()
        .find(|(_, text)| text.matches(message))
        .map(|&(code, _)| code)
}

#[cfg(test)]
mod tests;
