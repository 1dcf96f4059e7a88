//! End to end: `transaction_with_outbox` → `outbox relay` processes → a real Kafka-protocol
//! broker → a real Kafka consumer. Relays are real processes, killed with SIGKILL where the
//! test says so. Needs the brokers of `scripts/kafka.sh start` (the test command starts them).
//!
//! Run with `cargo test --all-features --test e2e`.
#![allow(missing_docs)]

#[path = "../integration/pgbouncer.rs"]
mod pgbouncer;
#[path = "../integration/private_postgres.rs"]
mod private_postgres;
#[path = "../integration/support.rs"]
mod support;

mod broker_tls;
mod chaos;
mod faults;
mod harness;
mod holds;
mod inputs;
mod kafka_tls;
mod metrics;
mod nats_credentials;
mod ops;
mod pooler;
mod scenarios;
mod secrets;
mod takeover;
mod tls;
mod tls_mysql;
mod unreachable_broker;

diesel::table! {
    orders (id) {
        id -> BigInt,
        total_cents -> BigInt,
    }
}
