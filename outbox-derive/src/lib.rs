//! Procedural macros of `outbox` (being written).
use proc_macro::TokenStream;

/// `#[derive(OutboxEvent)]` (being written).
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(_input: TokenStream) -> TokenStream {
    "compile_error!(\"OutboxEvent derive is being written\");".parse().unwrap()
}
