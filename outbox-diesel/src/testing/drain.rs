//! [`drain`]: a deterministic relay for tests, on the test's own connection.

use std::fmt;
use std::time::{Duration, Instant};

use outbox_core::relay::{Delivery, OutboxMessage, Publisher};
use outbox_core::{DecodeError, Envelope, OutboxEvent};
use serde::de::DeserializeOwned;

use super::written::{ReadError, Row, WrittenEvent, select_sql};
use crate::OutboxBackend;

/// How long [`Drain`] waits between two publishes while the broker is unavailable.
const OUTAGE_PAUSE: Duration = Duration::from_millis(10);

/// A relay for tests: publishes every pending outbox row in `seq` order on the test's own
/// connection, one batch at a time, and marks each published, until the outbox is empty.
///
/// Unlike [`Relay`](outbox_core::relay::Relay) it runs no loop in the background, takes no
/// leases and ignores retry backoff, so a test knows exactly what was published when it
/// returns. It never runs inside a transaction: rows are read, published, then marked, as
/// the relay does. Configure it, then [`run`](Drain::run) (sync connections) or
/// [`run_async`](Drain::run_async) (diesel-async); [`drain`] is `Drain::new().run(..)`.
///
/// ```
/// # include!("../doctest_setup.rs");
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_core::relay::MemoryBroker;
/// use outbox_core::testing::{Fault, Faulty};
/// use outbox_diesel::OutboxConnection;
/// use outbox_diesel::testing::{Drain, DrainError, drain};
///
/// let mut conn = establish();
/// conn.transaction_with_outbox(|tx| {
///     tx.publish(&OrderCreated { order_id: 7, total_cents: 1250 })?;
///     Ok::<_, outbox_diesel::Error>(())
/// })?;
///
/// // The broker is down: nothing is published, nothing is lost.
/// let broker = Faulty::new(MemoryBroker::new());
/// broker.fail_always(Fault::Unreachable);
/// assert!(matches!(drain(&mut conn, &broker), Err(DrainError::Unavailable { .. })));
///
/// // It comes back: the event is published once.
/// broker.clear();
/// let published = Drain::new().run(&mut conn, &broker)?;
/// assert_eq!(published.events::<OrderCreated>()?, [OrderCreated { order_id: 7, total_cents: 1250 }]);
/// assert_eq!(broker.inner().published::<OrderCreated>()?.len(), 1);
/// assert!(drain(&mut conn, &broker)?.is_empty()); // nothing left
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Drain {
    batch_size: usize,
    publish_timeout: Duration,
    wait_for_broker: Duration,
    crash_after_publish: bool,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            batch_size: 100,
            publish_timeout: Duration::from_secs(10),
            wait_for_broker: Duration::ZERO,
            crash_after_publish: false,
        }
    }
}

impl Drain {
    /// Batches of 100, a 10-second publish timeout, no waiting for an unavailable broker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rows per publish (at least 1).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// How long one publish may take before its messages count as unavailable (a black-holed
    /// broker): 10 seconds by default.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// While the broker is unavailable, publish again every 10 ms for up to `duration` before
    /// giving up with [`DrainError::Unavailable`] (the default, zero, gives up at once). A
    /// broker that is down for a while and then returns is drained completely.
    pub fn wait_for_broker(mut self, duration: Duration) -> Self {
        self.wait_for_broker = duration;
        self
    }

    /// Kills the relay between its publish and its mark: the first batch is published and
    /// then [`DrainError::Crashed`] is returned with nothing marked, so the next drain
    /// publishes the same events again, as a real relay does after a crash. Use it to prove
    /// that consumers apply a redelivered event once.
    pub fn crash_after_publish(mut self) -> Self {
        self.crash_after_publish = true;
        self
    }

