//! SQLite: the store suite, several relays on one file included (they take turns on its
//! write lock).

use crate::backends::Sqlite;

crate::store_suite!(Sqlite);

#[tokio::test]
async fn malformed_id_is_dead_lettered() {
    crate::text_ids::malformed_id_is_dead_lettered::<Sqlite>().await;
}
