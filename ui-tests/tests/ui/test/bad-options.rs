// Unknown, repeated, empty and non-string options, each reported at itself.
use diesel::SqliteConnection;

#[outbox::test(migration = "migrations")]
fn a(conn: &mut SqliteConnection) {
    let _ = conn;
}

#[outbox::test(env = "A_URL", env = "B_URL")]
fn b(conn: &mut SqliteConnection) {
    let _ = conn;
}

#[outbox::test(env = "  ")]
fn c(conn: &mut SqliteConnection) {
    let _ = conn;
}

#[outbox::test(migrations = 5)]
fn d(conn: &mut SqliteConnection) {
    let _ = conn;
}

fn main() {}
