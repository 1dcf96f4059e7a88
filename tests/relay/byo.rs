//! Bring your own connections: relays whose every connection comes from the application's
//! factory or deadpool pool, on PostgreSQL and MySQL/MariaDB.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use outbox::relay::{Backoff, MemoryBroker, Mode, Relay, RelayConfig, RelayStore};

use crate::backends::{Backend, Contract};
use crate::support::TestDatabase;

/// Writes `per` events for each of `aggregates` orders, interleaved, payload `{"n": i}`.
fn write<B: Backend>(db: &TestDatabase, aggregates: usize, per: usize, from: usize) {
    for n in from..from + per {
        for a in 0..aggregates {
            B::exec(
                db,
                &format!(
                    "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload) \
                     VALUES ('order', 'byo-{a}', 'OrderPaid', 1, '{{\"n\": {n}}}')"
                ),
            );
        }
    }
}

/// A fast sharded relay.
fn config() -> RelayConfig {
    RelayConfig {
        mode: Mode::Sharded,
        batch_size: 20,
        poll_interval: Duration::from_millis(20),
        lease: Duration::from_secs(3),
        publish_timeout: Duration::from_secs(2),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: 0.0,
        },
        ..RelayConfig::default()
    }
}

const PENDING: &str = "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at IS NULL";
const DEAD: &str = "SELECT COUNT(*) AS n FROM outbox_events WHERE dead_at IS NOT NULL";

/// A running relay and how to stop it.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<()>,
}

fn start<S: RelayStore + Send + 'static>(store: S, broker: Arc<MemoryBroker>) -> Running {
    let relay = Relay::new(store, broker, config()).unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        relay
            .run(async move {
                let _ = rx.await;
            })
            .await;
    });
    Running { stop, handle }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.handle.await.unwrap();
    }
}

