//! What only the backends that store the event id as text (MySQL, SQLite) can show.

use std::time::Duration;

use outbox::relay::*;

use crate::backends::Backend;

/// A row whose id is not a UUID (written by something other than the outbox) makes the
/// claim fail with an error naming it, and the claim is undone: no row stays leased, no
/// attempt is counted.
pub async fn malformed_id_fails_the_claim_and_undoes_it<B: Backend>() {
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
        order: ClaimOrder::Unordered,
    };
    let error = store.claim(&claim).await.unwrap_err().to_string();
    assert!(error.contains("invalid id \"not-a-uuid\""), "{error}");
    assert_eq!(
        B::count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE locked_by IS NULL AND attempts = 0"
        ),
        3
    );
    // The store reconnects and carries on once the row is repaired.
    B::exec(
        &db,
        "UPDATE outbox_events SET id = '00000000-0000-7000-8000-000000000000' \
         WHERE id = 'not-a-uuid'",
    );
    assert_eq!(store.claim(&claim).await.unwrap().len(), 3);
}
