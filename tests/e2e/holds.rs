//! Who held which outbox rows when, recorded by the database itself (a test-only trigger), to
//! check that two relays never published at the same time.
//!
//! A relay publishes only rows it holds: from the claim that sets `locked_by` to its id until
//! the statement that clears or changes it (mark published, record a failure, release, or
//! another relay's takeover of an expired lease). The trigger records both ends with the
//! database clock; [`batches`] turns them into one interval per claim. If two relays ever
//! published at once, each held the rows it was publishing at that moment, so their intervals
//! overlap, and [`assert_one_at_a_time`] fails. (Checked the other way round too: with two
//! `unordered` relays, which do publish at the same time, the same check finds overlapping
//! batches; see `scenarios::hold_check_sees_concurrent_relays`.)

use diesel::{Connection, RunQueryDsl};

/// The audit table and trigger; run on the test database before the relays start.
pub const AUDIT_SQL: &str = "
CREATE TABLE test_relay_holds (
    seq BIGINT NOT NULL, relay TEXT NOT NULL, claim_txn TIMESTAMPTZ,
    at TIMESTAMPTZ NOT NULL, kind TEXT NOT NULL);
CREATE FUNCTION test_audit_holds() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.locked_by IS NOT NULL AND NEW.locked_by IS DISTINCT FROM OLD.locked_by THEN
        INSERT INTO test_relay_holds VALUES (OLD.seq, OLD.locked_by, NULL, clock_timestamp(), 'end');
    END IF;
    IF NEW.locked_by IS NOT NULL AND (NEW.locked_by IS DISTINCT FROM OLD.locked_by
                                      OR NEW.locked_until IS DISTINCT FROM OLD.locked_until) THEN
        INSERT INTO test_relay_holds VALUES (NEW.seq, NEW.locked_by, now(), clock_timestamp(), 'start');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_audit_holds AFTER UPDATE ON outbox_events
    FOR EACH ROW EXECUTE FUNCTION test_audit_holds();";

/// One claim of one relay: from its first row's claim to the last release of those rows
/// (seconds since the epoch, database clock; `f64::INFINITY` if still held).
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct Batch {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub relay: String,
    #[diesel(sql_type = diesel::sql_types::Double)]
    pub start: f64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    pub end: f64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub rows: i64,
}

/// Every claim's interval. A row's hold ends at the first `end` of the same relay after it
/// started.
pub fn batches(url: &str) -> Vec<Batch> {
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query(
        "SELECT s.relay, extract(epoch FROM min(s.at))::float8 AS start, \
                extract(epoch FROM max(coalesce(e.at, 'infinity')))::float8 AS \"end\", \
                COUNT(*) AS rows \
         FROM test_relay_holds s \
         LEFT JOIN LATERAL (SELECT at FROM test_relay_holds e \
                            WHERE e.kind = 'end' AND e.seq = s.seq AND e.relay = s.relay AND e.at >= s.at \
                            ORDER BY e.at LIMIT 1) e ON true \
         WHERE s.kind = 'start' \
         GROUP BY s.relay, s.claim_txn ORDER BY start",
    )
    .load(&mut c)
    .unwrap()
}

/// The database clock now, in seconds since the epoch (to cap the holds of a killed relay:
/// a dead process publishes nothing after its death, though its leases run on).
pub fn db_now(url: &str) -> f64 {
    #[derive(diesel::QueryableByName)]
    struct Now {
        #[diesel(sql_type = diesel::sql_types::Double)]
        now: f64,
    }
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query("SELECT extract(epoch FROM clock_timestamp())::float8 AS now")
        .get_result::<Now>(&mut c)
        .unwrap()
        .now
}

/// The first pair of claims of different relays whose intervals overlap, if any.
pub fn overlap(batches: &[Batch]) -> Option<(Batch, Batch)> {
    for (i, a) in batches.iter().enumerate() {
        for b in &batches[i + 1..] {
            if a.relay != b.relay && a.start < b.end && b.start < a.end {
                return Some((a.clone(), b.clone()));
            }
        }
    }
    None
}

/// Fails, showing both claims, if two relays ever held rows at the same time.
pub fn assert_one_at_a_time(batches: &[Batch]) {
    if let Some((a, b)) = overlap(batches) {
        panic!("two relays held rows at the same time: {a:?} and {b:?}");
    }
}
