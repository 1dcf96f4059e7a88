//! Declaring what the publisher and the consumer need: exchanges (kept as they are when they
//! exist), the consumer's queues and bindings, and the dead-letter exchanges and queues.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Connection, ExchangeKind};

use super::classify::{NOT_FOUND, reply_code};

/// A name as AMQP carries it (at most 255 bytes), or why it cannot be one.
pub(crate) fn short(what: &str, value: &str) -> Result<ShortString, String> {
    ShortString::try_new(value).map_err(|_| {
        format!(
            "the {what} is {} bytes long; AMQP allows at most 255",
            value.len()
        )
    })
}

/// Makes sure exchange `name` exists: a passive declare, and if the broker answers 404
/// NOT_FOUND, a durable declare of `kind`. An exchange that exists is kept as it is (its kind
/// and arguments too: a user's pre-declared `x-consistent-hash` exchange stays one). Each
/// declare runs on a channel of its own, because a refused declare closes its channel.
pub(crate) async fn ensure_exchange(
    connection: &Connection,
    exchange: &ShortString,
    kind: &ExchangeKind,
) -> Result<(), lapin::Error> {
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    let channel = connection.create_channel().await?;
    match channel
        .exchange_declare(
            exchange.clone(),
            kind.clone(),
            passive,
            FieldTable::default(),
        )
        .await
    {
        Ok(()) => return Ok(()),
        Err(e) if reply_code(&e) == Some(NOT_FOUND) => {}
        Err(e) => return Err(e),
    }
    let channel = connection.create_channel().await?;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.clone(),
            kind.clone(),
            durable,
            FieldTable::default(),
        )
        .await
}

/// What a consumer reads and where its dead letters go, for one topic (names checked by the
/// builder: AMQP names are at most 255 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicQueues {
    /// The exchange: the topic.
    pub(crate) topic: ShortString,
    /// `<group>.<topic>`, bound to the topic with `#`.
    pub(crate) queue: ShortString,
    /// The dead-letter exchange (fanout) and the queue of the same name bound to it.
    pub(crate) dead_letters: ShortString,
}

impl TopicQueues {
    /// `topic`'s queues for consumer `group`, dead letters to `dead_letters` (default
    /// `<topic>.dlt`); or the name that is too long.
    pub(crate) fn new(
        group: &str,
        topic: &str,
        dead_letters: Option<&str>,
    ) -> Result<Self, String> {
        let dead_letters = dead_letters.map_or_else(|| format!("{topic}.dlt"), str::to_owned);
        Ok(TopicQueues {
            topic: short("topic", topic)?,
            queue: short("queue", &format!("{group}.{topic}"))?,
            dead_letters: short("dead-letter exchange", &dead_letters)?,
        })
    }
}

/// Declares one topic's part of a consumer's topology (see the module docs' table): the topic
/// exchange if missing, the durable queue with a single active consumer and its binding, and
/// the dead-letter exchange and queue.
pub(crate) async fn declare_consumer(
    connection: &Connection,
    queues: &TopicQueues,
    kind: &ExchangeKind,
) -> Result<(), lapin::Error> {
    ensure_exchange(connection, &queues.topic, kind).await?;
    ensure_exchange(connection, &queues.dead_letters, &ExchangeKind::Fanout).await?;
    let channel = connection.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let mut single_active = FieldTable::default();
    single_active.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    let queue = queues.queue.clone();
    channel
        .queue_declare(queue.clone(), durable, single_active)
        .await?;
    channel
        .queue_bind(
            queue,
            queues.topic.clone(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let dead_letters = queues.dead_letters.clone();
    channel
        .queue_declare(dead_letters.clone(), durable, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            dead_letters.clone(),
            dead_letters,
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_reads_its_own_queue_and_dead_letters_default_per_topic() {
        let q = TopicQueues::new("billing", "order", None).unwrap();
        let names = [q.topic.as_str(), q.queue.as_str(), q.dead_letters.as_str()];
        assert_eq!(names, ["order", "billing.order", "order.dlt"]);
        let fixed = TopicQueues::new("billing", "order", Some("billing.dlt")).unwrap();
        assert_eq!(fixed.dead_letters.as_str(), "billing.dlt");
        let long = TopicQueues::new("billing", &"o".repeat(250), None).unwrap_err();
        assert!(long.contains("queue") && long.contains("255"), "{long}");
    }
}
