//! The span of each consumed message: `outbox.consume`, with the event's id, type and
//! aggregate, the message's topic, partition and offset, and how it ended (`outcome`). The
//! handler runs inside it, so the spans it opens nest under it.
//!
//! With the `opentelemetry` feature the span continues the trace whose `traceparent` /
//! `tracestate` headers the message carries (see [`crate::otel`]).

use rdkafka::Message;
use rdkafka::message::{Headers as _, OwnedMessage};
use tracing::Span;

use super::Done;
use crate::{HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, HEADER_ID};

/// The span of handling `message` (not entered).
pub(super) fn message_span(message: &OwnedMessage) -> Span {
    let header = |name: &str| {
        message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == name))
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
    };
    let span = tracing::info_span!(
        "outbox.consume",
        otel.kind = "consumer",
        messaging.system = "kafka",
        event_id = header(HEADER_ID),
        event_type = header(HEADER_EVENT_TYPE),
        aggregate_type = header(HEADER_AGGREGATE_TYPE),
        aggregate_id = message.key().and_then(|k| std::str::from_utf8(k).ok()),
        topic = message.topic(),
        partition = message.partition(),
        offset = message.offset(),
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
