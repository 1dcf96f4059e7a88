//! The admin API over stream mode's dead letters (PostgreSQL, `outbox_stream_dead_letters`):
//! they are listed, counted, retried and purged with the lease modes' dead rows, parked rows
//! never are, and status counts them by the stream's rules. The rows are written with SQL as
//! the stream relay writes them (a copy of the event row; the event row left as it was).

use chrono::Utc;
use outbox::relay::admin::{Admin, AdminError, DeadLetter, Filter};

use crate::backends::{Backend, Contract, Postgres};
use crate::support::TestDatabase;

fn seqs(rows: &[DeadLetter]) -> Vec<i64> {
    rows.iter().map(|d| d.seq).collect()
}

fn count(db: &TestDatabase, sql: &str) -> i64 {
    Postgres::count(db, sql)
}

/// Copies event `seq` into the stream table, as the relay does: a dead letter
/// (`parked_behind` NULL) or a row parked behind dead letter `behind`.
fn copy(db: &TestDatabase, seq: i64, behind: Option<i64>, attempts: i32, error: &str) {
    let behind = behind.map_or("NULL".to_owned(), |b| b.to_string());
    Postgres::exec(
        db,
        &format!(
            "INSERT INTO outbox_stream_dead_letters (seq, id, aggregate_type, aggregate_id, \
             event_type, event_version, payload, headers, topic, shard, created_at, attempts, \
             last_error, parked_behind) \
             SELECT seq, id, aggregate_type, aggregate_id, event_type, event_version, payload, \
             headers, topic, shard, created_at, {attempts}, '{error}', {behind} \
             FROM outbox_events WHERE seq = {seq}"
        ),
    );
}

/// Events, by seq (a fresh database numbers them from 1):
/// 1 A/E1 (2 h old): stream dead letter; 2 C/E1: lease-mode dead row; 3 B/Refused: stream
/// dead letter (no parked rows: as under `--skip-dead-letters`); 4 A/E2 (90 min old) and
/// 5 A/E3: parked behind 1; 6 D/E1, 7 B/E2: published by the stream (behind its positions);
/// 8 D/E2: written after the positions moved, so beyond them.
fn setup() -> TestDatabase {
    let db = Postgres::database("stream_admin");
    Postgres::exec(
        &db,
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, \
         payload, created_at) VALUES \
         ('order', 'A', 'E1', 1, '{}', now() - interval '2 hours'), \
         ('order', 'C', 'E1', 1, '{}', now()), \
         ('order', 'B', 'Refused', 1, '{}', now()), \
         ('order', 'A', 'E2', 1, '{}', now() - interval '90 minutes'), \
         ('order', 'A', 'E3', 1, '{}', now()), \
         ('order', 'D', 'E1', 1, '{}', now()), \
         ('order', 'B', 'E2', 1, '{}', now())",
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE (seq, aggregate_id, event_type) IN \
             ((1, 'A', 'E1'), (2, 'C', 'E1'), (3, 'B', 'Refused'), (4, 'A', 'E2'), \
              (5, 'A', 'E3'), (6, 'D', 'E1'), (7, 'B', 'E2'))"
        ),
        7,
        "seqs as the test expects"
    );
    copy(&db, 1, None, 5, "too large");
    copy(&db, 3, None, 4, "topic refused");
    copy(&db, 4, Some(1), 2, "parked");
    copy(&db, 5, Some(1), 2, "parked");
    Postgres::exec(
        &db,
        "UPDATE outbox_events SET dead_at = now(), attempts = 3, last_error = 'lease poison' \
         WHERE seq = 2",
    );
    db
}

/// The stream's positions move past everything written so far, as the relay's would.
fn move_positions(db: &TestDatabase) {
    Postgres::exec(
        db,
        "UPDATE outbox_stream_positions SET version = 1, last_snapshot = pg_current_snapshot()",
    );
}

