//! Relay drains: ours in every mode beside the textbook relay and the SQL ceiling.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt};
use outbox::prelude::*;
use outbox::relay::{
    Claim, Completion, Delivery, Failure, MemoryBroker, Mode, OutboxMessage, PgRelayStore,
    Publisher, Relay, RelayConfig, RelayStore, ShardAssignment, StoreError,
};

use crate::common::*;

/// A publisher that acknowledges everything at once: the database side alone.
pub struct Null;

impl Publisher for Null {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        vec![Delivery::Published; batch.len()]
    }
}

/// Where the relays' wall time went, in nanoseconds summed over relays: claim, publish and
/// mark run one after another but for the store's work beside each publish (`overlap`:
/// stream mode's writes and reads while a batch is published), which runs at the same time
/// as the publish; the rest is waiting for work and coordination.
#[derive(Default)]
pub struct Timings {
    claim: AtomicU64,
    mark: AtomicU64,
    publish: AtomicU64,
    overlap: AtomicU64,
}

impl Timings {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// "claim / publish / mark / beside" as shares of `wall` seconds (relays × drain time).
    pub fn shares(&self, wall: f64) -> String {
        let pct = |c: &AtomicU64| 100.0 * c.load(Ordering::Relaxed) as f64 / 1e9 / wall;
        format!(
            "{:.0} / {:.0} / {:.0} / {:.0} %",
            pct(&self.claim),
            pct(&self.publish),
            pct(&self.mark),
            pct(&self.overlap)
        )
    }
}

/// A store that times its claims and marks: the benchmark's profile of the relay loop.
pub struct Timed<S> {
    inner: S,
    t: Arc<Timings>,
}

impl<S: RelayStore> RelayStore for Timed<S> {
    async fn claim(&mut self, claim: &Claim<'_>) -> Result<Vec<OutboxMessage>, StoreError> {
        let t0 = Instant::now();
        let r = self.inner.claim(claim).await;
        Timings::add(&self.t.claim, t0);
        r
    }
    async fn complete(
        &mut self,
        relay: &str,
        seqs: &[i64],
        completion: Completion,
    ) -> Result<u64, StoreError> {
        let t0 = Instant::now();
        let r = self.inner.complete(relay, seqs, completion).await;
        Timings::add(&self.t.mark, t0);
        r
    }
    fn fail(
        &mut self,
        relay: &str,
        failures: &[Failure],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.inner.fail(relay, failures)
    }
    fn release(
        &mut self,
        relay: &str,
        seqs: &[i64],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.inner.release(relay, seqs)
    }
    fn acquire_leadership(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.inner.acquire_leadership(relay, lease)
    }
    fn rebalance_shards(
        &mut self,
        relay: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<ShardAssignment, StoreError>> + Send {
        self.inner.rebalance_shards(relay, lease)
    }
    fn release_all(&mut self, relay: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.release_all(relay)
    }
    fn cleanup(
        &mut self,
        older_than: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.inner.cleanup(older_than, limit)
    }
    fn wait_for_work(&mut self, timeout: Duration) -> impl Future<Output = ()> + Send {
        self.inner.wait_for_work(timeout)
    }
    async fn overlap(&mut self, claim: &Claim<'_>) {
        let t0 = Instant::now();
        self.inner.overlap(claim).await;
        Timings::add(&self.t.overlap, t0);
    }
    fn settler(&mut self) -> Option<Self> {
        Some(Timed {
            inner: self.inner.settler()?,
            t: self.t.clone(),
        })
    }
}

/// A publisher that times its publishes.
pub struct TimedPublisher<P> {
    inner: P,
    t: Arc<Timings>,
}

impl<P: Publisher> Publisher for TimedPublisher<P> {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let t0 = Instant::now();
        let r = self.inner.publish(batch).await;
        Timings::add(&self.t.publish, t0);
        r
    }
}

/// Where a drain publishes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sink {
    /// [`Null`].
    Null,
    /// The in-memory broker.
    Memory,
    /// The Kafka-protocol broker.
    Kafka,
    /// NATS JetStream.
    Nats,
    /// RabbitMQ.
    RabbitMq,
}

impl Sink {
    /// The command names of this sink's broker processes, for their CPU.
    fn broker_processes(self) -> &'static [&'static str] {
        match self {
            Sink::Kafka => &["noida", "tansu"],
            Sink::Nats => &["nats-server"],
            Sink::RabbitMq => &["beam.smp"],
            Sink::Null | Sink::Memory => &[],
        }
    }

    /// The broker's name in the report.
    pub fn broker(self) -> &'static str {
        match self {
            Sink::Kafka => "Kafka",
            Sink::Nats => "NATS JetStream",
            Sink::RabbitMq => "RabbitMQ",
            Sink::Null | Sink::Memory => "",
        }
    }
}

