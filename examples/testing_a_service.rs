//! Testing a service that uses outbox, with the test kit (`outbox::testing`, feature
//! `testing`) on PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! The service below (`shop`) places orders (the order row and an `OrderPlaced` event in one
//! transaction) and bills them (an `#[idempotent]` handler of `OrderPlaced`). Its tests, at the
//! bottom of this file, are what a team writes with the kit:
//!
//! - "placing an order writes one `OrderPlaced` with these fields" (`assert_written!`, no
//!   broker);
//! - "the billing handler charges once when the event arrives twice" (`deliver_twice_observed`);
//! - "if the broker is down, nothing is lost" (`drain` with a `Faulty` broker);
//! - "a relay killed between publish and mark makes the handler see the event twice, and it
//!   still charges once" (`Drain::crash_after_publish`);
//! - "every old version of an event still decodes" (`check_old_payloads`).
//!
//! Each test gets a fresh database from `#[outbox::test]`, with the outbox's and the shop's own
//! migrations (`examples/shop_migrations/`) applied, dropped afterwards.
//!
//! ```text
//! cargo test --example testing_a_service --features testing,postgres,mysql
//! cargo run  --example testing_a_service --features testing,postgres,mysql
//! ```
//!
//! PostgreSQL and MySQL come from `OUTBOX_TEST_POSTGRES_URL` and `OUTBOX_TEST_MYSQL_URL` (the
//! run below falls back to `postgres://postgres@127.0.0.1:5432/test` and
//! `mysql://root@127.0.0.1:3306/test`); SQLite needs nothing. `main` walks the same story once
//! per backend and exits non-zero if any step does not hold.

use outbox::relay::MemoryBroker;
use outbox::testing::{
    Drain, DrainError, Fault, Faulty, TestDatabase, assert_written, deliver_twice_observed, drain,
};

/// The service under test: what a team already has.
mod shop {
    use diesel::prelude::*;
    use outbox::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "OrderPlaced", version = 2, upcast_from = OrderPlacedV1)]
    pub struct OrderPlaced {
        #[outbox(aggregate_id)]
        pub order_id: i64,
        pub total_cents: i64,
        pub currency: String,
    }

    /// What release 1 wrote: no currency (all orders were in euros).
    #[derive(Debug, Clone, Serialize, Deserialize, OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "OrderPlaced", version = 1)]
    pub struct OrderPlacedV1 {
        #[outbox(aggregate_id)]
        pub order_id: i64,
        pub total_cents: i64,
    }

    impl From<OrderPlacedV1> for OrderPlaced {
        fn from(v1: OrderPlacedV1) -> Self {
            OrderPlaced {
                order_id: v1.order_id,
                total_cents: v1.total_cents,
                currency: "EUR".into(),
            }
        }
    }

    /// The service's own error type.
    #[derive(Debug)]
    pub enum ShopError {
        Database(diesel::result::Error),
        Outbox(outbox::Error),
        EmptyOrder,
    }

    impl std::fmt::Display for ShopError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                ShopError::Database(e) => write!(f, "database: {e}"),
                ShopError::Outbox(e) => write!(f, "outbox: {e}"),
                ShopError::EmptyOrder => f.write_str("an order needs a positive total"),
            }
        }
    }

    impl std::error::Error for ShopError {}

    impl From<diesel::result::Error> for ShopError {
        fn from(e: diesel::result::Error) -> Self {
            ShopError::Database(e)
        }
    }

    impl From<outbox::Error> for ShopError {
        fn from(e: outbox::Error) -> Self {
            ShopError::Outbox(e)
        }
    }

    /// Places an order: the row and its event commit together, or neither does.
    pub fn place_order<C>(conn: &mut C, order_id: i64, total_cents: i64) -> Result<(), ShopError>
    where
        C: Connection<Backend: outbox::OutboxBackend>,
    {
        conn.transaction_with_outbox(|tx| {
            tx.conn().batch_execute(&format!(
                "INSERT INTO orders (id, total_cents) VALUES ({order_id}, {total_cents})"
            ))?;
            tx.publish(&OrderPlaced {
                order_id,
                total_cents,
                currency: "EUR".into(),
            })?;
            if total_cents <= 0 {
                return Err(ShopError::EmptyOrder); // rolls back the row and the event
            }
            Ok(())
        })
    }

    /// The invoice of an order, on any backend.
    fn invoice<C: Connection>(conn: &mut C, event: &Envelope<OrderPlaced>) -> QueryResult<()> {
        conn.batch_execute(&format!(
            "INSERT INTO invoices (order_id, cents) VALUES ({}, {})",
            event.order_id, event.total_cents
        ))
    }

    // The billing consumer, one per backend the service runs on: each charges an order once,
    // however often the broker delivers its event.
    #[idempotent(consumer = "billing")]
    pub fn charge_sqlite(
        conn: &mut SqliteConnection,
        event: Envelope<OrderPlaced>,
    ) -> Result<(), ShopError> {
        Ok(invoice(conn, &event)?)
    }

    #[idempotent(consumer = "billing")]
    pub fn charge_postgres(
        conn: &mut PgConnection,
        event: Envelope<OrderPlaced>,
    ) -> Result<(), ShopError> {
        Ok(invoice(conn, &event)?)
    }

    #[idempotent(consumer = "billing")]
    pub fn charge_mysql(
        conn: &mut MysqlConnection,
        event: Envelope<OrderPlaced>,
    ) -> Result<(), ShopError> {
        Ok(invoice(conn, &event)?)
    }

    #[derive(QueryableByName)]
    pub struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        pub n: i64,
    }

    /// How many invoices were written: the effect the billing tests observe.
    pub fn invoices<C>(conn: &mut C) -> QueryResult<i64>
    where
        C: diesel::connection::LoadConnection<Backend: 'static>,
        Count: diesel::deserialize::QueryableByName<C::Backend>,
        diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
    {
        let count: Count =
            diesel::sql_query("SELECT COUNT(*) AS n FROM invoices").get_result(conn)?;
        Ok(count.n)
    }
}

