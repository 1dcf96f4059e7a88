//! A logical replication slot retains WAL while its reader is stopped, until the disk fills. Starts a private PostgreSQL cluster (`wal_level = logical`; server binaries under /usr/lib/postgresql).
//!
//! A CDC reader consumes its slot, then stops (injected: we stop reading). The application
//! keeps writing 20,000 events. The slot's `restart_lsn` does not move, so the server keeps
//! every WAL segment since then, checkpoint or not: `pg_wal_lsn_diff(pg_current_wal_lsn(),
//! restart_lsn)` grows with the writes, and so does the `pg_wal` directory, although a
//! checkpoint made all of it unnecessary for crash recovery. When the reader resumes and
//! consumes, the slot advances and the segments are freed for recycling.
//! Guard rails: alert on the retained bytes, and cap them with `max_slot_wal_keep_size`
//! (the slot is then invalidated instead of filling the disk). A polling relay has no slot.

mod common;

use common::{OrderPlaced, PrivatePg, expect};
use diesel::prelude::*;
use outbox::prelude::*;

const RETAINED: &str = "(SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = 'cdc')";
const SINCE_CHECKPOINT: &str =
    "(SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), redo_lsn)::bigint FROM pg_control_checkpoint())";
const WAL_DIR: &str = "(SELECT COALESCE(sum(size), 0)::bigint FROM pg_ls_waldir())";

fn mib(bytes: i64) -> f64 {
    bytes as f64 / 1_048_576.0
}

fn main() {
    let pg = PrivatePg::start();
    let mut conn = PgConnection::establish(&pg.url()).unwrap();
    outbox::migrations::run(&mut conn).unwrap();
    diesel::sql_query("SELECT pg_create_logical_replication_slot('cdc', 'test_decoding')")
        .execute(&mut conn)
        .unwrap();
    common::slot_changes(&mut conn, "cdc");
    diesel::sql_query("CHECKPOINT").execute(&mut conn).unwrap();
    let (retained0, dir0) = (
        PrivatePg::bigint(&mut conn, RETAINED),
        PrivatePg::bigint(&mut conn, WAL_DIR),
    );
    println!(
        "The reader is caught up: the slot retains {:.1} MiB; pg_wal holds {:.0} MiB.",
        mib(retained0),
        mib(dir0)
    );

    println!("\n1. The reader stops; the application writes 20,000 events.");
    for chunk in 0..20 {
        conn.transaction_with_outbox(|tx| {
            (0..1000).try_for_each(|i| {
                tx.publish(&OrderPlaced {
                    order_id: chunk * 1000 + i,
                    total_cents: 1,
                })
            })
        })
        .unwrap();
    }
    diesel::sql_query("CHECKPOINT").execute(&mut conn).unwrap();
    let (retained1, dir1) = (
        PrivatePg::bigint(&mut conn, RETAINED),
        PrivatePg::bigint(&mut conn, WAL_DIR),
    );
    let needed = PrivatePg::bigint(&mut conn, SINCE_CHECKPOINT);
    println!(
        "   After a checkpoint, crash recovery needs {:.1} MiB, but the slot retains {:.1} MiB; pg_wal holds {:.0} MiB.",
        mib(needed),
        mib(retained1),
        mib(dir1)
    );
    expect(
        retained1 > 5 * 1_048_576 && needed < 1_048_576 && dir1 > dir0,
        "the stopped slot to retain the WAL written since",
    );

    println!("\n2. The reader resumes and consumes its slot.");
    let changes = common::slot_changes(&mut conn, "cdc");
    let inserts = changes
        .iter()
        .filter(|c| c.starts_with("table public.outbox_events: INSERT"))
        .count();
    // The slot's restart point moves at the next running-transactions record, which a
    // checkpoint writes; the checkpoint after that removes the segments.
    for _ in 0..3 {
        diesel::sql_query("CHECKPOINT").execute(&mut conn).unwrap();
        common::slot_changes(&mut conn, "cdc");
    }
    diesel::sql_query("CHECKPOINT").execute(&mut conn).unwrap();
    let retained2 = PrivatePg::bigint(&mut conn, RETAINED);
    println!(
        "   It decoded {inserts} outbox inserts; the slot now retains {:.1} MiB (pg_wal recycles the freed segments).",
        mib(retained2)
    );
    expect(
        inserts == 20_000 && retained2 < 1_048_576,
        "the slot to advance once read",
    );
    println!(
        "\nA slot is a promise to keep WAL for a reader. Monitor pg_replication_slots (retained\nbytes, wal_status) and set max_slot_wal_keep_size; drop slots whose reader is gone."
    );
}