    /// Drains the outbox on a synchronous connection. The publisher's futures run on a
    /// private single-threaded Tokio runtime, so called from async code it returns
    /// [`DrainError::InsideRuntime`] (use [`run_async`](Drain::run_async) there).
    pub fn run<C, P>(&self, conn: &mut C, publisher: &P) -> Result<Drained, DrainError>
    where
        C: diesel::connection::LoadConnection<Backend: OutboxBackend>,
        P: Publisher,
    {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(DrainError::InsideRuntime);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(DrainError::Runtime)?;
        let mut state = State::new(self);
        loop {
            let sql = pending_sql::<C::Backend>(self.batch_size);
            let rows = <C::Backend as OutboxBackend>::testing_load(conn, sql)?;
            let Some(batch) = state.batch(rows)? else {
                return Ok(state.done());
            };
            let deliveries = runtime.block_on(self.publish(publisher, &batch));
            let (marks, next) = state.settle(batch, deliveries);
            if !marks.is_empty() {
                let sql = mark_sql::<C::Backend>(&marks);
                <C::Backend as OutboxBackend>::execute(conn, diesel::sql_query(sql).into_boxed())
                    .map_err(DrainError::Database)?;
            }
            match next {
                Next::Continue => {}
                Next::Pause => std::thread::sleep(OUTAGE_PAUSE),
                Next::Stop(error) => return Err(error),
            }
        }
    }

    /// Drains the outbox on a diesel-async connection, on the caller's Tokio runtime.
    ///
    /// ```
    /// # include!("../doctest_setup.rs");
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use outbox_core::relay::MemoryBroker;
    /// use outbox_diesel::AsyncOutboxConnection;
    /// use outbox_diesel::testing::Drain;
    ///
    /// let mut conn = establish_async().await;
    /// conn.transaction_with_outbox(async |tx| {
    ///     tx.publish(&OrderCreated { order_id: 7, total_cents: 1250 })?;
    ///     Ok::<_, outbox_diesel::Error>(())
    /// })
    /// .await?;
    /// let broker = MemoryBroker::new();
    /// let published = Drain::new().run_async(&mut conn, &broker).await?;
    /// assert_eq!(published.len(), 1);
    /// assert_eq!(broker.records("order")[0].key, "7");
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "async")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async")))]
    pub async fn run_async<C, P>(&self, conn: &mut C, publisher: &P) -> Result<Drained, DrainError>
    where
        C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
        P: Publisher,
    {
        let mut state = State::new(self);
        loop {
            let sql = pending_sql::<C::Backend>(self.batch_size);
            let rows = <C::Backend as OutboxBackend>::testing_load_async(conn, sql).await?;
            let Some(batch) = state.batch(rows)? else {
                return Ok(state.done());
            };
            let deliveries = self.publish(publisher, &batch).await;
            let (marks, next) = state.settle(batch, deliveries);
            if !marks.is_empty() {
                let sql = mark_sql::<C::Backend>(&marks);
                <C::Backend as OutboxBackend>::execute_async(
                    conn,
                    diesel::sql_query(sql).into_boxed(),
                )
                .await
                .map_err(DrainError::Database)?;
            }
            match next {
                Next::Continue => {}
                Next::Pause => tokio::time::sleep(OUTAGE_PAUSE).await,
                Next::Stop(error) => return Err(error),
            }
        }
    }

    async fn publish<P: Publisher>(&self, publisher: &P, batch: &[OutboxMessage]) -> Vec<Delivery> {
        match tokio::time::timeout(self.publish_timeout, publisher.publish(batch)).await {
            Ok(deliveries) => deliveries,
            Err(_) => vec![
                Delivery::Unavailable(format!(
                    "no answer from the broker within {:?}",
                    self.publish_timeout
                ));
                batch.len()
            ],
        }
    }
}

/// Drains the outbox on `conn` to `publisher` with [`Drain`]'s defaults: publishes every
/// pending event in order, marks it published, and returns what was published.
pub fn drain<C, P>(conn: &mut C, publisher: &P) -> Result<Drained, DrainError>
where
    C: diesel::connection::LoadConnection<Backend: OutboxBackend>,
    P: Publisher,
{
    Drain::new().run(conn, publisher)
}

