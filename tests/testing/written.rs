//! `written`, `written_events` and `assert_written!`.

use std::panic::{AssertUnwindSafe, catch_unwind};

use outbox::testing::{assert_written, written, written_events};

use crate::{OrderPlaced, PaymentEvent, place_order};

fn panic_message(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("the assertion should have failed");
    match err.downcast::<String>() {
        Ok(s) => *s,
        Err(err) => err.downcast::<&str>().map(|s| s.to_string()).unwrap(),
    }
}

#[test]
fn written_returns_the_typed_events_in_order_on_every_backend() {
    each_backend!(|conn| {
        place_order(&mut conn, 7, 1250).unwrap();
        place_order(&mut conn, 8, 99).unwrap();
        let placed = written::<OrderPlaced, _>(&mut conn).unwrap();
        assert_eq!(
            placed.iter().map(|e| e.order_id).collect::<Vec<_>>(),
            [7, 8]
        );
        assert_eq!(placed[0].customer, "customer-7");
        // The enum's variants are one type's events; the order placed events are left out.
        let payments = written::<PaymentEvent, _>(&mut conn).unwrap();
        assert_eq!(
            payments,
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
        let all = written_events(&mut conn).unwrap();
        let types: Vec<_> = all.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(
            types,
            ["OrderPlaced", "Captured", "OrderPlaced", "Captured"]
        );
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
        assert!(all.iter().all(|e| !e.published));
    });
}

#[test]
fn a_rolled_back_transaction_writes_nothing_to_read_back() {
    each_backend!(|conn| {
        place_order(&mut conn, 7, 1250).unwrap();
        // A second order with the same id violates the primary key: neither row nor events.
        assert!(place_order(&mut conn, 7, 1).is_err());
        assert_eq!(written::<OrderPlaced, _>(&mut conn).unwrap().len(), 1);
    });
}

#[test]
fn assert_written_matches_a_pattern_and_returns_the_event() {
    each_backend!(|conn| {
        place_order(&mut conn, 7, 1250).unwrap();
        let placed = assert_written!(conn, OrderPlaced { order_id: 7, .. });
        assert_eq!(placed.total_cents, 1250);
        assert_written!(conn, OrderPlaced { total_cents, .. } if total_cents > 1000);
        assert_written!(&mut conn, PaymentEvent::Captured { amount: 1250, .. });
    });
}

#[test]
fn assert_written_fails_on_a_wrong_field_listing_what_was_written() {
    each_backend!(|conn| {
        place_order(&mut conn, 7, 1250).unwrap();
        let message = panic_message(|| {
            assert_written!(
                conn,
                OrderPlaced {
                    order_id: 7,
                    total_cents: 1251,
                    ..
                }
            );
        });
        assert!(
            message.contains(
                "no event written matches `OrderPlaced { order_id: 7, total_cents: 1251, .. }`"
            ),
            "{message}"
        );
        assert!(
            message.contains("1 of the 2 events written decode as"),
            "{message}"
        );
        // Each row: aggregate/type, version, aggregate id and the payload JSON (PostgreSQL's
        // jsonb spaces its JSON out).
        assert!(
            message.contains("1. order/OrderPlaced v1 #7 {"),
            "{message}"
        );
        assert!(
            message.contains("\"total_cents\":") && message.contains("1250"),
            "{message}"
        );
        assert!(message.contains("2. payment/Captured v1 #7 {"), "{message}");

        let guard = panic_message(|| {
            assert_written!(conn, OrderPlaced { total_cents, .. } if total_cents > 5000);
        });
        assert!(
            guard.contains("matches `OrderPlaced { total_cents, .. } if total_cents > 5000`"),
            "{guard}"
        );
    });
}

#[test]
#[should_panic(
    expected = "assert_written!: no event written matches `PaymentEvent::Refunded { .. }`"
)]
fn assert_written_fails_when_nothing_of_the_type_was_written() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    place_order(&mut conn, 7, 1250).unwrap();
    assert_written!(conn, PaymentEvent::Refunded { .. });
}

#[test]
fn assert_written_on_an_empty_outbox_says_so() {
    let db = crate::database("sqlite");
    let mut conn: diesel::SqliteConnection = db.connect().unwrap();
    let message = panic_message(|| {
        assert_written!(conn, OrderPlaced { .. });
    });
    assert!(message.contains("0 of the 0 events written"), "{message}");
    assert!(message.contains("(nothing)"), "{message}");
}

#[test]
fn reading_an_outbox_that_is_not_migrated_is_a_typed_error() {
    use diesel::Connection;
    let mut conn = diesel::SqliteConnection::establish(":memory:").unwrap();
    let err = written_events(&mut conn).unwrap_err();
    assert!(
        matches!(err, outbox::testing::ReadError::Database(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn written_async_reads_a_diesel_async_connection() {
    use diesel_async::AsyncPgConnection;
    use outbox::AsyncOutboxConnection;
    let db = crate::database("postgres");
    let mut conn: AsyncPgConnection = db.connect_async().await.unwrap();
    conn.transaction_with_outbox(async |tx| {
        tx.publish(&OrderPlaced {
            order_id: 3,
            total_cents: 5,
            customer: "c".into(),
        })?;
        Ok::<_, crate::ShopError>(())
    })
    .await
    .unwrap();
    let placed = outbox::testing::written_async::<OrderPlaced, _>(&mut conn)
        .await
        .unwrap();
    assert_eq!(placed[0].order_id, 3);
    drop(conn);
}
