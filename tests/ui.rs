//! Compile-fail and compile-pass tests of `#[derive(OutboxEvent)]` and `#[idempotent]`.
//!
//! `tests/ui/derive/` and `tests/ui/idempotent/` hold one scenario per file, each with the
//! `.stderr` it must produce; `tests/ui/pass/` and `tests/ui/pass-idempotent/` hold inputs that
//! must compile and run. The `#[idempotent]` cases need every backend and `async`
//! (`--all-features`, as the test command runs them): compiler messages list the connection
//! types the enabled backends provide. Compiler output changes between
//! releases, so the tests only run on the toolchain pinned in `rust-toolchain.toml`; after
//! bumping it, re-bless with `TRYBUILD=overwrite cargo test --test ui` and review every diff.

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
#[cfg_attr(
    not(all(
        feature = "postgres",
        feature = "mysql",
        feature = "sqlite",
        feature = "async",
        feature = "r2d2"
    )),
    ignore = "needs --all-features"
)]
#[test]
fn idempotent() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/idempotent/*.rs");
    t.compile_fail("tests/ui/idempotent/async/*.rs");
    t.pass("tests/ui/pass-idempotent/*.rs");
}
