//! Scenario 3: a consumer's database goes away for 20 s (10 s in the short form). A
//! `KafkaConsumer` with the runtime's default settings runs an `#[idempotent]` handler on
//! PostgreSQL reached through a [`TcpProxy`] (a deadpool pool of `AsyncPgConnection`s, as an
//! application would have), while events keep arriving; the proxy cuts and refuses the
//! database's connections, then lets them through again. An outage is not the messages'
//! fault: nothing may be dead-lettered, each effect must be applied exactly once, and each
//! key's effects in order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::{Connection, RunQueryDsl};
use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use outbox::kafka::{KafkaConsumer, KafkaPublisher};
use outbox::relay::{Delivery, OutboxMessage, Publisher};
use outbox::{Envelope, idempotent};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

use super::proxy::{Mode, TcpProxy};
use super::tally::Tally;
use super::{Area, Row, size};
use crate::harness::noida;
use crate::support::{OrderEvent, TestDatabase, claimed};

const PARTITIONS: i32 = 3;
const KEYS: i64 = 30;

diesel::table! {
    chaos_effects (n) {
        n -> BigInt,
        event_id -> Text,
        order_id -> BigInt,
        amount -> BigInt,
    }
}

type PoolError = diesel_async::pooled_connection::deadpool::PoolError;

/// What the handler can fail with: the pool could not give a connection, or a statement
/// failed. A plain error type with its cause as `source()`, as an application would write:
/// the runtime sees the database's error through it.
#[derive(Debug)]
enum HandlerError {
    Pool(PoolError),
    Db(diesel::result::Error),
}

impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HandlerError::Pool(e) => Some(e),
            HandlerError::Db(e) => Some(e),
        }
    }
}

impl From<diesel::result::Error> for HandlerError {
    fn from(e: diesel::result::Error) -> Self {
        HandlerError::Db(e)
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandlerError::Pool(e) => write!(f, "no database connection: {e}"),
            HandlerError::Db(e) => write!(f, "database: {e}"),
        }
    }
}

#[idempotent(consumer = "chaos")]
async fn apply(
    conn: &mut AsyncPgConnection,
    event: Envelope<OrderEvent>,
) -> Result<(), HandlerError> {
    use diesel::ExpressionMethods;
    let (order_id, amount) = match event.payload {
        OrderEvent::Paid { order_id, amount } => (order_id, amount),
        OrderEvent::Cancelled { order_id, .. } => (order_id, -1),
    };
    diesel_async::RunQueryDsl::execute(
        diesel::insert_into(chaos_effects::table).values((
            chaos_effects::event_id.eq(event.id.to_string()),
            chaos_effects::order_id.eq(order_id),
            chaos_effects::amount.eq(amount),
        )),
        conn,
    )
    .await?;
    Ok(())
}

async fn create_topic(brokers: &str) -> String {
    let topic = format!("chaos-consumer-{}", uuid::Uuid::now_v7().simple());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let dlt = format!("{topic}.dlt");
    let new = [
        NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1)),
        NewTopic::new(&dlt, PARTITIONS, TopicReplication::Fixed(1)),
    ];
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&new, &options).await.unwrap() {
        result.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
    topic
}

/// The database URL with its host and port replaced by `address`.
fn through(url: &str, address: &str) -> (String, String) {
    let (scheme_user, rest) = url.split_once('@').expect("user@host in the URL");
    let (host_port, db) = rest.split_once('/').expect("a database in the URL");
    (
        format!("{scheme_user}@{address}/{db}"),
        host_port.to_owned(),
    )
}

