// Diesel runs queries on `&mut` connections.
use diesel::PgConnection;

#[outbox::test]
fn places_an_order(conn: &PgConnection) {
    let _ = conn;
}

fn main() {}
