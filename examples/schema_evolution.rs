//! Evolving an event from version 1 to version 2 without breaking its consumers.
//!
//! 1. Release 1 ships `OrderPlaced` v1; its schema snapshot is dumped (and would be committed).
//! 2. A breaking edit (renaming `total` in a new version) fails the check, one line per change.
//! 3. A compatible edit (a new optional field) passes, and `--update` accepts it.
//! 4. The rename done right: v2 upcasts from the v1 type, so the check passes, and a v1 event
//!    written to an SQLite outbox and relayed is decoded as v2.
//!
//! In a real project the snapshot check is one line in a test,
//! `outbox::schema::assert_compatible("events.schema.json")`, and the "releases" below are
//! commits; here each release is an explicit catalog so that one program can show all of them.
//!
//! ```text
//! cargo run --example schema_evolution --features schema
//! ```

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use outbox::catalog::Catalog;
use outbox::prelude::*;
use outbox::relay::{MemoryBroker, Relay, RelayConfig, SqliteRelayStore};
use outbox::schema::{Mode, check_catalog};
use serde::{Deserialize, Serialize};

/// Release 1.
mod v1 {
    use super::*;
    #[derive(Debug, Serialize, Deserialize, schemars::JsonSchema, OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "OrderPlaced", version = 1)]
    pub struct OrderPlaced {
        #[outbox(aggregate_id)]
        pub order_id: i64,
        pub total: i64,
    }
}

/// A breaking edit: the field renamed in a new version, with nothing to read old payloads.
mod breaking {
    use super::*;
    #[derive(Serialize, Deserialize, schemars::JsonSchema, OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "OrderPlaced", version = 2)]
    pub struct OrderPlaced {
        #[outbox(aggregate_id)]
        pub order_id: i64,
        pub total_cents: i64,
    }
}

/// A compatible edit: a new optional field (old payloads decode, with `None`).
mod compatible {
    use super::*;
    #[derive(Serialize, Deserialize, schemars::JsonSchema, OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "OrderPlaced", version = 2)]
    pub struct OrderPlaced {
        #[outbox(aggregate_id)]
        pub order_id: i64,
        pub total: i64,
        pub coupon: Option<String>,
    }
}

/// The rename done right: version 2 decodes version 1 as the v1 type, then converts it.
mod upcast {
    use super::*;
    #[derive(Debug, Serialize, Deserialize, schemars::JsonSchema, OutboxEvent)]
    #[outbox(aggregate = "order", event_type = "OrderPlaced", version = 2, upcast_from = v1::OrderPlaced)]
    pub struct OrderPlaced {
        #[outbox(aggregate_id)]
        pub order_id: i64,
        pub total_cents: i64,
    }

    impl From<v1::OrderPlaced> for OrderPlaced {
        fn from(old: v1::OrderPlaced) -> Self {
            OrderPlaced {
                order_id: old.order_id,
                total_cents: old.total,
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let snapshot = dir.path().join("events.schema.json");

    println!("1. Release 1: dump the snapshot of the catalog (commit it with the code).");
    let release1 = Catalog::builder().event::<v1::OrderPlaced>().build()?;
    let first = check_catalog(&release1, &snapshot, Mode::Backward, true)?;
    assert!(first.written, "the first check with update writes the file");
    println!("{}", indent(&std::fs::read_to_string(&snapshot)?));

    println!("2. A breaking edit: `total` renamed to `total_cents` in version 2.");
    let edit = Catalog::builder()
        .event::<breaking::OrderPlaced>()
        .build()?;
    let outcome = check_catalog(&edit, &snapshot, Mode::Backward, true)?;
    for finding in &outcome.report.breaking {
        println!("   breaking: {finding}");
    }
    if outcome.report.is_compatible() || outcome.written {
        return Err("the rename should have failed the check, and left the file alone".into());
    }

    println!("\n3. A compatible edit: version 2 adds an optional `coupon`.");
    let edit = Catalog::builder()
        .event::<compatible::OrderPlaced>()
        .build()?;
    let outcome = check_catalog(&edit, &snapshot, Mode::Full, false)?;
    for finding in &outcome.report.compatible {
        println!("   compatible: {finding}");
    }
    if !outcome.report.is_compatible() || outcome.up_to_date {
        return Err("the optional field should pass, and not be accepted yet".into());
    }
    println!("   Accepted with --update; the snapshot now keeps v1 and v2.");
    let accepted = check_catalog(&edit, &snapshot, Mode::Full, true)?;
    assert!(accepted.written);
    let again = check_catalog(&edit, &snapshot, Mode::Full, false)?;
    assert!(again.up_to_date && again.report.is_compatible());

    println!("\n4. The rename done right, from release 1: version 2 upcasts from the v1 type.");
    std::fs::remove_file(&snapshot)?;
    check_catalog(&release1, &snapshot, Mode::Backward, true)?;
    let release2 = Catalog::builder()
        .event::<v1::OrderPlaced>()
        .event::<upcast::OrderPlaced>()
        .build()?;
    let outcome = check_catalog(&release2, &snapshot, Mode::BackwardTransitive, true)?;
    for finding in &outcome.report.compatible {
        println!("   compatible: {finding}");
    }
    if !outcome.report.is_compatible() {
        return Err(format!("the upcast should pass: {:?}", outcome.report.breaking).into());
    }

    // Release 1 wrote an event; release 2 reads it.
    let database = dir.path().join("orders.db");
    let database = database.to_str().ok_or("non-UTF-8 temp path")?;
    let mut conn = SqliteConnection::establish(database)?;
    outbox::migrations::run(&mut conn)?;
    conn.transaction_with_outbox(|tx| {
        tx.publish(&v1::OrderPlaced {
            order_id: 7,
            total: 1250,
        })?;
        Ok::<_, outbox::Error>(())
    })?;
    let broker = Arc::new(MemoryBroker::new());
    let config = RelayConfig {
        poll_interval: Duration::from_millis(20),
        ..RelayConfig::default()
    };
    let relay = Relay::new(SqliteRelayStore::new(database), broker.clone(), config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(relay.run(async {
        while broker.all_records().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }));
    let record = &broker.records("order")[0];
    println!(
        "   relayed: {} {}",
        record.header("event_version").unwrap_or("?"),
        record.payload
    );
    let event = Envelope::<upcast::OrderPlaced>::from_record(record)?;
    println!(
        "   decoded as v2: {:?} (written as version {})",
        event.payload, event.version
    );
    if (event.version, event.total_cents) != (1, 1250) {
        return Err("the v1 event should decode as v2 with its total".into());
    }
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("   {l}\n")).collect()
}
