//! # outbox
//!
//! A Diesel-native transactional outbox. Write business rows and the events that describe them
//! in **one** local transaction; a relay publishes the events to a broker at least once;
//! consumers apply each event exactly once in effect.
//!
//! ## Why
//!
//! `insert order; commit; publish OrderCreated` loses the event when the process dies between
//! the commit and the publish; publishing first announces orders that a failed commit never
//! stored; retrying either step duplicates. There is no atomic commit across a database and a
//! broker. The outbox turns the problem into one local ACID transaction: the event is a row,
//! committed with the order or not at all, and a relay publishes committed rows afterwards.
//!
//! ```
//! use diesel::prelude::*;
//! use outbox::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, OutboxEvent)]
//! #[outbox(aggregate = "order", event_type = "OrderCreated", version = 1)]
//! struct OrderCreated {
//!     #[outbox(aggregate_id)]
//!     order_id: i64,
//!     total_cents: i64,
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! outbox::migrations::run(&mut conn)?;
//! # diesel::sql_query("CREATE TABLE orders (id BIGINT PRIMARY KEY, total_cents BIGINT)").execute(&mut conn)?;
//!
//! conn.transaction_with_outbox(|tx| {
//!     diesel::sql_query("INSERT INTO orders (id, total_cents) VALUES (1, 1250)")
//!         .execute(tx.conn())?;
//!     tx.publish(&OrderCreated { order_id: 1, total_cents: 1250 })?;
//!     Ok::<_, outbox::Error>(())
//! })?; // the order and its event commit together, or neither does
//! # Ok(())
//! # }
//! ```
//!
//! ## Consuming
//!
//! Delivery is at least once, so a consumer sees some events twice. An
//! [`#[idempotent]`](idempotent) handler applies each exactly once in effect: its body runs in a
//! transaction that first claims the event in the [`inbox`], and a redelivered event returns
//! [`Outcome::Duplicate`] without running the body.
//!
//! ```
//! use diesel::prelude::*;
//! use outbox::prelude::*;
//! # #[derive(Clone, serde::Serialize, serde::Deserialize, OutboxEvent)]
//! # #[outbox(aggregate = "order", event_type = "OrderCreated")]
//! # struct OrderCreated { #[outbox(aggregate_id)] order_id: i64, total_cents: i64 }
//!
//! #[idempotent(consumer = "billing")]
//! fn charge(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> QueryResult<()> {
//!     diesel::sql_query(format!("INSERT INTO invoices VALUES ({})", event.order_id)).execute(conn)?;
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut conn = SqliteConnection::establish(":memory:")?;
//! # outbox::migrations::run(&mut conn)?;
//! # diesel::sql_query("CREATE TABLE invoices (order_id BIGINT)").execute(&mut conn)?;
//! let event = Envelope::new(OrderCreated { order_id: 1, total_cents: 1250 });
//! assert!(charge(&mut conn, event.clone())?.is_applied());
//! assert!(charge(&mut conn, event)?.is_duplicate()); // delivered twice, applied once
//! # Ok(())
//! # }
//! ```
//!
//! With the `kafka` feature, `kafka::KafkaConsumer` reads topics, decodes each
//! message into the [`Envelope`] of its event type and calls that type's handler, committing the
//! offset only once the handler is done.
//!
//! ## Crate features
//! - `sqlite` (default): SQLite through Diesel, with a bundled libsqlite3.
//! - `postgres`: PostgreSQL (links libpq).
//! - `mysql`: MySQL and MariaDB (links the MySQL/MariaDB client library).
//! - `async`: diesel-async 0.9 connections (`AsyncPgConnection`, `AsyncMysqlConnection`,
//!   `SyncConnectionWrapper<SqliteConnection>`), with `transaction_with_outbox` taking an async
//!   closure.
//! - `r2d2`: Diesel's r2d2 pool; pooled connections work unchanged.
//! - `deadpool`, `bb8`: kept for existing manifests; with `async` the Kafka consumer already
//!   knows the errors of diesel-async's pools as outages ([`fault`]).
//! - `relay`: the relay engine and its stores (implies `async`).
//! - `kafka`: the Kafka publisher and consumer (librdkafka, built from bundled sources).
//! - `schema`: the JSON Schema of every event (`schemars`) and `outbox::schema`'s snapshot check.
//! - `testing`: the test kit, [`testing`] (for dev-dependencies).
//! - `cli`: the `outbox` binary: `outbox migrate`, `outbox relay`, `outbox status`, `outbox dead`,
//!   `outbox replay`, `outbox cleanup`.
//! - `tls`, `mysql_tls`: TLS (rustls) for the async PostgreSQL and MySQL connections, from the
//!   URL's `sslmode`/`sslrootcert`/`sslcert`/`sslkey` and `ssl-mode`/`ssl-ca` ([`connect`]).
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(hidden)]
pub use outbox_core::SHARD_TEST_VECTORS;
pub use outbox_core::{
    AggregateKey, BoxError, DEFAULT_MAX_PAYLOAD_BYTES, DecodeError, Envelope, EventError,
    EventType, HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_TYPE, HEADER_EVENT_VERSION,
    HEADER_ID, Headers, NewMessage, OutboxEvent, Outcome, RESERVED_HEADERS, SHARD_COUNT,
    max_payload_bytes, set_max_payload_bytes, shard_of,
};

