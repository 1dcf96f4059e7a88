use super::*;

fn db(kind: DatabaseErrorKind, message: &str) -> QueryError {
    QueryError::DatabaseError(kind, Box::new(message.to_owned()))
}

/// A message of each outage code, as the server writes it, with the code it stands for.
const OUTAGE_MESSAGES: &[(&str, &str)] = &[
    ("57014", "canceling statement due to statement timeout"),
    ("57014", "canceling statement due to user request"),
    ("55P03", "canceling statement due to lock timeout"),
    (
        "55P03",
        "could not obtain lock on row in relation \"invoices\"",
    ),
    ("55P03", "could not obtain lock on relation \"invoices\""),
    ("40P01", "deadlock detected"),
    (
        "53100",
        "could not extend file \"base/16384/16385\": No space left on device",
    ),
    (
        "53100",
        "could not write to file \"pg_wal/xlogtemp.123\": No space left on device",
    ),
    ("53200", "out of memory"),
    ("53300", "sorry, too many clients already"),
    (
        "53300",
        "remaining connection slots are reserved for roles with the SUPERUSER attribute",
    ),
    ("53300", "too many connections for role \"billing\""),
    ("53300", "too many connections for database \"billing\""),
    (
        "57P01",
        "terminating connection due to administrator command",
    ),
    (
        "57P01",
        "terminating connection because of crash of another server process",
    ),
    (
        "57P01",
        "terminating connection due to idle-session timeout",
    ),
    (
        "57P01",
        "terminating connection due to idle-in-transaction timeout",
    ),
    ("57P03", "the database system is starting up"),
    ("57P03", "the database system is shutting down"),
    ("57P03", "the database system is in recovery mode"),
    (
        "57P03",
        "the database system is not yet accepting connections",
    ),
    (
        "55000",
        "database \"billing\" is not currently accepting connections",
    ),
    (
        "08006",
        "server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally\n\tbefore or while processing the request.\n",
    ),
    ("08003", "no connection to the server"),
    (
        "08006",
        "could not receive data from server: Connection reset by peer",
    ),
    ("08006", "SSL SYSCALL error: EOF detected"),
    (
        "1205",
        "Lock wait timeout exceeded; try restarting transaction",
    ),
    (
        "1213",
        "Deadlock found when trying to get lock; try restarting transaction",
    ),
    ("1040", "Too many connections"),
    ("1053", "Server shutdown in progress"),
    (
        "1290",
        "The MySQL server is running with the --read-only option so it cannot execute this statement",
    ),
    (
        "1290",
        "The MySQL server is running with the --super-read-only option so it cannot execute this statement",
    ),
    (
        "1290",
        "The MariaDB server is running with the --read-only option so it cannot execute this statement",
    ),
    (
        "1021",
        "Disk full (/tmp/#sql_1.MAI); waiting for someone to free some space... (errno: 28 \"No space left on device\")",
    ),
    ("1114", "The table 'invoices' is full"),
    (
        "1037",
        "Out of memory; restart server and try again (needed 65536 bytes)",
    ),
    (
        "1037",
        "Out of memory; check if mysqld or some other process uses all available memory; if not, you may have to use 'ulimit' to allow mysqld to use more memory or you can add more swap space",
    ),
    (
        "1038",
        "Out of sort memory, consider increasing server sort buffer size",
    ),
    (
        "3024",
        "Query execution was interrupted, maximum statement execution time exceeded",
    ),
    (
        "1969",
        "Query execution was interrupted (max_statement_time exceeded)",
    ),
    ("1317", "Query execution was interrupted"),
    ("1927", "Connection was killed"),
    (
        "2002",
        "Can't connect to local MySQL server through socket '/run/mysqld/mysqld.sock' (2)",
    ),
    (
        "2002",
        "Can't connect to local server through socket '/run/mysqld/mysqld.sock' (2)",
    ),
    (
        "2003",
        "Can't connect to MySQL server on '127.0.0.1:3306' (111)",
    ),
    ("2003", "Can't connect to server on '127.0.0.1' (111)"),
    ("2006", "MySQL server has gone away"),
    ("2006", "Server has gone away"),
    ("2013", "Lost connection to MySQL server during query"),
    ("2013", "Lost connection to server during query"),
    ("SQLITE_BUSY", "database is locked"),
    ("SQLITE_LOCKED", "database table is locked: outbox_events"),
    (
        "io",
        "Input/output error: Connection reset by peer (os error 104)",
    ),
    (
        "closed",
        "Driver error: `Connection to the server is closed.'",
    ),
];

