//! The connection types the admin API runs on; each backend's file implements them with its
//! own SQL.

use std::future::Future;
use std::time::Duration;

use super::types::{AdminError, DeadLetter, Filter, Status};

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// A connection the admin API runs on: `AsyncPgConnection`, `AsyncMysqlConnection`, or
/// `SyncConnectionWrapper<SqliteConnection>` (with the matching feature). Sealed: its
/// methods are the per-backend statements behind [`Admin`](super::Admin).
#[allow(missing_docs)] // hidden methods, not API
pub trait AdminConnection: Sealed + Send {
    #[doc(hidden)]
    fn admin_status(&mut self) -> impl Future<Output = Result<Status, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_dead(
        &mut self,
        filter: &Filter,
        after_seq: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, AdminError>> + Send;
    /// Rows matching `filter` among the dead letters (`dead`) or the published events.
    #[doc(hidden)]
    fn admin_count(
        &mut self,
        filter: &Filter,
        dead: bool,
    ) -> impl Future<Output = Result<i64, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_retry(
        &mut self,
        filter: &Filter,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_purge(
        &mut self,
        filter: &Filter,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
    /// The highest `seq` of the next `limit` published rows matching `filter` after `after`.
    #[doc(hidden)]
    fn admin_replay_bound(
        &mut self,
        filter: &Filter,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Option<i64>, AdminError>> + Send;
    /// Replays the published rows matching `filter` with `after < seq <= last`.
    #[doc(hidden)]
    fn admin_replay(
        &mut self,
        filter: &Filter,
        after: i64,
        last: i64,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
    #[doc(hidden)]
    fn admin_cleanup(
        &mut self,
        older_than: Duration,
        limit: i64,
    ) -> impl Future<Output = Result<u64, AdminError>> + Send;
}
