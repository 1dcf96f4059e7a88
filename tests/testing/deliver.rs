//! `deliver_twice`, `deliver_twice_observed`, `deliver_out_of_order` and the async twins,
//! against a service's own `#[idempotent]` handlers.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use outbox::prelude::*;
use outbox::testing::{
    DeliveryError, deliver_out_of_order, deliver_twice, deliver_twice_async,
    deliver_twice_observed, deliver_twice_observed_async,
};

use crate::{OrderPlaced, ShopError};

const INVOICES_DDL: &str =
    "CREATE TABLE invoices (order_id BIGINT NOT NULL, cents BIGINT NOT NULL)";

fn placed(order_id: i64) -> Envelope<OrderPlaced> {
    Envelope::new(OrderPlaced {
        order_id,
        total_cents: 100 * order_id,
        customer: "c".into(),
    })
}

#[idempotent(consumer = "billing")]
fn charge(conn: &mut SqliteConnection, event: Envelope<OrderPlaced>) -> Result<i64, ShopError> {
    diesel::sql_query("INSERT INTO invoices (order_id, cents) VALUES (?, ?)")
        .bind::<BigInt, _>(event.order_id)
        .bind::<BigInt, _>(event.total_cents)
        .execute(conn)?;
    Ok(event.total_cents)
}

#[idempotent(consumer = "billing")]
fn charge_pg(conn: &mut PgConnection, event: Envelope<OrderPlaced>) -> Result<i64, ShopError> {
    diesel::sql_query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
        .bind::<BigInt, _>(event.order_id)
        .bind::<BigInt, _>(event.total_cents)
        .execute(conn)?;
    Ok(event.total_cents)
}

/// The same effect without the inbox: what a team forgets.
fn charge_without_inbox(
    conn: &mut SqliteConnection,
    event: Envelope<OrderPlaced>,
) -> Result<Outcome<i64>, ShopError> {
    diesel::sql_query("INSERT INTO invoices (order_id, cents) VALUES (?, ?)")
        .bind::<BigInt, _>(event.order_id)
        .bind::<BigInt, _>(event.total_cents)
        .execute(conn)?;
    Ok(Outcome::Applied(event.total_cents))
}

#[derive(QueryableByName, Debug, PartialEq)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn invoices<C>(conn: &mut C) -> QueryResult<i64>
where
    C: diesel::connection::LoadConnection<Backend: 'static>,
    Count: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    Ok(diesel::sql_query("SELECT COUNT(*) AS n FROM invoices")
        .get_result::<Count>(conn)?
        .n)
}

fn sqlite() -> (outbox::testing::TestDatabase, SqliteConnection) {
    let db = crate::database("sqlite");
    let mut conn: SqliteConnection = db.connect().unwrap();
    conn.batch_execute(INVOICES_DDL).unwrap();
    (db, conn)
}

#[test]
fn an_idempotent_handler_applies_a_redelivered_event_once() {
    let (_db, mut conn) = sqlite();
    assert_eq!(deliver_twice(&mut conn, charge, placed(7)).unwrap(), 700);
    assert_eq!(invoices(&mut conn).unwrap(), 1);
    let value = deliver_twice_observed(&mut conn, charge, placed(8), invoices).unwrap();
    assert_eq!(value, 800);
    assert_eq!(invoices(&mut conn).unwrap(), 2);
}

#[test]
fn an_idempotent_handler_on_postgres() {
    let db = crate::database("postgres");
    let mut conn: PgConnection = db.connect().unwrap();
    conn.batch_execute(INVOICES_DDL).unwrap();
    deliver_twice_observed(&mut conn, charge_pg, placed(7), invoices).unwrap();
}

#[test]
fn a_handler_without_the_inbox_fails_deliver_twice() {
    let (_db, mut conn) = sqlite();
    let err = deliver_twice(&mut conn, charge_without_inbox, placed(7)).unwrap_err();
    assert!(matches!(err, DeliveryError::AppliedTwice), "{err:?}");
    assert!(err.to_string().contains("is it #[idempotent]?"), "{err}");
    assert_eq!(
        invoices(&mut conn).unwrap(),
        2,
        "the effect really happened twice"
    );
}