#[test]
fn outages_are_recognised_by_their_code_s_message() {
    for &(code, message) in OUTAGE_MESSAGES {
        assert_eq!(outage_code(message), Some(code), "{message}");
        let e = db(DatabaseErrorKind::Unknown, message);
        assert_eq!(classify(&e), Some(ErrorClass::Transient), "{message}");
    }
}

#[test]
fn values_quoted_in_a_message_decide_nothing() {
    use DatabaseErrorKind::*;
    // Each holds the text of an outage, inside a value the server quotes.
    for message in [
        r#"invalid input syntax for type integer: "timed out""#,
        r#"invalid input syntax for type integer: "deadlock detected""#,
        r#"invalid input syntax for type uuid: "terminating connection due to administrator command""#,
        "value too long for type character varying(5)",
        "Incorrect integer value: 'timed out' for column `t`.`n` at row 1",
        "Incorrect integer value: 'Lost connection to MySQL server during query' for column 'n' at row 1",
        "Data too long for column 'note' at row 1",
        "unexpected eof while parsing the payload: connection refused, broken pipe",
        " deadlock detected",
        "deadlock detected.",
        "Canceling statement due to statement timeout",
        "The table 'invoices' is full of rows",
        "database \"billing\" is not currently accepting connections, said the note",
    ] {
        assert_eq!(outage_code(message), None, "{message}");
        let e = db(Unknown, message);
        assert_eq!(classify(&e), None, "{message}");
        assert_eq!(
            outbox_core::fault::classify(&e, &[]),
            ErrorClass::Permanent,
            "{message}"
        );
    }
}

#[test]
fn kinds_of_an_outage_are_transient_whatever_the_message() {
    use DatabaseErrorKind::*;
    for e in [
        db(
            SerializationFailure,
            "could not serialize access due to concurrent update",
        ),
        db(ClosedConnection, "anything"),
        db(
            UnableToSendCommand,
            "error communicating with the server: Connection refused",
        ),
        db(
            ReadOnlyTransaction,
            "cannot execute INSERT in a read-only transaction",
        ),
        QueryError::BrokenTransactionManager,
    ] {
        assert_eq!(classify(&e), Some(ErrorClass::Transient), "{e:?}");
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
        // A constraint's kind decides, even if its message reads like an outage.
        db(UniqueViolation, "deadlock detected"),
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
    // The manager's ping: no message is involved, whatever the query error says.
    let e = diesel::r2d2::Error::QueryError(QueryError::NotFound);
    assert_eq!(classify(&e), Some(ErrorClass::Transient));
    let e = diesel::r2d2::Error::ConnectionError(diesel::ConnectionError::BadConnection(
        "refused".into(),
    ));
    assert_eq!(classify(&e), Some(ErrorClass::Transient));
}

/// diesel-async's pools are known with `async` alone: no pool feature of this crate.
#[cfg(feature = "async")]
#[test]
fn diesel_asyncs_pool_errors_are_classified() {
    use diesel_async::pooled_connection::{PoolError, bb8::RunError, deadpool};
    let refused = || {
        PoolError::ConnectionError(diesel::ConnectionError::BadConnection(
            "database \"billing\" is not currently accepting connections".into(),
        ))
    };
    assert_eq!(classify(&RunError::TimedOut), Some(ErrorClass::Transient));
    assert_eq!(
        classify(&RunError::User(refused())),
        Some(ErrorClass::Transient)
    );
    // A pool's error involves no message, whatever it wraps (here a failed ping).
    let ping = RunError::User(PoolError::QueryError(QueryError::NotFound));
    assert_eq!(classify(&ping), Some(ErrorClass::Transient));

    let created = deadpool::PoolError::Backend(refused());
    assert_eq!(classify(&created), Some(ErrorClass::Transient));
    assert_eq!(
        classify(&deadpool::PoolError::Closed),
        Some(ErrorClass::Transient)
    );
    let ping = deadpool::PoolError::Backend(PoolError::QueryError(QueryError::NotFound));
    assert_eq!(classify(&ping), Some(ErrorClass::Transient));
    assert_eq!(classify(&refused()), Some(ErrorClass::Transient));
}
