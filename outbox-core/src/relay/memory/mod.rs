//! In-memory broker and store: for tests of your own code and of the relay's logic, and for
//! the embedded quickstart. Never a stand-in for a real broker in production.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use uuid::Uuid;

use super::{Delivery, OutboxMessage, Publisher, message_headers};
use crate::{Headers, NewMessage};

mod store;
pub use store::{MemoryRow, MemoryStore};

/// A message as the in-memory broker stored it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The topic it was published to.
    pub topic: String,
    /// Its key (the aggregate id).
    pub key: String,
    /// The headers a Kafka message would carry (see [`message_headers`]).
    pub headers: Vec<(String, String)>,
    /// The payload, JSON text.
    pub payload: String,
    /// The event id.
    pub id: Uuid,
    /// Position in the topic, from 0.
    pub offset: u64,
}

impl Record {
    /// The value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

type FaultFn = dyn Fn(&OutboxMessage) -> Option<String> + Send + Sync;

/// A broker in memory, implementing [`Publisher`] with the same contract as Kafka's.
///
/// Faults can be injected, of both classes:
/// - outages: [`set_available`](MemoryBroker::set_available) refuses every publish at once
///   ([`Delivery::Unavailable`], like a refused connection),
///   [`set_black_hole`](MemoryBroker::set_black_hole) makes publishes hang (the relay's
///   publish timeout ends them, like a network that drops packets), and
///   [`unavailable_when`](MemoryBroker::unavailable_when) makes chosen messages unavailable
///   (like a partition without a leader);
/// - poison: [`fail_when`](MemoryBroker::fail_when) refuses chosen messages for themselves
///   ([`Delivery::Failed`], like a record too large).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use outbox_core::relay::{Delivery, MemoryBroker, Publisher};
/// # let m = outbox_core::relay::MemoryStore::default();
/// # m.insert(outbox_core::relay::test_message("order", "1", "E"));
/// # let mut store = m.clone();
/// # use outbox_core::relay::RelayStore;
/// # let claim = outbox_core::relay::Claim { relay: "r", limit: 1, lease: std::time::Duration::from_secs(5), order: outbox_core::relay::ClaimOrder::Unordered, look_ahead: None, settling: &[] };
/// # let batch = store.claim(&claim).await.unwrap();
/// let broker = MemoryBroker::new();
/// broker.set_available(false);
/// assert!(broker.publish(&batch).await[0].is_outage());
/// broker.set_available(true);
/// broker.fail_when(|_| Some("too large".into()));
/// assert_eq!(broker.publish(&batch).await[0], Delivery::Failed("too large".into()));
/// # }
/// ```
#[derive(Default)]
pub struct MemoryBroker {
    topics: Mutex<BTreeMap<String, Vec<Record>>>,
    down: AtomicBool,
    black_hole: AtomicBool,
    fault: Mutex<Option<Box<FaultFn>>>,
    outage: Mutex<Option<Box<FaultFn>>>,
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

impl MemoryBroker {
    /// An empty broker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the broker down (`false`: every publish is refused at once with
    /// [`Delivery::Unavailable`], as by a broker whose port is closed) or brings it back.
    pub fn set_available(&self, available: bool) {
        self.down.store(!available, Ordering::SeqCst);
    }

    /// While `true`, every publish hangs and never reports (the relay's publish timeout ends
    /// it), as when the network drops the broker's packets. Nothing reaches the broker.
    pub fn set_black_hole(&self, black_hole: bool) {
        self.black_hole.store(black_hole, Ordering::SeqCst);
    }

    /// Refuses every message for which `f` returns an error as the message's own fault
    /// ([`Delivery::Failed`], poison), until replaced or cleared
    /// ([`clear_faults`](MemoryBroker::clear_faults)).
    pub fn fail_when(&self, f: impl Fn(&OutboxMessage) -> Option<String> + Send + Sync + 'static) {
        *lock(&self.fault) = Some(Box::new(f));
    }

    /// Reports every message for which `f` returns an error as an outage
    /// ([`Delivery::Unavailable`]), until replaced or cleared
    /// ([`clear_faults`](MemoryBroker::clear_faults)).
    pub fn unavailable_when(
        &self,
        f: impl Fn(&OutboxMessage) -> Option<String> + Send + Sync + 'static,
    ) {
        *lock(&self.outage) = Some(Box::new(f));
    }

    /// Removes the faults set by [`fail_when`](MemoryBroker::fail_when) and
    /// [`unavailable_when`](MemoryBroker::unavailable_when).
    pub fn clear_faults(&self) {
        *lock(&self.fault) = None;
        *lock(&self.outage) = None;
    }

    /// The records of `topic`, in offset order.
    pub fn records(&self, topic: &str) -> Vec<Record> {
        lock(&self.topics).get(topic).cloned().unwrap_or_default()
    }

    /// Every record of every topic, topics in name order.
    pub fn all_records(&self) -> Vec<Record> {
        lock(&self.topics).values().flatten().cloned().collect()
    }
}

impl Publisher for MemoryBroker {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        if self.black_hole.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.down.load(Ordering::SeqCst) {
            return vec![
                Delivery::Unavailable("broker unavailable: connection refused".into());
                batch.len()
            ];
        }
        let fault = lock(&self.fault);
        let outage = lock(&self.outage);
        let mut topics = lock(&self.topics);
        let mut failed_keys: HashSet<(&str, &str)> = HashSet::new();
        batch
            .iter()
            .map(|m| {
                if failed_keys.contains(&m.ordering_key()) {
                    return Delivery::NotAttempted;
                }
                if let Some(error) = outage.as_ref().and_then(|f| f(m)) {
                    failed_keys.insert(m.ordering_key());
                    return Delivery::Unavailable(error);
                }
                if let Some(error) = fault.as_ref().and_then(|f| f(m)) {
                    failed_keys.insert(m.ordering_key());
                    return Delivery::Failed(error);
                }
                let records = topics.entry(m.topic().to_owned()).or_default();
                records.push(Record {
                    topic: m.topic().to_owned(),
                    key: m.aggregate_id.clone(),
                    headers: message_headers(m),
                    payload: m.payload.clone(),
                    id: m.id,
                    offset: records.len() as u64,
                });
                Delivery::Published
            })
            .collect()
    }

    fn unavailable(&self) -> Option<String> {
        if self.down.load(Ordering::SeqCst) {
            Some("broker unavailable: connection refused".into())
        } else if self.black_hole.load(Ordering::SeqCst) {
            Some("broker unavailable: no answer".into())
        } else {
            None
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data here; carry on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A message for examples and tests: aggregate, id and event type, payload `{}`.
#[doc(hidden)]
pub fn test_message(aggregate_type: &str, aggregate_id: &str, event_type: &str) -> NewMessage {
    NewMessage {
        id: Uuid::now_v7(),
        aggregate_type: aggregate_type.to_owned().into(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: event_type.to_owned().into(),
        event_version: 1,
        payload: "{}".to_owned(),
        headers: Headers::new(),
        topic: None,
        shard: crate::shard_of(aggregate_type, aggregate_id),
        created_at: crate::now_micros(),
    }
}
