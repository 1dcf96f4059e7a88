// What else the function can look like, run against SQLite: methods, extra parameters,
// patterns, generic connections and errors, `Result` aliases, `key` as a closure or a path,
// `crate = ...`, and early returns and `?` in the body.
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_async::AsyncConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: i64,
    cents: i64,
}

#[derive(Debug)]
enum AppError {
    Db(diesel::result::Error),
    TooSmall,
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

struct Billing {
    minimum: i64,
}

fn by_order(e: &Envelope<OrderCreated>) -> String {
    format!("order-{}", e.order_id)
}

impl Billing {
    #[idempotent(consumer = "billing", key = by_order)]
    fn charge(
        &self,
        mut conn: &mut SqliteConnection,
        note: &str,
        Envelope { payload, id, .. }: Envelope<OrderCreated>,
    ) -> Result<String, AppError> {
        if payload.cents < self.minimum {
            return Err(AppError::TooSmall);
        }
        let conn = &mut conn;
        conn.batch_execute("SELECT 1")?;
        Ok(format!("{note} {id} {}", payload.cents))
    }

    #[idempotent(crate = outbox_diesel, consumer = "audit", key = |e| e.order_id)]
    async fn audit<C>(&self, conn: &mut C, event: Envelope<OrderCreated>) -> QueryResult<i64>
    where
        C: diesel_async::AsyncConnection<Backend = diesel::sqlite::Sqlite>,
    {
        conn.batch_execute("SELECT 1").await?;
        Ok(event.cents + self.minimum)
    }
}

#[idempotent(consumer = "generic")]
fn generic<C, E>(conn: &mut C, event: Envelope<OrderCreated>) -> Result<(), E>
where
    C: Connection<Backend = diesel::sqlite::Sqlite>,
    E: From<diesel::result::Error>,
{
    let _ = (conn, event);
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    outbox::migrations::run(&mut conn).unwrap();
    let billing = Billing { minimum: 100 };
    let event = Envelope::new(OrderCreated { order_id: 1, cents: 250 });
    let applied = billing.charge(&mut conn, "paid", event.clone()).unwrap();
    assert_eq!(applied.applied(), Some(format!("paid {} 250", event.id)));
    let other_event_same_order = Envelope::new(OrderCreated { order_id: 1, cents: 250 });
    assert!(billing.charge(&mut conn, "paid", other_event_same_order).unwrap().is_duplicate());
    let small = Envelope::new(OrderCreated { order_id: 2, cents: 5 });
    assert!(matches!(billing.charge(&mut conn, "paid", small), Err(AppError::TooSmall)));
    assert!(generic::<_, diesel::result::Error>(&mut conn, event.clone()).unwrap().is_applied());

    let mut conn = SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
    outbox::migrations::run_async(&mut conn).await.unwrap();
    assert_eq!(billing.audit(&mut conn, event.clone()).await.unwrap(), Outcome::Applied(350));
    assert_eq!(billing.audit(&mut conn, event).await.unwrap(), Outcome::Duplicate);
}
