//! What the end-to-end tests through NATS and RabbitMQ share: 20,000 events of 1,000
//! aggregates written with `transaction_with_outbox`, the `#[idempotent]` handler that records
//! each event's position in its aggregate, and the checks that every aggregate arrived once and
//! in order.

use std::collections::HashMap;
use std::time::Duration;

use diesel::Connection;
use diesel_async::AsyncPgConnection;
use outbox::prelude::*;
use outbox::{Envelope, idempotent};

use crate::conns::*;
use crate::support::*;

pub(crate) const AGGREGATES: i64 = 1_000;
pub(crate) const PER_AGGREGATE: i64 = 20;
/// A guard against a hang, not a speed target: beside the test command's other tests and
/// compilers the 20,000 handler transactions (one at a time) have run at under 100 a second.
pub(crate) const DEADLINE: Duration = Duration::from_secs(480);

/// The event's position in its aggregate travels as `total_cents`; the effect records it.
#[idempotent(consumer = "billing")]
pub(crate) async fn apply(
    conn: &mut AsyncPgConnection,
    event: Envelope<OrderCreated>,
) -> Result<(), AppError> {
    conn.effect(
        "billing",
        &event.inbox_key(),
        event.order_id,
        event.total_cents,
    )
    .await?;
    Ok(())
}

pub(crate) fn pending_in(url: &str) -> i64 {
    use diesel::RunQueryDsl;
    let mut conn = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query(
        "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .get_result::<Count>(&mut conn)
    .unwrap()
    .n
}

/// (order id, position) of every effect, in the order they were written.
pub(crate) async fn effects_in_order(conn: &mut AsyncPgConnection) -> Vec<(i64, i64)> {
    use diesel::ExpressionMethods;
    use diesel::QueryDsl;
    use diesel_async::RunQueryDsl;
    effects::table
        .order(effects::n.asc())
        .select((effects::order_id, effects::amount))
        .load(conn)
        .await
        .unwrap()
}

/// Fails unless each aggregate's positions are exactly `0..PER_AGGREGATE`, in order.
pub(crate) fn assert_each_aggregate_in_order(what: &str, positions: &[(i64, i64)]) {
    let mut next: HashMap<i64, i64> = HashMap::new();
    for &(order_id, position) in positions {
        let expected = next.entry(order_id).or_default();
        assert_eq!(position, *expected, "{what}: order {order_id} out of order");
        *expected += 1;
    }
    assert_eq!(next.len() as i64, AGGREGATES, "{what}: every aggregate");
    assert!(
        next.values().all(|n| *n == PER_AGGREGATE),
        "{what}: every event once"
    );
}

/// Writes position k of every aggregate, for k in `0..PER_AGGREGATE`, 100 aggregates per
/// transaction, to the outbox at `url`.
pub(crate) fn write_positions(url: &str) {
    let writer_url = url.to_owned();
    let writer = std::thread::spawn(move || {
        let mut conn = diesel::PgConnection::establish(&writer_url).unwrap();
        for position in 0..PER_AGGREGATE {
            for first in (1..=AGGREGATES).step_by(100) {
                conn.transaction_with_outbox(|tx| {
                    for order_id in first..first + 100 {
                        let event = OrderCreated {
                            order_id,
                            total_cents: position,
                        };
                        tx.publish(&event)?;
                    }
                    Ok::<_, AppError>(())
                })
                .unwrap();
            }
        }
    });
    writer.join().unwrap();
}
