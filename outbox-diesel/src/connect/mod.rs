//! Opening async connections from a database URL, with TLS as the URL asks.
//!
//! [`postgres`] opens an [`AsyncPgConnection`](diesel_async::AsyncPgConnection) honouring
//! libpq's TLS parameters, which tokio-postgres (under diesel-async) only partly knows:
//!
//! | URL parameter | meaning |
//! |---|---|
//! | `sslmode=disable` | no TLS |
//! | `sslmode=allow` | plain first; TLS if the server refuses a plain session |
//! | `sslmode=prefer` (default) | TLS if the server offers it, else plain; no verification |
//! | `sslmode=require` | TLS, no verification (as `verify-ca` when a root certificate is given) |
//! | `sslmode=verify-ca` | TLS, the server's chain checked against the root certificates |
//! | `sslmode=verify-full` | as `verify-ca`, and the certificate must name the host connected to |
//! | `sslrootcert=<file>` | the trusted roots (PEM); `system` for the platform's (implies `verify-full`) |
//! | `sslcert=<file>`, `sslkey=<file>` | a client certificate and its key (PEM) |
//!
//! As in libpq, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY` give the parameters
//! the URL leaves out, `~/.postgresql/root.crt` is the default root file and
//! `~/.postgresql/postgresql.{crt,key}` the default client certificate, each used when it
//! exists. TLS is rustls on the `ring` provider (feature `tls`); without that feature a URL
//! that requires TLS is refused, and `prefer`/`allow` connect in plain text.
//!
//! [`mysql`] does the same for MySQL and MariaDB with `ssl-mode` and `ssl-ca` (feature
//! `mysql_tls`).
//!
//! The relay's stores (their reconnects and PostgreSQL's `LISTEN` connection included) and the
//! `outbox` CLI open every connection through these, so one URL works for all of them.

#[cfg(feature = "mysql_backend")]
mod mysql;
#[cfg(feature = "postgres_backend")]
mod pg;
#[cfg(feature = "postgres_backend")]
mod pg_url;
#[cfg(all(feature = "postgres_backend", feature = "tls"))]
mod tls;
#[cfg(any(feature = "postgres_backend", feature = "mysql_backend"))]
mod url;

#[cfg(feature = "mysql_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql_backend")))]
pub use mysql::mysql;

#[cfg(feature = "postgres_backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres_backend")))]
pub use pg::postgres;
#[cfg(all(feature = "postgres_backend", feature = "relay"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "postgres_backend", feature = "relay"))))]
pub use pg::postgres_pooled;

use std::fmt;
use std::path::PathBuf;

/// Why a connection could not be opened. Messages name the server (host and port), never the
/// URL's password.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL's TLS parameters are not usable: an unknown `sslmode`, a combination libpq
    /// refuses, or TLS asked of a build without the `tls` feature.
    Url(String),
    /// A certificate or key file the URL names (or a default one that exists) cannot be read
    /// or holds nothing usable.
    File {
        /// The URL parameter that names the file (`sslrootcert`, `sslcert`, `sslkey`).
        param: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The TLS handshake failed: the server's certificate is not trusted or does not name the
    /// host, or the server refused ours.
    Tls {
        /// `host:port` connected to.
        server: String,
        /// What failed.
        reason: String,
    },
    /// The server could not be reached, refused the session (authentication, a missing
    /// database, `pg_hba.conf`), or does not speak TLS when it is required.
    Connect {
        /// `host:port` connected to.
        server: String,
        /// The driver's message.
        reason: String,
    },
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Url(msg) => write!(f, "unusable database URL: {msg}"),
            ConnectError::File {
                param,
                path,
                reason,
            } => write!(f, "cannot use {param} `{}`: {reason}", path.display()),
            ConnectError::Tls { server, reason } => {
                write!(f, "cannot connect to {server}: TLS: {reason}")
            }
            ConnectError::Connect { server, reason } => {
                write!(f, "cannot connect to {server}: {reason}")
            }
        }
    }
}

impl std::error::Error for ConnectError {}

/// The rustls error behind a driver's error, if a TLS handshake failed.
#[cfg(any(feature = "tls", feature = "mysql_tls"))]
pub(crate) fn tls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cause = Some(e);
    while let Some(err) = cause {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if tls.is_some() {
            return tls;
        }
        cause = err.source();
    }
    None
}

/// What a failed handshake says, in a few words: the common certificate failures by name
/// (`roots` is the URL parameter naming the trusted roots), anything else as rustls words it.
#[cfg(any(feature = "tls", feature = "mysql_tls"))]
pub(crate) fn describe(e: &rustls::Error, host: &str, roots: &str) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. } => {
                format!("certificate not valid for name \"{host}\"")
            }
            rustls::CertificateError::UnknownIssuer => {
                format!("certificate not signed by a trusted root ({roots})")
            }
            rustls::CertificateError::Expired | rustls::CertificateError::ExpiredContext { .. } => {
                "certificate expired".to_owned()
            }
            rustls::CertificateError::NotValidYet
            | rustls::CertificateError::NotValidYetContext { .. } => {
                "certificate not valid yet".to_owned()
            }
            other => format!("invalid certificate: {other:?}"),
        },
        other => other.to_string(),
    }
}

impl From<ConnectError> for diesel::ConnectionError {
    fn from(e: ConnectError) -> Self {
        diesel::ConnectionError::BadConnection(e.to_string())
    }
}