/// [`drain`] on a diesel-async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn drain_async<C, P>(conn: &mut C, publisher: &P) -> Result<Drained, DrainError>
where
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
    P: Publisher,
{
    Drain::new().run_async(conn, publisher).await
}

fn pending_sql<B: OutboxBackend>(limit: usize) -> String {
    format!(
        "{} WHERE published_at IS NULL AND dead_at IS NULL ORDER BY seq LIMIT {limit}",
        select_sql(B::NAME)
    )
}

fn mark_sql<B: OutboxBackend>(seqs: &[i64]) -> String {
    let now = match B::NAME {
        "postgres" => "now()",
        "mysql" => "UTC_TIMESTAMP(6)",
        _ => "strftime('%Y-%m-%d %H:%M:%f000', 'now')",
    };
    let list = seqs
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "UPDATE outbox_events SET published_at = {now}, locked_by = NULL, locked_until = NULL, \
         attempts = attempts + 1 WHERE seq IN ({list})"
    )
}

/// What a drain does after marking a batch's published rows.
enum Next {
    /// Claim the next batch.
    Continue,
    /// The broker was unavailable: wait a moment, then publish again.
    Pause,
    /// Stop with this error.
    Stop(DrainError),
}

/// What a drain carries from batch to batch: the pure decisions, shared by sync and async.
struct State<'a> {
    drain: &'a Drain,
    published: Vec<OutboxMessage>,
    /// When an unavailable broker is given up on (set at the first outage).
    give_up_at: Option<Instant>,
}

impl<'a> State<'a> {
    fn new(drain: &'a Drain) -> Self {
        State {
            drain,
            published: Vec::new(),
            give_up_at: None,
        }
    }

    fn batch(&self, rows: Vec<Row>) -> Result<Option<Vec<OutboxMessage>>, DrainError> {
        if rows.is_empty() {
            return Ok(None);
        }
        let batch = rows
            .into_iter()
            .map(|row| WrittenEvent::from_row(row).map(|e| e.to_outbox_message()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(batch))
    }

    fn done(mut self) -> Drained {
        self.take()
    }

    /// The rows of `batch` to mark published, and what to do next.
    fn settle(&mut self, batch: Vec<OutboxMessage>, deliveries: Vec<Delivery>) -> (Vec<i64>, Next) {
        let mut marks = Vec::new();
        let mut refused = None;
        let mut outage = None;
        for (message, delivery) in batch.into_iter().zip(deliveries) {
            match delivery {
                Delivery::Published => {
                    marks.push(message.seq);
                    self.published.push(message);
                }
                Delivery::Failed(error) => {
                    refused.get_or_insert((message, error));
                }
                Delivery::Unavailable(error) => {
                    outage.get_or_insert(error);
                }
                _ => {}
            }
        }
        if self.drain.crash_after_publish {
            let published = self.take();
            return (Vec::new(), Next::Stop(DrainError::Crashed { published }));
        }
        if let Some((message, error)) = refused {
            let published = self.take();
            let error = DrainError::Refused {
                event_type: message.event_type,
                id: message.id,
                error,
                published,
            };
            return (marks, Next::Stop(error));
        }
        // A publisher that published nothing and said why not (only `NotAttempted`, or fewer
        // outcomes than messages) would have the drain publish the same batch forever.
        let outage = match outage {
            None if marks.is_empty() => {
                Some("the publisher published none of the batch and reported no failure".into())
            }
            outage => outage,
        };
        let Some(error) = outage else {
            self.give_up_at = None;
            return (marks, Next::Continue);
        };
        let give_up_at = *self
            .give_up_at
            .get_or_insert_with(|| Instant::now() + self.drain.wait_for_broker);
        if Instant::now() >= give_up_at {
            let published = self.take();
            return (
                marks,
                Next::Stop(DrainError::Unavailable { error, published }),
            );
        }
        (marks, Next::Pause)
    }

    fn take(&mut self) -> Drained {
        Drained {
            messages: std::mem::take(&mut self.published),
        }
    }
}

/// What a drain published, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Drained {
    messages: Vec<OutboxMessage>,
}

