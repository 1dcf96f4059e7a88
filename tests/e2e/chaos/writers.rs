//! Writer threads committing events through `transaction_with_outbox`, as an application
//! would, while a scenario breaks things; some transactions are rolled back on purpose.
//!
//! Each writer owns its aggregates (order ids), so an aggregate's order is its writer's commit
//! order, and every event carries its aggregate's sequence number in `amount`: the reader can
//! check order from the payload alone. Every tenth transaction is rolled back, alternately
//! (a) by the closure of `transaction_with_outbox` returning an error (nothing is inserted),
//! and (b) after `outbox::publish` inserted the rows and 20 ms passed (the rows existed,
//! uncommitted, while relays polled): a relay that published either would show a phantom.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::{Connection, PgConnection};
use outbox::prelude::*;

use crate::support::{AppError, OrderEvent};

#[derive(Debug, Clone)]
pub struct WriterSpec {
    pub threads: usize,
    /// Connections in the writers' pool (as many as threads unless a scenario starves them).
    pub pool_size: u32,
    /// Aggregates per thread.
    pub aggregates: i64,
    /// Events to commit in all (rolled-back ones not counted).
    pub events: u64,
    /// Target commit rate over all threads, events per second.
    pub rate: f64,
    /// Time each transaction spends inside, as business work would (0: none).
    pub hold: Duration,
}

/// What the writers did.
#[derive(Debug, Default)]
pub struct WriterLog {
    /// `(order_id, amount)` → when `COMMIT` returned.
    pub committed: HashMap<(i64, i64), DateTime<Utc>>,
    /// Events of transactions rolled back on purpose, never inserted / inserted then rolled back.
    pub rolled_back_never_inserted: u64,
    pub rolled_back_after_insert: u64,
    /// Transactions that failed for the scenario's fault (connection lost, server restarting).
    pub failed: u64,
    /// Events whose `COMMIT` failed with the connection: committed or not, the table says.
    pub ambiguous: Vec<(i64, i64)>,
    /// Time to get a connection from the pool, per transaction.
    pub pool_waits: Vec<Duration>,
    pub pool_timeouts: u64,
    pub first_commit: Option<Instant>,
    pub last_commit: Option<Instant>,
    pub elapsed: Duration,
}

pub struct Writers {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<WriterLog>>,
    started: Instant,
}

/// The order id base: aggregates of writer thread `t` are `t * 1_000_000 + 0..aggregates`,
/// `t` numbering every writer thread of the process, so that two sets of writers on one
/// database never share an aggregate (each aggregate's sequence has one writer).
const PER_THREAD: i64 = 1_000_000;
static NEXT_THREAD: AtomicU64 = AtomicU64::new(0);

impl Writers {
    /// Starts the writers on `url` (PostgreSQL).
    pub fn start(url: &str, spec: &WriterSpec) -> Writers {
        let pool = Pool::builder()
            .max_size(spec.pool_size)
            .build_unchecked(ConnectionManager::<PgConnection>::new(url));
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let handles = (0..spec.threads)
            .map(|_| {
                let t = NEXT_THREAD.fetch_add(1, Ordering::SeqCst) as usize;
                let (pool, stop, committed, spec) =
                    (pool.clone(), stop.clone(), committed.clone(), spec.clone());
                std::thread::spawn(move || write(t, &pool, &stop, &committed, &spec))
            })
            .collect();
        Writers {
            stop,
            handles,
            started,
        }
    }

    /// Stops the writers (if they have not finished) and merges their logs.
    pub fn stop(self) -> WriterLog {
        self.stop.store(true, Ordering::SeqCst);
        self.join()
    }

