//! Events are written in the order they were published, across nested transactions.
//!
//! `transaction_with_outbox` keeps its events until its closure returns and writes them just
//! before its `COMMIT` (or savepoint release), with one multi-row `INSERT`. Code inside it
//! can write events sooner: a nested `transaction_with_outbox` writes at the release of its
//! savepoint, the free `publish` at once. Left alone, those would come before the events the
//! enclosing closure published earlier, so a consumer would see an aggregate's events out of
//! order.
//!
//! So each running `transaction_with_outbox` registers its pending events here, under its
//! connection (the address of the connection's transaction state, which a pooled wrapper
//! shares with the connection it wraps) and transaction depth. Before any other write of
//! events on that connection, the events enclosing transactions published so far are written
//! first:
//! - at their own depth (a nested `transaction_with_outbox` about to open its savepoint, or a
//!   free `publish` in the closure itself) they are written and leave the buffer;
//! - from inside a savepoint that the outbox did not open (a plain `conn.transaction`), they
//!   are written there but stay in the buffer, marked as possibly written: if that savepoint
//!   rolls back, they are gone from the table, so every later write of the enclosing
//!   transaction (the next nested write, and the final one) writes them again with
//!   "skip rows whose id exists". Either way, when anything later is written, everything
//!   published earlier is already in the table before it.
//!
//! A transaction with no nested writes costs one registry entry (a global lock taken twice)
//! and writes its events as any other transaction does, with one `INSERT`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use diesel::connection::TransactionManagerStatus;
use outbox_core::NewMessage;

use crate::OutboxBackend;

/// The pending events of one running `transaction_with_outbox`.
#[derive(Debug, Default)]
pub(crate) struct Frame {
    /// Transaction depth its events are written at (1: the top-level transaction).
    depth: u32,
    /// Published and not yet written for good, oldest first.
    pub(crate) pending: Vec<NewMessage>,
    /// How many of the first `pending` may already be in the table (written inside a
    /// savepoint that may since have rolled back).
    maybe_written: usize,
}

pub(crate) type FrameRef = Arc<Mutex<Frame>>;

/// Running frames per connection, outermost first.
static FRAMES: LazyLock<Mutex<HashMap<usize, Vec<FrameRef>>>> = LazyLock::new(Default::default);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here is left half-changed by a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The connection's key and current transaction depth (0 outside a transaction).
pub(crate) fn position(status: &mut TransactionManagerStatus) -> diesel::QueryResult<(usize, u32)> {
    let depth = status.transaction_depth()?.map_or(0, |d| d.get());
    Ok((status as *mut TransactionManagerStatus as usize, depth))
}

/// A frame registered for the life of this value.
pub(crate) struct Registered {
    key: usize,
    frame: FrameRef,
}

impl Registered {
    pub(crate) fn new(key: usize, depth: u32) -> Self {
        let frame: FrameRef = Arc::new(Mutex::new(Frame {
            depth,
            ..Frame::default()
        }));
        lock(&FRAMES).entry(key).or_default().push(frame.clone());
        Registered { key, frame }
    }

    pub(crate) fn frame(&self) -> FrameRef {
        self.frame.clone()
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut all = lock(&FRAMES);
        if let Some(frames) = all.get_mut(&self.key) {
            frames.retain(|f| !Arc::ptr_eq(f, &self.frame));
            if frames.is_empty() {
                all.remove(&self.key);
            }
        }
    }
}

/// One write to make before a write at some depth: `messages[..keep_upto]` (and, unless
/// `own_level`, all of them) with "skip existing ids".
pub(crate) struct Flush {
    frame: FrameRef,
    pub(crate) messages: Vec<NewMessage>,
    pub(crate) keep_upto: usize,
    pub(crate) own_level: bool,
}

/// What enclosing frames of connection `key` must write before a write at `depth`.
pub(crate) fn plan(key: usize, depth: u32) -> Vec<Flush> {
    let frames: Vec<FrameRef> = lock(&FRAMES).get(&key).cloned().unwrap_or_default();
    frames
        .into_iter()
        .filter_map(|frame| {
            let f = lock(&frame);
            if f.pending.is_empty() || f.depth > depth {
                return None;
            }
            let own_level = f.depth == depth;
            let (messages, keep_upto) = (f.pending.clone(), f.maybe_written);
            drop(f);
            Some(Flush {
                frame,
                keep_upto: if own_level { keep_upto } else { messages.len() },
                messages,
                own_level,
            })
        })
        .collect()
}

impl Flush {
    /// Records that the write succeeded.
    pub(crate) fn done(self) {
        let mut f = lock(&self.frame);
        if self.own_level {
            f.pending.drain(..self.messages.len());
            f.maybe_written = 0;
        } else {
            f.maybe_written = f.maybe_written.max(self.messages.len());
        }
    }
}

/// A frame's own final write: all its pending events, oldest first.
pub(crate) fn take_own(frame: &FrameRef) -> Flush {
    let mut f = lock(frame);
    let messages = std::mem::take(&mut f.pending);
    let keep_upto = std::mem::take(&mut f.maybe_written);
    drop(f);
    Flush {
        frame: frame.clone(),
        messages,
        keep_upto,
        own_level: true,
    }
}

/// Writes what enclosing transactions published so far, before a write of events at the
/// connection's current depth.
pub(crate) fn flush_enclosing<C>(conn: &mut C) -> diesel::QueryResult<()>
where
    C: diesel::Connection<Backend: OutboxBackend>,
{
    use diesel::connection::TransactionManager;
    let (key, depth) = position(C::TransactionManager::transaction_manager_status_mut(conn))?;
    for flush in plan(key, depth) {
        write(conn, &flush)?;
        flush.done();
    }
    Ok(())
}

/// Writes one [`Flush`] on a sync connection.
pub(crate) fn write<C>(conn: &mut C, flush: &Flush) -> diesel::QueryResult<()>
where
    C: diesel::Connection<Backend: OutboxBackend>,
{
    let (kept, fresh) = flush.messages.split_at(flush.keep_upto);
    if !kept.is_empty() {
        C::Backend::write_as(conn, kept, true)?;
    }
    if !fresh.is_empty() {
        C::Backend::write_as(conn, fresh, false)?;
    }
    Ok(())
}

/// The async twin of [`flush_enclosing`].
#[cfg(feature = "async")]
pub(crate) async fn flush_enclosing_async<C>(conn: &mut C) -> diesel::QueryResult<()>
where
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
{
    use diesel_async::TransactionManager;
    let (key, depth) = position(C::TransactionManager::transaction_manager_status_mut(conn))?;
    for flush in plan(key, depth) {
        write_async(conn, &flush).await?;
        flush.done();
    }
    Ok(())
}

/// The async twin of [`write`].
#[cfg(feature = "async")]
pub(crate) async fn write_async<C>(conn: &mut C, flush: &Flush) -> diesel::QueryResult<()>
where
    C: diesel_async::AsyncConnection<Backend: OutboxBackend>,
{
    let (kept, fresh) = flush.messages.split_at(flush.keep_upto);
    if !kept.is_empty() {
        C::Backend::write_as_async(conn, kept, true).await?;
    }
    if !fresh.is_empty() {
        C::Backend::write_as_async(conn, fresh, false).await?;
    }
    Ok(())
}