impl Drained {
    /// How many events were published.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether nothing was published.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The published messages, as the relay handed them to the publisher.
    pub fn messages(&self) -> &[OutboxMessage] {
        &self.messages
    }

    /// The published events of type `E`, decoded, in order (events of other types left out).
    pub fn events<E: OutboxEvent + DeserializeOwned>(&self) -> Result<Vec<E>, DecodeError> {
        Ok(self
            .envelopes::<E>()?
            .into_iter()
            .map(Envelope::into_payload)
            .collect())
    }

    /// The published events of type `E` as a consumer's handler receives them.
    pub fn envelopes<E: OutboxEvent + DeserializeOwned>(
        &self,
    ) -> Result<Vec<Envelope<E>>, DecodeError> {
        self.messages
            .iter()
            .filter(|m| {
                E::EVENT_TYPES
                    .iter()
                    .any(|t| t.aggregate_type == m.aggregate_type && t.event_type == m.event_type)
            })
            .map(Envelope::from_outbox_message)
            .collect()
    }
}

/// Why a [`Drain`] stopped before the outbox was empty. Every row it did not mark published
/// is still pending: a later drain publishes it.
#[derive(Debug)]
#[non_exhaustive]
pub enum DrainError {
    /// Reading the pending rows failed.
    Read(ReadError),
    /// Marking rows published failed.
    Database(diesel::result::Error),
    /// The broker refused an event for itself ([`Delivery::Failed`]).
    Refused {
        /// Its event type.
        event_type: String,
        /// Its id.
        id: uuid::Uuid,
        /// The broker's error.
        error: String,
        /// What was published and marked before.
        published: Drained,
    },
    /// The broker stayed unavailable (or did not answer in time) past
    /// [`wait_for_broker`](Drain::wait_for_broker).
    Unavailable {
        /// The last outage's error.
        error: String,
        /// What was published and marked before.
        published: Drained,
    },
    /// [`crash_after_publish`](Drain::crash_after_publish): the relay "died" after publishing
    /// `published` and before marking it; those events are still pending.
    Crashed {
        /// What reached the broker in the batch that was not marked.
        published: Drained,
    },
    /// The private Tokio runtime of a sync drain could not be built.
    Runtime(std::io::Error),
    /// [`Drain::run`] was called from async code (inside a Tokio runtime), where it would
    /// block the runtime's thread: use [`Drain::run_async`] there.
    InsideRuntime,
}

impl fmt::Display for DrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrainError::Read(e) => e.fmt(f),
            DrainError::Database(e) => write!(f, "marking outbox rows published failed: {e}"),
            DrainError::Refused {
                event_type,
                id,
                error,
                ..
            } => write!(f, "the broker refused event {id} ({event_type}): {error}"),
            DrainError::Unavailable { error, .. } => {
                write!(f, "the broker is unavailable: {error}")
            }
            DrainError::Crashed { published } => write!(
                f,
                "the drain was stopped between publish and mark ({} events published, none marked)",
                published.len()
            ),
            DrainError::Runtime(e) => write!(f, "could not start the drain's runtime: {e}"),
            DrainError::InsideRuntime => f.write_str(
                "a sync drain was run inside a Tokio runtime: use `Drain::run_async` (or \
                 `drain_async`) from async code",
            ),
        }
    }
}

impl std::error::Error for DrainError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DrainError::Read(e) => Some(e),
            DrainError::Database(e) => Some(e),
            DrainError::Runtime(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ReadError> for DrainError {
    fn from(e: ReadError) -> Self {
        DrainError::Read(e)
    }
}

impl From<diesel::result::Error> for DrainError {
    fn from(e: diesel::result::Error) -> Self {
        DrainError::Read(ReadError::Database(e))
    }
}
