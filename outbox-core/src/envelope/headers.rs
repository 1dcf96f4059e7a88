//! The names of the headers a publisher sets on every message.

/// Header carrying the event id (a UUID, hyphenated): consumers deduplicate on it.
///
/// ```
/// assert_eq!(outbox_core::HEADER_ID, "id");
/// ```
pub const HEADER_ID: &str = "id";
/// Header carrying the event type, e.g. `OrderCreated`.
///
/// ```
/// assert_eq!(outbox_core::HEADER_EVENT_TYPE, "event_type");
/// ```
pub const HEADER_EVENT_TYPE: &str = "event_type";
/// Header carrying the event's schema version, in decimal.
///
/// ```
/// assert_eq!(outbox_core::HEADER_EVENT_VERSION, "event_version");
/// ```
pub const HEADER_EVENT_VERSION: &str = "event_version";
/// Header carrying the aggregate type, e.g. `order`.
///
/// ```
/// assert_eq!(outbox_core::HEADER_AGGREGATE_TYPE, "aggregate_type");
/// ```
pub const HEADER_AGGREGATE_TYPE: &str = "aggregate_type";
/// Header carrying when the event was written to the outbox: RFC 3339, UTC, microseconds,
/// e.g. `2025-01-31T09:30:00.123456Z`.
///
/// ```
/// assert_eq!(outbox_core::HEADER_CREATED_AT, "created_at");
/// ```
pub const HEADER_CREATED_AT: &str = "created_at";

/// The headers a publisher sets itself; an event header with one of these names is not sent
/// (the publisher's value is the one consumers read), and [`Envelope::headers`](crate::Envelope::headers) leaves them out.
///
/// ```
/// assert!(outbox_core::RESERVED_HEADERS.contains(&"id"));
/// assert!(!outbox_core::RESERVED_HEADERS.contains(&"traceparent"));
/// ```
pub const RESERVED_HEADERS: [&str; 5] = [
    HEADER_ID,
    HEADER_EVENT_TYPE,
    HEADER_EVENT_VERSION,
    HEADER_AGGREGATE_TYPE,
    HEADER_CREATED_AT,
];
