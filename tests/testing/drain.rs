//! `drain` and `Drain`: the deterministic relay on the test's own connection.

use std::time::{Duration, Instant};

use outbox::relay::MemoryBroker;
use outbox::testing::{Drain, DrainError, Fault, Faulty, drain, written_events};

use crate::{OrderPlaced, PaymentEvent, place_order};

#[test]
fn drain_publishes_everything_pending_in_order_and_marks_it_on_every_backend() {
    each_backend!(|conn| {
        place_order(&mut conn, 7, 1250).unwrap();
        place_order(&mut conn, 8, 99).unwrap();
        let broker = MemoryBroker::new();
        // Batches of 3: four events take two publishes, and the order still holds.
        let published = Drain::new().batch_size(3).run(&mut conn, &broker).unwrap();
        assert_eq!(published.len(), 4);
        assert_eq!(
            published
                .events::<OrderPlaced>()
                .unwrap()
                .iter()
                .map(|e| e.order_id)
                .collect::<Vec<_>>(),
            [7, 8]
        );
        assert_eq!(
            broker.published::<PaymentEvent>().unwrap(),
            [
                PaymentEvent::Captured {
                    order_id: 7,
                    amount: 1250
                },
                PaymentEvent::Captured {
                    order_id: 8,
                    amount: 99
                },
            ]
        );
        assert_eq!(broker.records("order").len(), 2);
        assert!(
            written_events(&mut conn)
                .unwrap()
                .iter()
                .all(|e| e.published)
        );
        // Nothing is left: a second drain publishes nothing.
        assert!(drain(&mut conn, &broker).unwrap().is_empty());
        assert_eq!(broker.all_records().len(), 4);
    });
}

#[test]
fn a_broker_that_is_down_loses_nothing() {
    each_backend!(|conn| {
        place_order(&mut conn, 7, 1250).unwrap();
        let broker = Faulty::new(MemoryBroker::new());
        broker.fail_always(Fault::Unreachable);
        let err = drain(&mut conn, &broker).unwrap_err();
        assert!(
            matches!(err, DrainError::Unavailable { ref published, .. } if published.is_empty()),
            "{err:?}"
        );
        assert!(err.to_string().contains("broker unreachable"), "{err}");
        assert!(broker.inner().all_records().is_empty());
        assert!(
            written_events(&mut conn)
                .unwrap()
                .iter()
                .all(|e| !e.published)
        );

        broker.clear();
        assert_eq!(drain(&mut conn, &broker).unwrap().len(), 2);
        assert_eq!(broker.inner().published::<OrderPlaced>().unwrap().len(), 1);
    });
}

#[test]
fn drain_waits_for_a_broker_that_comes_back() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    let broker = Faulty::new(MemoryBroker::new());
    broker.fail_for(Fault::Unreachable, Duration::from_millis(100));
    let started = Instant::now();
    let published = Drain::new()
        .wait_for_broker(Duration::from_secs(10))
        .run(&mut conn, &broker)
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(published.len(), 2);
    assert!(
        broker.calls() > 2,
        "it published again while the broker was down"
    );
    assert_eq!(broker.inner().all_records().len(), 2, "each event once");
}

#[test]
fn a_black_holed_broker_times_out_as_unavailable() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    let broker = Faulty::new(MemoryBroker::new());
    broker.fail_times(Fault::BlackHole, 1);
    let err = Drain::new()
        .publish_timeout(Duration::from_millis(50))
        .run(&mut conn, &broker)
        .unwrap_err();
    assert!(matches!(err, DrainError::Unavailable { .. }), "{err:?}");
    assert!(
        err.to_string().contains("no answer from the broker"),
        "{err}"
    );
    assert_eq!(drain(&mut conn, &broker).unwrap().len(), 2);
}

