// One database, one connection or pool: a second parameter is reported at itself.
use diesel::{PgConnection, SqliteConnection};

#[outbox::test]
fn places_an_order(conn: &mut PgConnection, other: &mut SqliteConnection) {
    let _ = (conn, other);
}

fn main() {}