    /// Waits for the writers to commit their events.
    pub fn join(self) -> WriterLog {
        let mut all = WriterLog::default();
        for h in self.handles {
            let log = h.join().expect("a writer panicked");
            all.committed.extend(log.committed);
            all.rolled_back_never_inserted += log.rolled_back_never_inserted;
            all.rolled_back_after_insert += log.rolled_back_after_insert;
            all.failed += log.failed;
            all.ambiguous.extend(log.ambiguous);
            all.pool_waits.extend(log.pool_waits);
            all.pool_timeouts += log.pool_timeouts;
            all.first_commit = match (all.first_commit, log.first_commit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            all.last_commit = all.last_commit.max(log.last_commit);
        }
        all.elapsed = self.started.elapsed();
        all
    }

    pub fn is_finished(&self) -> bool {
        self.handles.iter().all(|h| h.is_finished())
    }
}

fn write(
    t: usize,
    pool: &Pool<ConnectionManager<PgConnection>>,
    stop: &AtomicBool,
    committed: &AtomicU64,
    spec: &WriterSpec,
) -> WriterLog {
    let mut log = WriterLog::default();
    let mut next_seq: Vec<i64> = vec![0; spec.aggregates as usize];
    let per_thread_rate = spec.rate / spec.threads as f64;
    let t = t as i64;
    let started = Instant::now();
    let mut written_here = 0u64;
    let mut tx_n = 0u64;
    while !stop.load(Ordering::SeqCst) && committed.load(Ordering::SeqCst) < spec.events {
        // Pace: this thread's share of the rate.
        let due = started + Duration::from_secs_f64(written_here as f64 / per_thread_rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        tx_n += 1;
        let size = 1 + (tx_n % 3) as i64;
        let events: Vec<OrderEvent> = (0..size)
            .map(|i| {
                let a = ((tx_n as i64 * 7 + i) % spec.aggregates) as usize;
                next_seq[a] += 1;
                OrderEvent::Paid {
                    order_id: t * PER_THREAD + a as i64,
                    amount: next_seq[a],
                }
            })
            .collect();
        let keys: Vec<(i64, i64)> = events
            .iter()
            .map(|e| match e {
                OrderEvent::Paid { order_id, amount } => (*order_id, *amount),
                OrderEvent::Cancelled { .. } => unreachable!(),
            })
            .collect();
        let asked = Instant::now();
        let mut conn = match pool.get() {
            Ok(c) => c,
            Err(_) => {
                log.pool_timeouts += 1;
                log.failed += 1;
                continue;
            }
        };
        log.pool_waits.push(asked.elapsed());
        let hold = spec.hold;
        match tx_n % 20 {
            10 => {
                let r = conn.transaction_with_outbox(|tx| {
                    for e in &events {
                        tx.publish(e)?;
                    }
                    Err::<(), _>(AppError::Business("rolled back on purpose"))
                });
                match r {
                    Err(AppError::Business(_)) => log.rolled_back_never_inserted += size as u64,
                    _ => log.failed += 1,
                }
            }
            0 => {
                let r = conn.transaction(|c| {
                    for e in &events {
                        outbox::publish(c, e)?;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    Err::<(), _>(AppError::Business("rolled back on purpose"))
                });
                match r {
                    Err(AppError::Business(_)) => log.rolled_back_after_insert += size as u64,
                    _ => log.failed += 1,
                }
            }
            _ => {
                let r = conn.transaction_with_outbox(|tx| {
                    if !hold.is_zero() {
                        diesel::RunQueryDsl::execute(
                            diesel::sql_query(format!("SELECT pg_sleep({})", hold.as_secs_f64())),
                            tx.conn(),
                        )?;
                    }
                    for e in &events {
                        tx.publish(e)?;
                    }
                    Ok::<_, AppError>(())
                });
                match r {
                    Ok(()) => {
                        let now = Utc::now();
                        let at = Instant::now();
                        log.first_commit.get_or_insert(at);
                        log.last_commit = Some(at);
                        for k in keys {
                            log.committed.insert(k, now);
                        }
                        written_here += size as u64;
                        committed.fetch_add(size as u64, Ordering::SeqCst);
                    }
                    Err(_) => {
                        // Lost the connection or the server: whether COMMIT got through is
                        // for the table to say. The pool drops a broken connection.
                        log.failed += 1;
                        log.ambiguous.extend(keys);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
    }
    log
}
