//! What the end-to-end tests through NATS and RabbitMQ share: 20,000 events of 1,000
//! aggregates written with `transaction_with_outbox`, the `#[idempotent]` handler that records
//! each event's position in its aggregate, and the checks that every aggregate arrived once and
//! in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::Connection;
use diesel_async::AsyncPgConnection;
use outbox::consumer::ConsumerStats;
use outbox::prelude::*;
use outbox::relay::{Mode, PgRelayStore, Publisher, Relay, RelayConfig};
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

/// Two sharded relays (batch 500), one per publisher, drain `source` while
/// [`write_positions`] writes every event to it. Once nothing is pending and the consumer
/// (`stats`, running as `consuming`) has done every event, stops the relays and the consumer,
/// checks the consumer's effects in `sink` (every aggregate once, in order), and returns the
/// events and the time since `started`.
pub(crate) async fn relay_write_and_check<P: Publisher + 'static>(
    source: &TestDatabase,
    sink: &TestDatabase,
    publishers: [P; 2],
    stats: Arc<ConsumerStats>,
    (stop_consumer, consuming): (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    started: Instant,
) -> (u64, Duration) {
    let (stop_relays, relays_stopped) = tokio::sync::watch::channel(false);
    let mut relays = Vec::new();
    for publisher in publishers {
        let config = RelayConfig {
            mode: Mode::Sharded,
            batch_size: 500,
            poll_interval: Duration::from_millis(50),
            ..RelayConfig::default()
        };
        let relay = Relay::new(PgRelayStore::new(source.url.clone()), publisher, config).unwrap();
        let mut stopped = relays_stopped.clone();
        relays.push(tokio::spawn(relay.run(async move {
            stopped.wait_for(|stop| *stop).await.ok();
        })));
    }

    // The writer: position k of every aggregate, 100 aggregates per transaction.
    write_positions(&source.url);

    let total = (AGGREGATES * PER_AGGREGATE) as u64;
    let deadline = Instant::now() + DEADLINE;
    while pending_in(&source.url) > 0 || stats.get(&stats.done) < total {
        assert!(Instant::now() < deadline, "not done in time: {stats:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_relays.send(true).unwrap();
    for relay in relays {
        relay.await.unwrap();
    }
    stop_consumer.send(()).unwrap();
    consuming.await.unwrap();
    let elapsed = started.elapsed();

    // Applied exactly once in effect, each aggregate in order.
    let mut conn = <AsyncPgConnection as AsyncConn>::open(sink).await;
    let effects = effects_in_order(&mut conn).await;
    assert_each_aggregate_in_order("the consumer's effects", &effects);
    assert_eq!(stats.get(&stats.applied), total, "{stats:?}");
    (total, elapsed)
}
