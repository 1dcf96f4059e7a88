//! `#[idempotent]`: reads the options (`options.rs`) and the function's signature
//! (`signature.rs`), reports every mistake at once, and wraps the body in a transaction that
//! first claims the message in the inbox (`expand.rs`).
//!
//! The body stays in the function (in a closure, or an `async` block for an `async fn`) so that
//! its `return`, `?` and `.await` keep their meaning; the generated code around it calls
//! `__private::{begin, finish}` (or their async twins) in the runtime crate.

mod expand;
mod options;
mod signature;

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::Item;

use crate::ctxt::Ctxt;
use expand::generate;
use options::Options;
use signature::Signature;

/// `#[idempotent(...)]` on proc_macro2 tokens: the wrapped function, or every error found
/// together with the best code that still compiles (see [`generate`]).
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let options = Options::parse(&cx, args);
    let function = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(function)) => function,
        Ok(other) => {
            let (what, at) = describe(&other);
            cx.error_spanned_by(
                at,
                format!(
                    "`#[idempotent]` applies to a function that takes a Diesel connection and an \
                     `Envelope`, not to {what}"
                ),
            );
            return original_with_errors(item, cx);
        }
        Err(err) => {
            cx.syn_error(err);
            return original_with_errors(item, cx);
        }
    };
    let signature = Signature::read(&cx, &function);
    match (cx.check(), signature) {
        (Ok(()), Some(signature)) => generate(&options, &function, &signature),
        // Only the options were wrong: the function is still generated (with placeholders for
        // what was wrong), so that its callers and its body report nothing more.
        (Err(err), Some(signature)) => {
            let mut out = generate(&options, &function, &signature);
            out.extend(err.into_compile_error());
            out
        }
        (Err(err), None) => {
            // The function as written (minus a `const` that was reported), so that its body's
            // own errors are reported, and nothing about the attribute twice.
            let mut function = function;
            function.sig.constness = None;
            let mut out = function.into_token_stream();
            out.extend(err.into_compile_error());
            out
        }
        (Ok(()), None) => unreachable!("a signature that cannot be wrapped is reported"),
    }
}

fn original_with_errors(item: TokenStream, cx: Ctxt) -> TokenStream {
    let errors = cx.check().err().map(syn::Error::into_compile_error);
    quote!(#item #errors)
}

/// What an item is, and the token to point at, for the "not a function" message.
fn describe(item: &Item) -> (&'static str, TokenStream) {
    match item {
        Item::Struct(i) => ("a struct", i.struct_token.into_token_stream()),
        Item::Enum(i) => ("an enum", i.enum_token.into_token_stream()),
        Item::Union(i) => ("a union", i.union_token.into_token_stream()),
        Item::Impl(i) => ("an impl block", i.impl_token.into_token_stream()),
        Item::Trait(i) => ("a trait", i.trait_token.into_token_stream()),
        Item::Mod(i) => ("a module", i.mod_token.into_token_stream()),
        Item::Const(i) => ("a const", i.const_token.into_token_stream()),
        Item::Static(i) => ("a static", i.static_token.into_token_stream()),
        Item::Type(i) => ("a type alias", i.type_token.into_token_stream()),
        Item::Use(i) => ("a use declaration", i.use_token.into_token_stream()),
        Item::Macro(i) => ("a macro", i.mac.path.to_token_stream()),
        other => ("this item", other.to_token_stream()),
    }
}
