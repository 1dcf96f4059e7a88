//! [`RabbitMqConfigError`]: why a RabbitMQ publisher or consumer could not be built.

use std::fmt;

use crate::broker_tls::{TlsFiles, TlsPem};

/// Why a [`RabbitMqPublisher`](super::RabbitMqPublisher) or a
/// [`RabbitMqConsumer`](super::RabbitMqConsumer) could not be built. Every variant names the
/// builder option at fault. None holds the URI's password: a URI is only ever shown through
/// [`redact::url`](crate::redact::url).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use outbox_core::rabbitmq::{RabbitMqConfigError, RabbitMqConsumer};
/// let err = RabbitMqConsumer::builder().topic("order").build().unwrap_err();
/// assert!(matches!(&err, RabbitMqConfigError::InvalidOption { option, .. } if option == "group"));
/// assert!(err.to_string().starts_with("invalid `group`: "), "{err}");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RabbitMqConfigError {
    /// The URI is not an AMQP URI lapin can parse (`amqp://user:password@host:5672/vhost`,
    /// `amqps://…`).
    InvalidUri {
        /// The URI with its password hidden.
        uri: String,
        /// The parser's reason.
        reason: String,
    },
    /// A builder option is missing or invalid, e.g. a consumer without a group or a handler.
    InvalidOption {
        /// The builder method, e.g. `"group"`.
        option: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for RabbitMqConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RabbitMqConfigError::InvalidUri { uri, reason } => {
                write!(f, "invalid `uri` {uri}: {reason}")
            }
            RabbitMqConfigError::InvalidOption { option, reason } => {
                write!(f, "invalid `{option}`: {reason}")
            }
        }
    }
}

impl std::error::Error for RabbitMqConfigError {}

impl RabbitMqConfigError {
    pub(crate) fn option(option: &str, reason: impl Into<String>) -> Self {
        RabbitMqConfigError::InvalidOption {
            option: option.to_owned(),
            reason: reason.into(),
        }
    }
}

/// Checks `uri` and the TLS files, and reads the files: `amqps://` needs this build's TLS
/// (feature `rabbitmq-tls`), and TLS files need an `amqps://` URI (lapin speaks TLS only
/// there: the files would otherwise be ignored without a word).
pub(crate) fn check_endpoint(uri: &str, tls: &TlsFiles) -> Result<TlsPem, RabbitMqConfigError> {
    let parsed = check_uri(uri)?;
    let secure = parsed.scheme == lapin::uri::AMQPScheme::AMQPS;
    if secure && !cfg!(feature = "rabbitmq-tls") {
        return Err(RabbitMqConfigError::option(
            "uri",
            format!(
                "{} is an `amqps://` URI, and this build has no TLS for RabbitMQ: enable the \
                 feature `rabbitmq-tls` (of `outbox`, or `outbox-kernel`)",
                crate::redact::url(uri)
            ),
        ));
    }
    if !secure && tls.is_set() {
        let option = if tls.ca.is_some() {
            "tls_ca_file"
        } else {
            "tls_client_cert"
        };
        return Err(RabbitMqConfigError::option(
            option,
            format!(
                "TLS files need an `amqps://` URI, and {} is not one",
                crate::redact::url(uri)
            ),
        ));
    }
    tls.load()
        .map_err(|e| RabbitMqConfigError::option(e.option, e.reason))
}

/// Checks `uri` with lapin's parser; the error shows it redacted.
pub(crate) fn check_uri(uri: &str) -> Result<lapin::uri::AMQPUri, RabbitMqConfigError> {
    uri.parse::<lapin::uri::AMQPUri>()
        .map_err(|reason| RabbitMqConfigError::InvalidUri {
            uri: crate::redact::url(uri).into_owned(),
            // The parser's message may quote the URI, password included.
            reason: if reason.contains(uri) {
                "not an AMQP URI".to_owned()
            } else {
                reason
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_uri_is_named_without_its_password() {
        let err = check_uri("amqp://app:s3cret@host:notaport/%2f").unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("`uri`"), "{shown}");
        assert!(check_uri("amqp://guest:guest@127.0.0.1:5672/%2f").is_ok());
    }

    #[test]
    fn tls_files_need_amqps_and_are_read_at_build() {
        let tls = TlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            client: None,
        };
        let option = |err: &RabbitMqConfigError| match err {
            RabbitMqConfigError::InvalidOption { option, .. } => option.clone(),
            other => panic!("{other}"),
        };
        let err = check_endpoint("amqp://app:s3cret@host:5672/%2f", &tls).unwrap_err();
        assert_eq!(option(&err), "tls_ca_file");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        assert!(err.to_string().contains("amqps://"), "{err}");

        let err = check_endpoint("amqps://app:s3cret@host:5671/%2f", &tls).unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        if cfg!(feature = "rabbitmq-tls") {
            assert_eq!(option(&err), "tls_ca_file");
            assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        } else {
            assert_eq!(option(&err), "uri");
            assert!(err.to_string().contains("rabbitmq-tls"), "{err}");
        }
        let plain = TlsFiles::default();
        assert!(check_endpoint("amqp://guest:guest@127.0.0.1:5672/%2f", &plain).is_ok());
    }
}
