//! [`OutboxTx`]: the handle a `transaction_with_outbox` closure gets.

use std::ops::{Deref, DerefMut};
use std::sync::MutexGuard;

use outbox_core::{Headers, NewMessage, OutboxEvent};

use crate::Error;
use crate::order::{Frame, FrameRef, lock};

/// A connection inside an open transaction, plus the events published in it so far.
///
/// `transaction_with_outbox` hands one to its closure. It dereferences to the connection, and
/// [`conn`](OutboxTx::conn) returns it, so Diesel queries run on it as on the connection itself;
/// [`publish`](OutboxTx::publish) serialises an event at once (a payload that fails to
/// serialise fails the `publish` call, naming the event type) and keeps it until the closure
/// returns `Ok`. Then all of them are written with one multi-row `INSERT` (one per 1,000
/// events) just before `COMMIT`, so they commit together with the business rows, or not at all.
///
/// Events are written in the order they were published: that is their order in the outbox and
/// so, per aggregate, the order in which consumers see them. That holds across nesting too:
/// before a nested `transaction_with_outbox` or a free [`publish`](crate::publish) writes its
/// events, the events this transaction published earlier are written first (a nested call
/// that rolls back still drops its own events). A transaction without nested writes writes its
/// events with one `INSERT`; each nested write after `publish` calls adds one.
pub struct OutboxTx<'c, C> {
    conn: &'c mut C,
    frame: FrameRef,
    headers: Headers,
    max_payload_bytes: Option<usize>,
}

/// The events an [`OutboxTx`] holds, not yet written: a slice (`len`, indexing, `iter`), see
/// [`OutboxTx::pending`]. Drop it before publishing more.
pub struct PendingEvents<'a> {
    guard: MutexGuard<'a, Frame>,
}

impl Deref for PendingEvents<'_> {
    type Target = [NewMessage];

    fn deref(&self) -> &[NewMessage] {
        &self.guard.pending
    }
}

impl std::fmt::Debug for PendingEvents<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'c, C> OutboxTx<'c, C> {
    pub(crate) fn new(conn: &'c mut C, frame: FrameRef) -> Self {
        OutboxTx {
            conn,
            frame,
            headers: Headers::new(),
            max_payload_bytes: None,
        }
    }