/// One drain's figures.
pub struct Drain {
    /// Events per second.
    pub rate: f64,
    /// Events published, if the drain was stopped at the time cap before the end.
    pub capped: Option<u64>,
    /// CPU seconds of all `postgres` processes during the drain.
    pub pg_cpu: f64,
    /// CPU seconds of this process during the drain.
    pub bench_cpu: f64,
    /// CPU seconds of the sink's broker processes during the drain.
    pub broker_cpu: f64,
    /// (seconds since the start, events published so far), every 100 ms (ours only).
    pub series: Vec<(f64, u64)>,
    /// Where the relays' time went: "claim / publish / mark / beside publish" shares (ours only).
    pub profile: Option<String>,
}

/// Empties the outbox and the relay coordination tables.
pub fn clear_outbox(conn: &mut PgConnection) {
    exec(conn, "TRUNCATE outbox_events");
    exec(
        conn,
        "UPDATE outbox_shard_leases SET owner = NULL, lease_until = NULL",
    );
    exec(conn, "DELETE FROM outbox_relays");
    exec(conn, "DELETE FROM outbox_leader");
    // Stream mode's positions start over at the current snapshot: every row written after
    // this is in their first delta (where the schema has them: the wal section's *before*
    // does not).
    exec(
        conn,
        "DO $$ BEGIN IF to_regclass('outbox_stream_positions') IS NOT NULL THEN \
         UPDATE outbox_stream_positions SET last_snapshot = pg_current_snapshot(), \
         cur_snapshot = NULL, cur_seq = 0, version = version + 1; END IF; END $$",
    );
}

/// Empties the outbox and the relay coordination tables, then copies the template back in,
/// 1,000 rows a transaction as [`fill_template`] wrote them. (Stream mode reads by
/// transaction: one transaction of the whole backlog would be one delta that cannot be split,
/// the case `outbox-diesel/src/pg/relay/stream/` measures apart; the lease modes do not
/// care.)
pub fn reset_outbox(conn: &mut PgConnection) {
    clear_outbox(conn);
    let rows = count(conn, "SELECT count(*) AS c FROM bench_template");
    for from in (0..rows).step_by(1000) {
        exec(
            conn,
            &format!(
                "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, \
                 event_version, payload, headers, shard, created_at, available_at) \
                 SELECT gen_random_uuid(), aggregate_type, aggregate_id, event_type, \
                 event_version, payload, headers, shard, created_at, created_at \
                 FROM bench_template WHERE n > {from} AND n <= {} ORDER BY n",
                from + 1000
            ),
        );
    }
    exec(conn, "ANALYZE outbox_events");
}

/// The `c` column of the single row `sql` returns.
fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct C {
        #[diesel(sql_type = BigInt)]
        c: i64,
    }
    diesel::sql_query(sql).get_result::<C>(conn).expect(sql).c
}

/// Pending events.
pub fn pending(conn: &mut PgConnection) -> i64 {
    count(
        conn,
        "SELECT count(*) AS c FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL",
    )
}

/// Events stream mode has not published: beyond their shard's position (not visible in its
/// last snapshot, and not among the rows of the delta being consumed up to its cursor).
pub fn pending_stream(conn: &mut PgConnection) -> i64 {
    count(
        conn,
        "SELECT count(*) AS c FROM outbox_events o JOIN outbox_stream_positions p USING (shard) \
         WHERE NOT pg_visible_in_snapshot(o.xid, p.last_snapshot) \
           AND (p.cur_snapshot IS NULL OR o.seq > p.cur_seq \
                OR NOT pg_visible_in_snapshot(o.xid, p.cur_snapshot))",
    )
}

/// Fills the template of `n` events over 1,000 aggregates, through `transaction_with_outbox`
/// (1,000 events per transaction); returns the seconds the writes took.
pub fn fill_template(conn: &mut PgConnection, n: usize) -> f64 {
    exec(conn, "DROP TABLE IF EXISTS bench_template");
    exec(conn, "TRUNCATE outbox_events");
    let mut left = n;
    let mut i = 0i64;
    let start = Instant::now();
    while left > 0 {
        let k = left.min(1000);
        conn.transaction_with_outbox(|tx| {
            for _ in 0..k {
                i += 1;
                tx.publish(&OrderCreated {
                    order_id: i % 1000,
                    customer: i,
                    total_cents: 1250,
                })?;
            }
            Ok::<_, outbox::Error>(())
        })
        .expect("fill");
        left -= k;
    }
    let secs = start.elapsed().as_secs_f64();
    exec(
        conn,
        "CREATE TABLE bench_template AS SELECT row_number() OVER (ORDER BY seq) AS n, \
         aggregate_type, aggregate_id, event_type, event_version, payload, headers, shard, \
         created_at FROM outbox_events",
    );
    secs
}

