//! Procedural macros of [`outbox`](https://docs.rs/outbox). Do not depend on this crate
//! directly: depend on `outbox`, which re-exports them next to the traits they implement.
//!
//! Layout: `lib.rs` holds the entry points and their documentation, `expand.rs` drives a
//! derive and generates the impl, `ast.rs` reads the input into a checked model, `attr.rs`
//! reads `#[outbox(...)]` attributes, `value.rs` their values, `valid.rs` holds the rules a
//! value must follow, `ctxt.rs` collects every error, and `fallback.rs` is what is generated
//! when there are errors.

mod ast;
mod attr;
mod catalog;
mod ctxt;
mod expand;
mod fallback;
mod idempotent;
#[cfg(feature = "testing")]
mod testing;
mod valid;
mod value;

use proc_macro::TokenStream;

/// Implements `OutboxEvent` for a struct or an enum, so that its values can be written to the
/// outbox in the same transaction as the rows they describe.
///
/// A struct is one event type. An enum is one event type per variant; its payload is serde's
/// representation of the whole enum, so that a consumer deserialises the type it was produced
/// from. The derive only describes the event: the payload is what `serde::Serialize` makes of
/// the value, so the type derives (or implements) `Serialize` as well, and `#[serde(...)]`
/// attributes shape the payload as usual.
///
/// ```
/// # extern crate outbox_core as outbox;
/// use outbox::OutboxEvent;
/// use serde::Serialize;
/// use uuid::Uuid;
///
/// #[derive(Serialize, OutboxEvent)]
/// #[outbox(aggregate = "order", event_type = "OrderCreated", version = 2)]
/// struct OrderCreated {
///     #[outbox(aggregate_id)]
///     order_id: Uuid,
///     total_cents: i64,
/// }
///
/// let event = OrderCreated { order_id: Uuid::nil(), total_cents: 1250 };
/// assert_eq!(event.aggregate_type(), "order");
/// assert_eq!(event.aggregate_id(), "00000000-0000-0000-0000-000000000000");
/// assert_eq!(event.event_type(), "OrderCreated");
/// assert_eq!(event.event_version(), 2);
/// assert_eq!(event.topic(), None);
/// # assert_eq!(event.total_cents, 1250);
/// ```
///
/// # What it generates
///
/// One `impl OutboxEvent for YourType` with:
///
/// * `AGGREGATE_TYPE`: the `aggregate` attribute.
/// * `EVENT_TYPES`: one `EventType` (aggregate type, event type, version, topic) for a struct,
///   or one per variant of an enum, in declaration order.
/// * `aggregate_id()`: `AggregateKey::to_key` of the field marked `#[outbox(aggregate_id)]`
///   (of the value's variant, for an enum).
/// * `event_type()`, `event_version()` and `topic()`: those of the struct, or of the value's
///   variant.
///
/// The impl has the type's generics. When the type has type parameters, the impl also
/// requires `YourType<..>: Serialize` and, for an id field whose type mentions a parameter,
/// `FieldType: AggregateKey`; an instantiation whose id cannot become a key is then
/// reported where it is used as an event.
///
/// Mistakes are compile errors pointing at the offending token, and all the mistakes of an item
/// are reported together. A field type that is no key is reported at that type, with
/// `AggregateKey`'s message. While a type has errors the derive still emits a placeholder impl,
/// so that code using the type as an event reports nothing more.
///
/// # Attributes
///
/// ## Required container attributes
///
/// * `#[outbox(aggregate = "order")]`: the aggregate type every event of the type belongs
///   to. It is also the default topic, so it must be a valid Kafka topic name: 1 to 249 ASCII
///   letters, digits, `.`, `_` or `-`, and not `.` or `..`.
///
/// ## Optional container attributes
///
/// * `#[outbox(event_type = "OrderCreated")]` (structs only): the event type. Defaults to the
///   struct's name. It must not be empty or blank, start or end with whitespace, or contain
///   control characters. On an enum each variant is its own event type: put it on the
///   variants.
/// * `#[outbox(version = 2)]`: the schema version, from 1 to 2147483647 (a signed 32-bit
///   column stores it). Defaults to 1; on an enum it is the default of every variant.
/// * `#[outbox(topic = "orders")]`: the topic to publish to, instead of routing by aggregate
///   type. A valid Kafka topic name, as for `aggregate`. On an enum it is the default of every
///   variant.
/// * `#[outbox(crate = outbox_core)]` or `#[outbox(crate = "outbox_core")]`: the path the
///   generated code reaches the `outbox` crate through. Defaults to `::outbox`; set it when
///   you depend on `outbox-core` only, or have renamed the dependency.
/// * `#[outbox(upcast_from = OrderCreatedV1)]` (structs only, non-generic): older versions of
///   this event type are decoded as `OrderCreatedV1`, then converted with
///   `From<OrderCreatedV1> for Self`; a source with its own `upcast_from` makes a chain
///   (V1 -> V2 -> V3). A compile error at the path when the `From` impl is missing, when the
///   source is not an event or not `Deserialize`, when it does not carry the same event type
///   of the same aggregate, or when its version is not lower (which also rules out cycles).
///
/// Every non-generic type is also registered in the catalog (`outbox::catalog`) with its
/// upcast sources and, with the `schema` feature and `schemars::JsonSchema` derived, its
/// JSON Schema.
///
/// ## Optional variant attributes
///
/// * `#[outbox(event_type = "OrderCancelled")]`: the variant's event type. Defaults to the
///   variant's name. Event types are unique within an enum, whether given or defaulted.
/// * `#[outbox(version = 2)]`: the variant's version, instead of the enum's.
/// * `#[outbox(topic = "cancellations")]`: the variant's topic, instead of the enum's.
/// * `#[outbox(upcast_from = OrderCancelledV1)]`: as on a struct, with
///   `From<OrderCancelledV1> for TheEnum`.
///
/// ## Required field attributes
///
/// * `#[outbox(aggregate_id)]`: marks the field that identifies the aggregate: exactly one
///   field of a struct, and exactly one field of every variant of an enum (so an enum has no
///   unit variants). Its type implements `AggregateKey`: strings, integers, `Uuid`, references
///   and smart pointers to them, or your own id type.
///
/// Several keys can share one attribute or be spread over several; each key is given once.
///
/// # Examples
///
/// An enum, with struct and tuple variants, container defaults and variant overrides:
///
/// ```
/// # extern crate outbox_core as outbox;
/// use outbox::{EventType, OutboxEvent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, OutboxEvent)]
/// #[outbox(aggregate = "order", topic = "orders")]
/// enum OrderEvent {
///     Paid {
///         #[outbox(aggregate_id)]
///         order_id: u64,
///         amount: i64,
///     },
///     #[outbox(event_type = "OrderCancelled", version = 2)]
///     Cancelled {
///         #[outbox(aggregate_id)]
///         order_id: u64,
///         reason: String,
///     },
///     #[outbox(topic = "shipping")]
///     Shipped(#[outbox(aggregate_id)] u64, String),
/// }
///
/// let cancelled = OrderEvent::Cancelled { order_id: 7, reason: "changed mind".into() };
/// assert_eq!(cancelled.aggregate_id(), "7");
/// assert_eq!(cancelled.event_type(), "OrderCancelled");
/// assert_eq!(cancelled.event_version(), 2);
/// assert_eq!(cancelled.topic(), Some("orders"));
///
/// let shipped = OrderEvent::Shipped(7, "DHL".into());
/// assert_eq!((shipped.event_type(), shipped.topic()), ("Shipped", Some("shipping")));
///
/// let names: Vec<&str> = OrderEvent::EVENT_TYPES.iter().map(|t| t.event_type).collect();
/// assert_eq!(names, ["Paid", "OrderCancelled", "Shipped"]);
/// assert_eq!(
///     OrderEvent::EVENT_TYPES[0],
///     EventType { aggregate_type: "order", event_type: "Paid", version: 1, topic: Some("orders") },
/// );
/// # let _ = OrderEvent::Paid { order_id: 1, amount: 2 };
/// ```
///
/// An id type of your own, and a generic event:
///
/// ```
/// # extern crate outbox_core as outbox;
/// use outbox::{AggregateKey, OutboxEvent};
/// use serde::Serialize;
///
/// #[derive(Serialize)]
/// struct TenantId(u32);
///
/// impl AggregateKey for TenantId {
///     fn to_key(&self) -> String {
///         format!("tenant-{}", self.0)
///     }
/// }
///
/// #[derive(Serialize, OutboxEvent)]
/// #[outbox(aggregate = "tenant")]
/// struct Renamed<Id>(#[outbox(aggregate_id)] Id, String);
///
/// assert_eq!(Renamed(TenantId(3), "Acme".into()).aggregate_id(), "tenant-3");
/// assert_eq!(Renamed("t-9", "Acme".into()).aggregate_id(), "t-9");
/// ```
///
/// With only the inner crate as a dependency:
///
/// ```
/// use outbox_core::OutboxEvent;
///
/// #[derive(serde::Serialize, OutboxEvent)]
/// #[outbox(crate = outbox_core, aggregate = "cart")]
/// struct CartEmptied(#[outbox(aggregate_id)] u64);
///
/// assert_eq!(CartEmptied(5).aggregate_id(), "5");
/// ```
///
/// A mistake is an error at the token that is wrong:
///
/// ```compile_fail
/// # extern crate outbox_core as outbox;
/// use outbox::OutboxEvent;
///
/// #[derive(serde::Serialize, OutboxEvent)]
/// #[outbox(aggregate = "order", version = 0)] // error: `version` must be at least 1
/// struct OrderCreated(#[outbox(aggregate_id)] u64);
/// ```
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    expand::derive(input.into()).into()
}

/// Makes a message handler idempotent: its body runs in a database transaction that first
/// claims the message in the inbox, and a message it already applied is recognised and not
/// applied again.
///
/// See the `outbox` crate for the documentation and examples.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::expand(args.into(), item.into()).into()
}

/// `#[outbox::test]`: see the `outbox` crate (feature `testing`) for its documentation.
#[cfg(feature = "testing")]
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    testing::expand(args.into(), item.into()).into()
}
