//! The ordering rules of one batch, free of any broker: in which order to enqueue, which
//! messages to hold back after a failure, and how to report a broken order.

use std::collections::HashMap;

use crate::relay::{Delivery, OutboxMessage};

/// The order in which to enqueue the messages of `batch` at `indices` (ascending): grouped by
/// ordering key (groups in order of first appearance), each group in batch order.
///
/// Grouping keeps the messages of one key next to each other in librdkafka's partition queue
/// and enqueued within microseconds of each other, so they share a produce request and their
/// `message.timeout.ms` deadlines are practically equal (see the module docs for why that
/// matters). Order across keys is not promised, so regrouping costs nothing.
pub(crate) fn enqueue_order(batch: &[OutboxMessage], indices: &[usize]) -> Vec<usize> {
    let mut group_of: HashMap<(&str, &str), usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &i in indices {
        let msg = &batch[i];
        let g = *group_of.entry(msg.ordering_key()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups.into_iter().flatten().collect()
}

/// After every message has an outcome: where a message failed but a later message of the same
/// key in the batch was published anyway (possible only through an asynchronous failure, see the
/// module docs), say so in the failed message's error, so the relay's `last_error` shows it.
/// Outcomes are left as they are: the published message is on the broker and must not be sent
/// again, and the failed one must be retried.
pub(crate) fn flag_order_breaks(batch: &[OutboxMessage], outcomes: &mut [Delivery]) {
    let mut first_failure: HashMap<(&str, &str), (usize, bool)> = HashMap::new();
    for (i, msg) in batch.iter().enumerate() {
        match &outcomes[i] {
            Delivery::Failed(_) | Delivery::Unavailable(_) => {
                first_failure
                    .entry(msg.ordering_key())
                    .or_insert((i, false));
            }
            Delivery::Published => {
                if let Some((failed, flagged)) = first_failure.get_mut(&msg.ordering_key())
                    && !*flagged
                {
                    *flagged = true;
                    if let Some(reason) = outcomes[*failed].error_mut() {
                        reason.push_str(
                            "; a later event of this aggregate in the same batch was \
                             published, so this event may reach consumers out of order",
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(aggregate_type: &str, aggregate_id: &str) -> OutboxMessage {
        OutboxMessage {
            seq: 0,
            id: uuid::Uuid::nil(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: "E".into(),
            event_version: 1,
            payload: "{}".into(),
            headers: Default::default(),
            topic: None,
            shard: 0,
            created_at: chrono::Utc::now(),
            attempts: 1,
        }
    }

    #[test]
    fn enqueue_order_groups_by_key_in_batch_order() {
        let batch = [
            msg("order", "1"),
            msg("order", "2"),
            msg("user", "1"),
            msg("order", "1"),
            msg("order", "2"),
            msg("order", "1"),
        ];
        assert_eq!(
            enqueue_order(&batch, &[0, 1, 2, 3, 4, 5]),
            [0, 3, 5, 1, 4, 2]
        );
        assert_eq!(enqueue_order(&batch, &[1, 2, 5]), [1, 2, 5]);
        assert_eq!(enqueue_order(&[], &[]), Vec::<usize>::new());
    }

    #[test]
    fn a_publish_after_a_failure_of_the_same_key_is_flagged_once() {
        let batch = [msg("o", "1"), msg("o", "2"), msg("o", "1"), msg("o", "1")];
        let mut outcomes = vec![
            Delivery::Failed("timed out".into()),
            Delivery::Published,
            Delivery::Published,
            Delivery::Published,
        ];
        flag_order_breaks(&batch, &mut outcomes);
        let Delivery::Failed(reason) = &outcomes[0] else {
            panic!()
        };
        assert!(reason.starts_with("timed out; a later event"), "{reason}");
        assert_eq!(reason.matches("later event").count(), 1);
        assert_eq!(
            &outcomes[1..],
            [
                Delivery::Published,
                Delivery::Published,
                Delivery::Published
            ]
        );
    }

    #[test]
    fn an_outage_followed_by_a_publish_is_flagged_and_stays_an_outage() {
        let batch = [msg("o", "1"), msg("o", "1")];
        let mut outcomes = vec![
            Delivery::Unavailable("timed out".into()),
            Delivery::Published,
        ];
        flag_order_breaks(&batch, &mut outcomes);
        assert!(outcomes[0].is_outage());
        assert!(outcomes[0].error().unwrap().contains("later event"));
    }

    #[test]
    fn failures_followed_by_not_attempted_are_left_alone() {
        let batch = [msg("o", "1"), msg("o", "1"), msg("o", "2")];
        let mut outcomes = vec![
            Delivery::Failed("too large".into()),
            Delivery::NotAttempted,
            Delivery::Published,
        ];
        flag_order_breaks(&batch, &mut outcomes);
        assert_eq!(outcomes[0], Delivery::Failed("too large".into()));
    }
}