#[allow(clippy::too_many_arguments)]
/// Drains the backlog with `relays` relays of ours; stops at `cap`. `broker` is the sink's
/// address (Kafka's bootstrap servers, the NATS server, the RabbitMQ URI).
pub async fn drain_ours(
    url: &str,
    mode: Mode,
    relays: usize,
    batch: usize,
    sink: Sink,
    broker: &str,
    n: i64,
    cap: Duration,
) -> Drain {
    let mut conn = PgConnection::establish(url).expect("connect");
    reset_outbox(&mut conn);
    if matches!(mode, Mode::Sharded | Mode::Stream) && relays > 1 {
        // Steady state: the relays start as if they had been running, each already holding
        // its fair share of the shards. (From a cold start the first relay takes all 256 and
        // gives up the surplus at its next renewal, a third of the lease later: 10 s by
        // default, longer than a whole drain here.)
        exec(
            &mut conn,
            &format!(
                "INSERT INTO outbox_relays (relay_id, heartbeat_until) \
                 SELECT 'bench-' || r, now() + interval '30 seconds' \
                 FROM generate_series(0, {}) r",
                relays - 1
            ),
        );
        exec(
            &mut conn,
            &format!(
                "UPDATE outbox_shard_leases SET owner = 'bench-' || (shard % {relays}), \
                 lease_until = now() + interval '30 seconds'"
            ),
        );
    }
    // Kafka publishers are built and warmed up before the clock starts: a producer's first
    // delivery waits for its connection, the topic's metadata and the idempotent producer's id
    // (measured: 0.5–1.0 s on noida-db, against 2–3 ms for a batch of 1,000 once started), a
    // cost paid once per relay process that a 20,000-event drain would otherwise report as
    // half of its time. The null publisher has no such cost.
    // The other brokers' publishers likewise (their first publish connects, and finds or
    // creates the stream or declares the exchange).
    let mut kafka_publishers = Vec::new();
    let mut nats_publishers = Vec::new();
    let mut rabbitmq_publishers = Vec::new();
    for _ in 0..relays {
        match sink {
            Sink::Kafka => kafka_publishers.push(warm_kafka_publisher(broker).await),
            Sink::Nats => nats_publishers.push(crate::brokers::warm_nats_publisher(broker).await),
            Sink::RabbitMq => {
                rabbitmq_publishers.push(crate::brokers::warm_rabbitmq_publisher(broker).await)
            }
            Sink::Null | Sink::Memory => {}
        }
    }
    let cpu0 = Cpu::now();
    let start = Instant::now();
    let mut handles = Vec::new();
    let mut all_stats = Vec::new();
    let stop = Arc::new(tokio::sync::Notify::new());
    let timings = Arc::new(Timings::default());
    for r in 0..relays {
        let store = Timed {
            inner: PgRelayStore::new(url),
            t: timings.clone(),
        };
        let config = RelayConfig {
            relay_id: format!("bench-{r}"),
            mode,
            batch_size: batch,
            poll_interval: Duration::from_millis(50),
            ..RelayConfig::default()
        };
        let stop = stop.clone();
        let shutdown = async move { stop.notified().await };
        macro_rules! spawn {
            ($p:expr) => {{
                let publisher = TimedPublisher {
                    inner: $p,
                    t: timings.clone(),
                };
                let relay = Relay::new(store, publisher, config).expect("config");
                all_stats.push(relay.stats());
                handles.push(tokio::spawn(relay.run(shutdown)));
            }};
        }
        match sink {
            Sink::Null => spawn!(Null),
            Sink::Memory => spawn!(Arc::new(MemoryBroker::new())),
            Sink::Kafka => spawn!(kafka_publishers.pop().expect("one publisher per relay")),
            Sink::Nats => spawn!(nats_publishers.pop().expect("one publisher per relay")),
            Sink::RabbitMq => spawn!(rabbitmq_publishers.pop().expect("one publisher per relay")),
        }
    }
    let timeout = start + cap;
    let mut published: u64;
    let mut series = vec![(0.0, 0)];
    loop {
        published = all_stats
            .iter()
            .map(|s| s.published.load(Ordering::Relaxed))
            .sum();
        let t = start.elapsed().as_secs_f64();
        if t >= series.last().map_or(0.0, |s| s.0) + 0.1 {
            series.push((t, published));
        }
        if published >= n as u64 || Instant::now() > timeout {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    series.push((start.elapsed().as_secs_f64(), published));
    let elapsed = start.elapsed().as_secs_f64();
    let cpu1 = Cpu::now();
    let (pg_cpu, bench_cpu) = cpu1.since(&cpu0);
    let broker_cpu = cpu1.broker_since(&cpu0, sink.broker_processes());
    stop.notify_waiters();
    for h in handles {
        let _ = h.await;
    }
    let left = if mode == Mode::Stream {
        pending_stream(&mut conn)
    } else {
        pending(&mut conn)
    };
    let capped = (published < n as u64).then_some(published);
    assert!(
        capped.is_some() || left == 0,
        "{mode:?} x{relays} b{batch} {sink:?}: {left} rows left"
    );
    Drain {
        rate: published.min(n as u64) as f64 / elapsed,
        capped,
        pg_cpu,
        bench_cpu,
        broker_cpu,
        series,
        profile: Some(timings.shares(elapsed * relays as f64)),
    }
}

/// A message of `warm-up` type to topic `order` (`bench.order` with the drains' prefix).
pub fn warm_up_message() -> OutboxMessage {
    OutboxMessage {
        seq: 0,
        id: uuid::Uuid::now_v7(),
        aggregate_type: "order".into(),
        aggregate_id: "warm-up".into(),
        event_type: "WarmUp".into(),
        event_version: 1,
        payload: "{}".into(),
        headers: Default::default(),
        topic: None,
        shard: 0,
        created_at: chrono::Utc::now(),
        attempts: 1,
    }
}

/// The Kafka publisher the drains use (topic `bench.order`), after one delivery to that topic
/// (a message of `warm-up` type that no drain counts).
pub async fn warm_kafka_publisher(kafka: &str) -> outbox::kafka::KafkaPublisher {
    let publisher = outbox::kafka::KafkaPublisher::builder()
        .brokers(kafka)
        .topic_prefix("bench.")
        .build()
        .expect("kafka");
    let warm = warm_up_message();
    let outcome = publisher.publish(std::slice::from_ref(&warm)).await;
    assert!(
        outcome.iter().all(|d| d.error().is_none()),
        "warm-up publish to {kafka} failed: {outcome:?}"
    );
    publisher
}

/// How long a new Kafka publisher's first delivery takes, as text (the median of 3).
async fn warm_up_time(kafka: &str) -> String {
    let mut times = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        drop(warm_kafka_publisher(kafka).await);
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    format!("median {:.0} ms of 3 new producers", median(times))
}

/// The rate of a warmed-up publisher alone, as text: 20,000 events of 1,000 aggregates in
/// batches of 1,000 with 4 batches in flight, the median of 3 runs.
async fn publisher_alone<P: Publisher>(publisher: P) -> String {
    let publisher = Arc::new(publisher);
    let mut rates = Vec::new();
    for _ in 0..3 {
        let batches: Vec<Vec<OutboxMessage>> = (0..20)
            .map(|b| {
                (0..1000)
                    .map(|i| {
                        let n = b * 1000 + i;
                        OutboxMessage {
                            seq: n as i64,
                            aggregate_id: (n % 1000).to_string(),
                            event_type: "OrderCreated".into(),
                            payload: format!(
                                r#"{{"order_id":{n},"customer":"c-{n}","total_cents":1999}}"#
                            ),
                            ..warm_up_message()
                        }
                    })
                    .collect()
            })
            .collect();
        let queue = Arc::new(std::sync::Mutex::new(batches));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (publisher, queue) = (publisher.clone(), queue.clone());
            tasks.push(tokio::spawn(async move {
                let mut ok = 0;
                loop {
                    let next = queue.lock().expect("queue").pop();
                    let Some(batch) = next else { break };
                    let outcome = publisher.publish(&batch).await;
                    ok += outcome.iter().filter(|d| d.error().is_none()).count();
                }
                ok
            }));
        }
        let mut ok = 0;
        for t in tasks {
            ok += t.await.expect("publish task");
        }
        assert_eq!(ok, 20_000, "the publisher alone lost deliveries");
        rates.push(ok as f64 / t0.elapsed().as_secs_f64());
    }
    format!("{} events/s (median of 3)", fmt_n(median(rates)))
}

/// Drains the backlog with `relays` threads, each with its own connection running `drain`
/// (given the thread's number) until the outbox is empty; the figures of a baseline.
fn drain_baseline(
    url: &str,
    relays: usize,
    n: i64,
    drain: impl Fn(usize, &mut PgConnection) + Sync,
) -> Drain {
    let mut conn = PgConnection::establish(url).expect("connect");
    reset_outbox(&mut conn);
    let cpu0 = Cpu::now();
    let start = Instant::now();
    // Each thread hands its connection back, so that its server process is still there (and
    // counted) when the drain's CPU is read.
    let conns = std::thread::scope(|s| {
        let threads: Vec<_> = (0..relays)
            .map(|r| {
                let drain = &drain;
                s.spawn(move || {
                    let mut c = PgConnection::establish(url).expect("connect");
                    drain(r, &mut c);
                    c
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("relay"))
            .collect::<Vec<_>>()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let (pg_cpu, bench_cpu) = Cpu::now().since(&cpu0);
    drop(conns);
    assert_eq!(pending(&mut conn), 0);
    Drain {
        rate: n as f64 / elapsed,
        capped: None,
        pg_cpu,
        bench_cpu,
        broker_cpu: 0.0,
        series: Vec::new(),
        profile: None,
    }
}

/// The textbook relay: one transaction per batch of 100 that selects `FOR UPDATE SKIP LOCKED`,
/// publishes each row inside it (to the null publisher) and UPDATEs each row one by one. Its
/// select has the pending index's predicate, so that it is not slowed by an index it could not
/// use (with `published_at IS NULL` alone it walked the primary key past every published row).
pub fn drain_textbook(url: &str, relays: usize, n: i64) -> Drain {
    #[derive(QueryableByName)]
    #[allow(dead_code)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        seq: i64,
        #[diesel(sql_type = diesel::sql_types::Text)]
        aggregate_id: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        payload: String,
    }
    drain_baseline(url, relays, n, |_, c| {
        loop {
            let got = c
                .transaction(|c| {
                    let rows: Vec<Row> = diesel::sql_query(
                        "SELECT seq, aggregate_id, payload::text AS payload FROM outbox_events \
                     WHERE published_at IS NULL AND dead_at IS NULL \
                     ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED",
                    )
                    .load(c)?;
                    for r in &rows {
                        std::hint::black_box(&r.payload); // "publish"
                        diesel::sql_query(
                            "UPDATE outbox_events SET published_at = now() WHERE seq = $1",
                        )
                        .bind::<BigInt, _>(r.seq)
                        .execute(c)?;
                    }
                    QueryResult::Ok(rows.len())
                })
                .expect("textbook");
            if got == 0 {
                break;
            }
        }
    })
}

/// The SQL ceiling: a set-based claim (lease UPDATE over SKIP LOCKED) and a set-based mark,
/// two autocommit statements per batch, no publishing.
pub fn drain_ceiling(url: &str, relays: usize, batch: usize, n: i64) -> Drain {
    #[derive(QueryableByName)]
    struct Seq {
        #[diesel(sql_type = BigInt)]
        seq: i64,
    }
    drain_baseline(url, relays, n, |r, c| {
        // The claimed rows are updated by primary key through `seq = ANY(ARRAY(...))`; joined
        // as `FROM (...) c WHERE o.seq = c.seq`, PostgreSQL hash-joined them with a sequential
        // scan of the whole table per claim.
        let claim = format!(
            "UPDATE outbox_events o SET locked_by = 'ceiling-{r}', \
             locked_until = now() + interval '30 seconds', attempts = o.attempts + 1 \
             WHERE o.seq = ANY(ARRAY(SELECT seq FROM outbox_events \
             WHERE published_at IS NULL AND dead_at IS NULL \
             AND (locked_until IS NULL OR locked_until < now()) \
             ORDER BY seq LIMIT {batch} FOR UPDATE SKIP LOCKED)) RETURNING o.seq"
        );
        // The relay's own durability (`ASYNC_COMMIT_SQL`: its writes do not wait for their WAL
        // flush), so that the ceiling is the same work under the same settings.
        diesel::sql_query("SET synchronous_commit = off")
            .execute(c)
            .expect("session");
        loop {
            let seqs: Vec<Seq> = diesel::sql_query(&claim).load(c).expect("claim");
            if seqs.is_empty() {
                break;
            }
            let ids: Vec<i64> = seqs.iter().map(|s| s.seq).collect();
            diesel::sql_query(
                "UPDATE outbox_events SET published_at = now(), locked_by = NULL, \
                 locked_until = NULL WHERE seq = ANY($1) AND locked_by IS NOT NULL",
            )
            .bind::<Array<BigInt>, _>(ids)
            .execute(c)
            .expect("mark");
        }
    })
}

/// One drain to run: what, with how many relays, which batch, where to.
#[derive(Clone, Copy, PartialEq)]
enum Job {
    Textbook {
        relays: usize,
    },
    Ceiling {
        relays: usize,
        batch: usize,
    },
    Ours {
        mode: Mode,
        relays: usize,
        batch: usize,
        sink: Sink,
    },
}

impl Job {
    /// What the job is, for the progress lines.
    fn label(self) -> String {
        match self {
            Job::Textbook { relays } => format!("textbook x{relays}"),
            Job::Ceiling { relays, batch } => format!("ceiling x{relays} b{batch}"),
            Job::Ours {
                mode,
                relays,
                batch,
                sink,
            } => format!("{mode:?} x{relays} b{batch} {sink:?}"),
        }
    }

    fn run(self, ctx: &Ctx, backlog: i64, cap: Duration) -> Drain {
        match self {
            Job::Textbook { relays } => drain_textbook(&ctx.url, relays, backlog),
            Job::Ceiling { relays, batch } => drain_ceiling(&ctx.url, relays, batch, backlog),
            Job::Ours {
                mode,
                relays,
                batch,
                sink,
            } => {
                let broker = match sink {
                    Sink::Kafka => {
                        ctx.fresh_broker();
                        &ctx.kafka
                    }
                    Sink::Nats => {
                        ctx.rt.block_on(crate::brokers::reset_nats(&ctx.nats));
                        &ctx.nats
                    }
                    Sink::RabbitMq => {
                        ctx.rt.block_on(crate::brokers::reset_rabbitmq(&ctx.amqp));
                        &ctx.amqp
                    }
                    Sink::Null | Sink::Memory => "",
                };
                ctx.rt.block_on(drain_ours(
                    &ctx.url, mode, relays, batch, sink, broker, backlog, cap,
                ))
            }
        }
    }
}

/// The median drain of several runs of one job (by rate), with the median rate.
fn median_drain(mut runs: Vec<Drain>) -> Drain {
    runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let rate = median(runs.iter().map(|d| d.rate).collect());
    let mut mid = runs.swap_remove(runs.len() / 2);
    mid.rate = rate;
    mid
}

/// The drain section of the report.
pub fn section(ctx: &Ctx, md: &mut String) {
    let quick = ctx.quick;
    // A drain that has not finished by the cap is stopped and reported as such, with the rate
    // over the events it published.
    let cap = Duration::from_secs(if quick { 10 } else { 120 });
    let backlog: i64 = if quick { 20_000 } else { 100_000 };
    let reps = 3;
    let mut conn = PgConnection::establish(&ctx.url).expect("connect");
    eprintln!("filling {backlog} events");
    fill_template(&mut conn, backlog as usize);
    let relay_counts: &[usize] = if quick { &[1, 2] } else { &[1, 2, 4] };
    let batches: &[usize] = if quick {
        &[100, 1000]
    } else {
        &[100, 500, 1000]
    };
    let modes = [Mode::Unordered, Mode::Sharded, Mode::Leader, Mode::Stream];
    // The plan: every configuration with the null publisher; in the full run also the
    // in-memory broker at the largest batch (its cost is per message, not per claim); Kafka in
    // its own table.
    let mut jobs = Vec::new();
    for &relays in relay_counts {
        jobs.push(Job::Textbook { relays });
        for &batch in batches {
            jobs.push(Job::Ceiling { relays, batch });
            for mode in modes {
                jobs.push(Job::Ours {
                    mode,
                    relays,
                    batch,
                    sink: Sink::Null,
                });
                if batch == 1000 && !quick {
                    jobs.push(Job::Ours {
                        mode,
                        relays,
                        batch,
                        sink: Sink::Memory,
                    });
                }
            }
        }
    }
    let brokers = [
        (Sink::Kafka, &ctx.kafka),
        (Sink::Nats, &ctx.nats),
        (Sink::RabbitMq, &ctx.amqp),
    ];
    for (sink, address) in brokers {
        if address.is_empty() {
            continue;
        }
        for mode in modes {
            for &relays in &[1, 2] {
                jobs.push(Job::Ours {
                    mode,
                    relays,
                    batch: 1000,
                    sink,
                });
            }
        }
    }
    // Repetitions interleaved (the whole plan, then again) so that every configuration
    // samples the machine's noise alike.
    let mut results: Vec<Vec<Drain>> = jobs.iter().map(|_| Vec::new()).collect();
    for rep in 0..reps {
        eprintln!("drains: repetition {} of {reps}", rep + 1);
        for (j, job) in jobs.iter().enumerate() {
            let t = std::time::Instant::now();
            results[j].push(job.run(ctx, backlog, cap));
            eprintln!("  {} {:.1} s", job.label(), t.elapsed().as_secs_f64());
        }
    }
    let drains: Vec<Drain> = results.into_iter().map(median_drain).collect();
    let ceiling = |relays: usize, batch: usize| {
        jobs.iter()
            .position(|j| *j == Job::Ceiling { relays, batch })
            .map(|i| drains[i].rate)
    };

    let _ = writeln!(
        md,
        "\n## Relay drain (PostgreSQL), {} pending events over 1,000 aggregates\n",
        fmt_n(backlog as f64)
    );
    let _ = writeln!(
        md,
        "events/s from the first claim until every event is marked published, the median of \
         {reps} runs (the whole plan runs {reps} times, interleaved); a drain still running after \
         {} s is stopped and its rate is over the events it published. CPU: seconds of CPU used \
         during the (median) drain by all `postgres` processes and by the bench process (relays, \
         publisher), from /proc. Relay time: the relays' wall time spent in claims / publishes / \
         marks (publishes overlap the claims and marks, up to `max_in_flight` batches at once, \
         and in every mode but stream the marks overlap the claims, made on a second \
         connection (an ordered claim treats the rows being marked as published: \
         `Claim::settling`), so the three can add up to over 100 %; the rest is waiting and \
         coordination). In leader \
         mode one relay works and the others stand by, so its drains are compared with the \
         one-worker ceiling whatever their number of relays. Stream mode (PostgreSQL's \
         snapshot positions, no row updated) has one batch in flight, reads at least 3,000 \
         rows a claim and hands the rest out to the next claims from memory \
         (`PgRelayStore::stream_read_ahead`), and its \"mark\" is the update of its shards' \
         positions, which it makes while the next batch is published, with the read that \
         follows the last batch of a read (*beside publish*: the store's `overlap`, running \
         at the same time as the publish); the backlog is written 1,000 events \
         a transaction in every mode (stream mode reads by transaction). The relays' sessions \
         commit their own writes without waiting for the WAL flush (`synchronous_commit = off`, \
         the store's default), and so does the SQL ceiling; the textbook relay keeps the \
         server's setting (on).\n",
        cap.as_secs()
    );
    let _ = writeln!(
        md,
        "| drain | mode | relays | batch | publisher | events/s | vs SQL ceiling (same working relays, batch) | postgres CPU s | bench CPU s | relay time: claim / publish / mark / beside publish |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    let null_rate = |mode: Mode, relays: usize, batch: usize| {
        jobs.iter()
            .position(|j| {
                *j == Job::Ours {
                    mode,
                    relays,
                    batch,
                    sink: Sink::Null,
                }
            })
            .map(|i| drains[i].rate)
    };
    let one_relay = |mode: Mode, sink: Sink| {
        jobs.iter()
            .position(|j| {
                *j == Job::Ours {
                    mode,
                    relays: 1,
                    batch: 1000,
                    sink,
                }
            })
            .map(|i| drains[i].rate)
    };
    let mut broker_rows: Vec<(Sink, String)> = Vec::new();
    for (job, d) in jobs.iter().zip(&drains) {
        let (what, mode, relays, batch, sink, vs) = match *job {
            Job::Textbook { relays } => (
                "textbook relay (baseline a)",
                "SKIP LOCKED".to_string(),
                relays,
                100,
                "null".to_string(),
                None,
            ),
            Job::Ceiling { relays, batch } => (
                "SQL ceiling (baseline b)",
                "set-based".to_string(),
                relays,
                batch,
                "none".to_string(),
                None,
            ),
            Job::Ours {
                mode,
                relays,
                batch,
                sink,
            } => (
                "outbox relay",
                format!("{mode:?}").to_lowercase(),
                relays,
                batch,
                format!("{sink:?}").to_lowercase(),
                // A leader-mode relay works alone whatever the number of relays (the others
                // are standbys): its ceiling is one worker's.
                ceiling(if mode == Mode::Leader { 1 } else { relays }, batch),
            ),
        };
        let rate = format!(
            "{}{}",
            fmt_n(d.rate),
            d.capped.map_or(String::new(), |p| format!(
                " (stopped at the cap: {} published)",
                fmt_n(p as f64)
            ))
        );
        let vs = vs.map_or("–".into(), |c| format!("{:.0} %", 100.0 * d.rate / c));
        let cpu = format!("{:.1} | {:.1}", d.pg_cpu, d.bench_cpu);
        let profile = d.profile.as_deref().unwrap_or("–");
        let to_broker = match *job {
            Job::Ours {
                mode: m, sink: s, ..
            } if !s.broker().is_empty() => Some((m, s)),
            _ => None,
        };
        let line = if let Some((m, s)) = to_broker {
            let ratio =
                |of: Option<f64>| of.map_or("–".into(), |r| format!("{:.2}×", d.rate / r));
            let vs_one = if relays > 1 {
                ratio(one_relay(m, s))
            } else {
                "–".into()
            };
            format!(
                "| {mode} | {relays} | {batch} | {rate} | {} | {vs_one} | {vs} | {cpu} | {:.2} | {profile} |",
                ratio(null_rate(m, relays, batch)),
                d.broker_cpu
            )
        } else {
            format!(
                "| {what} | {mode} | {relays} | {batch} | {sink} | {rate} | {vs} | {cpu} | {profile} |"
            )
        };
        println!("{line}");
        match to_broker {
            Some((_, s)) => broker_rows.push((s, line)),
            None => {
                let _ = writeln!(md, "{line}");
            }
        }
    }
    stream_against_sharded(md, &jobs, &drains);
    let kafka_rows: Vec<&String> = broker_rows
        .iter()
        .filter(|(s, _)| *s == Sink::Kafka)
        .map(|(_, line)| line)
        .collect();
    if !kafka_rows.is_empty() {
        let _ = writeln!(
            md,
            "\n### To the Kafka-protocol broker ({}), batch 1000\n",
            ctx.kafka
        );
        let _ = writeln!(
            md,
            "The same drains with `outbox::kafka::KafkaPublisher` (`acks=all`, idempotent, \
             `linger.ms` 1), each relay with its own producer, built and warmed up by one delivery \
             before the clock starts (a producer's first delivery waits for its connection, the \
             topic's metadata and its producer id: {warm}, paid once per relay process). \
             *vs null*: against the null-publisher drain of the same mode, relays and batch in \
             this run; *vs 1 relay*: against the same mode's one-relay drain to Kafka. The \
             publisher alone, with no database (20,000 events in batches of 1,000, 4 batches in \
             flight, one warmed producer): {alone}.\n",
            warm = {
                ctx.fresh_broker();
                ctx.rt.block_on(warm_up_time(&ctx.kafka))
            },
            alone = {
                ctx.fresh_broker();
                ctx.rt.block_on(async {
                    publisher_alone(warm_kafka_publisher(&ctx.kafka).await).await
                })
            },
        );
        let _ = writeln!(
            md,
            "| mode | relays | batch | events/s | vs null | vs 1 relay | vs SQL ceiling (same working relays, batch) | postgres CPU s | bench CPU s | broker CPU s | relay time: claim / publish / mark / beside publish |\n|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for line in kafka_rows {
            let _ = writeln!(md, "{line}");
        }
    }
    for (sink, address, how) in [
        (
            Sink::Nats,
            &ctx.nats,
            "`outbox::nats::NatsPublisher` (each message acknowledged by the stream, \
             `Nats-Msg-Id` set, an aggregate's next message sent once the previous one was \
             acknowledged); the stream `bench_order` (file storage) is created by the first \
             publish and purged before each drain",
        ),
        (
            Sink::RabbitMq,
            &ctx.amqp,
            "`outbox::rabbitmq::RabbitMqPublisher` (publisher confirms, persistent, \
             `mandatory`, an aggregate's next message sent once the previous one was \
             confirmed) to the topic exchange `bench.order`, bound to a durable queue of the \
             bench's own, purged before each drain",
        ),
    ] {
        let rows: Vec<&String> = broker_rows
            .iter()
            .filter(|(s, _)| *s == sink)
            .map(|(_, line)| line)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "\n### To {} ({}), batch 1000\n",
            sink.broker(),
            crate::brokers::shown(address)
        );
        let _ = writeln!(
            md,
            "The same drains with {how}, each relay with its own publisher, built and warmed \
             up by one publish before the clock starts. *vs null*: against the null-publisher \
             drain of the same mode, relays and batch in this run; *vs 1 relay*: against the \
             same mode's one-relay drain to this broker. Broker CPU: the broker's processes \
             (`{}`). The publisher alone, with no database (20,000 events of 1,000 aggregates in \
             batches of 1,000, 4 batches in flight, one warmed publisher): {alone}.\n",
            sink.broker_processes().join("`, `"),
            alone = ctx.rt.block_on(async {
                if sink == Sink::Nats {
                    crate::brokers::reset_nats(address).await;
                    publisher_alone(crate::brokers::warm_nats_publisher(address).await).await
                } else {
                    crate::brokers::reset_rabbitmq(address).await;
                    publisher_alone(crate::brokers::warm_rabbitmq_publisher(address).await).await
                }
            }),
        );
        let _ = writeln!(
            md,
            "| mode | relays | batch | events/s | vs null | vs 1 relay | vs SQL ceiling (same working relays, batch) | postgres CPU s | bench CPU s | broker CPU s | relay time: claim / publish / mark / beside publish |\n|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for line in rows {
            let _ = writeln!(md, "{line}");
        }
    }
    ctx.rt
        .block_on(crate::brokers::forget(&ctx.nats, &ctx.amqp));
}

/// The stream drains next to the sharded ones of the same relays, batch and publisher.
fn stream_against_sharded(md: &mut String, jobs: &[Job], drains: &[Drain]) {
    let rate_of = |job: Job| jobs.iter().position(|j| *j == job).map(|i| &drains[i]);
    let mut rows = Vec::new();
    for job in jobs {
        let Job::Ours {
            mode: Mode::Stream,
            relays,
            batch,
            sink,
        } = *job
        else {
            continue;
        };
        let (Some(stream), Some(sharded)) = (
            rate_of(*job),
            rate_of(Job::Ours {
                mode: Mode::Sharded,
                relays,
                batch,
                sink,
            }),
        ) else {
            continue;
        };
        rows.push(format!(
            "| {relays} | {batch} | {} | {} | {} | {:.2}× | {:.1} / {:.1} |",
            format!("{sink:?}").to_lowercase(),
            fmt_n(stream.rate),
            fmt_n(sharded.rate),
            stream.rate / sharded.rate,
            stream.pg_cpu,
            sharded.pg_cpu,
        ));
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n### Stream mode against sharded\n\nThe stream drains of the tables above and below \
         next to the sharded ones of the same relays, batch and publisher (both ordered per \
         aggregate; stream mode reads the rows committed between two snapshots and updates \
         only its shards' positions, sharded claims and marks every row).\n\n\
         | relays | batch | publisher | stream events/s | sharded events/s | stream / sharded | \
         postgres CPU s: stream / sharded |\n|---|---|---|---|---|---|---|"
    );
    for row in rows {
        let _ = writeln!(md, "{row}");
    }
}
