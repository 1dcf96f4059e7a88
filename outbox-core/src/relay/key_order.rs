//! [`publish_in_key_order`]: the ordering half of the [`Publisher`](super::Publisher) contract,
//! for brokers that acknowledge each message on its own (NATS JetStream, RabbitMQ).

use std::collections::HashMap;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::publisher::{Delivery, OutboxMessage};

/// Publishes `batch` through `send` (one message and its index in the batch, awaited until
/// the broker acknowledged or refused it) one message at a time per [`ordering_key`](OutboxMessage::ordering_key) and
/// concurrently across keys, and returns one [`Delivery`] per message, in batch order.
///
/// A key's next message is sent only once the one before it was
/// [`Published`](Delivery::Published); after a failure the key's later messages are
/// [`NotAttempted`](Delivery::NotAttempted). So no message is ever stored by the broker
/// before an earlier one of its key, whatever fails: a broker that acknowledges messages one
/// by one (a JetStream publish acknowledgement, a RabbitMQ publisher confirm) can refuse or
/// lose one of a pipeline and take the next, which a pipelined key would turn into a reordered
/// aggregate. Keys are independent, so a batch of many aggregates still travels as a
/// pipeline; a batch of one aggregate costs one round trip per message.
///
/// ```
/// use outbox_core::relay::{Delivery, OutboxMessage, publish_in_key_order};
/// # fn message(seq: i64, aggregate_id: &str) -> OutboxMessage {
/// #     OutboxMessage {
/// #         seq, id: uuid::Uuid::now_v7(), aggregate_type: "order".into(),
/// #         aggregate_id: aggregate_id.into(), event_type: "OrderPlaced".into(),
/// #         event_version: 1, payload: "{}".into(), headers: Default::default(), topic: None,
/// #         shard: 0, created_at: chrono::Utc::now(), attempts: 1,
/// #     }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Order 7's first event times out, so its second is not sent; order 8's goes on.
/// let batch = vec![message(1, "7"), message(2, "7"), message(3, "8")];
/// let outcomes = publish_in_key_order(&batch, |_, msg| async move {
///     if msg.seq == 1 { Delivery::Unavailable("timed out".into()) } else { Delivery::Published }
/// })
/// .await;
/// assert_eq!(
///     outcomes,
///     [Delivery::Unavailable("timed out".into()), Delivery::NotAttempted, Delivery::Published]
/// );
/// # }
/// ```
pub async fn publish_in_key_order<'a, F, Fut>(
    batch: &'a [OutboxMessage],
    mut send: F,
) -> Vec<Delivery>
where
    F: FnMut(usize, &'a OutboxMessage) -> Fut,
    Fut: Future<Output = Delivery> + 'a,
{
    // `next[i]`: the index of the message after `i` with the same key (`None` for the last).
    let mut next: Vec<Option<usize>> = vec![None; batch.len()];
    let mut last: HashMap<(&str, &str), usize> = HashMap::with_capacity(batch.len());
    let mut heads = Vec::new();
    for (i, msg) in batch.iter().enumerate() {
        match last.insert(msg.ordering_key(), i) {
            Some(previous) => next[previous] = Some(i),
            None => heads.push(i),
        }
    }
    let tagged = |i: usize, sent: Fut| async move { (i, sent.await) };
    let mut in_flight: FuturesUnordered<_> = heads
        .into_iter()
        .map(|i| tagged(i, send(i, &batch[i])))
        .collect();
    let mut outcomes: Vec<Option<Delivery>> = vec![None; batch.len()];
    while let Some((i, delivery)) = in_flight.next().await {
        let published = delivery == Delivery::Published;
        outcomes[i] = Some(delivery);
        if published {
            if let Some(j) = next[i] {
                in_flight.push(tagged(j, send(j, &batch[j])));
            }
        } else {
            let mut later = next[i];
            while let Some(j) = later {
                outcomes[j] = Some(Delivery::NotAttempted);
                later = next[j];
            }
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| outcome.unwrap_or(Delivery::NotAttempted))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    fn test_message(seq: i64, aggregate_id: &str) -> OutboxMessage {
        OutboxMessage {
            seq,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: aggregate_id.into(),
            event_type: "OrderPlaced".into(),
            event_version: 1,
            payload: "{}".into(),
            headers: Default::default(),
            topic: None,
            shard: 0,
            created_at: chrono::Utc::now(),
            attempts: 1,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_key_waits_for_its_previous_message_and_keys_overlap() {
        let batch = vec![
            test_message(1, "a"),
            test_message(2, "b"),
            test_message(3, "a"),
            test_message(4, "b"),
        ];
        let log = Mutex::new(Vec::new());
        let outcomes = publish_in_key_order(&batch, |_, msg| {
            let log = &log;
            async move {
                log.lock().unwrap().push(("start", msg.seq));
                // `a` is slow: `b` overtakes it, but `a`'s second message waits for its first.
                let ms = if msg.aggregate_id == "a" { 10 } else { 1 };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                log.lock().unwrap().push(("end", msg.seq));
                Delivery::Published
            }
        })
        .await;
        assert_eq!(outcomes, vec![Delivery::Published; 4]);
        let log = log.into_inner().unwrap();
        let at = |event: (&str, i64)| log.iter().position(|e| *e == event).unwrap();
        assert!(at(("end", 1)) < at(("start", 3)), "{log:?}");
        assert!(at(("end", 2)) < at(("start", 4)), "{log:?}");
        assert!(at(("end", 4)) < at(("end", 1)), "{log:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn after_a_failure_the_key_stops_and_the_others_go_on() {
        let batch = vec![
            test_message(1, "a"),
            test_message(2, "b"),
            test_message(3, "a"),
            test_message(4, "a"),
            test_message(5, "b"),
        ];
        let sent = Mutex::new(Vec::new());
        let outcomes = publish_in_key_order(&batch, |_, msg| {
            sent.lock().unwrap().push(msg.seq);
            async move {
                match msg.seq {
                    3 => Delivery::Failed("too large".into()),
                    _ => Delivery::Published,
                }
            }
        })
        .await;
        assert_eq!(
            outcomes,
            [
                Delivery::Published,
                Delivery::Published,
                Delivery::Failed("too large".into()),
                Delivery::NotAttempted,
                Delivery::Published,
            ]
        );
        let mut sent = sent.into_inner().unwrap();
        sent.sort_unstable();
        assert_eq!(sent, [1, 2, 3, 5], "4 is never sent");
    }
}
