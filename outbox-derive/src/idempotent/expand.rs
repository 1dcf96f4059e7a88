//! The wrapped function `#[idempotent]` generates.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{
    FnArg, GenericArgument, Ident, ItemFn, LitStr, Pat, PatIdent, Path, PathArguments, ReturnType,
    Type, parse_quote,
};

use super::options::Options;
use super::signature::Signature;
use crate::expand::{first_last_span, respan};

/// `Span::mixed_site()` located at `span`: generated locals stay invisible to the user's code,
/// while errors point at the user's tokens.
fn at(span: Span) -> Span {
    Span::mixed_site().located_at(span)
}

pub(super) fn generate(options: &Options, function: &ItemFn, signature: &Signature) -> TokenStream {
    let krate: Path = options
        .krate
        .value()
        .cloned()
        .unwrap_or_else(|| parse_quote!(::outbox));
    let private = quote!(#krate::__private);
    let consumer = options
        .consumer
        .value()
        .cloned()
        .unwrap_or_else(|| LitStr::new("", Span::call_site()));
    let is_async = function.sig.asyncness.is_some();

    let here = Span::mixed_site();
    let conn = Ident::new("__outbox_conn", here);
    let envelope = Ident::new("__outbox_envelope", here);
    let key = Ident::new("__outbox_key", here);
    let begun = Ident::new("__outbox_begun", here);
    let body = Ident::new("__outbox_body", here);
    let tx = Ident::new("__outbox_tx", here);

    // The signature, with the connection and the envelope renamed and `Outcome` in the
    // return type. The user's patterns are bound again inside the body.
    let mut sig = function.sig.clone();
    let mut user_conn = None;
    let mut user_envelope = None;
    for (index, arg) in sig.inputs.iter_mut().enumerate() {
        let FnArg::Typed(param) = arg else { continue };
        let name = if index == signature.conn.index {
            &conn
        } else if index == signature.envelope {
            &envelope
        } else {
            continue;
        };
        let pat = std::mem::replace(
            &mut *param.pat,
            Pat::Ident(PatIdent {
                attrs: Vec::new(),
                by_ref: None,
                mutability: None,
                ident: name.clone(),
                subpat: None,
            }),
        );
        let attrs = std::mem::take(&mut param.attrs);
        let binding = quote!(#(#attrs)* let #pat = );
        if index == signature.conn.index {
            user_conn = Some(binding);
        } else {
            user_envelope = Some(binding);
        }
    }
    let output = &signature.output;
    let mut rewritten = output.clone();
    if let Type::Path(p) = &mut rewritten
        && let Some(last) = p.path.segments.last_mut()
        && let PathArguments::AngleBracketed(args) = &mut last.arguments
        && let Some(GenericArgument::Type(ok)) = args.args.first_mut()
    {
        *ok = parse_quote!(#private::Outcome<#ok>);
    }
    sig.output = ReturnType::Type(Default::default(), Box::new(rewritten));

    let key_expr = match options.key.value() {
        Some(expr) => {
            let loc = at(first_last_span(expr).0);
            let private = respan(private.clone(), loc);
            quote_spanned!(loc=> #private::key_of(&#envelope, #expr))
        }
        None => quote!(#private::default_key(&#envelope)),
    };
    let conn_at = at(first_last_span(&signature.conn.ty).0);
    let output_at = at(first_last_span(output).0);
    // The calls whose bounds check the user's types are located at those types, every token
    // of them, so that an error points there rather than at the attribute. (Locals keep their
    // mixed-site hygiene: `at` only moves the location.)
    let (begin, finish) = if is_async {
        ("begin_async", "finish_async")
    } else {
        ("begin", "finish")
    };
    let (begin, finish) = (Ident::new(begin, here), Ident::new(finish, here));
    let begin_call = respan(
        quote!(#private::#begin(&mut *#conn, #consumer, &#key)),
        conn_at,
    );
    let finish_call = respan(quote!(#private::#finish(#conn, #begun, #body)), output_at);
    let dot_await = is_async.then(|| quote!(.await));

    let stmts = &function.block.stmts;
    let run_body = if is_async {
        quote! {
            async move {
                #user_conn #tx;
                #user_envelope #envelope;
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::let_with_type_underscore,
                    clippy::unreachable
                )]
                if false {
                    let __outbox_fake_return: #output = loop {};
                    return __outbox_fake_return;
                }
                #(#stmts)*
            }
            .await
        }
    } else {
        quote! {
            #[allow(clippy::redundant_closure_call)]
            (move || -> #output {
                #user_conn #tx;
                #user_envelope #envelope;
                #(#stmts)*
            })()
        }
    };

    let attrs = &function.attrs;
    let vis = &function.vis;
    quote! {
        #(#attrs)*
        #vis #sig {
            let #key: ::std::string::String = #key_expr;
            let #begun = #begin_call #dot_await;
            let #body = if #begun.is_claimed() {
                let #tx = &mut *#conn;
                ::core::option::Option::Some(#run_body)
            } else {
                ::core::option::Option::None
            };
            #finish_call #dot_await
        }
    }
}
