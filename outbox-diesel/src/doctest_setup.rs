// Shared setup of the doc examples: an in-memory SQLite database with the outbox migrations,
// an `orders` table and an `OrderCreated` event. Included (hidden) by the examples.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[allow(dead_code)]
struct OrderCreated {
    order_id: i64,
    total_cents: i64,
}

// What `#[derive(OutboxEvent)] #[outbox(aggregate = "order")]` generates, written out so that
// these examples do not depend on the derive crate.
impl outbox_core::OutboxEvent for OrderCreated {
    const AGGREGATE_TYPE: &'static str = "order";
    const EVENT_TYPES: &'static [outbox_core::EventType] = &[outbox_core::EventType {
        aggregate_type: "order",
        event_type: "OrderCreated",
        version: 1,
        topic: None,
    }];
    fn aggregate_id(&self) -> String {
        outbox_core::AggregateKey::to_key(&self.order_id)
    }
    fn event_type(&self) -> &'static str {
        "OrderCreated"
    }
    fn event_version(&self) -> u32 {
        1
    }
}

const ORDERS_SQL: &str = "CREATE TABLE orders (id BIGINT PRIMARY KEY, total_cents BIGINT NOT NULL)";

#[allow(dead_code)]
fn establish() -> diesel::SqliteConnection {
    let mut conn =
        <diesel::SqliteConnection as diesel::Connection>::establish(":memory:").unwrap();
    outbox_diesel::migrations::run(&mut conn).unwrap();
    diesel::connection::SimpleConnection::batch_execute(&mut conn, ORDERS_SQL).unwrap();
    conn
}

#[allow(dead_code)]
fn count_events(conn: &mut diesel::SqliteConnection) -> i64 {
    use diesel::dsl::sql;
    let query =
        diesel::select(sql::<diesel::sql_types::BigInt>("(SELECT COUNT(*) FROM outbox_events)"));
    diesel::RunQueryDsl::get_result(query, conn).unwrap()
}

#[cfg(feature = "async")]
#[allow(dead_code)]
async fn establish_async()
-> diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection> {
    use diesel_async::{AsyncConnection, SimpleAsyncConnection};
    let mut conn =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper::establish(":memory:")
            .await
            .unwrap();
    outbox_diesel::migrations::run_async(&mut conn).await.unwrap();
    conn.batch_execute(ORDERS_SQL).await.unwrap();
    conn
}
