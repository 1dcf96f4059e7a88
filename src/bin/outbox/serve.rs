//! `outbox relay --metrics-addr HOST:PORT`: `/metrics` (Prometheus text format), `/healthz`
//! (the process is alive) and `/readyz` (it reached its database and its broker within the
//! last lease, and is not waiting for the broker), on a small HTTP/1.1 listener of its own.
//! Also samples the backlog gauges every [`SAMPLE_EVERY`] with one `Admin::status` query.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel_async::AsyncConnection;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use outbox::kafka::KafkaPublisher;
use outbox::relay::RelayStats;
use outbox::relay::admin::{Admin, AdminConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{Backend, Fatal, sqlite_connection};

/// How often the backlog gauges are sampled: a count over the outbox table, so not per batch.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What the probes look at.
#[derive(Clone)]
pub struct Probes {
    stats: Arc<RelayStats>,
    lease: Duration,
    /// The broker counts as reached if a probe succeeded within this (the lease less one
    /// probe interval, so that a cut shows within one lease).
    broker_fresh: Duration,
    broker_reached_ms: Arc<AtomicU64>,
    handle: PrometheusHandle,
}

impl Probes {
    /// Why the relay is not ready, if it is not.
    fn unready(&self) -> Option<String> {
        let fresh_ms = u64::try_from(self.broker_fresh.as_millis()).unwrap_or(u64::MAX);
        let broker = self.broker_reached_ms.load(Ordering::Relaxed);
        if !self.stats.ready(self.lease) {
            return Some(if self.stats.waiting_for_broker.load(Ordering::Relaxed) {
                "waiting for the broker".to_owned()
            } else {
                "the database was not reached within the last lease".to_owned()
            });
        }
        if broker == 0 || now_ms().saturating_sub(broker) > fresh_ms {
            return Some("the broker was not reached within the last lease".to_owned());
        }
        None
    }
}

/// Installs the Prometheus recorder, binds `addr` (failing at start-up if it cannot), and
/// serves the endpoints, probes the broker and samples the backlog in the background.
pub async fn start(
    addr: SocketAddr,
    stats: Arc<RelayStats>,
    lease: Duration,
    probe: KafkaPublisher,
    backend: Backend,
    url: String,
) -> Result<(), Fatal> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Fatal(format!("cannot install the metrics recorder: {e}")))?;
    outbox::relay::describe_metrics();
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Fatal(format!("cannot listen on --metrics-addr {addr}: {e}")))?;
    // Often enough that a cut broker shows within one lease.
    let every = (lease / 4).max(Duration::from_millis(500));
    let probes = Probes {
        stats,
        lease,
        broker_fresh: lease.saturating_sub(every),
        broker_reached_ms: Arc::new(AtomicU64::new(0)),
        handle,
    };
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    let reached = probes.broker_reached_ms.clone();
    tokio::spawn(async move {
        loop {
            if probe.check_reachable(every).await.is_ok() {
                reached.store(now_ms(), Ordering::Relaxed);
            }
            tokio::time::sleep(every).await;
        }
    });
    tokio::spawn(sample_backlog(backend, url));
    let upkeep = probes.handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                continue;
            };
            let probes = probes.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), answer(conn, probes)).await;
            });
        }
    });
    Ok(())
}

async fn answer(mut conn: tokio::net::TcpStream, probes: Probes) -> std::io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    while len < buf.len() {
        let n = conn.read(&mut buf[len..]).await?;
        if n == 0 {
            break;
        }
        len += n;
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let request = String::from_utf8_lossy(&buf[..len]);
    let mut words = request.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4",
            probes.handle.render(),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_owned()),
        ("GET", "/readyz") => match probes.unready() {
            None => ("200 OK", "text/plain", "ready\n".to_owned()),
            Some(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
        },
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}

/// Samples the backlog gauges every [`SAMPLE_EVERY`] over a connection of its own
/// (reconnecting after errors).
async fn sample_backlog(backend: Backend, url: String) {
    loop {
        let error = match backend {
            Backend::Postgres => match diesel_async::AsyncPgConnection::establish(&url).await {
                Ok(c) => sample(c).await,
                Err(e) => e.to_string(),
            },
            Backend::Mysql => match diesel_async::AsyncMysqlConnection::establish(&url).await {
                Ok(c) => sample(c).await,
                Err(e) => e.to_string(),
            },
            Backend::Sqlite => match sqlite_connection(&url).await {
                Ok(c) => sample(c).await,
                Err(Fatal(e)) => e,
            },
        };
        tracing::warn!(error = %error, "sampling the backlog failed; trying again");
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// Samples until an error, which it returns.
async fn sample<C: AdminConnection>(conn: C) -> String {
    let mut admin = Admin::new(conn);
    loop {
        match admin.status().await {
            Ok(s) => {
                metrics::gauge!("outbox_relay_backlog").set(s.pending as f64);
                metrics::gauge!("outbox_relay_oldest_pending_age_seconds")
                    .set(s.oldest_pending_age_seconds.unwrap_or(0.0));
                metrics::gauge!("outbox_relay_dead_letters").set(s.dead as f64);
                metrics::gauge!("outbox_relay_blocked_aggregates").set(s.blocked_aggregates as f64);
                if let Some(stream) = &s.stream {
                    metrics::gauge!("outbox_relay_stream_open_transaction_seconds").set(
                        stream
                            .oldest_open_transaction
                            .as_ref()
                            .map_or(0.0, |t| t.age_seconds),
                    );
                    if let Some(ring) = &stream.ring {
                        metrics::gauge!("outbox_relay_stream_ring_headroom_xids")
                            .set(ring.headroom_xids as f64);
                        metrics::gauge!("outbox_relay_stream_ring_bytes").set(ring.bytes as f64);
                    }
                }
            }
            Err(e) => return e.to_string(),
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}
