//! The error the NATS builders return.

use std::fmt;

/// Why a [`NatsPublisher`](super::NatsPublisher) or a [`NatsConsumer`](super::NatsConsumer)
/// could not be built: the builder option at fault and why. A server address is shown with
/// its password replaced by `***`.
///
/// ```
/// use outbox_core::nats::NatsConfigError;
/// let err = NatsConfigError::InvalidOption { option: "group".into(), reason: "missing".into() };
/// assert_eq!(err.to_string(), "invalid `group`: missing");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NatsConfigError {
    /// A builder option is missing or invalid, e.g. no servers, a consumer without a group.
    InvalidOption {
        /// The builder method, e.g. `"servers"`.
        option: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for NatsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NatsConfigError::InvalidOption { option, reason } => {
                write!(f, "invalid `{option}`: {reason}")
            }
        }
    }
}

impl std::error::Error for NatsConfigError {}
