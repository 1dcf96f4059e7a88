//! Tests of the test kit (`outbox::testing`), written as a service that uses the outbox would
//! write its own: its own events and error type, its own tables, each backend.

/// Runs `$body` with `$conn` bound to a fresh connection of each backend in turn.
macro_rules! each_backend {
    (|$conn:ident| $body:block) => {{
        {
            let db = $crate::database("sqlite");
            let mut $conn: diesel::SqliteConnection = db.connect().unwrap();
            $body
        }
        {
            let db = $crate::database("postgres");
            let mut $conn: diesel::PgConnection = db.connect().unwrap();
            $body
        }
        {
            let db = $crate::database("mysql");
            let mut $conn: diesel::MysqlConnection = db.connect().unwrap();
            $body
        }
    }};
}

mod attribute;
mod deliver;
mod drain;
mod faults;
mod old_payloads;
mod written;

use outbox::prelude::*;
use outbox::testing::TestDatabase;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "OrderPlaced", version = 1)]
pub(crate) struct OrderPlaced {
    #[outbox(aggregate_id)]
    pub(crate) order_id: i64,
    pub(crate) total_cents: i64,
    pub(crate) customer: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "payment")]
pub(crate) enum PaymentEvent {
    Captured {
        #[outbox(aggregate_id)]
        order_id: i64,
        amount: i64,
    },
    Refunded {
        #[outbox(aggregate_id)]
        order_id: i64,
    },
}

/// The service's own error type.
#[derive(Debug)]
pub(crate) enum ShopError {
    Db(diesel::result::Error),
    Outbox(outbox::Error),
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShopError::Db(e) => write!(f, "database: {e}"),
            ShopError::Outbox(e) => write!(f, "outbox: {e}"),
        }
    }
}

impl std::error::Error for ShopError {}

impl From<diesel::result::Error> for ShopError {
    fn from(e: diesel::result::Error) -> Self {
        ShopError::Db(e)
    }
}

impl From<outbox::Error> for ShopError {
    fn from(e: outbox::Error) -> Self {
        ShopError::Outbox(e)
    }
}

pub(crate) const ORDERS_DDL: &str =
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, total_cents BIGINT NOT NULL)";

/// The service's write path: the order row and its events in one transaction.
pub(crate) fn place_order<C>(conn: &mut C, order_id: i64, total_cents: i64) -> Result<(), ShopError>
where
    C: diesel::Connection<Backend: outbox::OutboxBackend>,
{
    conn.transaction_with_outbox(|tx| {
        tx.conn().batch_execute(&format!(
            "INSERT INTO orders (id, total_cents) VALUES ({order_id}, {total_cents})"
        ))?;
        tx.publish(&OrderPlaced {
            order_id,
            total_cents,
            customer: format!("customer-{order_id}"),
        })?;
        tx.publish(&PaymentEvent::Captured {
            order_id,
            amount: total_cents,
        })?;
        Ok(())
    })
}

pub(crate) fn postgres_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub(crate) fn mysql_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A fresh database of `backend` with the service's `orders` table.
pub(crate) fn database(backend: &str) -> TestDatabase {
    let db = match backend {
        "postgres" => TestDatabase::create(&postgres_url()),
        "mysql" => TestDatabase::create(&mysql_url()),
        _ => TestDatabase::sqlite(),
    }
    .unwrap_or_else(|e| panic!("{e}"));
    match backend {
        "postgres" => orders_table(&mut db.connect::<diesel::PgConnection>().unwrap()),
        "mysql" => orders_table(&mut db.connect::<diesel::MysqlConnection>().unwrap()),
        _ => orders_table(&mut db.connect::<diesel::SqliteConnection>().unwrap()),
    }
    db
}

fn orders_table<C: diesel::Connection>(conn: &mut C) {
    conn.batch_execute(ORDERS_DDL).unwrap();
}
