//! The span of each consumed message: `outbox.consume`, with the event's id, type and
//! aggregate, the message's topic (source), partition (where there are partitions) and offset
//! (position), the broker as `messaging.system`, and how it ended (`outcome`). The handler
//! runs inside it, so the spans it opens nest under it.
//!
//! With the `opentelemetry` feature the span continues the trace whose `traceparent` /
//! `tracestate` headers the message carries (see [`crate::otel`]).

use tracing::Span;

use super::received::Received;
use super::runtime::Done;
use crate::{HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, HEADER_ID};

/// The span of handling `message` (not entered), read from broker `system` (e.g. `kafka`).
pub(super) fn message_span(message: &impl Received, system: &'static str) -> Span {
    let header = |name: &str| {
        message
            .header(name)
            .and_then(|v| std::str::from_utf8(v).ok())
    };
    let span = tracing::info_span!(
        "outbox.consume",
        otel.kind = "consumer",
        messaging.system = system,
        event_id = header(HEADER_ID),
        event_type = header(HEADER_EVENT_TYPE),
        aggregate_type = header(HEADER_AGGREGATE_TYPE),
        aggregate_id = message.key().and_then(|k| std::str::from_utf8(k).ok()),
        topic = message.source(),
        partition = message.partition(),
        offset = message.position(),
        outcome = tracing::field::Empty,
    );
    #[cfg(feature = "opentelemetry")]
    crate::otel::continue_trace(&span, header);
    span
}

/// Records how the current message ended on its span: `applied`, `duplicate`,
/// `dead_lettered`, `parked`, `skipped` or `stopped` (shutdown came first; it is read again).
pub(super) fn outcome(outcome: &'static str) {
    Span::current().record("outcome", outcome);
}

/// Records `stopped` on a message's span if shutdown came before the message was done.
pub(super) fn ended(span: &Span, done: &Done) {
    if let Done::Stopped = done {
        span.record("outcome", "stopped");
    }
}
