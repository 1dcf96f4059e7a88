//! The batch in flight and the rows read ahead, and where they move the positions to.

use std::collections::HashMap;
use std::time::Instant;

use outbox_core::relay::OutboxMessage;

use super::Outcome;
use super::sql::PositionRow;

/// The batch in flight: what is needed to advance its shards' positions (a delta), or to
/// settle its rows in `outbox_stream_dead_letters` (a release: no positions).
#[derive(Clone)]
pub(super) struct Pending {
    /// A release batch: its rows are copies in `outbox_stream_dead_letters`.
    pub(super) release: bool,
    pub(super) positions: Vec<PositionRow>,
    /// Per shard, how many rows its delta offered (at most the read + 1, less the rows of the
    /// read handed out in earlier batches), for the shards with a row in the batch.
    pub(super) offered: HashMap<i16, i64>,
    /// The claim returned a whole batch: the shards with no row in it may have rows past
    /// it, so their positions stay.
    pub(super) full: bool,
    /// The batch's rows (seq, shard), in seq order.
    pub(super) rows: Vec<(i64, i16)>,
    pub(super) outcomes: HashMap<i64, Outcome>,
}

/// A row read ahead: its seq and shard, and its message, or what became of it at once
/// (parked, malformed).
pub(super) struct AheadRow {
    pub(super) seq: i64,
    pub(super) shard: i16,
    pub(super) row: Result<OutboxMessage, Outcome>,
}

/// The rows of a read (`CANDIDATES`) not yet handed out, with what advances their shards'
/// positions: the positions as they are in the database once every batch handed out so far
/// is settled (each `ADVANCE` applied to them), and the read's counts.
pub(super) struct Ahead {
    pub(super) positions: Vec<PositionRow>,
    /// Per shard, the rows its delta offers past the batches handed out (the read's
    /// `shard_rows`, less those), so that the batch with a shard's last row exhausts it.
    pub(super) offered: HashMap<i16, i64>,
    /// The read was full: shards with no row in it may have rows past it.
    pub(super) full: bool,
    pub(super) rows: std::collections::VecDeque<AheadRow>,
    pub(super) read_at: Instant,
    /// Read while the batch in flight was published (`overlap`): `positions` are
    /// already where that batch's `ADVANCE` leaves them, so the rows are kept only if the
    /// batch is passed whole.
    pub(super) assumes: bool,
}

/// A shard's next position: the row, the delta being consumed (`None`: exhausted) and the
/// rows of the batch it passes.
pub(super) struct Advance {
    pub(super) next: PositionRow,
    pub(super) cur: Option<String>,
    pub(super) passed: Vec<i64>,
}

/// The new position of each shard of `p`, given the outcomes: up to the first event of the
/// shard neither published nor copied aside (dead, parked); the whole delta (last snapshot :=
/// the delta's end) when every row it offered was passed. A shard whose position stays is left
/// out: among them the shards with no row in a full batch, whose deltas may hold rows the
/// batch had no room for (treating them as empty would lose those rows; the test
/// `stream_delta_larger_than_a_batch_loses_nothing` checks they are published, see
/// `docs/design/stream-mode.md`, section "Shards with no row in a full batch").
pub(super) fn advanced(p: &Pending) -> Vec<Advance> {
    // Each shard's rows, in seq order, grouped in one pass: a filter of the batch's rows for
    // each position is O(shards × batch), several times slower at 256 shards and 1,000 rows,
    // and a batch passed whole and followed by rows read ahead makes three calls. Measured:
    // `docs/design/stream-mode.md`, section "Settling a batch in memory".
    let mut by_shard: HashMap<i16, Vec<i64>> = HashMap::new();
    for (seq, shard) in &p.rows {
        by_shard.entry(*shard).or_default().push(*seq);
    }
    let mut out = Vec::new();
    for pos in &p.positions {
        let rows = by_shard.get(&pos.shard).cloned().unwrap_or_default();
        if rows.is_empty() && p.full {
            continue;
        }
        let done = rows
            .iter()
            .take_while(|seq| p.outcomes.get(seq).is_some_and(Outcome::passed))
            .count();
        let offered = p.offered.get(&pos.shard).copied().unwrap_or(0);
        let passed = rows[..done].to_vec();
        if done == rows.len() && rows.len() as i64 == offered {
            // The delta is exhausted: every row it offered is passed.
            let next = PositionRow {
                last_snap: pos.cur_snap.clone(),
                cur_seq: 0,
                ..pos.clone()
            };
            out.push(Advance {
                next,
                cur: None,
                passed,
            });
        } else if done > 0 {
            let next = PositionRow {
                cur_seq: rows[done - 1],
                ..pos.clone()
            };
            out.push(Advance {
                next,
                cur: Some(pos.cur_snap.clone()),
                passed,
            });
        }
    }
    out
}

