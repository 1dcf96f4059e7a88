//! SQLite: the store suite, several relays on one file included (they take turns on its
//! write lock).

use crate::backends::Sqlite;

crate::store_suite!(Sqlite);
crate::admin_suite!(Sqlite);

#[tokio::test]
async fn malformed_id_is_dead_lettered() {
    crate::text_ids::malformed_id_is_dead_lettered::<Sqlite>().await;
}

#[tokio::test]
async fn cleanup_timing_1m() {
    crate::admin_suite::cleanup_timing::<Sqlite>("WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 1000000) INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload, shard, created_at, available_at, published_at) SELECT printf('00000000-0000-7000-8000-%012d', n), 'order', CAST(n % 1000 AS TEXT), 'Paid', 1, '{\"amount\": 1}', n % 256, '2020-01-01 00:00:00.000000', '2020-01-01 00:00:00.000000', strftime('%Y-%m-%d %H:%M:%f000', 'now', '-2 days') FROM g").await;
}
