// A diesel-async connection needs an `async fn` test.
use diesel_async::AsyncPgConnection;

#[outbox::test]
fn places_an_order(conn: &mut AsyncPgConnection) {
    let _ = conn;
}

fn main() {}