#[tokio::test]
async fn stream_admin_dead_letters() {
    let db = setup();
    let mut admin = Admin::new(Postgres::admin(&db).await);

    // Before the positions move: no stream figures, but the dead letters are dead.
    let s = admin.status().await.unwrap();
    assert_eq!(s.stream, None, "{s:?}");
    assert_eq!((s.dead, s.blocked_aggregates), (3, 1), "{s:?}");

    move_positions(&db);
    Postgres::exec(
        &db,
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, \
         payload) VALUES ('order', 'D', 'E2', 1, '{}')",
    );

    // Status: dead = 2 stream dead letters + 1 lease dead row; pending = 2 parked + 1 beyond
    // the positions; published = the unmarked rows behind the positions that are neither
    // dead letters nor parked (6, 7); blocked = A (parked rows); the oldest pending event is
    // the parked 4 (90 min), not the dead letter 1 (2 h) nor 8 (now).
    let s = admin.status().await.unwrap();
    let stream = s.stream.clone().expect("the positions moved");
    assert_eq!(s.dead, 3, "{s:?}");
    assert_eq!(s.pending, 3, "{s:?}");
    assert_eq!(s.published, 2, "{s:?}");
    assert_eq!(s.blocked_aggregates, 1, "{s:?}");
    assert_eq!((stream.parked, stream.retry_requested), (2, 0), "{s:?}");
    let age = s.oldest_pending_age_seconds.unwrap();
    assert!((5300.0..5500.0).contains(&age), "{s:?}");
    let oldest = s.oldest_pending.unwrap();
    let expected = Utc::now() - chrono::Duration::minutes(90);
    assert!((oldest - expected).num_seconds().abs() < 100, "{s:?}");

    // List: both kinds in seq order, parked rows never; the lease row (2) between the two
    // stream dead letters, so a page is one ORDER BY over both.
    let all = admin
        .dead_letters(&Filter::default(), 0, 100)
        .await
        .unwrap();
    assert_eq!(seqs(&all), [1, 2, 3]);
    assert_eq!(
        all.iter().map(|d| d.stream).collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(
        all.iter()
            .map(|d| (d.attempts, d.last_error.as_deref()))
            .collect::<Vec<_>>(),
        [
            (5, Some("too large")),
            (3, Some("lease poison")),
            (4, Some("topic refused"))
        ]
    );
    assert!(all.iter().all(|d| d.retry_requested_at.is_none()));
    assert!(all.iter().all(|d| d.dead_at.is_some()));
    assert_eq!(
        (all[2].aggregate_id.as_str(), all[2].event_type.as_str()),
        ("B", "Refused")
    );
    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT COUNT(*) AS n FROM outbox_events WHERE seq = 3 AND id::text = '{}'",
                all[2].id
            )
        ),
        1,
        "the event's id"
    );
    for after in [0, 1, 2] {
        let page = admin
            .dead_letters(&Filter::default(), after, 1)
            .await
            .unwrap();
        assert_eq!(seqs(&page), [after + 1], "page after {after}");
    }
    assert!(
        admin
            .dead_letters(&Filter::default(), 3, 1)
            .await
            .unwrap()
            .is_empty()
    );
    let page = admin.dead_letters(&Filter::default(), 0, 2).await.unwrap();
    assert_eq!(seqs(&page), [1, 2]);
    let page = admin.dead_letters(&Filter::default(), 2, 2).await.unwrap();
    assert_eq!(seqs(&page), [3]);

    let agg_a = Filter {
        aggregate_id: Some("A".into()),
        ..Filter::default()
    };
    assert_eq!(
        seqs(&admin.dead_letters(&agg_a, 0, 100).await.unwrap()),
        [1]
    );
    let refused = Filter {
        event_type: Some("Refused".into()),
        ..Filter::default()
    };
    assert_eq!(
        seqs(&admin.dead_letters(&refused, 0, 100).await.unwrap()),
        [3]
    );
    let with_parked = Filter {
        seqs: Some(vec![2, 4, 5]),
        ..Filter::default()
    };
    assert_eq!(
        seqs(&admin.dead_letters(&with_parked, 0, 100).await.unwrap()),
        [2]
    );
    let older = Filter {
        until: Some(Utc::now() - chrono::Duration::hours(1)),
        ..Filter::default()
    };
    assert_eq!(
        seqs(&admin.dead_letters(&older, 0, 100).await.unwrap()),
        [1]
    );
    let range = Filter {
        from_seq: Some(3),
        to_seq: Some(5),
        ..Filter::default()
    };
    assert_eq!(
        seqs(&admin.dead_letters(&range, 0, 100).await.unwrap()),
        [3]
    );

    // Count: as listed.
    assert_eq!(admin.count(&Filter::default(), true).await.unwrap(), 3);
    assert_eq!(admin.count(&agg_a, true).await.unwrap(), 1);
    assert_eq!(admin.count(&with_parked, true).await.unwrap(), 1);
    assert_eq!(
        admin.count(&Filter::default(), false).await.unwrap(),
        0,
        "published counts published_at, never the stream table"
    );

    // Retry is all or nothing: when the stream table's statement fails, the lease row stays
    // dead too.
    Postgres::exec(
        &db,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
    );
    Postgres::exec(
        &db,
        "CREATE TRIGGER refuse BEFORE UPDATE OR DELETE ON outbox_stream_dead_letters \
         FOR EACH ROW EXECUTE FUNCTION refuse()",
    );
    let err = admin.retry_dead(&Filter::default()).await.unwrap_err();
    assert!(
        matches!(err, AdminError::Database { operation, .. } if operation == "retry dead letters"),
        "{err:?}"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE seq = 2 AND dead_at IS NOT NULL \
             AND attempts = 3"
        ),
        1,
        "the lease row's retry was rolled back"
    );
    let err = admin.purge_dead(&Filter::default()).await.unwrap_err();
    assert!(
        matches!(err, AdminError::Database { operation, .. } if operation == "purge dead letters"),
        "{err:?}"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) AS n FROM outbox_events WHERE seq = 2"),
        1,
        "the lease row's purge was rolled back"
    );
    Postgres::exec(&db, "DROP TRIGGER refuse ON outbox_stream_dead_letters");
    // The admin connection is usable after the failed transactions.
    assert_eq!(admin.count(&Filter::default(), true).await.unwrap(), 3);

    // Retry A's dead letter: retry asked for, attempts 0; the parked rows untouched.
    assert_eq!(admin.retry_dead(&agg_a).await.unwrap(), 1);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters \
             WHERE seq = 1 AND attempts = 0 AND retry_requested_at IS NOT NULL \
             AND last_error = 'too large'"
        ),
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters \
             WHERE seq IN (4, 5) AND attempts = 2 AND retry_requested_at IS NULL"
        ),
        2,
        "parked rows are not retried"
    );
    assert_eq!(
        admin.retry_dead(&agg_a).await.unwrap(),
        0,
        "its retry is asked for already"
    );
    let listed = admin.dead_letters(&agg_a, 0, 100).await.unwrap();
    assert_eq!(
        seqs(&listed),
        [1],
        "still a dead letter until a relay publishes it"
    );
    let asked = listed[0].retry_requested_at.expect("retry requested");
    assert!((Utc::now() - asked).num_seconds().abs() < 60, "{asked}");
    assert_eq!(listed[0].attempts, 0);
    let s = admin.status().await.unwrap();
    assert_eq!(
        (s.dead, s.stream.as_ref().unwrap().retry_requested),
        (3, 1),
        "{s:?}"
    );

    // Retry every dead letter: B's stream dead letter and C's lease row. The positions passed
    // C's row, so no stream relay would read it again: it is copied into the stream's dead
    // letters, retry-requested, for the stream relay to release (its event row no longer
    // dead).
    assert_eq!(admin.retry_dead(&Filter::default()).await.unwrap(), 2);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE seq = 2 AND dead_at IS NULL"
        ),
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters \
             WHERE seq = 2 AND attempts = 0 AND last_error = 'lease poison'"
        ),
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters \
             WHERE retry_requested_at IS NOT NULL AND attempts = 0"
        ),
        3,
        "1, 2 and 3"
    );
    let all = admin
        .dead_letters(&Filter::default(), 0, 100)
        .await
        .unwrap();
    assert_eq!(seqs(&all), [1, 2, 3]);
    assert!(
        all.iter()
            .all(|d| d.retry_requested_at.is_some() && d.stream)
    );
    let s = admin.status().await.unwrap();
    assert_eq!(
        (s.dead, s.stream.as_ref().unwrap().retry_requested),
        (3, 3),
        "{s:?}"
    );

    // Purge deletes dead letters only: selecting 1 and its parked 4 deletes 1; 4 and 5 stay
    // for the relay to release.
    let one_and_parked = Filter {
        seqs: Some(vec![1, 4]),
        ..Filter::default()
    };
    assert_eq!(admin.count(&one_and_parked, true).await.unwrap(), 1);
    assert_eq!(admin.purge_dead(&one_and_parked).await.unwrap(), 1);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters WHERE seq IN (2, 3, 4, 5)"
        ),
        4
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters"),
        4
    );
    let s = admin.status().await.unwrap();
    assert_eq!(
        (s.dead, s.blocked_aggregates, s.pending),
        (2, 1, 3),
        "{s:?}"
    );

    // Purge the rest: C's copy and B's stream dead letter (their event rows lie behind the
    // positions, for retention).
    assert_eq!(admin.purge_dead(&Filter::default()).await.unwrap(), 2);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters \
             WHERE seq IN (4, 5) AND parked_behind = 1"
        ),
        2,
        "parked rows are never purged"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) AS n FROM outbox_stream_dead_letters"),
        2
    );
    assert!(
        admin
            .dead_letters(&Filter::default(), 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(admin.count(&Filter::default(), true).await.unwrap(), 0);
    let s = admin.status().await.unwrap();
    assert_eq!(s.dead, 0, "{s:?}");
    assert_eq!(
        s.blocked_aggregates, 1,
        "A's parked rows wait for a release"
    );
    assert_eq!(s.pending, 3, "{s:?}");
    assert_eq!(s.stream.as_ref().unwrap().parked, 2, "{s:?}");
}
