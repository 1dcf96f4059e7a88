//! `Faulty` in front of the real relay: the faults a team puts in its own tests.

use std::sync::Arc;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use outbox::relay::{Backoff, MemoryBroker, Mode, Relay, RelayConfig, SqliteRelayStore};
use outbox::testing::{Fault, Faulty, deliver_twice, written_events};

use crate::{OrderPlaced, place_order};

fn config() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(10),
        mode: Mode::Unordered,
        outage_backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(20),
            ..RelayConfig::default().outage_backoff
        },
        ..RelayConfig::default()
    }
}

/// Runs the relay on `db` until `done` says so (or 30 s pass).
async fn relay_until(
    db: &outbox::testing::TestDatabase,
    broker: Arc<Faulty<MemoryBroker>>,
    done: impl Fn(&Faulty<MemoryBroker>) -> bool + Send + 'static,
) {
    let relay = Relay::new(SqliteRelayStore::new(db.url()), broker.clone(), config()).unwrap();
    let watched = broker.clone();
    let run = relay.run(async move {
        while !done(&watched) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the relay did not finish in 30 s");
}

#[tokio::test]
async fn the_relay_rides_out_a_broker_that_fails_n_times() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    let broker = Arc::new(Faulty::new(MemoryBroker::new()));
    broker.fail_times(Fault::Unreachable, 3);
    relay_until(&db, broker.clone(), |b| b.inner().all_records().len() == 2).await;
    assert!(
        broker.calls() >= 4,
        "three refused publishes, then the one that went through"
    );
    // An outage costs no attempt: nothing was dead-lettered, every event published once.
    let events = written_events(&mut conn).unwrap();
    assert!(events.iter().all(|e| e.published), "{events:?}");
    assert_eq!(broker.inner().published::<OrderPlaced>().unwrap().len(), 1);
}

#[tokio::test]
async fn lost_acknowledgements_redeliver_and_an_idempotent_handler_applies_once() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    conn.batch_execute("CREATE TABLE invoices (order_id BIGINT NOT NULL, cents BIGINT NOT NULL)")
        .unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    place_order(&mut conn, 8, 99).unwrap();
    // The relay publishes, and "dies" before it can mark: the broker has the events, the
    // outbox still says pending, so they are published again.
    let broker = Arc::new(Faulty::new(MemoryBroker::new()));
    broker.fail_times(Fault::LoseAcks, 1);
    relay_until(&db, broker.clone(), |b| {
        b.inner().published::<OrderPlaced>().map_or(0, |v| v.len()) >= 4
    })
    .await;
    let deliveries = broker.inner().published_envelopes::<OrderPlaced>().unwrap();
    assert_eq!(deliveries.len(), 4, "each order event twice");

    // Consume everything the broker holds, duplicates included.
    let mut applied = 0;
    for event in deliveries {
        if charge(&mut conn, event).unwrap().is_applied() {
            applied += 1;
        }
    }
    assert_eq!(applied, 2);
    // And the harness says the same of one event.
    let again = broker.inner().published_envelopes::<OrderPlaced>().unwrap()[0].clone();
    let err = deliver_twice(&mut conn, charge, again).unwrap_err();
    assert!(
        matches!(err, outbox::testing::DeliveryError::FirstWasDuplicate),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_broker_unreachable_for_a_while_delays_but_loses_nothing() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    let broker = Arc::new(Faulty::new(MemoryBroker::new()));
    broker.fail_for(Fault::Unreachable, Duration::from_millis(200));
    let started = std::time::Instant::now();
    relay_until(&db, broker.clone(), |b| b.inner().all_records().len() == 2).await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(
        written_events(&mut conn)
            .unwrap()
            .iter()
            .all(|e| e.published)
    );
}

#[outbox::idempotent(consumer = "billing")]
fn charge(
    conn: &mut diesel::SqliteConnection,
    event: outbox::Envelope<OrderPlaced>,
) -> Result<(), crate::ShopError> {
    use diesel::RunQueryDsl;
    diesel::sql_query("INSERT INTO invoices (order_id, cents) VALUES (?, ?)")
        .bind::<diesel::sql_types::BigInt, _>(event.order_id)
        .bind::<diesel::sql_types::BigInt, _>(event.total_cents)
        .execute(conn)?;
    Ok(())
}
