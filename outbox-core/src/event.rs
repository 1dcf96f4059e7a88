//! The [`OutboxEvent`] trait that `#[derive(OutboxEvent)]` implements, and the
//! [`AggregateKey`] trait for aggregate ids.

use serde::Serialize;
use uuid::Uuid;

/// An event that can be written to the outbox.
///
/// Implement it with `#[derive(OutboxEvent)]` (see the derive's documentation in the `outbox`
/// crate); writing it by hand is possible but the derive checks at compile time what a hand
/// written impl can only get wrong at run time.
///
/// The payload stored in the outbox is exactly what `serde_json` produces for the value, so
/// `#[serde(...)]` attributes shape it as usual. For an enum, each variant is its own event type
/// and the payload is serde's representation of the enum (externally tagged unless the enum says
/// otherwise), so that a consumer deserialises the same type it was produced from.
///
/// # Example
///
/// ```
/// use outbox_core::OutboxEvent;
/// # use outbox_core as outbox;
/// #[derive(serde::Serialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderCreated", version = 2)]
/// struct OrderCreated {
///     #[outbox(aggregate_id)]
///     order_id: i64,
///     total_cents: i64,
/// }
///
/// let event = OrderCreated { order_id: 7, total_cents: 1250 };
/// assert_eq!(event.aggregate_type(), "order");
/// assert_eq!(event.aggregate_id(), "7");
/// assert_eq!(event.event_type(), "OrderCreated");
/// assert_eq!(event.event_version(), 2);
/// assert_eq!(OrderCreated::EVENT_TYPES[0].event_type, "OrderCreated");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox event",
    label = "this type does not implement `OutboxEvent`",
    note = "add `#[derive(serde::Serialize, outbox::OutboxEvent)]` and an `#[outbox(aggregate = \"...\")]` attribute to the type"
)]
pub trait OutboxEvent: Serialize {
    /// The aggregate type every event of this type belongs to, e.g. `"order"`.
    /// It names the default topic and is half of the ordering key.
    const AGGREGATE_TYPE: &'static str;

    /// Every event type this Rust type can carry: one for a struct, one per variant for an
    /// enum. Consumers use it to dispatch and to refuse unknown or too-new events.
    const EVENT_TYPES: &'static [EventType];

    /// The aggregate type of this event (the same as [`OutboxEvent::AGGREGATE_TYPE`]).
    fn aggregate_type(&self) -> &'static str {
        Self::AGGREGATE_TYPE
    }

    /// The id of the aggregate this event is about, as a key: the Kafka message key and,
    /// with the aggregate type, the unit of ordering.
    fn aggregate_id(&self) -> String;

    /// The event type of this value, e.g. `"OrderCreated"`.
    fn event_type(&self) -> &'static str;

    /// The schema version of this event type (at least 1).
    fn event_version(&self) -> u32;

    /// The topic this event goes to, if it names one; `None` routes by aggregate type.
    fn topic(&self) -> Option<&'static str> {
        None
    }
}

/// Static description of one event type an [`OutboxEvent`] can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventType {
    /// The aggregate type, e.g. `"order"`.
    pub aggregate_type: &'static str,
    /// The event type, e.g. `"OrderCreated"`.
    pub event_type: &'static str,
    /// The newest schema version this type understands (at least 1).
    pub version: u32,
    /// The topic the event names, if any.
    pub topic: Option<&'static str>,
}

/// A value that can serve as an aggregate id: it becomes the Kafka message key.
///
/// Implemented for strings, integers, [`Uuid`], and references and smart pointers to them.
/// Implement it for your own id newtypes; the key must be stable (the same id always gives the
/// same key) because ordering and sharding are derived from it.
///
/// # Example
///
/// ```
/// use outbox_core::AggregateKey;
/// struct OrderId(u64);
/// impl AggregateKey for OrderId {
///     fn to_key(&self) -> String {
///         self.0.to_key()
///     }
/// }
/// assert_eq!(OrderId(42).to_key(), "42");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an aggregate id",
    label = "an aggregate id must become a message key",
    note = "use a string, an integer or a `Uuid`, or implement `outbox::AggregateKey` for `{Self}`"
)]
pub trait AggregateKey {
    /// The key this id stands for.
    fn to_key(&self) -> String;
}

impl AggregateKey for str {
    fn to_key(&self) -> String {
        self.to_owned()
    }
}

impl AggregateKey for String {
    fn to_key(&self) -> String {
        self.clone()
    }
}

impl AggregateKey for Uuid {
    fn to_key(&self) -> String {
        // Hyphenated lower case: what `Uuid`'s `Display` and most other languages produce.
        self.hyphenated().to_string()
    }
}

macro_rules! int_keys {
    ($($t:ty)*) => {$(
        impl AggregateKey for $t {
            fn to_key(&self) -> String {
                ::std::string::ToString::to_string(self)
            }
        }
    )*};
}
int_keys!(i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize);

impl<T: AggregateKey + ?Sized> AggregateKey for &T {
    fn to_key(&self) -> String {
        (**self).to_key()
    }
}

impl<T: AggregateKey + ?Sized> AggregateKey for Box<T> {
    fn to_key(&self) -> String {
        (**self).to_key()
    }
}

impl<T: AggregateKey + ?Sized> AggregateKey for std::sync::Arc<T> {
    fn to_key(&self) -> String {
        (**self).to_key()
    }
}

impl AggregateKey for std::borrow::Cow<'_, str> {
    fn to_key(&self) -> String {
        self.as_ref().to_owned()
    }
}
