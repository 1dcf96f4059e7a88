//! Fault classes: is an error the infrastructure's (an outage: wait and retry, for as long as
//! it takes) or the message's own (poison: count attempts, then dead-letter)?
//!
//! The consumer runtime (under `KafkaConsumer`, `NatsConsumer` and `RabbitMqConsumer`) classifies every
//! handler error with [`classify`]: it walks the error and its [`source`](Error::source)
//! chain from the outside in, and the first link that something recognises decides:
//!
//! 1. the markers [`Transient`] and [`Permanent`], which a handler returns (or puts in its
//!    error's chain) to say it itself;
//! 2. the classifiers given to the consumer's builder (`.classifier(...)`);
//! 3. the classifiers other crates register in [`CLASSIFIERS`]: the Diesel store registers one
//!    for `diesel::result::Error` (by its kind, and where Diesel keeps no SQLSTATE or MySQL
//!    error number, by the server's whole message or the fixed text before any value, never
//!    a substring), `diesel::ConnectionError` and the pool errors (r2d2, deadpool, bb8), with
//!    no pool feature to turn on (`outbox_diesel::fault` lists what is recognised);
//! 4. the built-in one for [`std::io::Error`] ([`io_error_class`]).
//!
//! An error nothing recognises is [`ErrorClass::Permanent`]: a bug or a business rule does not
//! go away by waiting.
//!
//! ```
//! use outbox_core::fault::{classify, ErrorClass, Transient};
//!
//! let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
//! assert_eq!(classify(&refused, &[]), ErrorClass::Transient);
//!
//! // A user's own error, marked: retried for as long as it takes, never dead-lettered.
//! let busy = Transient::new("the payment provider is rate limiting us");
//! assert_eq!(classify(&busy, &[]), ErrorClass::Transient);
//!
//! let declined = std::io::Error::other("card declined");
//! assert_eq!(classify(&declined, &[]), ErrorClass::Permanent);
//! ```
//!
//! # Your own error type
//!
//! A `thiserror`-style error that wraps a database error keeps it as its `source()` (that is
//! what `#[from]` and `#[source]` do): the chain then reaches the Diesel error and the Diesel
//! store's classifier sees it. An error type that turns the database error into a string loses
//! that, and is poison. To decide for your own variants, return them wrapped in [`Transient`] or
//! [`Permanent`], or implement [`ClassifyError`] and register the type on the consumer's
//! builder.

use std::error::Error;
use std::fmt;
use std::io::ErrorKind;

use crate::BoxError;

/// Which fault class an error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The infrastructure's fault (a database or network outage, a serialization failure, a
    /// deadlock, a pool timeout): retried with the outage backoff for as long as it takes,
    /// never counted as an attempt, never dead-lettered.
    Transient,
    /// The message's own fault (or a bug): counted as an attempt, dead-lettered after the last.
    Permanent,
}

