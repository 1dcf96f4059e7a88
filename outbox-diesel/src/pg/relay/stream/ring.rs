//! The partition ring's layout, and reads by a partition's name.

/// The partition ring's layout (`outbox_stream_partitioning`), as the store last read it.
///
/// A read whose transaction ids all fall in one slot reads that partition by its name
/// instead of the partitioned table: planning and running through the parent costs a node
/// per partition at each shard scan and payload lookup (measured: `docs/design/stream-mode.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ring {
    pub(super) slots: i64,
    pub(super) slot_xids: i64,
}

impl Ring {
    /// The slot whose partition holds every row of the transactions in `[lo, hi)`, if one
    /// does (the range lies within one slot).
    pub(super) fn slot_of(self, lo: i64, hi: i64) -> Option<i64> {
        if self.slots <= 0 || self.slot_xids <= 0 || lo < 0 || hi <= lo {
            return None;
        }
        let first = lo / self.slot_xids;
        ((hi - 1) / self.slot_xids == first).then_some(first % self.slots)
    }

    /// The slot of transaction id `xid`.
    pub(super) fn slot(self, xid: i64) -> Option<i64> {
        self.slot_of(xid, xid.checked_add(1)?)
    }
}

/// `sql` reading the event table through partition `slot` of the ring instead of through the
/// partitioned table: every `FROM outbox_events ` is renamed (the statements name no other
/// table starting so).
pub(super) fn on_partition(sql: &str, slot: i64) -> String {
    sql.replace(
        "FROM outbox_events ",
        &format!("FROM outbox_events_slot_{slot} "),
    )
}

/// A snapshot's xmin and xmax, from its text (`xmin:xmax:xip,…`).
pub(super) fn snapshot_bounds(snap: &str) -> Option<(i64, i64)> {
    let mut parts = snap.split(':');
    let xmin = parts.next()?.parse().ok()?;
    let xmax = parts.next()?.parse().ok()?;
    Some((xmin, xmax))
}

#[cfg(test)]
mod tests {
    use super::super::sql::{CANDIDATES, POSITIONS};
    use super::*;

    #[test]
    fn a_range_within_one_slot_has_that_slot_and_one_across_two_none() {
        let ring = Ring {
            slots: 4,
            slot_xids: 1000,
        };
        assert_eq!(ring.slot_of(1000, 2000), Some(1));
        assert_eq!(ring.slot_of(3999, 4000), Some(3));
        // A turn on, the same partitions again.
        assert_eq!(ring.slot_of(4000, 4500), Some(0));
        assert_eq!(ring.slot_of(1999, 2001), None);
        assert_eq!(ring.slot_of(0, 40_000), None);
        assert_eq!(ring.slot_of(5, 5), None);
        assert_eq!(ring.slot_of(-1, 5), None);
        assert_eq!(ring.slot(7_654), Some(3));
        assert_eq!(ring.slot(i64::MAX), None);
        let broken = Ring {
            slots: 0,
            slot_xids: 1000,
        };
        assert_eq!(broken.slot_of(1, 2), None);
    }

    #[test]
    fn reads_on_a_partition_name_it_in_place_of_the_table_and_nothing_else() {
        for (sql, n) in [(CANDIDATES, 2), (POSITIONS, 1)] {
            let on = on_partition(sql, 3);
            assert_eq!(on.matches("FROM outbox_events_slot_3 ").count(), n);
            assert!(!on.contains("FROM outbox_events "));
            assert_eq!(
                on.replace("outbox_events_slot_3 ", "outbox_events "),
                sql,
                "only the table's name changes"
            );
        }
    }

    #[test]
    fn snapshot_bounds_are_read_from_its_text() {
        assert_eq!(snapshot_bounds("100:105:101,103"), Some((100, 105)));
        assert_eq!(snapshot_bounds("7:7:"), Some((7, 7)));
        assert_eq!(snapshot_bounds("x:7:"), None);
        assert_eq!(snapshot_bounds(""), None);
    }
}
