//! OpenTelemetry trace propagation (feature `opentelemetry`): from the span that writes an
//! event to the span that handles it, through the outbox row and the Kafka message.
//!
//! - **Writing**: `OutboxTx::publish` (and `publish_with_headers`) put the W3C `traceparent`
//!   and `tracestate` of the current `tracing` span into the event's headers ([`inject`]).
//!   The context comes from the span through `tracing-opentelemetry`, so it is there when the
//!   application's subscriber has the OpenTelemetry layer (`tracing_opentelemetry::layer()`),
//!   the usual way Rust services export traces; without the layer, or outside any span, no
//!   header is written. Headers the application sets itself, with `publish_with_headers` or
//!   `set_header`, win.
//! - **Relaying**: the headers are stored with the row and sent as Kafka message headers.
//! - **Consuming**: [`KafkaConsumer`](crate::kafka::KafkaConsumer) reads them and makes its
//!   per-message span (`outbox.consume`) a **child** of the writer's span; the handler runs
//!   inside that span, so the handler's own spans are in the writer's trace.
//!
//! **Why a parent, not a link.** OpenTelemetry's messaging semantic conventions let a
//! consumer's "process" span be a child of the producer's context when it processes a single
//! message, and ask for links when one span processes a batch (there is no single parent
//! then). The consumer runtime handles messages one at a time, one span each, so every span has
//! exactly one producer context, and as its child the whole flow, request → write → handler,
//! reads as one trace in any tracing UI. The price is that a trace's duration includes the time
//! an event waited in the outbox and in Kafka; a message re-delivered after a crash adds a
//! second handling span to the same trace. The relay's batch spans (`outbox.relay.batch`)
//! carry many events of many traces and so are not part of them.
//!
//! The propagator is OpenTelemetry's W3C [`TraceContextPropagator`], used directly (not the
//! global one), so nothing needs registering.

#[cfg(feature = "consumer")]
use std::collections::BTreeMap;

#[cfg(feature = "consumer")]
use opentelemetry::propagation::Extractor;
use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C trace context headers.
pub const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// Writes the current `tracing` span's W3C trace context (`traceparent`, `tracestate`) into
/// `headers`, leaving headers already there untouched. Does nothing outside a span that the
/// OpenTelemetry layer records. `OutboxTx::publish` calls it; call it yourself for headers you
/// build elsewhere.
///
/// ```
/// let mut headers = outbox_core::Headers::new();
/// headers.insert("traceparent".into(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
/// outbox_core::otel::inject(&mut headers); // the application's own header wins
/// assert_eq!(headers["traceparent"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// ```
pub fn inject(headers: &mut crate::Headers) {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return;
    }
    let mut carrier = Absent(headers);
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
}

/// Makes `span` a child of the trace context that `header` (a message's headers, by name)
/// carries; does nothing without a valid `traceparent` or without the OpenTelemetry layer.
#[cfg(feature = "consumer")]
pub(crate) fn continue_trace<'a>(span: &tracing::Span, header: impl Fn(&str) -> Option<&'a str>) {
    let carrier: BTreeMap<&str, &str> = TRACE_HEADERS
        .iter()
        .filter_map(|name| Some((*name, header(name)?)))
        .collect();
    if carrier.is_empty() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Carrier(carrier));
    if parent.span().span_context().is_valid() {
        // Fails only without the layer (or for a disabled span): nothing to continue then.
        let _ = span.set_parent(parent);
    }
}

/// Writes only headers not set yet.
struct Absent<'a>(&'a mut crate::Headers);

impl Injector for Absent<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.entry(key.to_owned()).or_insert(value);
    }
}

#[cfg(feature = "consumer")]
struct Carrier<'a>(BTreeMap<&'a str, &'a str>);

#[cfg(feature = "consumer")]
impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).copied()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().copied().collect()
    }
}