#[test]
fn an_effect_that_escapes_the_inbox_transaction_is_caught() {
    let (_db, mut conn) = sqlite();
    // Claims the inbox in one transaction and writes in another: says Duplicate the second
    // time, but the write happened again.
    let leaky = |conn: &mut SqliteConnection, event: Envelope<OrderPlaced>| {
        let _ = charge_without_inbox(conn, event.clone())?;
        let new = outbox::inbox::claim(conn, "billing", &event.inbox_key())?;
        Ok::<_, ShopError>(if new {
            Outcome::Applied(())
        } else {
            Outcome::Duplicate
        })
    };
    let err = deliver_twice_observed(&mut conn, leaky, placed(7), invoices).unwrap_err();
    let DeliveryError::EffectRepeated {
        after_first,
        after_second,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!((after_first.as_str(), after_second.as_str()), ("1", "2"));
}

#[test]
fn a_handler_with_no_effect_is_caught() {
    let (_db, mut conn) = sqlite();
    let idle = |conn: &mut SqliteConnection, event: Envelope<OrderPlaced>| {
        let new = outbox::inbox::claim(conn, "billing", &event.inbox_key())?;
        Ok::<_, ShopError>(if new {
            Outcome::Applied(())
        } else {
            Outcome::Duplicate
        })
    };
    let err = deliver_twice_observed(&mut conn, idle, placed(7), invoices).unwrap_err();
    assert!(matches!(err, DeliveryError::NoEffect { .. }), "{err:?}");
}

#[test]
fn a_handler_error_and_a_reused_inbox_are_reported() {
    let (_db, mut conn) = sqlite();
    let event = placed(7);
    let _ = charge(&mut conn, event.clone()).unwrap();
    let err = deliver_twice(&mut conn, charge, event).unwrap_err();
    assert!(matches!(err, DeliveryError::FirstWasDuplicate), "{err:?}");

    conn.batch_execute("DROP TABLE invoices").unwrap();
    let err = deliver_twice(&mut conn, charge, placed(8)).unwrap_err();
    assert!(
        matches!(
            err,
            DeliveryError::Handler {
                delivery: 1,
                source: ShopError::Db(_)
            }
        ),
        "{err:?}"
    );
}

#[test]
fn deliver_out_of_order_delivers_the_latest_first() {
    let (_db, mut conn) = sqlite();
    let events = vec![placed(1), placed(2), placed(3)];
    let outcomes = deliver_out_of_order(&mut conn, charge, events).unwrap();
    assert_eq!(
        outcomes,
        [
            Outcome::Applied(300),
            Outcome::Applied(200),
            Outcome::Applied(100)
        ]
    );
    // A handler that insists on order fails, and says at which delivery.
    let mut last = 0;
    let strict = |_: &mut SqliteConnection, e: Envelope<OrderPlaced>| {
        if e.order_id < last {
            return Err(format!("order {} after {last}", e.order_id));
        }
        last = e.order_id;
        Ok(Outcome::Applied(()))
    };
    let err = deliver_out_of_order(&mut conn, strict, vec![placed(1), placed(2)]).unwrap_err();
    let DeliveryError::Handler { delivery, source } = err else {
        panic!("{err:?}")
    };
    assert_eq!((delivery, source.as_str()), (2, "order 1 after 2"));
}

mod async_handlers {
    use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

    use super::{
        BigInt, Count, DeliveryError, Envelope, INVOICES_DDL, OrderPlaced, Outcome, QueryResult,
        ShopError, deliver_twice_async, deliver_twice_observed_async, idempotent, placed,
    };

    #[idempotent(consumer = "billing")]
    async fn charge(
        conn: &mut AsyncPgConnection,
        event: Envelope<OrderPlaced>,
    ) -> Result<i64, ShopError> {
        diesel::sql_query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
            .bind::<BigInt, _>(event.order_id)
            .bind::<BigInt, _>(event.total_cents)
            .execute(conn)
            .await?;
        Ok(event.total_cents)
    }

    async fn charge_without_inbox(
        conn: &mut AsyncPgConnection,
        event: Envelope<OrderPlaced>,
    ) -> Result<Outcome<i64>, ShopError> {
        diesel::sql_query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
            .bind::<BigInt, _>(event.order_id)
            .bind::<BigInt, _>(event.total_cents)
            .execute(conn)
            .await?;
        Ok(Outcome::Applied(event.total_cents))
    }

    async fn invoices(conn: &mut AsyncPgConnection) -> QueryResult<i64> {
        Ok(diesel::sql_query("SELECT COUNT(*) AS n FROM invoices")
            .get_result::<Count>(conn)
            .await?
            .n)
    }

    #[tokio::test]
    async fn async_handlers_on_postgres() {
        let db = crate::database("postgres");
        let mut conn: AsyncPgConnection = db.connect_async().await.unwrap();
        conn.batch_execute(INVOICES_DDL).await.unwrap();
        assert_eq!(
            deliver_twice_async(&mut conn, charge, placed(7))
                .await
                .unwrap(),
            700
        );
        deliver_twice_observed_async(&mut conn, charge, placed(8), invoices)
            .await
            .unwrap();
        let err = deliver_twice_async(&mut conn, charge_without_inbox, placed(9))
            .await
            .unwrap_err();
        assert!(matches!(err, DeliveryError::AppliedTwice), "{err:?}");
    }
}
