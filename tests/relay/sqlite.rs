//! SQLite: the store suite, several relays on one file included (they take turns on its
//! write lock).

use crate::backends::Sqlite;

crate::store_suite!(Sqlite);

#[tokio::test]
async fn malformed_id_fails_the_claim_and_undoes_it() {
    crate::text_ids::malformed_id_fails_the_claim_and_undoes_it::<Sqlite>().await;
}
