//! Redelivery harnesses for consumers: [`deliver_twice`], [`deliver_twice_observed`],
//! [`deliver_out_of_order`] and their async twins.

use std::fmt;

use outbox_core::{Envelope, Outcome};

/// Why a redelivery harness failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeliveryError<E> {
    /// The handler returned an error on the `delivery`-th delivery (from 1).
    Handler {
        /// Which delivery failed, from 1.
        delivery: usize,
        /// The handler's error.
        source: E,
    },
    /// The first delivery was reported a duplicate: the inbox already held the event (a
    /// database shared with an earlier test?), so nothing was tested.
    FirstWasDuplicate,
    /// The second delivery of the same event was applied again: the handler does not
    /// deduplicate (no `#[idempotent]`, or a key that differs between deliveries).
    AppliedTwice,
    /// The observed state did not change on the first delivery: the handler had no effect.
    NoEffect {
        /// The observed state, before and after.
        state: String,
    },
    /// The observed state changed again on the second delivery: the effect happened twice.
    EffectRepeated {
        /// After the first delivery.
        after_first: String,
        /// After the second.
        after_second: String,
    },
    /// Observing the state failed.
    Observe(diesel::result::Error),
}

impl<E: fmt::Display> fmt::Display for DeliveryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeliveryError::Handler { delivery, source } => {
                write!(f, "delivery {delivery} failed: {source}")
            }
            DeliveryError::FirstWasDuplicate => {
                f.write_str("the first delivery was a duplicate: the inbox already held the event")
            }
            DeliveryError::AppliedTwice => f.write_str(
                "the second delivery of the same event was applied again: the handler does not \
                 deduplicate (is it #[idempotent]?)",
            ),
            DeliveryError::NoEffect { state } => {
                write!(f, "the first delivery changed nothing observed: {state}")
            }
            DeliveryError::EffectRepeated {
                after_first,
                after_second,
            } => write!(
                f,
                "the effect happened twice: after one delivery {after_first}, after two {after_second}"
            ),
            DeliveryError::Observe(e) => write!(f, "observing the effect failed: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for DeliveryError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DeliveryError::Handler { source, .. } => Some(source),
            DeliveryError::Observe(e) => Some(e),
            _ => None,
        }
    }
}

fn check_twice<T, E>(
    first: Result<Outcome<T>, E>,
    second: Result<Outcome<T>, E>,
) -> Result<T, DeliveryError<E>> {
    let first = first.map_err(|source| DeliveryError::Handler {
        delivery: 1,
        source,
    })?;
    let Outcome::Applied(value) = first else {
        return Err(DeliveryError::FirstWasDuplicate);
    };
    match second {
        Err(source) => Err(DeliveryError::Handler {
            delivery: 2,
            source,
        }),
        Ok(Outcome::Applied(_)) => Err(DeliveryError::AppliedTwice),
        Ok(_) => Ok(value),
    }
}

fn check_effect<O: PartialEq + fmt::Debug, E>(
    before: O,
    after_first: O,
    after_second: O,
) -> Result<(), DeliveryError<E>> {
    if before == after_first {
        return Err(DeliveryError::NoEffect {
            state: format!("{before:?}"),
        });
    }
    if after_first != after_second {
        return Err(DeliveryError::EffectRepeated {
            after_first: format!("{after_first:?}"),
            after_second: format!("{after_second:?}"),
        });
    }
    Ok(())
}