use shop::{OrderPlaced, place_order};

/// The shop's migrations, relative to the package (as `#[outbox::test(migrations = ...)]`
/// takes them).
const MIGRATIONS: &str = "examples/shop_migrations";

/// The story of the tests below, once on `conn`: write, assert, broker down, drain, crash,
/// redeliver. Returns the first step that did not hold.
fn story<C, H>(conn: &mut C, mut charge: H) -> Result<(), Box<dyn std::error::Error>>
where
    C: diesel::connection::LoadConnection<Backend: outbox::OutboxBackend + 'static>,
    shop::Count: diesel::deserialize::QueryableByName<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
    H: FnMut(&mut C, outbox::Envelope<OrderPlaced>) -> Result<outbox::Outcome<()>, shop::ShopError>,
{
    place_order(conn, 7, 1250)?;
    assert_written!(
        conn,
        OrderPlaced {
            order_id: 7,
            total_cents: 1250,
            ..
        }
    );
    println!("    placed order 7: the outbox holds its OrderPlaced");

    let broker = Faulty::new(MemoryBroker::new());
    broker.fail_always(Fault::Unreachable);
    if !matches!(drain(conn, &broker), Err(DrainError::Unavailable { .. })) {
        return Err("a drain to a broker that is down did not report it".into());
    }
    broker.clear();
    let published = drain(conn, &broker)?;
    println!(
        "    broker down: nothing published; back up: {} published",
        published.len()
    );

    place_order(conn, 8, 99)?;
    let crashed = Drain::new().crash_after_publish().run(conn, &broker);
    if !matches!(crashed, Err(DrainError::Crashed { .. })) {
        return Err("the drain did not stop between publish and mark".into());
    }
    drain(conn, &broker)?;
    let deliveries = broker.inner().published_envelopes::<OrderPlaced>()?;
    let mut applied = 0;
    for event in deliveries.iter().cloned() {
        if charge(conn, event)?.is_applied() {
            applied += 1;
        }
    }
    println!(
        "    relay killed between publish and mark: {} deliveries of 2 orders, {applied} charged",
        deliveries.len()
    );
    if (deliveries.len(), applied) != (3, 2) {
        return Err(format!(
            "expected 3 deliveries and 2 charges, got {} and {applied}",
            deliveries.len()
        )
        .into());
    }
    let order_9 = outbox::Envelope::new(OrderPlaced {
        order_id: 9,
        total_cents: 5,
        currency: "EUR".into(),
    });
    deliver_twice_observed(conn, &mut charge, order_9, shop::invoices)?;
    println!("    order 9 delivered twice: charged once");
    Ok(())
}

fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    outbox::testing::check_old_payloads::<OrderPlaced>(&[
        (
            "OrderPlaced",
            1,
            serde_json::json!({ "order_id": 1, "total_cents": 10 }),
        ),
        (
            "OrderPlaced",
            2,
            serde_json::json!({ "order_id": 1, "total_cents": 10, "currency": "USD" }),
        ),
    ])?;
    println!("-- every version of OrderPlaced still decodes");

    println!("-- SQLite");
    let db = TestDatabase::sqlite()?;
    db.migrate_dir(MIGRATIONS)?;
    story(
        &mut db.connect::<diesel::SqliteConnection>()?,
        shop::charge_sqlite,
    )?;

    println!("-- PostgreSQL");
    let db = TestDatabase::create(&url(
        "OUTBOX_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ))?;
    db.migrate_dir(MIGRATIONS)?;
    story(
        &mut db.connect::<diesel::PgConnection>()?,
        shop::charge_postgres,
    )?;

    println!("-- MySQL/MariaDB");
    let db = TestDatabase::create(&url(
        "OUTBOX_TEST_MYSQL_URL",
        "mysql://root@127.0.0.1:3306/test",
    ))?;
    db.migrate_dir(MIGRATIONS)?;
    story(
        &mut db.connect::<diesel::MysqlConnection>()?,
        shop::charge_mysql,
    )?;
    Ok(())
}

/// The shop's tests, as the team writes them.
#[cfg(test)]
mod tests {
    use diesel::{MysqlConnection, PgConnection, SqliteConnection};
    use outbox::Envelope;
    use outbox::testing::{DeliveryError, deliver_twice, written};

    use super::*;

    #[outbox::test(migrations = "examples/shop_migrations")]
    fn placing_an_order_writes_one_order_placed(conn: &mut PgConnection) {
        place_order(conn, 7, 1250).unwrap();
        assert_written!(
            conn,
            OrderPlaced {
                order_id: 7,
                total_cents: 1250,
                ..
            }
        );
        assert_eq!(written::<OrderPlaced, _>(conn).unwrap().len(), 1);
    }

    #[outbox::test(migrations = "examples/shop_migrations")]
    fn a_refused_order_writes_no_event(conn: &mut MysqlConnection) {
        assert!(matches!(
            place_order(conn, 7, 0),
            Err(shop::ShopError::EmptyOrder)
        ));
        assert!(written::<OrderPlaced, _>(conn).unwrap().is_empty());
    }

    #[outbox::test(migrations = "examples/shop_migrations")]
    fn billing_charges_once_when_the_event_arrives_twice(conn: &mut SqliteConnection) {
        let event = Envelope::new(OrderPlaced {
            order_id: 7,
            total_cents: 1250,
            currency: "EUR".into(),
        });
        deliver_twice_observed(conn, shop::charge_sqlite, event, shop::invoices).unwrap();
        let again = Envelope::new(OrderPlaced {
            order_id: 8,
            total_cents: 1,
            currency: "EUR".into(),
        });
        let err = deliver_twice(conn, shop::charge_sqlite, again.clone()).map(|_| ());
        assert!(err.is_ok(), "{err:?}");
        assert!(matches!(
            deliver_twice(conn, shop::charge_sqlite, again),
            Err(DeliveryError::FirstWasDuplicate)
        ));
    }

    #[outbox::test(migrations = "examples/shop_migrations")]
    fn the_whole_story_on_postgres(conn: &mut PgConnection) {
        story(conn, shop::charge_postgres).unwrap();
    }

    #[outbox::test(migrations = "examples/shop_migrations")]
    fn the_whole_story_on_mysql(conn: &mut MysqlConnection) {
        story(conn, shop::charge_mysql).unwrap();
    }

    #[outbox::test(migrations = "examples/shop_migrations")]
    fn the_whole_story_on_sqlite(conn: &mut SqliteConnection) {
        story(conn, shop::charge_sqlite).unwrap();
    }

    #[test]
    fn every_version_of_order_placed_still_decodes() {
        let n = outbox::testing::check_old_payloads::<OrderPlaced>(&[
            (
                "OrderPlaced",
                1,
                serde_json::json!({ "order_id": 1, "total_cents": 10 }),
            ),
            (
                "OrderPlaced",
                2,
                serde_json::json!({ "order_id": 1, "total_cents": 10, "currency": "USD" }),
            ),
        ])
        .unwrap();
        assert_eq!(n, 2);
    }
}
