//! Ordering: a retried event overtakes nothing only if its aggregate's later events wait for it (head-of-line per aggregate, key = aggregate). SQLite, no services.
//!
//! Order 1 emits steps 1, 2, 3; order 2 does too. The broker rejects order 1's step 1 once
//! (injected). A relay that keeps publishing while the failed event backs off (the
//! `Unordered` mode, like any "retry later" queue) puts step 1 after steps 2 and 3: consumers
//! see "shipped" before "placed". In `Sharded` mode the relay holds an aggregate's later events
//! until its failed event is out, so order 1 arrives 1, 2, 3, while order 2, another key, is
//! not held up at all. On Kafka the key (the aggregate id) picks the partition, and a
//! partition keeps the order the relay published in.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{OrderPlaced, SqliteDb, expect};
use outbox::prelude::*;
use outbox::relay::{Backoff, MemoryBroker, Mode, RelayConfig, SqliteRelayStore};

/// Runs one relay in `mode` over six events; returns (order 1's steps, order 2's steps, and
/// whether all of order 2 was out before order 1's step 1) as the broker received them.
fn run(mode: Mode) -> (Vec<i64>, Vec<i64>, bool) {
    let db = SqliteDb::new();
    let mut conn = db.conn();
    for step in 1..=3 {
        for order_id in [1, 2] {
            conn.transaction_with_outbox(|tx| {
                tx.publish(&OrderPlaced {
                    order_id,
                    total_cents: step,
                })
            })
            .unwrap();
        }
    }
    let broker = Arc::new(MemoryBroker::new());
    let rejected = AtomicBool::new(false);
    broker.fail_when(move |m| {
        let first = m.aggregate_id == "1"
            && m.payload.contains("\"total_cents\":1")
            && !rejected.swap(true, Ordering::SeqCst);
        first.then(|| "NOT_ENOUGH_REPLICAS (injected, once)".to_owned())
    });
    let config = RelayConfig {
        mode,
        // The failed event waits 1 s before its retry; the relay polls every 20 ms.
        backoff: Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(1),
            multiplier: 1.0,
            jitter: 0.0,
        },
        ..common::quick_config()
    };
    let seen = broker.clone();
    let (done, _) = common::relay_until(
        SqliteRelayStore::new(db.path.clone()),
        broker.clone(),
        config,
        Duration::from_secs(10),
        move || seen.records("order").len() == 6,
    );
    common::ensure(done, "the relay to publish all six events");
    let records = broker.records("order");
    let steps = |key: &str| -> Vec<i64> {
        records
            .iter()
            .filter(|r| r.key == key)
            .map(|r| Envelope::<OrderPlaced>::from_record(r).unwrap().total_cents)
            .collect()
    };
    let pos_1_1 = records
        .iter()
        .position(|r| r.key == "1" && r.payload.contains("\"total_cents\":1"))
        .unwrap();
    let last_2 = records.iter().rposition(|r| r.key == "2").unwrap();
    (steps("1"), steps("2"), last_2 < pos_1_1)
}

fn main() {
    println!("1. Retrying later while the queue moves on (Mode::Unordered).");
    let (one, two, _) = run(Mode::Unordered);
    println!("   order 1 arrived as steps {one:?}, order 2 as {two:?}");
    expect(
        one != vec![1, 2, 3],
        "the retry to reorder order 1's events",
    );

    println!("\n2. Head-of-line per aggregate (Mode::Sharded).");
    let (one, two, unblocked) = run(Mode::Sharded);
    println!(
        "   order 1 arrived as steps {one:?}, order 2 as {two:?}; order 2 done before order 1's retry: {unblocked}"
    );
    expect(
        one == vec![1, 2, 3] && two == vec![1, 2, 3],
        "both orders in order",
    );
    expect(unblocked, "order 2 not to wait for order 1's retry");
    println!(
        "\nOrder is per key: publish with key = aggregate id, and let a failed event hold back only\nits own aggregate's later events."
    );
}
