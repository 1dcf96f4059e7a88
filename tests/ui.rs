//! Compile-fail and compile-pass tests of `#[derive(OutboxEvent)]`.
//!
//! `tests/ui/derive/` holds one scenario per file, each with the `.stderr` it must produce;
//! `tests/ui/pass/` holds inputs that must compile and run. Compiler output changes between
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
