//! The database half of the test kit (feature `testing`), for services that use the outbox.
//! Use it through `outbox::testing`, which adds the broker half (typed reads of the
//! in-memory broker, a fault-injecting publisher) and `#[outbox::test]`.
//!
//! - What a transaction wrote, with no relay and no broker: [`written`], [`written_events`],
//!   [`assert_written!`](crate::assert_written).
//! - A deterministic relay on the test's own connection: [`drain`] and [`Drain`].
//! - Redelivery harnesses for `#[idempotent]` handlers: [`deliver_twice`],
//!   [`deliver_twice_observed`], [`deliver_out_of_order`].
//! - A fresh database per test, dropped afterwards: [`TestDatabase`].

mod connections;
mod database;
mod deliver;
mod drain;
mod written;

pub use crate::assert_written;
pub use connections::{AsyncTestConnection, MYSQL_URL_VAR, POSTGRES_URL_VAR, TestConnection};
pub use database::{DatabaseError, TestDatabase};
pub use deliver::{DeliveryError, deliver_out_of_order, deliver_twice, deliver_twice_observed};
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use deliver::{deliver_twice_async, deliver_twice_observed_async};
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use drain::drain_async;
pub use drain::{Drain, DrainError, Drained, drain};
#[doc(hidden)]
pub use written::Row;
pub use written::{ReadError, WrittenEvent, written, written_events};
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use written::{written_async, written_events_async};

/// What `assert_written!` expands to calls. Not public API.
#[doc(hidden)]
pub mod __private {
    use std::marker::PhantomData;

    use outbox_core::OutboxEvent;
    use serde::de::DeserializeOwned;

    use super::{ReadError, WrittenEvent};
    use crate::OutboxBackend;

    pub use super::connections::{async_setup, runtime, sync_setup};
    pub use super::written::assert_failed;

    /// Reads the outbox back through method-call syntax, so that the macro takes a
    /// connection or a `&mut` to one alike.
    pub trait ReadBack {
        fn __outbox_written_events(&mut self) -> Result<Vec<WrittenEvent>, ReadError>;
    }

    impl<C: diesel::connection::LoadConnection<Backend: OutboxBackend>> ReadBack for C {
        fn __outbox_written_events(&mut self) -> Result<Vec<WrittenEvent>, ReadError> {
            super::written_events(self)
        }
    }

    /// The type the pattern matches, inferred from it.
    pub struct Target<T>(PhantomData<T>, pub usize);

    impl<T: OutboxEvent + DeserializeOwned> Target<T> {
        #[allow(clippy::new_without_default)]
        pub fn new() -> Self {
            Target(PhantomData, 0)
        }

        /// `event` as a `T`, if it is one of `T`'s event types and decodes (counted).
        pub fn decode(&mut self, event: &WrittenEvent) -> Option<T> {
            if !event.is::<T>() {
                return None;
            }
            let value = event.decode::<T>().ok()?.into_payload();
            self.1 += 1;
            Some(value)
        }

        pub fn name(&self) -> &'static str {
            std::any::type_name::<T>()
        }
    }
}

/// Asserts that the outbox holds an event matching a pattern, and returns the first one that
/// does. For a test of what a transaction wrote, with no relay and no broker.
///
/// `assert_written!(conn, Pattern)` or `assert_written!(conn, Pattern if guard)`: `conn` is a
/// synchronous connection (or a `&mut` to one) on which the outbox is migrated; the pattern
/// names the event type (`OrderPlaced { order_id: 7, .. }`, `OrderEvent::Paid { .. }`), and
/// every written event of that type is decoded and matched against it. On failure it panics
/// with the pattern and every event the outbox holds, one a line: aggregate, event type,
/// version, aggregate id and payload JSON.
///
/// ```
/// # include!("../doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_diesel::OutboxConnection;
/// use outbox_diesel::assert_written;
///
/// let mut conn = establish();
/// conn.transaction_with_outbox(|tx| {
///     tx.publish(&OrderCreated { order_id: 7, total_cents: 1250 })?;
///     Ok::<_, outbox_diesel::Error>(())
/// })?;
/// let event = assert_written!(conn, OrderCreated { order_id: 7, .. });
/// assert_eq!(event.total_cents, 1250);
/// assert_written!(conn, OrderCreated { total_cents, .. } if total_cents > 1000);
///
/// let missing = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
///     assert_written!(conn, OrderCreated { order_id: 8, .. });
/// }));
/// let message = missing.unwrap_err().downcast::<String>().unwrap();
/// assert!(message.contains("no event written matches `OrderCreated { order_id: 8, .. }`"));
/// assert!(message.contains(r#"1. order/OrderCreated v1 #7 {"order_id":7,"total_cents":1250}"#));
/// # Ok(())
/// # }
/// ```
#[macro_export]
macro_rules! assert_written {
    ($conn:expr, $pattern:pat $(if $guard:expr)? $(,)?) => {{
        #[allow(unused_imports)]
        use $crate::testing::__private::ReadBack as _;
        let __events = match ($conn).__outbox_written_events() {
            ::std::result::Result::Ok(events) => events,
            ::std::result::Result::Err(error) => {
                ::std::panic!("assert_written!: reading the outbox failed: {error}")
            }
        };
        let mut __target = $crate::testing::__private::Target::new();
        let mut __found = ::std::option::Option::None;
        for __event in &__events {
            if let ::std::option::Option::Some(__value) = __target.decode(__event) {
                // By value, so that the guard sees the fields as the pattern binds them; the
                // match is decoded again to be returned.
                #[allow(unreachable_patterns, unused_variables)]
                let __matches = match __value {
                    $pattern $(if $guard)? => true,
                    _ => false,
                };
                if __matches {
                    __found = __target.decode(__event);
                    break;
                }
            }
        }
        match __found {
            ::std::option::Option::Some(value) => value,
            ::std::option::Option::None => $crate::testing::__private::assert_failed(
                ::std::stringify!($pattern $(if $guard)?),
                __target.name(),
                &__events,
                __target.1,
            ),
        }
    }};
}
