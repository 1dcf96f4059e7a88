//! Procedural macros of [`outbox`](https://docs.rs/outbox). Do not depend on this crate
//! directly: use `outbox`, which re-exports them.

mod ast;
mod attr;
mod ctxt;
mod expand;
mod fallback;
mod valid;
mod value;

use proc_macro::TokenStream;

/// Implements `OutboxEvent` (docs to come).
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    expand::derive(input.into()).into()
}