/// Delivers `envelope` to `handler` twice, as a broker redelivers it, and checks that the
/// first delivery was applied and the second recognised as a duplicate
/// ([`Outcome::Duplicate`]). Returns the first delivery's value.
///
/// `handler` is an [`#[idempotent]`](https://docs.rs/outbox/latest/outbox/attr.idempotent.html)
/// function (or a closure around one, for extra parameters). To check the effect itself, not
/// only the handler's word, use [`deliver_twice_observed`].
///
/// ```
/// # include!("../doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::prelude::*;
/// use outbox_core::{Envelope, Outcome};
/// use outbox_diesel::testing::{DeliveryError, deliver_twice};
///
/// // What `#[idempotent(consumer = "billing")]` generates, written out.
/// fn charge(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> QueryResult<Outcome<()>> {
///     conn.transaction(|conn| {
///         if !outbox_diesel::inbox::claim(conn, "billing", &event.inbox_key())? {
///             return Ok(Outcome::Duplicate);
///         }
///         diesel::sql_query("INSERT INTO orders (id, total_cents) VALUES (?, ?)")
///             .bind::<diesel::sql_types::BigInt, _>(event.order_id)
///             .bind::<diesel::sql_types::BigInt, _>(event.total_cents)
///             .execute(conn)?;
///         Ok(Outcome::Applied(()))
///     })
/// }
///
/// let mut conn = establish();
/// let event = Envelope::new(OrderCreated { order_id: 7, total_cents: 1250 });
/// deliver_twice(&mut conn, charge, event)?;
///
/// // A handler that forgets the inbox is caught.
/// fn forgetful(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> QueryResult<Outcome<()>> {
///     Ok(Outcome::Applied(()))
/// }
/// let event = Envelope::new(OrderCreated { order_id: 8, total_cents: 1 });
/// assert!(matches!(deliver_twice(&mut conn, forgetful, event), Err(DeliveryError::AppliedTwice)));
/// # Ok(())
/// # }
/// ```
pub fn deliver_twice<C, E, T, Er, H>(
    conn: &mut C,
    mut handler: H,
    envelope: Envelope<E>,
) -> Result<T, DeliveryError<Er>>
where
    C: ?Sized,
    E: Clone,
    H: FnMut(&mut C, Envelope<E>) -> Result<Outcome<T>, Er>,
{
    let first = handler(conn, envelope.clone());
    let second = match &first {
        Ok(Outcome::Applied(_)) => handler(conn, envelope),
        _ => Ok(Outcome::Duplicate),
    };
    check_twice(first, second)
}

/// [`deliver_twice`], and checks the effect: `observe` reads the state the handler changes
/// (a row count, a balance) before, after the first and after the second delivery; the first
/// must change it and the second must not. This also catches a handler that claims the inbox
/// but whose effect escapes its transaction.
///
/// ```
/// # include!("../doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::prelude::*;
/// use outbox_core::{Envelope, Outcome};
/// use outbox_diesel::testing::{DeliveryError, deliver_twice_observed};
///
/// // Claims the inbox, then writes outside the claim's transaction: applied twice.
/// fn leaky(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> QueryResult<Outcome<()>> {
///     diesel::sql_query("INSERT INTO orders (id, total_cents) VALUES (?, 0)")
///         .bind::<diesel::sql_types::BigInt, _>(event.order_id * 100 + count(conn)?)
///         .execute(conn)?;
///     let new = outbox_diesel::inbox::claim(conn, "billing", &event.inbox_key())?;
///     Ok(if new { Outcome::Applied(()) } else { Outcome::Duplicate })
/// }
/// fn count(conn: &mut SqliteConnection) -> QueryResult<i64> {
///     diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>("(SELECT COUNT(*) FROM orders)"))
///         .get_result(conn)
/// }
///
/// let mut conn = establish();
/// let event = Envelope::new(OrderCreated { order_id: 7, total_cents: 1250 });
/// let err = deliver_twice_observed(&mut conn, leaky, event, count).unwrap_err();
/// assert!(matches!(err, DeliveryError::EffectRepeated { .. }));
/// assert_eq!(err.to_string(), "the effect happened twice: after one delivery 1, after two 2");
/// # Ok(())
/// # }
/// ```
pub fn deliver_twice_observed<C, E, T, Er, H, O, Obs>(
    conn: &mut C,
    mut handler: H,
    envelope: Envelope<E>,
    mut observe: Obs,
) -> Result<T, DeliveryError<Er>>
where
    C: ?Sized,
    E: Clone,
    H: FnMut(&mut C, Envelope<E>) -> Result<Outcome<T>, Er>,
    O: PartialEq + fmt::Debug,
    Obs: FnMut(&mut C) -> diesel::QueryResult<O>,
{
    let before = observe(conn).map_err(DeliveryError::Observe)?;
    let first = handler(conn, envelope.clone());
    let after_first = observe(conn).map_err(DeliveryError::Observe)?;
    let second = match &first {
        Ok(Outcome::Applied(_)) => handler(conn, envelope),
        _ => Ok(Outcome::Duplicate),
    };
    let after_second = observe(conn).map_err(DeliveryError::Observe)?;
    let value = check_twice(first, second)?;
    check_effect(before, after_first, after_second)?;
    Ok(value)
}

