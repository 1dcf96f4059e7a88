// The parameter's type must be a connection or pool the kit can open.
#[outbox::test]
fn places_an_order(conn: &mut String) {
    let _ = conn;
}

fn main() {}
