//! What only the backends that store the event id as text (MySQL, SQLite) can show.

use std::time::Duration;

use outbox::relay::*;

use crate::backends::Backend;

/// A row whose id is not a UUID (written by something other than the outbox) is
/// dead-lettered with an error naming the column and value; the other rows are published,
/// and the relay is not stuck on it.
pub async fn malformed_id_is_dead_lettered<B: Backend>() {
    let db = B::database("malformed_id");
    B::fill(&db, 3, 1);
    B::exec(
        &db,
        "UPDATE outbox_events SET id = 'not-a-uuid' WHERE seq = (SELECT MIN(seq) FROM \
         (SELECT seq FROM outbox_events) s)",
    );
    let mut store = B::store(&db);
    let claim = Claim {
        relay: "r",
        limit: 10,
        lease: Duration::from_secs(30),
        look_ahead: None,
        settling: &[],
        order: ClaimOrder::Unordered,
    };
    assert_eq!(store.claim(&claim).await.unwrap().len(), 2);
    assert_eq!(
        B::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE id = 'not-a-uuid' \
             AND dead_at IS NOT NULL AND locked_by IS NULL \
             AND last_error LIKE '%column `id` is not a UUID%not-a-uuid%'"
        ),
        1
    );
}