/// Recognises some errors: `Some(class)` for an error it knows, `None` to let others decide.
/// It is called on each link of an error's `source()` chain, outermost first.
pub type Classifier = fn(&(dyn Error + 'static)) -> Option<ErrorClass>;

/// Classifiers contributed by other crates, collected at link time (with `linkme`). The Diesel
/// store adds its own; a crate of yours can add one for a driver the outbox does not know:
///
/// ```
/// use outbox_core::fault::{CLASSIFIERS, Classifier, ErrorClass};
///
/// #[derive(Debug)]
/// struct ServiceUnavailable;
/// impl std::fmt::Display for ServiceUnavailable {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("503 service unavailable")
///     }
/// }
/// impl std::error::Error for ServiceUnavailable {}
///
/// #[linkme::distributed_slice(CLASSIFIERS)]
/// static HTTP: Classifier = |e| e.is::<ServiceUnavailable>().then_some(ErrorClass::Transient);
///
/// assert_eq!(outbox_core::fault::classify(&ServiceUnavailable, &[]), ErrorClass::Transient);
/// ```
#[linkme::distributed_slice]
pub static CLASSIFIERS: [Classifier];

/// An error type that says for itself which of its errors are transient. Register it on the
/// consumer with `KafkaConsumerBuilder::classify_errors_of::<MyError>()`.
///
/// ```
/// use outbox_core::fault::{ClassifyError, ErrorClass};
///
/// #[derive(Debug)]
/// enum BillingError {
///     ProviderDown,
///     CardDeclined,
/// }
/// # impl std::fmt::Display for BillingError {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
/// # }
/// # impl std::error::Error for BillingError {}
///
/// impl ClassifyError for BillingError {
///     fn error_class(&self) -> Option<ErrorClass> {
///         match self {
///             BillingError::ProviderDown => Some(ErrorClass::Transient),
///             BillingError::CardDeclined => Some(ErrorClass::Permanent),
///         }
///     }
/// }
/// assert_eq!(BillingError::ProviderDown.error_class(), Some(ErrorClass::Transient));
/// ```
pub trait ClassifyError: Error + 'static {
    /// The class of this error, or `None` to let its `source()` chain decide.
    fn error_class(&self) -> Option<ErrorClass>;
}

/// The classifier of a [`ClassifyError`] type (what `classify_errors_of` registers).
pub fn classifier_of<T: ClassifyError>(e: &(dyn Error + 'static)) -> Option<ErrorClass> {
    e.downcast_ref::<T>().and_then(T::error_class)
}

macro_rules! marker {
    ($name:ident, $class:ident, $what:literal) => {
        #[doc = concat!("Marks an error as ", $what, ", whatever it wraps.")]
        ///
        /// Transparent: it displays as the error it wraps and has that error's `source()`.
        /// Return it from a handler (it converts into the boxed error handlers return), or
        /// keep it in your error's `source()` chain.
        #[derive(Debug)]
        pub struct $name(BoxError);

        impl $name {
            /// Wraps `error` (anything that converts into a boxed error, a `String` too).
            pub fn new(error: impl Into<BoxError>) -> Self {
                $name(error.into())
            }

            /// The wrapped error.
            pub fn into_inner(self) -> BoxError {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl Error for $name {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                self.0.source()
            }
        }
    };
}

marker!(
    Transient,
    Transient,
    "transient (an outage: retried until it passes)"
);
marker!(
    Permanent,
    Permanent,
    "permanent (poison: counted, then dead-lettered)"
);

/// The class of `error`: see the [module documentation](self) for the order in which the
/// markers, `extra` (the consumer's own classifiers), [`CLASSIFIERS`] and the built-in
/// [`io_error_class`] are asked, link by link.
pub fn classify(error: &(dyn Error + 'static), extra: &[Classifier]) -> ErrorClass {
    classify_with(error, |e| extra.iter().find_map(|c| c(e)))
}

/// [`classify`] with the consumer's classifiers as one function (they may be closures).
pub(crate) fn classify_with(
    error: &(dyn Error + 'static),
    extra: impl Fn(&(dyn Error + 'static)) -> Option<ErrorClass>,
) -> ErrorClass {
    let mut link = Some(error);
    // A chain is finite, but a buggy `source()` could loop: stop after 64 links.
    for _ in 0..64 {
        let Some(e) = link else { break };
        if let Some(class) = marker_class(e)
            .or_else(|| extra(e))
            .or_else(|| CLASSIFIERS.iter().find_map(|c| c(e)))
            .or_else(|| e.downcast_ref::<std::io::Error>().and_then(io_error_class))
        {
            return class;
        }
        link = e.source();
    }
    ErrorClass::Permanent
}

fn marker_class(e: &(dyn Error + 'static)) -> Option<ErrorClass> {
    if e.is::<Transient>() {
        Some(ErrorClass::Transient)
    } else if e.is::<Permanent>() {
        Some(ErrorClass::Permanent)
    } else {
        None
    }
}

/// The built-in classification of [`std::io::Error`]: the kinds of a network or server that is
/// away (refused, reset, aborted, not connected, timed out, broken pipe, host or network
/// unreachable, unexpected end of stream, ...) are transient; other kinds say nothing (`None`),
/// so an io error that wraps a classified error (`io::Error::other(e)`) is decided by `e`.
///
/// ```
/// use std::io::{Error, ErrorKind};
/// use outbox_core::fault::{io_error_class, ErrorClass};
/// assert_eq!(io_error_class(&Error::from(ErrorKind::TimedOut)), Some(ErrorClass::Transient));
/// assert_eq!(io_error_class(&Error::from(ErrorKind::InvalidData)), None);
/// ```
pub fn io_error_class(e: &std::io::Error) -> Option<ErrorClass> {
    io_kind_is_transient(e.kind()).then_some(ErrorClass::Transient)
}

fn io_kind_is_transient(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::NotConnected
            | ErrorKind::BrokenPipe
            | ErrorKind::TimedOut
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
            | ErrorKind::UnexpectedEof
            | ErrorKind::HostUnreachable
            | ErrorKind::NetworkUnreachable
            | ErrorKind::NetworkDown
            | ErrorKind::AddrNotAvailable
            | ErrorKind::ResourceBusy
    )
}

/// `error` and its sources as one line, `outer: inner: innermost`, leaving out a link that says
/// exactly what the one before it said (transparent wrappers).
pub fn chain_text(error: &(dyn Error + 'static)) -> String {
    let mut out = String::new();
    let mut last = String::new();
    let mut link = Some(error);
    for _ in 0..64 {
        let Some(e) = link else { break };
        let text = e.to_string();
        if text != last && !last.ends_with(&format!(": {text}")) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        last = text;
        link = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user error wrapping its cause as `source()`, like thiserror's `#[from]`.
    #[derive(Debug)]
    struct Wrapper(std::io::Error);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("billing failed")
        }
    }
    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn io_kinds_of_an_unreachable_peer_are_transient_and_others_say_nothing() {
        let transient = [
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::NotConnected,
            ErrorKind::BrokenPipe,
            ErrorKind::TimedOut,
            ErrorKind::UnexpectedEof,
            ErrorKind::HostUnreachable,
            ErrorKind::NetworkUnreachable,
        ];
        for kind in transient {
            let e = std::io::Error::from(kind);
            assert_eq!(io_error_class(&e), Some(ErrorClass::Transient), "{kind:?}");
            assert_eq!(classify(&e, &[]), ErrorClass::Transient, "{kind:?}");
        }
        for kind in [
            ErrorKind::InvalidData,
            ErrorKind::InvalidInput,
            ErrorKind::NotFound,
            ErrorKind::PermissionDenied,
            ErrorKind::Other,
        ] {
            let e = std::io::Error::from(kind);
            assert_eq!(io_error_class(&e), None, "{kind:?}");
            assert_eq!(classify(&e, &[]), ErrorClass::Permanent, "{kind:?}");
        }
    }

    #[test]
    fn the_chain_is_walked_and_the_outermost_verdict_wins() {
        let wrapped = Wrapper(ErrorKind::ConnectionReset.into());
        assert_eq!(classify(&wrapped, &[]), ErrorClass::Transient);
        // io::Error::other(e) wraps e as its source.
        let other = std::io::Error::other(Wrapper(ErrorKind::TimedOut.into()));
        assert_eq!(classify(&other, &[]), ErrorClass::Transient);
        // A marker outside a transient error overrides it.
        let permanent = Permanent::new(Wrapper(ErrorKind::ConnectionReset.into()));
        assert_eq!(classify(&permanent, &[]), ErrorClass::Permanent);
        let transient = Transient::new("rate limited");
        assert_eq!(classify(&transient, &[]), ErrorClass::Transient);
        // Nothing recognised: poison.
        assert_eq!(
            classify(&*BoxError::from("card declined"), &[]),
            ErrorClass::Permanent
        );
    }

    #[test]
    fn the_consumers_classifiers_come_before_the_built_in_ones() {
        let reset = Wrapper(ErrorKind::ConnectionReset.into());
        let billing: Classifier = |e| e.is::<Wrapper>().then_some(ErrorClass::Permanent);
        assert_eq!(classify(&reset, &[billing]), ErrorClass::Permanent);
        let never: Classifier = |_| None;
        assert_eq!(classify(&reset, &[never]), ErrorClass::Transient);
    }

    #[test]
    fn markers_are_transparent_and_chains_read_as_one_line() {
        let e = Transient::new(Wrapper(ErrorKind::ConnectionRefused.into()));
        assert_eq!(e.to_string(), "billing failed");
        assert_eq!(chain_text(&e), "billing failed: connection refused");
        let boxed: BoxError = Permanent::new("card declined").into();
        assert_eq!(chain_text(&*boxed), "card declined");
    }
}
