//! `outbox relay --metrics-addr HOST:PORT`: `/metrics` (Prometheus text format), `/healthz`
//! (the process is alive) and `/readyz` (it reached its database and its broker within the
//! last lease, and is not waiting for the broker), on a small HTTP/1.1 listener of its own.
//! Also samples the backlog gauges every [`SAMPLE_EVERY`] with `Admin::sample` (index lookups
//! of the pending and dead rows, each statement cancelled after [`SAMPLE_TIMEOUT`]) on a
//! connection of its own: a slow or failed sample is logged once and skipped, and never holds
//! up the relay.
//!
//! The listener is bounded so that it cannot starve the relay of file descriptors or CPU: at
//! most [`MAX_CONNECTIONS`] connections at once (more wait in the kernel's backlog), each
//! closed after [`CONNECTION_TIMEOUT`] however slowly its client reads or writes, and after a
//! failed `accept` (e.g. the process is out of file descriptors) it waits 100 ms, doubling up
//! to 5 s, instead of retrying at once in a busy loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use outbox::relay::admin::{Admin, AdminConnection};
use outbox::relay::{Publisher, RelayStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::{Backend, Fatal, with_connection};

/// How often the backlog gauges are sampled: counts of the pending and dead rows, so not per
/// batch.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// How long one statement of a sample may run before the database cancels it.
pub const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// The longest one connection may stay open, from its accept to its last byte.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

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
/// serves the endpoints, probes the broker (through [`Publisher::ready`]) and samples the
/// backlog in the background.
pub async fn start(
    addr: SocketAddr,
    stats: Arc<RelayStats>,
    lease: Duration,
    probe: impl Publisher,
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
            if probe.ready(every).await.is_ok() {
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
    tokio::spawn(accept_loop(
        listener,
        MAX_CONNECTIONS,
        CONNECTION_TIMEOUT,
        move |conn| {
            let probes = probes.clone();
            async move {
                let _ = answer(conn, probes).await;
            }
        },
    ));
    Ok(())
}

/// Accepts connections while fewer than `limit` are open, and hands each to `handle`, closed
/// after `timeout`. A failed accept waits [`accept_backoff`] (logged once per run of failures).
async fn accept_loop<F, Fut>(listener: TcpListener, limit: usize, timeout: Duration, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limit));
    let mut failures = 0u32;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((conn, _)) => {
                failures = 0;
                let answered = handle(conn);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(timeout, answered).await;
                    drop(slot);
                });
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let wait = accept_backoff(failures);
                if failures == 1 {
                    tracing::warn!(error = %e, "metrics endpoint: accepting a connection failed; backing off");
                }
                drop(slot);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// The wait after the `failures`-th accept error in a row: 100 ms, doubling, at most 5 s.
fn accept_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(6);
    (Duration::from_millis(100) * (1 << doublings)).min(Duration::from_secs(5))
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
/// (reconnecting after errors). A run of failures (a timed-out sample, a lost connection) is
/// logged once, when it starts, and once more when sampling works again; the gauges keep
/// their last values meanwhile.
async fn sample_backlog(backend: Backend, url: String) {
    let mut failing = Streak::default();
    loop {
        let error = with_connection!(
            backend,
            &url,
            false,
            |c| sample(c, &mut failing).await,
            |e| e
        );
        if failing.failed() {
            tracing::warn!(
                error = %error,
                "sampling the backlog gauges failed; skipping samples until it works again"
            );
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// A run of failed samples: logged when it starts and when it ends, not at every sample.
#[derive(Debug, Default)]
struct Streak {
    failing: bool,
}

impl Streak {
    /// Records a failure; `true` if it starts a run (log it).
    fn failed(&mut self) -> bool {
        !std::mem::replace(&mut self.failing, true)
    }

    /// Records a success; `true` if it ends a run (log that).
    fn succeeded(&mut self) -> bool {
        std::mem::take(&mut self.failing)
    }
}

/// Samples until an error, which it returns.
async fn sample<C: AdminConnection>(conn: C, failing: &mut Streak) -> String {
    let mut admin = Admin::new(conn);
    loop {
        match admin.sample(SAMPLE_TIMEOUT).await {
            Ok(s) => {
                if failing.succeeded() {
                    tracing::info!("sampling the backlog gauges works again");
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a request (up to its blank line or the client's end) and answers `ok`.
    async fn ok(mut conn: TcpStream) {
        let mut buf = [0u8; 1024];
        let mut seen = Vec::new();
        while let Ok(n) = conn.read(&mut buf).await {
            if n == 0 {
                return;
            }
            seen.extend_from_slice(&buf[..n]);
            if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let _ = conn.write_all(b"ok").await;
                return;
            }
        }
    }

    async fn serving(limit: usize, timeout: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(accept_loop(listener, limit, timeout, ok));
        addr
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_wait_for_a_free_slot() {
        let addr = serving(2, Duration::from_secs(60)).await;
        let idle = TcpStream::connect(addr).await.unwrap();
        let _idle_too = TcpStream::connect(addr).await.unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        third.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 16];
        assert!(
            tokio::time::timeout(Duration::from_millis(300), third.read(&mut buf))
                .await
                .is_err(),
            "a third connection is not served while two are open"
        );
        drop(idle);
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert_eq!(&buf[..n], b"ok");
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_after_the_timeout() {
        let addr = serving(4, Duration::from_millis(200)).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
            .await
            .expect("the server closes an idle connection")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    #[test]
    fn a_run_of_failed_samples_is_logged_once() {
        let mut streak = Streak::default();
        assert!(streak.failed(), "the first failure is logged");
        assert!(
            !streak.failed() && !streak.failed(),
            "the next ones are not"
        );
        assert!(streak.succeeded(), "the recovery is logged");
        assert!(!streak.succeeded());
        assert!(streak.failed(), "a new run is logged again");
    }

    #[test]
    fn accept_errors_back_off_growing_to_five_seconds() {
        assert_eq!(accept_backoff(1), Duration::from_millis(100));
        assert_eq!(accept_backoff(2), Duration::from_millis(200));
        assert_eq!(accept_backoff(4), Duration::from_millis(800));
        assert_eq!(accept_backoff(7), Duration::from_secs(5));
        assert_eq!(accept_backoff(u32::MAX), Duration::from_secs(5));
    }
}
