//! A consumer's database going away for 10 s, with a handler written the usual way: its own
//! `thiserror` enum with `#[from]` diesel-async's deadpool `PoolError`, a pool with deadpool's
//! defaults, and the consumer's defaults. Two ways:
//! - refusing connections (`ALTER DATABASE … WITH ALLOW_CONNECTIONS false`, open sessions
//!   terminated): new connections fail with `database "…" is not currently accepting
//!   connections` (SQLSTATE 55000), which reaches the handler as the pool's "Error occurred
//!   while creating a new object";
//! - the server stopped (`pg_ctl stop -m fast`, a private cluster) and started again: lost
//!   connections, then refused ones.
//!
//! The promise: that is an outage whatever features the service enabled (only `postgres`,
//! `async` and `kafka` on `outbox` are needed; nothing here depends on a pool feature): 0
//! messages dead-lettered, every event applied exactly once, every key's effects in publish
//! order. Each test prints its figures.

use std::time::{Duration, Instant};

use diesel::RunQueryDsl;
use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::{Pool, PoolError};
use outbox::kafka::KafkaConsumer;
use outbox::{Envelope, idempotent};

use crate::conns::*;
use crate::outage::{assert_effects_in_order, publish_paced};
use crate::private_postgres::PrivatePostgres;
use crate::support::*;
use crate::through_broker::{bootstrap, n, topic, unique};

const AWAY: Duration = Duration::from_secs(10);
const KEYS: i64 = 10;
const BATCHES: i64 = 30;

/// A service's error type as `thiserror` writes it.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("pool: {0}")]
    Pool(#[from] PoolError),
    #[error("database: {0}")]
    Db(#[from] diesel::result::Error),
}

#[idempotent(consumer = "ledger")]
async fn record(
    conn: &mut AsyncPgConnection,
    event: Envelope<OrderCreated>,
) -> Result<(), LedgerError> {
    conn.effect(
        "ledger",
        &event.inbox_key(),
        event.order_id,
        event.total_cents,
    )
    .await?;
    Ok(())
}

/// Runs `sql` on the server's admin database at `admin`.
fn admin(admin: &str, sql: &str) {
    let mut conn = <diesel::PgConnection as diesel::Connection>::establish(admin).unwrap();
    diesel::sql_query(sql).execute(&mut conn).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_refusing_connections_dead_letters_nothing_through_a_users_thiserror_pool_error()
{
    let db = with_effects_async::<AsyncPgConnection>(TestDatabase::postgres("refusing")).await;
    let name = db.url.rsplit_once('/').unwrap().1.to_owned();
    let url = postgres_admin_url();
    let (refuse, allow) = (url.clone(), url);
    let (n1, n2) = (name.clone(), name);
    away_for(
        "refusing connections",
        &db,
        move || {
            admin(
                &refuse,
                &format!("ALTER DATABASE {n1} WITH ALLOW_CONNECTIONS false"),
            );
            admin(
                &refuse,
                &format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{n1}'"
                ),
            );
        },
        move || {
            admin(
                &allow,
                &format!("ALTER DATABASE {n2} WITH ALLOW_CONNECTIONS true"),
            )
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_stopped_and_restarted_dead_letters_nothing_through_a_users_thiserror_pool_error()
 {
    let pg = std::sync::Arc::new(
        tokio::task::spawn_blocking(PrivatePostgres::start)
            .await
            .unwrap(),
    );
    let db =
        with_effects_async::<AsyncPgConnection>(TestDatabase::postgres_on(pg.url(), "stopped"))
            .await;
    let (stop, start) = (pg.clone(), pg.clone());
    away_for(
        "stopped with pg_ctl stop -m fast, then started",
        &db,
        move || stop.ctl("stop"),
        move || start.ctl("start"),
    )
    .await;
    drop(db); // dropped on the running cluster, before the cluster goes
}

/// Publishes `BATCHES` × 10 events of `KEYS` keys over about 8 s while a consumer applies them
/// through [`record`]; once it applied some, the database goes `away` for [`AWAY`], then
/// comes `back`. Asserts the promise of the module and prints the figures.
async fn away_for(
    what: &str,
    db: &TestDatabase,
    away: impl FnOnce() + Send + 'static,
    back: impl FnOnce() + Send + 'static,
) {
    let pool: Pool<AsyncPgConnection> =
        Pool::builder(AsyncDieselConnectionManager::new(db.url.clone()))
            .max_size(4)
            .build()
            .unwrap();

    let topic = topic("db-refusing").await;
    let consumer = KafkaConsumer::builder()
        .brokers(bootstrap())
        .group(unique("db-refusing"))
        .assign(&topic, 0..3)
        .handler(move |event: Envelope<OrderCreated>| {
            let pool = pool.clone();
            async move {
                let mut conn = pool.get().await?;
                record(&mut conn, event).await
            }
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));

    let publishing = publish_paced(&topic, BATCHES, KEYS);

    let joined = Instant::now();
    while n(&stats.applied) == 0 && joined.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let applied_before = n(&stats.applied);
    assert!(
        applied_before > 0,
        "the consumer applied nothing: {stats:?}"
    );
    tokio::task::spawn_blocking(away).await.unwrap();
    tokio::time::sleep(AWAY).await;
    let retried = n(&stats.transient_errors);
    let dead_during = n(&stats.dead_lettered);
    tokio::task::spawn_blocking(back).await.unwrap();
    let allowed_at = Instant::now();
    publishing.await.unwrap();

    let total = (BATCHES * 10) as u64;
    let done = || n(&stats.applied) + n(&stats.duplicates);
    while done() < total && n(&stats.dead_lettered) == 0 {
        assert!(
            allowed_at.elapsed() < Duration::from_secs(60),
            "the backlog was not applied within 60 s of the database's return: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = allowed_at.elapsed();
    stop.send(()).unwrap();
    consuming.await.unwrap();

    assert_eq!(
        (
            dead_during,
            n(&stats.dead_lettered),
            n(&stats.handler_errors)
        ),
        (0, 0, 0),
        "a database refusing connections is an outage, never the message's fault: {stats:?}"
    );
    assert!(retried > 0, "the refusal was met: {stats:?}");

    let mut conn = <AsyncPgConnection as AsyncConn>::open(db).await;
    assert_eq!(conn.count(COUNT_INBOX).await, total as i64);
    assert_eq!(
        conn.count("SELECT COUNT(DISTINCT event_id) AS n FROM effects")
            .await,
        total as i64,
    );
    assert_eq!(
        conn.count(COUNT_EFFECTS).await,
        total as i64,
        "each event applied exactly once"
    );
    assert_effects_in_order(&mut conn, KEYS, total as i64 / KEYS).await;
    eprintln!(
        "consumer database away for {AWAY:?} ({what}): {total} events, {applied_before} applied \
         before, {retried} transient failures retried while away, 0 dead-lettered, each \
         applied once in publish order; the backlog applied {recovered:?} after it was back"
    );
}
