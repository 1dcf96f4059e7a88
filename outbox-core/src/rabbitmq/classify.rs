//! What a lapin error means, by the AMQP reply code the broker sent (never by its text).

// The publisher uses the codes that may be a message's own fault; the consumer alone does not.
#![cfg_attr(not(feature = "relay"), allow(dead_code))]

use lapin::{Error, ErrorKind};

/// 311 CONTENT_TOO_LARGE: the broker refuses the message's size.
pub(crate) const CONTENT_TOO_LARGE: u16 = 311;
/// 403 ACCESS_REFUSED: the user may not use the exchange (or vhost).
pub(crate) const ACCESS_REFUSED: u16 = 403;
/// 404 NOT_FOUND: no such exchange or queue.
pub(crate) const NOT_FOUND: u16 = 404;
/// 406 PRECONDITION_FAILED: RabbitMQ's answer to a message over `max_message_size`, to a
/// declare whose arguments differ from the existing entity's, to an acknowledgement timeout.
pub(crate) const PRECONDITION_FAILED: u16 = 406;

/// The AMQP reply code of `error`, if the broker sent one (it closed the channel or the
/// connection with it).
pub(crate) fn reply_code(error: &Error) -> Option<u16> {
    match error.kind() {
        ErrorKind::ProtocolError(amqp) => Some(amqp.get_id()),
        _ => None,
    }
}

/// The reply code's name, e.g. `NOT_FOUND`, for logs and the dead-letter failure metric;
/// `none` for an error without one (the connection was lost, a timeout).
pub(crate) fn code_name(error: &Error) -> String {
    match error.kind() {
        ErrorKind::ProtocolError(amqp) => name_of(amqp.get_id()).to_owned(),
        ErrorKind::IOError(_) | ErrorKind::MissingHeartbeatError => "connection".to_owned(),
        ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidConnectionState(_) => {
            "closed".to_owned()
        }
        _ => "none".to_owned(),
    }
}

/// The name of an AMQP reply code.
pub(crate) fn name_of(code: u16) -> &'static str {
    match code {
        200 => "REPLY_SUCCESS",
        311 => "CONTENT_TOO_LARGE",
        312 => "NO_ROUTE",
        313 => "NO_CONSUMERS",
        320 => "CONNECTION_FORCED",
        402 => "INVALID_PATH",
        403 => "ACCESS_REFUSED",
        404 => "NOT_FOUND",
        405 => "RESOURCE_LOCKED",
        406 => "PRECONDITION_FAILED",
        501 => "FRAME_ERROR",
        502 => "SYNTAX_ERROR",
        503 => "COMMAND_INVALID",
        504 => "CHANNEL_ERROR",
        505 => "UNEXPECTED_FRAME",
        506 => "RESOURCE_ERROR",
        530 => "NOT_ALLOWED",
        540 => "NOT_IMPLEMENTED",
        541 => "INTERNAL_ERROR",
        _ => "UNKNOWN",
    }
}

/// Whether the broker closed the publishing channel with a code that can be the message's own
/// fault (too large, a precondition of its own): the publisher then sends it again alone, to
/// learn whether it is.
pub(crate) fn may_be_the_message(error: &Error) -> bool {
    matches!(
        reply_code(error),
        Some(CONTENT_TOO_LARGE | PRECONDITION_FAILED)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPHardError, AMQPSoftError};

    fn amqp(kind: AMQPErrorKind) -> Error {
        ErrorKind::ProtocolError(AMQPError::new(kind, "text is never read".into())).into()
    }

    #[test]
    fn only_size_and_precondition_codes_may_be_the_message() {
        let too_large = amqp(AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED));
        assert!(may_be_the_message(&too_large));
        assert_eq!(code_name(&too_large), "PRECONDITION_FAILED");
        let refused = amqp(AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED));
        assert!(!may_be_the_message(&refused));
        assert_eq!(reply_code(&refused), Some(ACCESS_REFUSED));
        let forced = amqp(AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED));
        assert!(!may_be_the_message(&forced));
        assert_eq!(code_name(&forced), "CONNECTION_FORCED");
        let io: Error = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        assert!(!may_be_the_message(&io));
        assert_eq!(code_name(&io), "connection");
    }
}
