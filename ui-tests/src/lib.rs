//! Compile-fail and compile-pass tests of `#[derive(OutboxEvent)]` and `#[idempotent]`: see
//! `tests/ui.rs`. No library code: the package exists so that trybuild's second build compiles
//! only what the cases need (see Cargo.toml).
