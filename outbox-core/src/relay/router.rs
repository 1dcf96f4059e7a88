//! [`Router`]: where a broker's publisher sends a message (Kafka's topic, NATS's subject's
//! first part, RabbitMQ's exchange), the one rule for every publisher.

use std::fmt;
use std::sync::Arc;

use super::publisher::OutboxMessage;

type TopicFn = dyn Fn(&OutboxMessage) -> String + Send + Sync;

/// Chooses the topic of a message: a user function or [`OutboxMessage::topic`], then a prefix.
#[derive(Clone, Default)]
pub(crate) struct Router {
    pub(crate) prefix: String,
    pub(crate) map: Option<Arc<TopicFn>>,
}

impl Router {
    pub(crate) fn topic(&self, msg: &OutboxMessage) -> String {
        let base = match &self.map {
            Some(map) => map(msg),
            None => msg.topic().to_owned(),
        };
        if self.prefix.is_empty() {
            base
        } else {
            format!("{}{base}", self.prefix)
        }
    }
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router")
            .field("prefix", &self.prefix)
            .field("map", &self.map.as_ref().map(|_| "fn"))
            .finish()
    }
}
