//! [`MemoryBroker::published`]: what the in-memory broker received, typed.

use serde::de::DeserializeOwned;

use crate::relay::{MemoryBroker, Record};
use crate::{DecodeError, Envelope, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, OutboxEvent};

fn is<E: OutboxEvent>(record: &Record) -> bool {
    let (Some(aggregate_type), Some(event_type)) = (
        record.header(HEADER_AGGREGATE_TYPE),
        record.header(HEADER_EVENT_TYPE),
    ) else {
        return false;
    };
    E::EVENT_TYPES
        .iter()
        .any(|t| t.aggregate_type == aggregate_type && t.event_type == event_type)
}

impl MemoryBroker {
    /// The events of type `E` the broker received, decoded from its records as a Kafka
    /// consumer decodes them (feature `testing`). Records of other event types are left out.
    /// The order is the broker's: topic by topic (in name order), each in offset order, so
    /// the events of one aggregate are in the order they were published; a redelivered event
    /// appears as often as it was published.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use outbox_core as outbox;
    /// use std::sync::Arc;
    /// use outbox_core::relay::{MemoryBroker, MemoryStore, Relay, RelayConfig};
    /// use outbox_core::{NewMessage, OutboxEvent};
    ///
    /// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize, OutboxEvent)]
    /// #[outbox(crate = outbox_core, aggregate = "order", event_type = "OrderPlaced")]
    /// struct OrderPlaced { #[outbox(aggregate_id)] order_id: i64 }
    ///
    /// let store = MemoryStore::default();
    /// store.insert(NewMessage::from_event(&OrderPlaced { order_id: 7 }, Default::default())?);
    /// let broker = Arc::new(MemoryBroker::new());
    /// let relay = Relay::new(store.clone(), broker.clone(), RelayConfig::default())?;
    /// relay.run(async move { while !store.is_drained() { tokio::task::yield_now().await } }).await;
    /// assert_eq!(broker.published::<OrderPlaced>()?, [OrderPlaced { order_id: 7 }]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn published<E: OutboxEvent + DeserializeOwned>(&self) -> Result<Vec<E>, DecodeError> {
        Ok(self
            .published_envelopes::<E>()?
            .into_iter()
            .map(Envelope::into_payload)
            .collect())
    }

    /// [`published`](MemoryBroker::published) with each event's [`Envelope`]: its id (the
    /// same for every redelivery), headers and version, as a handler receives it.
    pub fn published_envelopes<E: OutboxEvent + DeserializeOwned>(
        &self,
    ) -> Result<Vec<Envelope<E>>, DecodeError> {
        self.all_records()
            .iter()
            .filter(|r| is::<E>(r))
            .map(Envelope::from_record)
            .collect()
    }
}