pub use outbox_core::claim_check;

pub use outbox_core::redact;

pub use outbox_diesel::{
    Error, INBOX_TABLE, OUTBOX_TABLE, OutboxBackend, OutboxConnection, OutboxTx, PendingEvents,
    publish, publish_with_headers,
};

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use outbox_diesel::{
    AsyncOutboxConnection, OutboxFunc, publish_async, publish_with_headers_async,
};

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use outbox_diesel::connect;

/// The relay: publishes committed outbox rows to a broker, at least once.
///
/// [`Relay`](relay::Relay) runs the loop over a store (`PgRelayStore`, `MysqlRelayStore`,
/// `SqliteRelayStore`) and a [`Publisher`](relay::Publisher) (Kafka with the `kafka` feature,
/// or the [`MemoryBroker`](relay::MemoryBroker)).
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub mod relay {
    pub use outbox_core::relay::*;
    pub use outbox_diesel::relay::*;
}

pub use outbox_diesel::notify;

/// Fault classes: is a consumer handler's error an outage (retried until it passes) or poison
/// (counted, then dead-lettered)? Diesel's errors are classified by the Diesel store, see
/// [`outbox_diesel::fault`](https://docs.rs/outbox-diesel/latest/outbox_diesel/fault/).
pub mod fault {
    pub use outbox_core::fault::*;
}

/// Kafka (feature `kafka`): the relay's [`KafkaPublisher`](kafka::KafkaPublisher) and the
/// consumers' [`KafkaConsumer`](kafka::KafkaConsumer), which dispatches each message to the
/// handler of its event type (typically an [`idempotent`] function) and commits its offset only
/// once the handler's transaction committed.
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub use outbox_core::kafka;

/// NATS JetStream (feature `nats`): the relay's [`NatsPublisher`](nats::NatsPublisher) and the
/// consumers' [`NatsConsumer`](nats::NatsConsumer), the same runtime over durable pull
/// consumers.
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use outbox_core::nats;

/// RabbitMQ (feature `rabbitmq`): the relay's
/// [`RabbitMqPublisher`](rabbitmq::RabbitMqPublisher) (publisher confirms) and the consumers'
/// [`RabbitMqConsumer`](rabbitmq::RabbitMqConsumer), which acknowledges each delivery only
/// once its handler's transaction committed.
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub use outbox_core::rabbitmq;

/// The broker-free consumer runtime under the brokers' consumers (features `kafka`, `nats`,
/// `rabbitmq`): its policies, default backoffs, dead-letter headers and
/// [`ConsumerStats`](consumer::ConsumerStats), which each broker's module re-exports too.
#[cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq")))
)]
pub use outbox_core::consumer;

