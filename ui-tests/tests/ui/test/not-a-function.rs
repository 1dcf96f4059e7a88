// The attribute makes test functions.
#[outbox::test]
struct Fixture;

fn main() {}
