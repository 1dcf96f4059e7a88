//! The relay's `LISTEN` connection: a task of its own drains its notifications as they come
//! and folds them into one pending wake-up, so that any number of notifications that arrive
//! while the relay is busy (draining a backlog; any role may `pg_notify` the channel) cost one
//! wake-up, never a queue of them with an empty claim each, and no memory grows with them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::sql::NOTIFY_CHANNEL;
use crate::relay::base::Source;

/// A `LISTEN outbox_events` connection and the task that drains it.
pub(super) struct Listener {
    /// Holds at most one wake-up ([`Notify::notify_one`] stores one permit).
    wake: Arc<Notify>,
    /// Set when the connection ended: the store reconnects on its next wait.
    lost: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Listener {
    /// Connects through the store's `source` and listens; the error is the connection's or
    /// `LISTEN`'s.
    pub(super) async fn connect(source: &Source<AsyncPgConnection>) -> Result<Listener, String> {
        let mut conn = source
            .open::<super::PgConnector>(false)
            .await
            .map_err(|e| format!("listener connection failed: {e}"))?;
        conn.batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}"))
            .await
            .map_err(|e| format!("LISTEN failed: {e}"))?;
        let wake = Arc::new(Notify::new());
        let lost = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(drain(conn, wake.clone(), lost.clone()));
        Ok(Listener { wake, lost, task })
    }

    /// Waits until a notification came (since the last wait, or now) or `timeout` passed.
    /// `false`: the connection is lost.
    pub(super) async fn wait(&self, timeout: Duration) -> bool {
        if !self.lost.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(timeout, self.wake.notified()).await;
        }
        !self.lost.load(Ordering::Acquire)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads notifications until the connection ends, each one setting the single wake-up.
async fn drain(mut conn: AsyncPgConnection, wake: Arc<Notify>, lost: Arc<AtomicBool>) {
    {
        let mut stream = std::pin::pin!(conn.notifications_stream());
        loop {
            match stream.next().await {
                // A notification only wakes the relay; it never carries data.
                Some(Ok(_)) => wake.notify_one(),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "listener connection lost; reconnecting later");
                    break;
                }
                None => break,
            }
        }
    }
    lost.store(true, Ordering::Release);
    wake.notify_one();
}