/// OpenTelemetry trace propagation (feature `opentelemetry`): `publish` writes the current
/// span's W3C trace context into the event's headers, and the Kafka consumer continues that
/// trace in the span of each message, as its child (see the module for why a parent, not a
/// link).
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub use outbox_core::otel;

pub use outbox_diesel::inbox;

pub use outbox_core::catalog;

/// Event schemas across releases (feature `schema`): a committed snapshot of every event
/// version's JSON Schema and a breaking-change check; see `docs/evolving-events.md`.
#[cfg(feature = "schema")]
#[cfg_attr(docsrs, doc(cfg(feature = "schema")))]
pub use outbox_core::schema;

/// `schemars`, to `#[derive(JsonSchema)]` on events (feature `schema`).
#[cfg(feature = "schema")]
#[cfg_attr(docsrs, doc(cfg(feature = "schema")))]
pub use outbox_core::schemars;

/// Makes a message handler idempotent (exactly once in effect): its body runs in a database
/// transaction that first claims the message in the [`inbox`], and a message it already applied
/// is recognised and not applied again.
///
/// ```
/// use diesel::prelude::*;
/// use outbox::prelude::*;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Serialize, Deserialize, OutboxEvent)]
/// #[outbox(aggregate = "order", event_type = "OrderCreated")]
/// struct OrderCreated {
///     #[outbox(aggregate_id)]
///     order_id: i64,
///     total_cents: i64,
/// }
///
/// #[idempotent(consumer = "billing")]
/// fn charge(conn: &mut SqliteConnection, event: Envelope<OrderCreated>) -> QueryResult<i64> {
///     diesel::sql_query("INSERT INTO invoices (order_id, cents) VALUES (?, ?)")
///         .bind::<diesel::sql_types::BigInt, _>(event.order_id)
///         .bind::<diesel::sql_types::BigInt, _>(event.total_cents)
///         .execute(conn)?;
///     Ok(event.total_cents)
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// outbox::migrations::run(&mut conn)?;
/// diesel::sql_query("CREATE TABLE invoices (order_id BIGINT, cents BIGINT)").execute(&mut conn)?;
///
/// let event = Envelope::new(OrderCreated { order_id: 7, total_cents: 1250 });
/// let redelivered = event.clone();
/// assert_eq!(charge(&mut conn, event)?, Outcome::Applied(1250));
/// assert_eq!(charge(&mut conn, redelivered)?, Outcome::Duplicate); // the body did not run
/// # Ok(())
/// # }
/// ```
///
/// # What it generates
///
/// The function keeps its name, parameters, visibility and attributes; its return type
/// `Result<T, E>` becomes `Result<Outcome<T>, E>` (an alias such as `QueryResult<T>` becomes
/// `QueryResult<Outcome<T>>`). Its body runs like this:
///
/// 1. Begin a transaction on the connection (a savepoint if one is already open).
/// 2. Claim `(consumer, key)` in the inbox ([`inbox::claim`]): `INSERT … ON CONFLICT DO
///    NOTHING` on PostgreSQL, `INSERT IGNORE` on MySQL/MariaDB, `INSERT OR IGNORE` on SQLite.
/// 3. If the inbox already held it, end the transaction and return `Ok(Outcome::Duplicate)`
///    **without running the body**.
/// 4. Otherwise run the body. `Ok(v)` commits the effect together with the inbox row and
///    returns `Ok(Outcome::Applied(v))`; `Err(e)` rolls both back and returns `Err(e)`, so that
///    a retry applies the message later.
///
/// Two consumers racing on one message are serialised by the inbox's primary key: the second
/// waits for the first transaction and then returns `Duplicate` (or applies the message, if the
/// first rolled back). Neither sees an error.
///
/// # The function
///
/// - A plain `fn` takes a synchronous connection: `&mut PgConnection`, `&mut MysqlConnection`,
///   `&mut SqliteConnection`, or a pooled one. An `async fn` takes a diesel-async connection:
///   `&mut AsyncPgConnection`, `&mut AsyncMysqlConnection`,
///   `&mut SyncConnectionWrapper<SqliteConnection>`, or a pooled one. The connection is the
///   one parameter whose type is a `&mut` reference; the body uses it under its own name.
/// - The message is the one parameter of type `Envelope<E>`, taken by value.
/// - Other parameters (`&self`, a `&Config`, ...) are passed through.
/// - It returns a `Result` whose error type implements `From<diesel::result::Error>`: the
///   transaction and the claim can fail on their own.
///
/// Inside an async function, as with diesel-async's transactions, dropping the future before
/// it completes leaves the transaction open: the connection must then be dropped (pools do so
/// for connections left in a transaction).
///
/// # Options
///
/// - `consumer = "billing"` (**required**): the name the inbox records this handler's messages
///   under; 1 to 255 characters. It is not defaulted to the function's path on purpose: the
///   inbox must recognise messages applied before a deploy, so the name has to survive renaming
///   or moving the function; a default that changed silently with the code would re-apply every
///   message still in the broker's retention. Two handlers with the same name share one inbox,
///   so each message is applied by only one of them.
/// - `key = |e| ...` or `key = path::to_fn` (optional): the deduplication key, computed from
///   `&Envelope<E>` as anything that implements `Display`; at most 255 characters. Defaults to
///   the event id ([`Envelope::inbox_key`]), which is the same for every redelivery of a
///   message. Choose another key when the same fact can arrive as different events, e.g.
///   `key = |e| e.order_id` to charge each order once.
/// - `crate = outbox_diesel` (optional): the path the generated code reaches the runtime
///   through; defaults to `::outbox`.
///
/// Misuse is a compile error at the offending token: no connection or no envelope parameter,
/// two of either, a return type that is not a `Result`, an unknown or repeated option, a
/// missing, empty or non-string `consumer`, a `key` that is not a one-argument closure or a
/// function, a connection of the wrong kind for a sync or async function.
///
/// ```
/// use outbox::prelude::*;
/// # #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// # #[outbox(aggregate = "order")]
/// # struct OrderCreated { #[outbox(aggregate_id)] order_id: i64 }
///
/// /// Charges each order once, whichever event announced it.
/// #[idempotent(consumer = "billing", key = |e| e.order_id)]
/// fn charge(
///     conn: &mut diesel::SqliteConnection,
///     event: Envelope<OrderCreated>,
/// ) -> Result<(), outbox::Error> {
///     # let _ = (conn, event);
///     Ok(())
/// }
/// # let _ = charge;
/// ```
///
/// ```compile_fail
/// use outbox::prelude::*;
/// # #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// # #[outbox(aggregate = "order")]
/// # struct OrderCreated { #[outbox(aggregate_id)] order_id: i64 }
/// #[idempotent] // error: missing `consumer = "..."`
/// fn charge(conn: &mut diesel::SqliteConnection, event: Envelope<OrderCreated>) -> diesel::QueryResult<()> {
///     Ok(())
/// }
/// ```
pub use outbox_core::idempotent;

