// The test's one parameter is what it is given: without one there is nothing to hand over.
#[outbox::test]
fn places_an_order() {}

fn main() {}
