//! Compile-fail and compile-pass tests of `#[derive(OutboxEvent)]`, `#[idempotent]` and
//! `#[outbox::test]`.
//!
//! `tests/ui/derive/`, `tests/ui/idempotent/` and `tests/ui/test/` hold one scenario per file, each with the
//! `.stderr` it must produce; `tests/ui/pass/` and `tests/ui/pass-idempotent/` hold inputs that
//! must compile and run. The `#[idempotent]` cases are compiled with every backend, `async`
//! and `r2d2` (this package's dependency on `outbox` enables them): compiler messages list the
//! connection types the enabled backends provide. Compiler output changes between
//! releases, so the tests only run on the toolchain pinned in `rust-toolchain.toml`; after
//! bumping it, re-bless with `TRYBUILD=overwrite cargo test -p outbox-ui-tests` and review every diff.

#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the .stderr files are pinned to rustc 1.95"
)]
#[test]
fn derive() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/derive/*.rs");
    t.pass("tests/ui/pass/*.rs");
}

#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the .stderr files are pinned to rustc 1.95"
)]
#[test]
fn idempotent() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/idempotent/*.rs");
    t.compile_fail("tests/ui/idempotent/async/*.rs");
    t.pass("tests/ui/pass-idempotent/*.rs");
}

#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the .stderr files are pinned to rustc 1.95"
)]
#[test]
fn test_attribute() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/test/*.rs");
    t.pass("tests/ui/pass-test/*.rs");
}