/// The test kit (feature `testing`) for services that use the outbox: assertions on what a
/// transaction wrote, a deterministic relay, redelivery harnesses for handlers and fault
/// injection. See `docs/guide/testing-a-service.md`.
///
/// - [`written`](testing::written), [`written_events`](testing::written_events) and
///   [`assert_written!`](testing::assert_written): the events a transaction wrote, no broker.
/// - [`drain`](testing::drain) / [`Drain`](testing::Drain): publishes everything pending to a
///   publisher on the test's own connection and returns what was published;
///   `MemoryBroker::published::<E>()` reads the in-memory broker back, typed.
/// - [`deliver_twice`](testing::deliver_twice),
///   [`deliver_twice_observed`](testing::deliver_twice_observed),
///   [`deliver_out_of_order`](testing::deliver_out_of_order): redelivery of one event to an
///   `#[idempotent]` handler.
/// - [`Faulty`](testing::Faulty): a publisher wrapper that fails, is unreachable for a while,
///   black-holes or loses acknowledgements; [`Drain::crash_after_publish`](testing::Drain::crash_after_publish)
///   stops a drain between publish and mark.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing {
    pub use outbox_core::testing::*;
    pub use outbox_diesel::testing::*;
}

/// A test with a fresh database (feature `testing`): `#[outbox::test]` on a sync or `async fn`
/// creates a database for the test, applies the outbox's migrations (and the application's,
/// with `migrations = "dir"`), hands the test the connection or pool its one parameter asks
/// for, and drops the database when the test ends, also when it panics.
///
/// ```
/// use diesel::prelude::*;
/// use outbox::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(aggregate = "order", event_type = "OrderPlaced")]
/// struct OrderPlaced { #[outbox(aggregate_id)] order_id: i64 }
///
/// #[outbox::test(migrations = "migrations/sqlite")]
/// fn placing_an_order_writes_the_event(conn: &mut SqliteConnection) {
///     conn.transaction_with_outbox(|tx| {
///         tx.publish(&OrderPlaced { order_id: 7 })?;
///         Ok::<_, outbox::Error>(())
///     })
///     .unwrap();
///     outbox::testing::assert_written!(conn, OrderPlaced { order_id: 7 });
/// }
///
/// #[outbox::test]
/// async fn async_tests_get_async_connections(pool: diesel_async::pooled_connection::deadpool::Pool<diesel_async::AsyncPgConnection>) {
///     let conn = pool.get().await.unwrap();
///     # drop(conn);
/// }
/// # fn main() {}
/// ```
///
/// # Where the database comes from
///
/// The parameter's type decides the backend ([`TestConnection`](testing::TestConnection),
/// [`AsyncTestConnection`](testing::AsyncTestConnection)):
///
/// - PostgreSQL (`&mut PgConnection`, `&mut AsyncPgConnection`, an r2d2, deadpool or bb8
///   pool of them): a database `outbox_t_kit_<process>_<n>` created on the server named by
///   `OUTBOX_TEST_POSTGRES_URL` (a URL of a database there, with the right to create others),
///   dropped `WITH (FORCE)` afterwards;
/// - MySQL/MariaDB (`&mut MysqlConnection`, `&mut AsyncMysqlConnection`, pools): the same on
///   `OUTBOX_TEST_MYSQL_URL`;
/// - SQLite (`&mut SqliteConnection`, `&mut SyncConnectionWrapper<SqliteConnection>`, an r2d2
///   pool): a temporary file, deleted afterwards.
///
/// A connection is taken as `&mut T`, a pool by value. An `async fn` test runs on a
/// single-threaded Tokio runtime of its own; a sync one is given sync connections and pools
/// only.
///
/// # Options
///
/// - `migrations = "dir"`: the application's Diesel migrations directory, relative to the
///   package (`CARGO_MANIFEST_DIR`), applied after the outbox's (see
///   [`TestDatabase::migrate_dir`](testing::TestDatabase::migrate_dir)).
/// - `env = "VAR"`: read the server's URL from `VAR` instead.
/// - `crate = path`: the path the generated code reaches the kit through; defaults to
///   `::outbox`.
///
/// Misuse is a compile error at the offending token: no parameter or more than one, `self`,
/// a connection taken as `&T`, an `impl Trait` parameter, a generic or `const` test, an
/// unknown or repeated option, an empty or non-string `migrations` or `env`, a type the kit
/// cannot open (or an async connection in a sync test), an item that is not a function.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use outbox_core::test;

/// The outbox's schema migrations: [`migrations::run`] (sync) and `migrations::run_async`.
pub mod migrations {
    pub use outbox_diesel::migrations::*;
}

/// The traits and derive most code needs: `use outbox::prelude::*;`.
pub mod prelude {
    pub use outbox_core::{Envelope, OutboxEvent, Outcome, idempotent};
    #[cfg(feature = "async")]
    pub use outbox_diesel::AsyncOutboxConnection;
    pub use outbox_diesel::OutboxConnection;
}

/// Items the generated code uses. Not public API: it may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use outbox_core::__private::*;
    pub use outbox_diesel::__private::*;
}
