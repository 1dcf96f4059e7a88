// A sync fn takes a sync connection, an async fn a diesel-async one.
use diesel::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
}

#[idempotent(consumer = "billing")]
fn charge(
    conn: &mut SyncConnectionWrapper<SqliteConnection>,
    event: Envelope<OrderCreated>,
) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

#[idempotent(consumer = "billing")]
async fn refund(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
    let _ = (conn, event);
    Ok(())
}

fn main() {}