/// Whether every event of `p` was published or parked: nothing of it holds an aggregate back
/// (a failure holds its shard, an outage hands the batch back, a new dead letter parks the
/// aggregate's later events, which a read made before it did not know of).
pub(super) fn clean(p: &Pending) -> bool {
    p.outcomes
        .values()
        .all(|o| matches!(o, Outcome::Published | Outcome::Parked(_)))
}

/// Where `p`'s `ADVANCE` will leave its positions if every event of it is passed: each
/// position, with the snapshot being consumed (`None`: the delta is exhausted, the next one
/// starts), as `POSITIONS` takes them given. (Without the consumed deltas of the batches
/// before `p`, which were passed on as deltas ending where they start, the reads beside the
/// publish would come back with a few rows each, and take nearly twice as many reads; see
/// `docs/design/stream-mode.md`, section "Positions assumed for a read beside the publish".)
pub(super) fn assumed_positions(p: &Pending) -> Vec<(PositionRow, Option<String>)> {
    let mut all = p.clone();
    for (seq, _) in &p.rows {
        all.outcomes.entry(*seq).or_insert(Outcome::Published);
    }
    let next = advanced(&all);
    p.positions
        .iter()
        .map(
            |pos| match next.iter().find(|a| a.next.shard == pos.shard) {
                Some(a) => (
                    PositionRow {
                        version: a.next.version + 1,
                        ..a.next.clone()
                    },
                    a.cur.clone(),
                ),
                // A delta consumed by an earlier batch of the read (`advanced` left its end as
                // its new start: a delta never ends where it starts) is over: the next starts.
                None => (
                    pos.clone(),
                    (pos.cur_snap != pos.last_snap).then(|| pos.cur_snap.clone()),
                ),
            },
        )
        .collect()
}

/// The rows of `batch` to copy into `outbox_stream_dead_letters`, as `ADVANCE`'s and
/// `SETTLE_RELEASE`'s arrays: seq, attempts, error, and the dead letter a parked row waits
/// behind.
#[derive(Default)]
pub(super) struct DeadRows {
    pub(super) seqs: Vec<i64>,
    pub(super) attempts: Vec<i32>,
    pub(super) errors: Vec<String>,
    pub(super) behind: Vec<Option<i64>>,
}

impl DeadRows {
    pub(super) fn push(&mut self, seq: i64, outcome: &Outcome, attempts: &HashMap<i64, i32>) {
        let (error, behind) = match outcome {
            Outcome::Dead(error) | Outcome::Malformed(error) => (error.clone(), None),
            Outcome::Parked(behind) => (
                format!(
                    "parked: an earlier event of its aggregate is a dead letter (seq {behind})"
                ),
                Some(*behind),
            ),
            _ => return,
        };
        self.seqs.push(seq);
        self.attempts.push(attempts.get(&seq).copied().unwrap_or(0));
        self.errors.push(error);
        self.behind.push(behind);
    }
}