    /// The connection, for Diesel queries: `diesel::insert_into(t).values(v).execute(tx.conn())`.
    ///
    /// ```
    /// # include!("doctest_setup.rs");
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = establish();
    /// use outbox_diesel::OutboxConnection;
    /// conn.transaction_with_outbox(|tx| {
    ///     diesel::RunQueryDsl::execute(
    ///         diesel::sql_query("INSERT INTO orders (id, total_cents) VALUES (5, 10)"),
    ///         tx.conn(),
    ///     )?;
    ///     Ok::<_, outbox_diesel::Error>(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn conn(&mut self) -> &mut C {
        self.conn
    }

    /// Publishes `event` in this transaction: it is written with the transaction's other
    /// events just before `COMMIT`, and is discarded if the transaction rolls back.
    ///
    /// The event gets a fresh UUIDv7 id and the transaction's default headers
    /// ([`set_header`](OutboxTx::set_header)). Fails with [`Error::Event`], writing nothing, if
    /// the payload does not serialise (`EventError::Serialize`, naming the event type) or the
    /// event is invalid (e.g. an empty aggregate id). Returning that error from the closure
    /// rolls the whole transaction back.
    ///
    /// ```
    /// # include!("doctest_setup.rs");
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = establish();
    /// use outbox_diesel::OutboxConnection;
    /// conn.transaction_with_outbox(|tx| {
    ///     tx.publish(&OrderCreated { order_id: 1, total_cents: 100 })?;
    ///     assert_eq!(tx.pending().len(), 1); // written just before COMMIT
    ///     Ok::<_, outbox_diesel::Error>(())
    /// })?;
    /// assert_eq!(count_events(&mut conn), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn publish<E: OutboxEvent + ?Sized>(&mut self, event: &E) -> Result<(), Error> {
        self.publish_with_headers(event, Headers::new())
    }

    /// [`publish`](OutboxTx::publish) with extra headers for this event (they override the
    /// transaction's default headers of the same name). Headers travel to Kafka as message
    /// headers, e.g. a `traceparent` or a correlation id.
    ///
    /// ```
    /// # include!("doctest_setup.rs");
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = establish();
    /// use outbox_diesel::OutboxConnection;
    /// conn.transaction_with_outbox(|tx| {
    ///     let mut headers = outbox_core::Headers::new();
    ///     headers.insert("traceparent".into(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    ///     tx.publish_with_headers(&OrderCreated { order_id: 1, total_cents: 100 }, headers)?;
    ///     assert!(tx.pending()[0].headers.contains_key("traceparent"));
    ///     Ok::<_, outbox_diesel::Error>(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn publish_with_headers<E: OutboxEvent + ?Sized>(
        &mut self,
        event: &E,
        headers: Headers,
    ) -> Result<(), Error> {
        let mut all = self.headers.clone();
        all.extend(headers);
        // The current span's `traceparent` / `tracestate`, unless set above.
        #[cfg(feature = "opentelemetry")]
        outbox_core::otel::inject(&mut all);
        let limit = self
            .max_payload_bytes
            .unwrap_or_else(outbox_core::max_payload_bytes);
        let message = NewMessage::from_event_with_limit(event, all, limit)?;
        lock(&self.frame).pending.push(message);
        Ok(())
    }

    /// Sets a header on every event published after this call in this transaction.
    ///
    /// ```
    /// # include!("doctest_setup.rs");
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = establish();
    /// use outbox_diesel::OutboxConnection;
    /// conn.transaction_with_outbox(|tx| {
    ///     tx.set_header("correlation-id", "req-42");
    ///     tx.publish(&OrderCreated { order_id: 1, total_cents: 100 })?;
    ///     tx.publish(&OrderCreated { order_id: 2, total_cents: 200 })?;
    ///     assert!(tx.pending().iter().all(|m| m.headers["correlation-id"] == "req-42"));
    ///     Ok::<_, outbox_diesel::Error>(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_header(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.headers.insert(name.into(), value.into());
    }

    /// Sets the size limit, in bytes, for the events published after this call in this
    /// transaction (instead of the process-wide `outbox::max_payload_bytes()`, by default
    /// `DEFAULT_MAX_PAYLOAD_BYTES`, 1,000,000). An event larger as the Kafka producer counts it
    /// (`NewMessage::record_size`: payload, key, headers, framing) fails its `publish` with
    /// `Error::Event(EventError::PayloadTooLarge)`, naming the event type, the size and the limit.
    ///
    /// ```
    /// # include!("doctest_setup.rs");
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = establish();
    /// use outbox_diesel::OutboxConnection;
    /// let result = conn.transaction_with_outbox(|tx| {
    ///     tx.set_max_payload_bytes(16);
    ///     tx.publish(&OrderCreated { order_id: 1, total_cents: 100 })
    /// });
    /// let err = result.unwrap_err();
    /// assert!(
    ///     matches!(err, outbox_diesel::Error::Event(outbox_core::EventError::PayloadTooLarge { limit: 16, .. })),
    ///     "{err}"
    /// );
    /// assert_eq!(count_events(&mut conn), 0); // the transaction rolled back
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_max_payload_bytes(&mut self, limit: usize) {
        self.max_payload_bytes = Some(limit);
    }

    /// The events published so far and not yet written (a nested write writes the earlier
    /// ones first, see [`OutboxTx`]).
    ///
    /// ```
    /// # include!("doctest_setup.rs");
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = establish();
    /// use outbox_diesel::OutboxConnection;
    /// conn.transaction_with_outbox(|tx| {
    ///     assert!(tx.pending().is_empty());
    ///     tx.publish(&OrderCreated { order_id: 1, total_cents: 100 })?;
    ///     assert_eq!(tx.pending()[0].event_type, "OrderCreated");
    ///     Ok::<_, outbox_diesel::Error>(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn pending(&self) -> PendingEvents<'_> {
        PendingEvents {
            guard: lock(&self.frame),
        }
    }
}

impl<C> Deref for OutboxTx<'_, C> {
    type Target = C;

    fn deref(&self) -> &C {
        self.conn
    }
}

impl<C> DerefMut for OutboxTx<'_, C> {
    fn deref_mut(&mut self) -> &mut C {
        self.conn
    }
}

impl<C> std::fmt::Debug for OutboxTx<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxTx")
            .field("pending", &self.pending().len())
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}