#[derive(diesel::QueryableByName)]
struct Effect {
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_id: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    order_id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    amount: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_consumer_database_outage() {
    let started = Instant::now();
    let mut row = Row::new(
        "consumer_database_outage",
        "Consumer database outage",
        Area::Consumer,
    );
    let outage = Duration::from_secs(size(10, 20));
    let before = Duration::from_secs(size(3, 5));
    let db = TestDatabase::postgres("chaos_consumer");
    {
        let mut c = diesel::PgConnection::establish(&db.url).unwrap();
        diesel::sql_query(
            "CREATE TABLE chaos_effects (n BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL, \
             order_id BIGINT NOT NULL, amount BIGINT NOT NULL)",
        )
        .execute(&mut c)
        .unwrap();
    }
    let (_, upstream) = through(&db.url, "x");
    let proxy = TcpProxy::start(0, &upstream);
    let (handler_url, _) = through(&db.url, &proxy.address());
    let brokers = noida();
    let topic = create_topic(&brokers).await;

    // The producer: 100 events/s over KEYS keys, each key's `amount` counting up.
    let published: Arc<std::sync::Mutex<Vec<(String, i64, i64)>>> = Arc::default();
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let (published, producing, topic, brokers) = (
            published.clone(),
            producing.clone(),
            topic.clone(),
            brokers.clone(),
        );
        tokio::spawn(async move {
            let t = topic.clone();
            let publisher = KafkaPublisher::builder()
                .brokers(brokers)
                .topic_for(move |_| t.clone())
                .build()
                .unwrap();
            let mut seq = vec![0i64; KEYS as usize];
            let mut i = 0i64;
            while producing.load(Ordering::SeqCst) {
                let batch: Vec<(OutboxMessage, i64, i64)> = (0..10)
                    .map(|_| {
                        i += 1;
                        let k = (i * 7) % KEYS;
                        seq[k as usize] += 1;
                        let e = OrderEvent::Paid {
                            order_id: k,
                            amount: seq[k as usize],
                        };
                        (claimed(&e), k, seq[k as usize])
                    })
                    .collect();
                let msgs: Vec<OutboxMessage> = batch.iter().map(|b| b.0.clone()).collect();
                let outcomes = publisher.publish(&msgs).await;
                assert!(
                    outcomes.iter().all(|o| *o == Delivery::Published),
                    "{outcomes:?}"
                );
                published
                    .lock()
                    .unwrap()
                    .extend(batch.iter().map(|(m, k, a)| (m.id.to_string(), *k, *a)));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let pool: Pool<AsyncPgConnection> = Pool::builder(AsyncDieselConnectionManager::<
        AsyncPgConnection,
    >::new(&handler_url))
    .build()
    .unwrap();
    let consumer = KafkaConsumer::builder()
        .brokers(&brokers)
        .group(format!("chaos-{}", uuid::Uuid::now_v7().simple()))
        .assign(&topic, 0..PARTITIONS)
        .handler(move |event: Envelope<OrderEvent>| {
            let pool = pool.clone();
            async move {
                let mut conn = pool.get().await.map_err(HandlerError::Pool)?;
                apply(&mut conn, event).await
            }
        })
        .build()
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));

    tokio::time::sleep(before).await;
    proxy.set(Mode::Refuse);
    let done_at_cut = stats.get(&stats.done);
    tokio::time::sleep(outage).await;
    let dead_during = stats.get(&stats.dead_lettered);
    let errors_during = stats.get(&stats.handler_errors);
    proxy.set(Mode::Forward);
    let restored = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    producing.store(false, Ordering::SeqCst);
    producer.await.unwrap();
    let total = published.lock().unwrap().len() as u64;
    let caught_up = loop {
        if stats.get(&stats.done) >= total {
            break Some(restored.elapsed());
        }
        if restored.elapsed() > Duration::from_secs(120) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop.send(()).unwrap();
    task.await.unwrap();

    let effects: Vec<Effect> = {
        let mut c = diesel::PgConnection::establish(&db.url).unwrap();
        diesel::sql_query("SELECT event_id, order_id, amount FROM chaos_effects ORDER BY n")
            .load(&mut c)
            .unwrap()
    };
    let published = published.lock().unwrap().clone();
    let dead_ids: HashSet<String> = super::reader::read_count(
        &brokers,
        &format!("{topic}.dlt"),
        stats.get(&stats.dead_lettered) as usize,
        Duration::from_secs(30),
    )
    .into_iter()
    .map(|r| r.id)
    .collect();
    let sent: HashMap<&str, (i64, i64)> = published
        .iter()
        .map(|(id, k, a)| (id.as_str(), (*k, *a)))
        .collect();
    let mut applied: HashMap<&str, u64> = HashMap::new();
    let mut t = Tally {
        written: total,
        ..Tally::default()
    };
    let mut last: HashMap<i64, i64> = HashMap::new();
    for e in &effects {
        if !sent.contains_key(e.event_id.as_str()) {
            t.phantom += 1;
            continue;
        }
        let n = applied.entry(e.event_id.as_str()).or_default();
        *n += 1;
        if *n > 1 {
            t.duplicated += 1;
            continue;
        }
        let prev = last.entry(e.order_id).or_insert(i64::MIN);
        if e.amount < *prev {
            t.out_of_order += 1;
        } else {
            *prev = e.amount;
        }
    }
    t.delivered = applied.len() as u64;
    t.dead_lettered = stats.get(&stats.dead_lettered);
    t.dead_but_delivered = dead_ids
        .iter()
        .filter(|id| applied.contains_key(id.as_str()))
        .count() as u64;
    t.lost = sent
        .keys()
        .filter(|id| !applied.contains_key(*id) && !dead_ids.contains(**id))
        .count() as u64;
    // Applied although an earlier event of its key was dead-lettered: per-key order broken
    // for whoever replays the dead letter.
    let first_dead: HashMap<i64, i64> = dead_ids
        .iter()
        .filter_map(|id| sent.get(id.as_str()))
        .fold(HashMap::new(), |mut m, (k, a)| {
            let e = m.entry(*k).or_insert(i64::MAX);
            *e = (*e).min(*a);
            m
        });
    let passed_dead = effects
        .iter()
        .filter(|e| first_dead.get(&e.order_id).is_some_and(|&d| e.amount > d))
        .count();
    row.tally = t.clone();
    row.recover_s = caught_up.map(|d| d.as_secs_f64());
    row.recover_means = "from the database's return to every message handled".into();
    let fmt =
        |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    row.figure("consumer", "KafkaConsumer defaults (max attempts, backoff), assigned 3 partitions; `#[idempotent]` handler on a deadpool of AsyncPgConnection");
    row.figure(
        "outage",
        format!(
            "{} s: the database's connections cut and refused",
            outage.as_secs()
        ),
    );
    row.figure("messages", format!("{total} over {KEYS} keys, 100/s"));
    row.figure("handled when the database went away", done_at_cut);
    row.figure("handler errors during the outage", errors_during);
    row.figure("dead-lettered during the outage", dead_during);
    row.figure(
        "applied past a dead-lettered earlier message of their key",
        passed_dead,
    );
    row.figure("caught up after the database's return", fmt(caught_up));
    row.target_intact();
    row.target("0 dead-lettered", t.dead_lettered, t.dead_lettered == 0);
    row.target(
        "every effect applied exactly once",
        format!(
            "{} of {} applied, {} twice",
            t.delivered, t.written, t.duplicated
        ),
        t.delivered == t.written && t.duplicated == 0,
    );
    row.target(
        "per-key order kept (nothing applied past a dead letter)",
        passed_dead,
        passed_dead == 0,
    );
    row.finish(started);
}
