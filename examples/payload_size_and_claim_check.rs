//! Payload size: a large event commits and is then refused by the broker on every attempt; the publish-time limit and a claim check fix it. SQLite, no services.
//!
//! 1. Without a limit, a 2 MB event commits fine, and the broker (1 MiB `message.max.bytes`,
//!    injected) refuses it on every attempt until the relay dead-letters it.
//! 2. With the limit (`DEFAULT_MAX_PAYLOAD_BYTES`, 1,000,000), `publish` fails at once, naming
//!    the event type, the size and the limit, and the transaction rolls back.
//! 3. With a claim check, the body goes to a table in the same transaction and the event
//!    carries a reference of about a hundred bytes; the consumer fetches and verifies the body.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{SqliteDb, expect};
use diesel::prelude::*;
use outbox::claim_check::{BodyStore, ClaimCheck};
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, RelayConfig, SqliteRelayStore};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "document", event_type = "DocumentUploaded")]
struct DocumentUploaded {
    #[outbox(aggregate_id)]
    doc_id: i64,
    body: String,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "document", event_type = "DocumentStored")]
struct DocumentStored {
    #[outbox(aggregate_id)]
    doc_id: i64,
    body: ClaimCheck,
}
/// Bodies in a table of the same database: written in the event's transaction.
struct TableStore<'c>(&'c mut SqliteConnection);

impl BodyStore for TableStore<'_> {
    fn put(&mut self, key: &str, body: &[u8]) -> Result<(), outbox::BoxError> {
        diesel::sql_query("INSERT INTO bodies (key, body) VALUES (?, ?)")
            .bind::<diesel::sql_types::Text, _>(key)
            .bind::<diesel::sql_types::Binary, _>(body)
            .execute(self.0)?;
        Ok(())
    }
    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, outbox::BoxError> {
        #[derive(QueryableByName)]
        struct Body {
            #[diesel(sql_type = diesel::sql_types::Binary)]
            body: Vec<u8>,
        }
        let row: Option<Body> = diesel::sql_query("SELECT body FROM bodies WHERE key = ?")
            .bind::<diesel::sql_types::Text, _>(key)
            .get_result(self.0)
            .optional()?;
        Ok(row.map(|b| b.body))
    }
}

fn broker_with_kafka_limit() -> Arc<MemoryBroker> {
    let broker = Arc::new(MemoryBroker::new());
    broker.fail_when(|m| {
        (m.payload.len() > 1_048_576)
            .then(|| format!("MESSAGE_TOO_LARGE: {} bytes", m.payload.len()))
    });
    broker
}

fn main() {
    let big = "x".repeat(2_000_000);
    let db = SqliteDb::new();
    let mut conn = db.conn();
    diesel::sql_query("CREATE TABLE bodies (key TEXT PRIMARY KEY, body BLOB NOT NULL)")
        .execute(&mut conn)
        .unwrap();

    println!("1. No limit at publish: the 2 MB event commits, the broker refuses it.");
    outbox::set_max_payload_bytes(usize::MAX);
    conn.transaction_with_outbox(|tx| {
        tx.publish(&DocumentUploaded {
            doc_id: 1,
            body: big.clone(),
        })
    })
    .unwrap();
    let broker = broker_with_kafka_limit();
    let config = RelayConfig {
        max_attempts: 3,
        ..common::quick_config()
    };
    let (dead, stats) = common::relay_until(
        SqliteRelayStore::new(db.path.clone()),
        broker.clone(),
        config.clone(),
        Duration::from_secs(10),
        {
            let path = db.path.clone();
            move || {
                count!(
                    &mut SqliteConnection::establish(&path).unwrap(),
                    "outbox_events WHERE dead_at IS NOT NULL"
                ) == 1
            }
        },
    );
    let retried = stats.retried.load(std::sync::atomic::Ordering::Relaxed);
    let attempts = retried
        + stats
            .dead_lettered
            .load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "   {attempts} attempts refused (max_attempts = 3), then dead-lettered; the broker got {} messages.",
        broker.all_records().len()
    );
    expect(
        dead && broker.all_records().is_empty(),
        "the oversized event to be dead-lettered",
    );
    diesel::sql_query("DELETE FROM outbox_events")
        .execute(&mut conn)
        .unwrap();

    println!(
        "\n2. The default limit ({} bytes) refuses it at publish.",
        outbox::DEFAULT_MAX_PAYLOAD_BYTES
    );
    outbox::set_max_payload_bytes(outbox::DEFAULT_MAX_PAYLOAD_BYTES);
    let err = conn
        .transaction_with_outbox(|tx| {
            tx.publish(&DocumentUploaded {
                doc_id: 2,
                body: big.clone(),
            })
        })
        .unwrap_err();
    println!("   publish failed: {err}");
    expect(
        matches!(
            err,
            // The size counts what the producer sends: payload, key and headers.
            outbox::Error::Event(outbox::EventError::PayloadTooLarge {
                size,
                limit: 1_000_000,
                ..
            }) if size > 2_000_000
        ) && count!(&mut conn, "outbox_events") == 0,
        "PayloadTooLarge and nothing written",
    );

    println!("\n3. A claim check: the body in a table, a reference in the event.");
    conn.transaction_with_outbox(|tx| {
        let check = ClaimCheck::store(&mut TableStore(tx.conn()), big.as_bytes())?;
        tx.publish(&DocumentStored {
            doc_id: 3,
            body: check,
        })
    })
    .unwrap();
    let broker = broker_with_kafka_limit();
    let seen = broker.clone();
    let (done, _) = common::relay_until(
        SqliteRelayStore::new(db.path.clone()),
        broker.clone(),
        config,
        Duration::from_secs(10),
        move || seen.all_records().len() == 1,
    );
    let record = &broker.records("document")[0];
    let event = Envelope::<DocumentStored>::from_record(record).unwrap();
    let body = event.body.fetch(&mut TableStore(&mut conn)).unwrap();
    println!(
        "   The event is {} bytes; the consumer fetched a {}-byte body and verified it.",
        record.payload.len(),
        body.len()
    );
    expect(
        done && record.payload.len() < 200 && body == big.as_bytes(),
        "a small event and the full body on the consumer's side",
    );
}