/// Delivers `envelopes` to `handler` in the reverse of the order given (the latest event
/// first), as a consumer of several partitions or a redelivery after a retry may see them,
/// and returns each delivery's outcome in delivery order. A handler error stops it. The test
/// then checks that the state is what in-order delivery would have produced.
///
/// ```
/// # include!("../doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_core::{Envelope, Outcome};
/// use outbox_diesel::testing::deliver_out_of_order;
///
/// let mut seen = Vec::new();
/// let mut conn = establish();
/// let events = vec![
///     Envelope::new(OrderCreated { order_id: 1, total_cents: 1 }),
///     Envelope::new(OrderCreated { order_id: 2, total_cents: 2 }),
/// ];
/// let outcomes = deliver_out_of_order(&mut conn, |_, e: Envelope<OrderCreated>| {
///     seen.push(e.order_id);
///     Ok::<_, diesel::result::Error>(Outcome::Applied(()))
/// }, events)?;
/// assert_eq!(seen, [2, 1]);
/// assert_eq!(outcomes.len(), 2);
/// # Ok(())
/// # }
/// ```
pub fn deliver_out_of_order<C, E, T, Er, H>(
    conn: &mut C,
    mut handler: H,
    envelopes: Vec<Envelope<E>>,
) -> Result<Vec<Outcome<T>>, DeliveryError<Er>>
where
    C: ?Sized,
    H: FnMut(&mut C, Envelope<E>) -> Result<Outcome<T>, Er>,
{
    envelopes
        .into_iter()
        .rev()
        .enumerate()
        .map(|(i, envelope)| {
            handler(conn, envelope).map_err(|source| DeliveryError::Handler {
                delivery: i + 1,
                source,
            })
        })
        .collect()
}

/// [`deliver_twice`] for an async handler (an `#[idempotent] async fn`) on a diesel-async
/// connection.
#[cfg(feature = "async")]
pub async fn deliver_twice_async<C, E, T, Er, H>(
    conn: &mut C,
    mut handler: H,
    envelope: Envelope<E>,
) -> Result<T, DeliveryError<Er>>
where
    C: ?Sized,
    E: Clone,
    H: AsyncFnMut(&mut C, Envelope<E>) -> Result<Outcome<T>, Er>,
{
    let first = handler(conn, envelope.clone()).await;
    let second = match &first {
        Ok(Outcome::Applied(_)) => handler(conn, envelope).await,
        _ => Ok(Outcome::Duplicate),
    };
    check_twice(first, second)
}

/// [`deliver_twice_observed`] for an async handler; `observe` is async too.
#[cfg(feature = "async")]
pub async fn deliver_twice_observed_async<C, E, T, Er, H, O, Obs>(
    conn: &mut C,
    mut handler: H,
    envelope: Envelope<E>,
    mut observe: Obs,
) -> Result<T, DeliveryError<Er>>
where
    C: ?Sized,
    E: Clone,
    H: AsyncFnMut(&mut C, Envelope<E>) -> Result<Outcome<T>, Er>,
    O: PartialEq + fmt::Debug,
    Obs: AsyncFnMut(&mut C) -> diesel::QueryResult<O>,
{
    let before = observe(conn).await.map_err(DeliveryError::Observe)?;
    let first = handler(conn, envelope.clone()).await;
    let after_first = observe(conn).await.map_err(DeliveryError::Observe)?;
    let second = match &first {
        Ok(Outcome::Applied(_)) => handler(conn, envelope).await,
        _ => Ok(Outcome::Duplicate),
    };
    let after_second = observe(conn).await.map_err(DeliveryError::Observe)?;
    let value = check_twice(first, second)?;
    check_effect(before, after_first, after_second)?;
    Ok(value)
}
