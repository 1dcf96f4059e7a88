//! [`Faulty`]: outages injected into any publisher, the in-memory broker or Kafka.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::relay::{Delivery, OutboxMessage, Publisher};

/// A fault [`Faulty`] injects into its next publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The broker is unreachable: every message is reported
    /// [`Delivery::Unavailable`] and nothing reaches the wrapped publisher.
    Unreachable,
    /// The publish hangs and never reports (the relay's publish timeout ends it), as when the
    /// network drops the broker's packets. Nothing reaches the wrapped publisher.
    BlackHole,
    /// The messages reach the wrapped publisher, but the acknowledgement is lost: every
    /// message is reported [`Delivery::Unavailable`] (outcome unknown), so the relay gives it
    /// back and publishes it again. This is a relay killed between its publish and its mark,
    /// seen from the broker: the events arrive twice.
    LoseAcks,
    /// The broker refuses every message for itself ([`Delivery::Failed`], poison: it costs an
    /// attempt and is dead-lettered after the relay's `max_attempts`).
    Refuse,
}

#[derive(Debug)]
enum Plan {
    /// For the next `n` publishes.
    Times(Fault, u32),
    /// Until then.
    Until(Fault, Instant),
    /// Until cleared.
    Always(Fault),
}

/// A [`Publisher`] wrapper that injects faults for tests (feature `testing`): the wrapped
/// publisher (the [`MemoryBroker`](crate::relay::MemoryBroker), a Kafka publisher, your own)
/// fails a number of times, is unreachable for a while, black-holes, or loses its
/// acknowledgements. Share it with the relay through an `Arc` and switch faults on and off
/// while the relay runs.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use outbox_core::relay::{MemoryBroker, Publisher};
/// use outbox_core::testing::{Fault, Faulty};
/// # let m = outbox_core::relay::MemoryStore::default();
/// # m.insert(outbox_core::relay::test_message("order", "1", "E"));
/// # let mut store = m.clone();
/// # use outbox_core::relay::RelayStore;
/// # let claim = outbox_core::relay::Claim { relay: "r", limit: 1, lease: Duration::from_secs(5), order: outbox_core::relay::ClaimOrder::Unordered, look_ahead: None, settling: &[] };
/// # let batch = store.claim(&claim).await.unwrap();
///
/// let broker = Faulty::new(MemoryBroker::new());
/// broker.fail_times(Fault::Unreachable, 2);
/// assert!(broker.publish(&batch).await[0].is_outage());
/// assert!(broker.publish(&batch).await[0].is_outage());
/// assert!(!broker.publish(&batch).await[0].is_failure()); // the third one goes through
/// assert_eq!(broker.inner().all_records().len(), 1);
///
/// broker.fail_times(Fault::LoseAcks, 1); // published, but the relay is told it was not
/// assert!(broker.publish(&batch).await[0].is_outage());
/// assert_eq!(broker.inner().all_records().len(), 2);
/// assert_eq!(broker.calls(), 4);
/// # }
/// ```
#[derive(Debug)]
pub struct Faulty<P> {
    inner: P,
    plan: Mutex<Option<Plan>>,
    calls: AtomicU64,
}

impl<P: Publisher> Faulty<P> {
    /// Wraps `inner`, with no fault yet.
    pub fn new(inner: P) -> Self {
        Faulty {
            inner,
            plan: Mutex::new(None),
            calls: AtomicU64::new(0),
        }
    }

    /// The wrapped publisher, e.g. to read the [`MemoryBroker`](crate::relay::MemoryBroker)'s
    /// records.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Injects `fault` into the next `times` publishes (each a batch), then none.
    pub fn fail_times(&self, fault: Fault, times: u32) {
        self.set((times > 0).then_some(Plan::Times(fault, times)));
    }

    /// Injects `fault` into every publish for `duration` from now, then none: "the broker is
    /// down for five seconds".
    pub fn fail_for(&self, fault: Fault, duration: Duration) {
        self.set(Some(Plan::Until(fault, Instant::now() + duration)));
    }

    /// Injects `fault` into every publish until [`clear`](Faulty::clear).
    pub fn fail_always(&self, fault: Fault) {
        self.set(Some(Plan::Always(fault)));
    }

    /// Removes the fault: publishes go through to the wrapped publisher again.
    pub fn clear(&self) {
        self.set(None);
    }

    /// How many publishes (batches) were asked of this wrapper, faulty ones included.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn set(&self, plan: Option<Plan>) {
        *self.plan.lock().unwrap_or_else(|e| e.into_inner()) = plan;
    }

    /// The fault of this publish, if any, counting it down.
    fn take(&self) -> Option<Fault> {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        let (fault, next) = match plan.take() {
            None => return None,
            Some(Plan::Times(fault, n)) => {
                let next = (n > 1).then(|| Plan::Times(fault.clone(), n - 1));
                (fault, next)
            }
            Some(Plan::Until(fault, until)) if Instant::now() < until => {
                (fault.clone(), Some(Plan::Until(fault, until)))
            }
            Some(Plan::Until(..)) => return None,
            Some(Plan::Always(fault)) => (fault.clone(), Some(Plan::Always(fault))),
        };
        *plan = next;
        Some(fault)
    }

    /// The fault a publish now would meet, without counting it down.
    fn current(&self) -> Option<Fault> {
        match &*self.plan.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(Plan::Times(f, _)) | Some(Plan::Always(f)) => Some(f.clone()),
            Some(Plan::Until(f, until)) if Instant::now() < *until => Some(f.clone()),
            _ => None,
        }
    }
}

impl<P: Publisher> Publisher for Faulty<P> {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let all = |d: Delivery| vec![d; batch.len()];
        match self.take() {
            None => self.inner.publish(batch).await,
            Some(Fault::Unreachable) => all(Delivery::Unavailable(
                "injected fault: broker unreachable".into(),
            )),
            Some(Fault::BlackHole) => std::future::pending().await,
            Some(Fault::LoseAcks) => {
                let deliveries = self.inner.publish(batch).await;
                deliveries
                    .into_iter()
                    .map(|d| match d {
                        Delivery::Published => Delivery::Unavailable(
                            "injected fault: acknowledgement lost after publishing".into(),
                        ),
                        other => other,
                    })
                    .collect()
            }
            Some(Fault::Refuse) => all(Delivery::Failed(
                "injected fault: the broker refused the message".into(),
            )),
        }
    }

    fn unavailable(&self) -> Option<String> {
        match self.current() {
            Some(Fault::Unreachable) => Some("injected fault: broker unreachable".into()),
            Some(Fault::BlackHole) => Some("injected fault: no answer".into()),
            _ => self.inner.unavailable(),
        }
    }

    /// Not ready while an unreachable or black-hole fault is planned, else as the wrapped
    /// publisher.
    async fn ready(&self, timeout: std::time::Duration) -> Result<(), crate::relay::NotReady> {
        match self.current() {
            Some(Fault::Unreachable | Fault::BlackHole) => Err(crate::relay::NotReady::new(
                self.unavailable().unwrap_or_default(),
            )),
            _ => self.inner.ready(timeout).await,
        }
    }
}
