//! `#[idempotent(...)]`'s options: `consumer`, `key` and `crate`, each read once, every
//! mistake reported.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Expr, ExprLit, Lit, LitStr, Path};

use crate::attr::{Slot, looks_like};
use crate::ctxt::Ctxt;
use crate::valid;
use crate::value::{crate_value, found, named_expr_value, take_rest};

const OPTIONS: [&str; 3] = ["consumer", "key", "crate"];

/// The options; a slot without a value where an option was missing or invalid (and
/// reported).
#[derive(Default)]
pub(super) struct Options {
    pub(super) consumer: Slot<LitStr>,
    pub(super) key: Slot<Expr>,
    pub(super) krate: Slot<Path>,
}

impl Options {
    pub(super) fn parse(cx: &Ctxt, args: TokenStream) -> Options {
        let mut options = Options::default();
        let parser = syn::meta::parser(|meta| {
            let Some(name) = OPTIONS.into_iter().find(|o| meta.path.is_ident(o)) else {
                cx.error_spanned_by(&meta.path, unknown_option_message(&meta.path));
                return take_rest(&meta).map(drop);
            };
            let what = format!("idempotent option `{name}`");
            match name {
                "consumer" => options
                    .consumer
                    .read(cx, &meta.path, &what, || consumer_value(cx, &meta)),
                "key" => options
                    .key
                    .read(cx, &meta.path, &what, || key_value(cx, &meta)),
                _ => options
                    .krate
                    .read(cx, &meta.path, &what, || crate_value(cx, &meta)),
            }
        });
        if let Err(err) = parser.parse2(args) {
            cx.syn_error(err);
        }
        if !options.consumer.seen() {
            cx.syn_error(syn::Error::new(
                Span::call_site(),
                "missing `consumer = \"...\"`: name the consumer, e.g. \
                 `#[idempotent(consumer = \"billing\")]`; the inbox remembers what each consumer \
                 applied under this name, so it must not change when the function is renamed \
                 or moved",
            ));
        }
        options
    }
}

fn unknown_option_message(path: &Path) -> String {
    let name = path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::");
    let hint = match OPTIONS.iter().find(|o| looks_like(&name, o)) {
        Some(o) => format!("; did you mean `{o}`?"),
        None => String::new(),
    };
    format!("unknown idempotent option `{name}`, expected one of `consumer`, `key`, `crate`{hint}")
}

fn consumer_value(cx: &Ctxt, meta: &ParseNestedMeta) -> syn::Result<Option<LitStr>> {
    let Some(expr) = named_expr_value(cx, meta, "consumer", "consumer = \"billing\"")? else {
        return Ok(None);
    };
    let Expr::Lit(ExprLit {
        lit: Lit::Str(lit), ..
    }) = expr
    else {
        let msg = format!(
            "expected a string literal for `consumer`, found {}, e.g. `consumer = \"billing\"`",
            found(&expr)
        );
        cx.error_spanned_by(&expr, msg);
        return Ok(None);
    };
    match valid::consumer(&lit.value()) {
        Err(msg) => {
            cx.error_spanned_by(&lit, msg);
            Ok(None)
        }
        Ok(()) => Ok(Some(lit)),
    }
}

const KEY_EXAMPLE: &str = "key = |e| e.order_id";

fn key_value(cx: &Ctxt, meta: &ParseNestedMeta) -> syn::Result<Option<Expr>> {
    let Some(expr) = named_expr_value(cx, meta, "key", KEY_EXAMPLE)? else {
        return Ok(None);
    };
    let problem = match &expr {
        Expr::Closure(closure) if closure.asyncness.is_some() => Some((
            closure.asyncness.to_token_stream(),
            "a `key` closure computes the key at once, it cannot be `async`".to_owned(),
        )),
        Expr::Closure(closure) if closure.inputs.len() != 1 => Some((
            {
                let (or1, or2) = (&closure.or1_token, &closure.or2_token);
                let inputs = &closure.inputs;
                quote!(#or1 #inputs #or2)
            },
            format!(
                "a `key` closure takes one argument, the `&Envelope`, found {}: e.g. \
                 `{KEY_EXAMPLE}`",
                closure.inputs.len()
            ),
        )),
        Expr::Lit(ExprLit { lit, .. }) => Some((
            lit.to_token_stream(),
            format!(
                "`key` takes a closure or the path of a function from `&Envelope<E>` to the \
                 key, found {}: e.g. `{KEY_EXAMPLE}` (the key is anything that implements \
                 `Display`)",
                found(&expr)
            ),
        )),
        _ => None,
    };
    match problem {
        Some((at, msg)) => {
            cx.error_spanned_by(at, msg);
            Ok(None)
        }
        None => Ok(Some(expr)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_mistakes_are_all_reported() {
        let cx = Ctxt::new();
        let options = Options::parse(
            &cx,
            quote!(consumer = "billing", consumer = "x", key = 1, keys = 2),
        );
        let errors: Vec<String> = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert_eq!(errors[0], "duplicate idempotent option `consumer`");
        assert!(errors[1].starts_with("`key` takes a closure"), "{errors:?}");
        assert!(errors[2].ends_with("did you mean `key`?"), "{errors:?}");
        assert_eq!(options.consumer.value().unwrap().value(), "billing");
        assert!(options.key.value().is_none());
    }
}
