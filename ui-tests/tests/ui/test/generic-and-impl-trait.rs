// A test is a plain function: no generics, no `impl Trait` parameter.
use diesel::Connection;

#[outbox::test]
fn generic<C: Connection>(conn: &mut C) {
    let _ = conn;
}

#[outbox::test]
fn opaque(conn: impl Connection) {
    let _ = conn;
}

fn main() {}