/// Waits (at most `limit`) until nothing is pending; whether it came to that.
async fn drained<B: Backend>(db: &TestDatabase, limit: Duration) -> bool {
    let start = Instant::now();
    while B::count(db, PENDING) > 0 {
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Each aggregate's events were published once each, in the order written, `0..per`.
fn assert_in_order(broker: &MemoryBroker, aggregates: usize, per: usize) {
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for r in broker.all_records() {
        let n: serde_json::Value = serde_json::from_str(&r.payload).unwrap();
        seen.entry(r.key.clone())
            .or_default()
            .push(n["n"].as_i64().unwrap());
    }
    assert_eq!(seen.len(), aggregates, "every aggregate published");
    for (key, ns) in seen {
        assert_eq!(
            ns,
            (0..per as i64).collect::<Vec<_>>(),
            "{key}: in order, once"
        );
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use crate::backends::Postgres;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::deadpool::Pool;
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    use outbox::relay::PgRelayStore;

    const APP_NAME: &str = "outbox_byo_factory";

    /// The sessions on the test's database other than the asking one, by application_name.
    fn sessions(db: &TestDatabase) -> Vec<String> {
        use diesel::{Connection, RunQueryDsl};
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            name: String,
        }
        let mut conn = diesel::PgConnection::establish(&db.url).unwrap();
        diesel::sql_query(
            "SELECT application_name AS name FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .load::<Row>(&mut conn)
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect()
    }

    /// A sharded relay on connections detached from the application's deadpool pool
    /// publishes every event in order; the pool keeps serving the application, and the admin
    /// API runs on a connection detached from it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn from_pool_relays_in_order() {
        let db = Postgres::database("byo_pool");
        let (aggregates, per) = (10, 6);
        write::<Postgres>(&db, aggregates, per, 0);
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(&db.url);
        let pool = Pool::builder(manager).max_size(4).build().unwrap();
        let broker = Arc::new(MemoryBroker::new());
        let relay = start(PgRelayStore::from_pool(pool.clone()), broker.clone());
        assert!(
            drained::<Postgres>(&db, Duration::from_secs(10)).await,
            "drained"
        );
        // The relay's connections were detached: the pool still hands out its full size.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(
                tokio::time::timeout(Duration::from_secs(2), pool.get())
                    .await
                    .expect("the pool is not exhausted by the relay")
                    .unwrap(),
            );
        }
        drop(held);
        relay.stop().await;
        assert_in_order(&broker, aggregates, per);
        assert_eq!(Postgres::count(&db, DEAD), 0);
        // The admin API on a connection detached from the same pool.
        let conn =
            diesel_async::pooled_connection::deadpool::Object::take(pool.get().await.unwrap());
        let status = outbox::relay::admin::Admin::new(conn)
            .status()
            .await
            .unwrap();
        assert_eq!(
            (status.published, status.pending),
            ((aggregates * per) as i64, 0)
        );
    }

    /// A relay on dedicated connections of the application's bb8 pool publishes every event
    /// in order, and none of the pool's own connections is held by it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn from_bb8_relays_in_order() {
        let db = Postgres::database("byo_bb8");
        let (aggregates, per) = (10, 6);
        write::<Postgres>(&db, aggregates, per, 0);
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(&db.url);
        let pool = diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(2)
            .build(manager)
            .await
            .unwrap();
        let broker = Arc::new(MemoryBroker::new());
        let relay = start(PgRelayStore::from_bb8(pool.clone()), broker.clone());
        assert!(
            drained::<Postgres>(&db, Duration::from_secs(10)).await,
            "drained"
        );
        let a = pool.get().await.unwrap();
        let b = tokio::time::timeout(Duration::from_secs(2), pool.get())
            .await
            .expect("the pool is not exhausted by the relay")
            .unwrap();
        assert_eq!(
            pool.state().connections,
            2,
            "the pool's own connections only"
        );
        drop((a, b));
        relay.stop().await;
        assert_in_order(&broker, aggregates, per);
    }

    /// The sessions once at least `n` are there and all carry [`APP_NAME`] (a test's own
    /// connection that just closed may be listed for an instant), or as they are after 5 s.
    async fn relay_sessions(db: &TestDatabase, n: usize) -> Vec<String> {
        let start = Instant::now();
        loop {
            let names = sessions(db);
            let settled = names.len() >= n && names.iter().all(|name| name == APP_NAME);
            if settled || start.elapsed() > Duration::from_secs(5) {
                return names;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every connection of a relay built on a factory comes from it (the application_name it
    /// sets shows on every session: the store's, the settler's, the listener's); after its
    /// sessions are terminated the relay reconnects through the factory and keeps publishing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn from_connect_reconnects_through_the_factory() {
        let db = Postgres::database("byo_factory");
        let calls = Arc::new(AtomicUsize::new(0));
        let url = format!("{}?application_name={APP_NAME}", db.url);
        let counter = calls.clone();
        let store = PgRelayStore::from_connect(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let url = url.clone();
            async move { AsyncPgConnection::establish(&url).await }
        });
        let broker = Arc::new(MemoryBroker::new());
        let relay = start(store, broker.clone());
        write::<Postgres>(&db, 5, 3, 0);
        assert!(
            drained::<Postgres>(&db, Duration::from_secs(10)).await,
            "drained"
        );
        // Store, settler and listener.
        let before = relay_sessions(&db, 3).await;
        assert!(before.len() >= 3, "store, settler, listener: {before:?}");
        assert!(before.iter().all(|n| n == APP_NAME), "{before:?}");
        let made = calls.load(Ordering::SeqCst);
        assert!(made >= 3, "{made} calls");

        Postgres::exec(
            &db,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        );
        write::<Postgres>(&db, 5, 3, 3);
        assert!(
            drained::<Postgres>(&db, Duration::from_secs(10)).await,
            "drained again"
        );
        let start = Instant::now();
        while calls.load(Ordering::SeqCst) < made + 2 && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            calls.load(Ordering::SeqCst) >= made + 2,
            "reconnected through the factory"
        );
        let after = relay_sessions(&db, 1).await;
        assert!(
            !after.is_empty() && after.iter().all(|n| n == APP_NAME),
            "{after:?}"
        );
        relay.stop().await;
        assert_in_order(&broker, 5, 6);
    }

    /// A factory that fails is an outage: the relay waits and retries, dead-letters nothing,
    /// and publishes everything once the factory succeeds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_factory_is_an_outage() {
        let db = Postgres::database("byo_factory_outage");
        write::<Postgres>(&db, 5, 4, 0);
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let failures = Arc::new(AtomicUsize::new(0));
        let (f, n, url) = (failing.clone(), failures.clone(), db.url.clone());
        let store = PgRelayStore::from_connect(move || {
            let fail = f.load(Ordering::SeqCst);
            if fail {
                n.fetch_add(1, Ordering::SeqCst);
            }
            let url = url.clone();
            async move {
                if fail {
                    return Err("token service unavailable".into());
                }
                AsyncPgConnection::establish(&url)
                    .await
                    .map_err(outbox::BoxError::from)
            }
        });
        let broker = Arc::new(MemoryBroker::new());
        let relay = start(store, broker.clone());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(failures.load(Ordering::SeqCst) >= 2, "the relay retried");
        assert!(broker.all_records().is_empty());
        assert_eq!(Postgres::count(&db, DEAD), 0);
        failing.store(false, Ordering::SeqCst);
        assert!(
            drained::<Postgres>(&db, Duration::from_secs(10)).await,
            "drained"
        );
        relay.stop().await;
        assert_eq!(Postgres::count(&db, DEAD), 0, "nothing dead-lettered");
        assert_in_order(&broker, 5, 4);
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use crate::backends::Mysql;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::deadpool::Pool;
    use diesel_async::{AsyncConnection, AsyncMysqlConnection};
    use outbox::relay::MysqlRelayStore;

    /// A MySQL relay on a connection detached from the application's deadpool pool publishes
    /// every event in order, and the pool still hands out its full size.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn from_pool_relays_in_order() {
        let db = Mysql::database("byo_pool");
        write::<Mysql>(&db, 5, 4, 0);
        let manager = AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(&db.url);
        let pool = Pool::builder(manager).max_size(1).build().unwrap();
        let broker = Arc::new(MemoryBroker::new());
        let relay = start(MysqlRelayStore::from_pool(pool.clone()), broker.clone());
        assert!(
            drained::<Mysql>(&db, Duration::from_secs(10)).await,
            "drained"
        );
        let held = tokio::time::timeout(Duration::from_secs(2), pool.get())
            .await
            .expect("the pool is not exhausted by the relay")
            .unwrap();
        drop(held);
        relay.stop().await;
        assert_in_order(&broker, 5, 4);
    }

    /// A MySQL relay on a factory that fails its first calls: an outage, then every event
    /// published in order through the factory's connections.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn from_connect_relays_through_the_factory() {
        let db = Mysql::database("byo_factory");
        write::<Mysql>(&db, 5, 4, 0);
        let calls = Arc::new(AtomicUsize::new(0));
        let (counter, url) = (calls.clone(), db.url.clone());
        let store = MysqlRelayStore::from_connect(move || {
            let call = counter.fetch_add(1, Ordering::SeqCst);
            let url = url.clone();
            async move {
                if call < 2 {
                    return Err(outbox::BoxError::from("token service unavailable"));
                }
                Ok(AsyncMysqlConnection::establish(&url).await?)
            }
        });
        let broker = Arc::new(MemoryBroker::new());
        let relay = start(store, broker.clone());
        assert!(
            drained::<Mysql>(&db, Duration::from_secs(10)).await,
            "drained"
        );
        relay.stop().await;
        assert!(
            calls.load(Ordering::SeqCst) >= 3,
            "connected through the factory"
        );
        assert_eq!(Mysql::count(&db, DEAD), 0, "nothing dead-lettered");
        assert_in_order(&broker, 5, 4);
    }
}
