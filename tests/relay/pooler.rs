//! Relays and writers through a real PgBouncer (Debian's, 1.18: no prepared-statement
//! tracking) in transaction mode, with fewer server connections than clients, so that
//! every client's transactions land on server connections other clients used before.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::prelude::*;
use outbox::relay::{Backoff, MemoryBroker, Mode, PgRelayStore, Relay, RelayConfig};

use crate::backends::{Backend, Contract, Postgres};
use crate::pgbouncer::{PgBouncer, pool_settings, server_settings, writer};
use crate::support::{AppError, OrderEvent};

fn config(mode: Mode) -> RelayConfig {
    RelayConfig {
        mode,
        batch_size: 100,
        poll_interval: Duration::from_millis(20),
        lease: Duration::from_secs(6),
        publish_timeout: Duration::from_secs(2),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: 0.0,
        },
        // No server session is a relay's behind the pooler: the lease is the rule.
        session_check: None,
        ..RelayConfig::default()
    }
}

/// Each order's events were published once each, in the order written.
fn assert_in_order(broker: &MemoryBroker, aggregates: usize, per: usize) {
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for r in broker.all_records() {
        let p: serde_json::Value = serde_json::from_str(&r.payload).unwrap();
        seen.entry(r.key.clone())
            .or_default()
            .push(p["amount"].as_i64().unwrap());
    }
    assert_eq!(seen.len(), aggregates, "every order published");
    for (key, amounts) in seen {
        assert_eq!(
            amounts,
            (0..per as i64).collect::<Vec<_>>(),
            "order {key}: each event once, in order"
        );
    }
}

/// Two relays in `mode` and two writers, all through PgBouncer, while the writers write:
/// every event published once, in order per order; no dead letter; and every server
/// connection of the pool still has the server's settings afterwards.
async fn through_pgbouncer(mode: Mode, aggregates: usize, per: usize) {
    let db = Postgres::database("pgbouncer");
    let bouncer = PgBouncer::start();
    let url = bouncer.url(&db);
    let server = server_settings(&db);
    let broker = Arc::new(MemoryBroker::new());
    let mut relays = Vec::new();
    let mut stats = Vec::new();
    for _ in 0..2 {
        let store = PgRelayStore::new(&url).transaction_pooler(true);
        let relay = Relay::new(store, broker.clone(), config(mode)).unwrap();
        stats.push(relay.stats());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            relay
                .run(async move {
                    let _ = rx.await;
                })
                .await;
        });
        relays.push((stop, handle));
    }
    let started = Instant::now();
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let url = url.clone();
            // Each writer its own orders: order ids `w * aggregates/2 ..`.
            std::thread::spawn(move || {
                let mut conn = writer(&url);
                for i in 0..per {
                    conn.transaction_with_outbox(|tx| {
                        for a in 0..aggregates / 2 {
                            tx.publish(&OrderEvent::Paid {
                                order_id: (w * aggregates / 2 + a) as i64,
                                amount: i as i64,
                            })?;
                        }
                        Ok::<_, AppError>(())
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let total = (aggregates * per) as i64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while (broker.all_records().len() as i64) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    for (stop, handle) in relays {
        let _ = stop.send(());
        handle.await.unwrap();
    }
    eprintln!(
        "{mode:?} through PgBouncer: {} of {total} events published in {elapsed:.2?}",
        broker.all_records().len()
    );
    assert_in_order(&broker, aggregates, per);
    let errors: u64 = stats
        .iter()
        .map(|s| s.store_errors.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    assert_eq!(
        errors, 0,
        "no statement of the relays failed behind PgBouncer"
    );
    assert_eq!(
        Postgres::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE dead_at IS NOT NULL"
        ),
        0,
        "no dead letter"
    );
    for seen in pool_settings(&url) {
        assert_eq!(
            seen, server,
            "a writer through PgBouncer sees the server's settings, not the relay's"
        );
    }
    drop(bouncer);
}

/// Sharded relays: 10,000 events of 20 orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_relays_and_writers_through_pgbouncer() {
    through_pgbouncer(Mode::Sharded, 20, 500).await;
}

/// A leader and its standby: 2,000 events of 10 orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_relays_and_writers_through_pgbouncer() {
    through_pgbouncer(Mode::Leader, 10, 200).await;
}

/// Stream mode: 2,000 events of 10 orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_relays_and_writers_through_pgbouncer() {
    through_pgbouncer(Mode::Stream, 10, 200).await;
}

/// Writers on diesel-async through PgBouncer, as `docs/production.md` says to set them up
/// (opened by `connect::postgres_pooled`, statement cache off, statements inside
/// transactions), beside a relay behind the same pooler: every event written and published
/// once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_writers_through_pgbouncer() {
    use diesel_async::AsyncConnection;
    let db = Postgres::database("pgbouncer_async");
    let bouncer = PgBouncer::start();
    let url = bouncer.url(&db);
    let server = server_settings(&db);
    let broker = Arc::new(MemoryBroker::new());
    let store = PgRelayStore::new(&url).transaction_pooler(true);
    let relay = Relay::new(store, broker.clone(), config(Mode::Sharded)).unwrap();
    let stats = relay.stats();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(relay.run(async move {
        let _ = rx.await;
    }));
    let (aggregates, per) = (10, 100);
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut conn = outbox::connect::postgres_pooled(&url).await.unwrap();
                conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
                for i in 0..per {
                    conn.transaction(async |c| {
                        for a in 0..aggregates / 2 {
                            let event = OrderEvent::Paid {
                                order_id: (w * aggregates / 2 + a) as i64,
                                amount: i as i64,
                            };
                            outbox::publish_async(c, &event).await?;
                        }
                        Ok::<_, outbox::Error>(())
                    })
                    .await
                    .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while broker.all_records().len() < aggregates * per && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    handle.await.unwrap();
    assert_in_order(&broker, aggregates, per);
    assert_eq!(
        stats
            .store_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "no statement of the relay failed behind PgBouncer"
    );
    for seen in pool_settings(&url) {
        assert_eq!(seen, server);
    }
    drop(bouncer);
}