#[test]
fn a_refused_event_stops_the_drain_and_stays_pending() {
    let db = crate::database("postgres");
    let mut conn: diesel::PgConnection = db.connect().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    let broker = MemoryBroker::new();
    broker.fail_when(|m| (m.event_type == "Captured").then(|| "record too large".to_owned()));
    let err = drain(&mut conn, &broker).unwrap_err();
    let DrainError::Refused {
        event_type,
        error,
        published,
        ..
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (event_type.as_str(), error.as_str()),
        ("Captured", "record too large")
    );
    assert_eq!(
        published.len(),
        1,
        "the order event before it was published"
    );
    let pending: Vec<_> = written_events(&mut conn)
        .unwrap()
        .into_iter()
        .filter(|e| !e.published)
        .map(|e| e.event_type)
        .collect();
    assert_eq!(pending, ["Captured"]);
}

#[test]
fn a_drain_killed_between_publish_and_mark_publishes_again() {
    each_backend!(|conn| {
        place_order(&mut conn, 7, 1250).unwrap();
        let broker = MemoryBroker::new();
        let err = Drain::new()
            .crash_after_publish()
            .run(&mut conn, &broker)
            .unwrap_err();
        let DrainError::Crashed { published } = err else {
            panic!("{err:?}")
        };
        assert_eq!(published.len(), 2);
        assert!(
            written_events(&mut conn)
                .unwrap()
                .iter()
                .all(|e| !e.published)
        );
        // The next relay publishes the same events again: the broker holds each twice, with
        // one id, as a consumer will see them.
        assert_eq!(drain(&mut conn, &broker).unwrap().len(), 2);
        let envelopes = broker.published_envelopes::<OrderPlaced>().unwrap();
        assert_eq!(envelopes.len(), 2);
        assert_eq!(envelopes[0].id, envelopes[1].id);
    });
}

#[tokio::test]
async fn drain_async_on_diesel_async_connections() {
    use diesel_async::AsyncMysqlConnection;
    let db = crate::database("mysql");
    let mut sync: diesel::MysqlConnection = db.connect().unwrap();
    place_order(&mut sync, 7, 1250).unwrap();
    let mut conn: AsyncMysqlConnection = db.connect_async().await.unwrap();
    let broker = MemoryBroker::new();
    let published = outbox::testing::drain_async(&mut conn, &broker)
        .await
        .unwrap();
    assert_eq!(published.len(), 2);
    assert!(
        outbox::testing::drain_async(&mut conn, &broker)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The same drain against a real Kafka-protocol broker (noida-db, `scripts/kafka.sh start`),
/// through the Kafka publisher.
#[cfg(feature = "kafka")]
#[tokio::test]
async fn drain_async_to_kafka() {
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use outbox::kafka::KafkaPublisher;
    let db = crate::database("sqlite");
    let mut sync: diesel::SqliteConnection = db.connect().unwrap();
    place_order(&mut sync, 7, 1250).unwrap();
    let topic = format!("outbox-testkit-{}", uuid::Uuid::now_v7());
    let publisher = KafkaPublisher::builder()
        .brokers(std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into()))
        .topic_for(move |_| topic.clone())
        .build()
        .unwrap();
    let mut conn: SyncConnectionWrapper<diesel::SqliteConnection> =
        db.connect_async().await.unwrap();
    let published = outbox::testing::Drain::new()
        .wait_for_broker(Duration::from_secs(20))
        .run_async(&mut conn, &publisher)
        .await
        .unwrap();
    assert_eq!(published.len(), 2);
    assert!(
        written_events(&mut sync)
            .unwrap()
            .iter()
            .all(|e| e.published)
    );
}

#[tokio::test]
async fn a_sync_drain_inside_a_runtime_is_a_typed_error() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    let err = drain(&mut conn, &MemoryBroker::new()).unwrap_err();
    assert!(matches!(err, DrainError::InsideRuntime), "{err:?}");
}

/// A publisher that breaks the contract: no outcome for any message.
struct Silent;

impl outbox::relay::Publisher for Silent {
    async fn publish(&self, _: &[outbox::relay::OutboxMessage]) -> Vec<outbox::relay::Delivery> {
        Vec::new()
    }
}

#[test]
fn a_publisher_that_publishes_nothing_does_not_loop_forever() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    let err = drain(&mut conn, &Silent).unwrap_err();
    assert!(matches!(err, DrainError::Unavailable { .. }), "{err:?}");
}
