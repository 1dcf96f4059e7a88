//! `#[idempotent]`: reads the options and the function's signature, reports every mistake at
//! once, and wraps the body in a transaction that first claims the message in the inbox.
//!
//! The body stays in the function (in a closure, or an `async` block for an `async fn`) so that
//! its `return`, `?` and `.await` keep their meaning; the generated code around it calls
//! `__private::{begin, finish}` (or their async twins) in the runtime crate.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{
    Expr, ExprLit, FnArg, GenericArgument, Ident, Item, ItemFn, Lit, LitStr, Pat, PatIdent, Path,
    PathArguments, ReturnType, Type, parse_quote,
};

use crate::attr::looks_like;
use crate::ctxt::Ctxt;
use crate::expand::{first_last_span, respan};
use crate::value::{crate_value, found, named_expr_value, take_rest};

const OPTIONS: [&str; 3] = ["consumer", "key", "crate"];

/// The longest consumer name the inbox stores (a `VARCHAR(255)` on MySQL).
const MAX_CONSUMER_CHARS: usize = 255;

/// `#[idempotent(...)]` on proc_macro2 tokens: the wrapped function, or every error found
/// together with the best code that still compiles (see [`expand`]).
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

/// The options, with `None` where an option was missing or invalid (and reported).
struct Options {
    consumer: Option<LitStr>,
    key: Option<Expr>,
    krate: Option<Path>,
}

impl Options {
    fn parse(cx: &Ctxt, args: TokenStream) -> Options {
        let mut options = Options {
            consumer: None,
            key: None,
            krate: None,
        };
        let mut seen: Vec<&'static str> = Vec::new();
        let parser = syn::meta::parser(|meta| {
            let Some(name) = OPTIONS.into_iter().find(|o| meta.path.is_ident(o)) else {
                cx.error_spanned_by(&meta.path, unknown_option_message(&meta.path));
                return take_rest(&meta).map(drop);
            };
            let duplicate = seen.contains(&name);
            if duplicate {
                cx.error_spanned_by(&meta.path, format!("duplicate idempotent option `{name}`"));
            }
            seen.push(name);
            match name {
                "consumer" => {
                    let value = consumer_value(cx, &meta)?;
                    if !duplicate {
                        options.consumer = value;
                    }
                }
                "key" => {
                    let value = key_value(cx, &meta)?;
                    if !duplicate {
                        options.key = value;
                    }
                }
                _ => {
                    let value = crate_value(cx, &meta)?;
                    if !duplicate {
                        options.krate = value;
                    }
                }
            }
            Ok(())
        });
        if let Err(err) = parser.parse2(args) {
            cx.syn_error(err);
        }
        if !seen.contains(&"consumer") {
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
    let value = lit.value();
    let problem = if value.is_empty() {
        Some("`consumer` must not be empty".to_owned())
    } else if value.trim() != value {
        Some("`consumer` must not start or end with whitespace".to_owned())
    } else if value.chars().any(char::is_control) {
        Some("`consumer` must not contain control characters".to_owned())
    } else if value.chars().count() > MAX_CONSUMER_CHARS {
        Some(format!(
            "`consumer` is {} characters long, the inbox stores at most {MAX_CONSUMER_CHARS}",
            value.chars().count()
        ))
    } else {
        None
    };
    match problem {
        Some(msg) => {
            cx.error_spanned_by(&lit, msg);
            Ok(None)
        }
        None => Ok(Some(lit)),
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

/// One parameter of the function: its position and its type.
struct Param {
    index: usize,
    ty: Type,
}

/// What the wrapping needs of the function's signature.
struct Signature {
    conn: Param,
    /// The position of the `Envelope` parameter.
    envelope: usize,
    /// The function's `Result` type, as the body returns it.
    output: Type,
}

enum Kind {
    Connection,
    Envelope,
    /// `&Envelope<E>` or `&mut Envelope<E>`: reported.
    EnvelopeByReference,
    Other,
}

fn kind(ty: &Type) -> Kind {
    match ty {
        Type::Group(g) => kind(&g.elem),
        Type::Paren(p) => kind(&p.elem),
        Type::Reference(r) if is_envelope(&r.elem) => Kind::EnvelopeByReference,
        Type::Reference(r) if r.mutability.is_some() => Kind::Connection,
        _ if is_envelope(ty) => Kind::Envelope,
        _ => Kind::Other,
    }
}

fn is_envelope(ty: &Type) -> bool {
    match ty {
        Type::Group(g) => is_envelope(&g.elem),
        Type::Paren(p) => is_envelope(&p.elem),
        Type::Path(p) => {
            p.qself.is_none()
                && p.path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "Envelope")
        }
        _ => false,
    }
}

/// The first type argument of a type that is a `Result` (by the last segment of its name:
/// `Result<T, E>`, `io::Result<T>`, `QueryResult<T>`, `anyhow::Result<T>`).
fn result_ok_type(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ty else { return None };
    if p.qself.is_some() {
        return None;
    }
    let last = p.path.segments.last()?;
    if !last.ident.to_string().ends_with("Result") {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(ok) => Some(ok),
        _ => None,
    }
}

impl Signature {
    /// Reads the signature, reporting every reason it cannot be wrapped; `None` if there is
    /// one.
    fn read(cx: &Ctxt, function: &ItemFn) -> Option<Signature> {
        let sig = &function.sig;
        let mut ok = true;
        if let Some(constness) = &sig.constness {
            cx.error_spanned_by(
                constness,
                "`#[idempotent]` cannot wrap a `const fn`: it runs a database transaction",
            );
            ok = false;
        }
        let mut conns: Vec<(usize, &syn::PatType)> = Vec::new();
        let mut envelopes: Vec<(usize, &syn::PatType)> = Vec::new();
        for (index, arg) in sig.inputs.iter().enumerate() {
            let FnArg::Typed(param) = arg else { continue };
            match kind(&param.ty) {
                Kind::Connection => conns.push((index, param)),
                Kind::Envelope => envelopes.push((index, param)),
                Kind::EnvelopeByReference => {
                    cx.error_spanned_by(
                        &param.ty,
                        "take the `Envelope` by value: `#[idempotent]` passes each message to \
                         the function once",
                    );
                    ok = false;
                }
                Kind::Other => {}
            }
        }
        let params = sig.paren_token.span.join();
        match conns.as_slice() {
            [] => {
                cx.syn_error(syn::Error::new(
                    params,
                    "an `#[idempotent]` function takes a Diesel connection, e.g. \
                     `conn: &mut PgConnection`: none of its parameters is a `&mut` reference",
                ));
                ok = false;
            }
            [_] => {}
            [(_, first), rest @ ..] => {
                for (_, extra) in rest {
                    cx.error_spanned_by(
                        &extra.ty,
                        format!(
                            "only one parameter of an `#[idempotent]` function can be a `&mut` \
                             reference: it is the Diesel connection, and `{}` already is one",
                            pattern_name(&first.pat)
                        ),
                    );
                }
                ok = false;
            }
        }
        match envelopes.as_slice() {
            [] => {
                cx.syn_error(syn::Error::new(
                    params,
                    "an `#[idempotent]` function takes the message as an `Envelope<E>`, e.g. \
                     `event: Envelope<OrderCreated>`: none of its parameters is one",
                ));
                ok = false;
            }
            [_] => {}
            [(_, first), rest @ ..] => {
                for (_, extra) in rest {
                    cx.error_spanned_by(
                        &extra.ty,
                        format!(
                            "an `#[idempotent]` function handles one message: `{}` is already \
                             its `Envelope`",
                            pattern_name(&first.pat)
                        ),
                    );
                }
                ok = false;
            }
        }
        let output =
            match &sig.output {
                ReturnType::Default => {
                    cx.error_spanned_by(
                        &sig.ident,
                        "an `#[idempotent]` function returns a `Result`: `Ok` commits the effect \
                     with the inbox row, `Err` rolls both back; add e.g. \
                     `-> Result<(), diesel::result::Error>`",
                    );
                    None
                }
                ReturnType::Type(_, ty) if result_ok_type(ty).is_some() => Some((**ty).clone()),
                ReturnType::Type(_, ty) => {
                    cx.error_spanned_by(
                    ty,
                    format!(
                        "an `#[idempotent]` function returns a `Result`, not `{}`: `Ok` commits \
                         the effect with the inbox row, `Err` rolls both back",
                        ty.to_token_stream().to_string().replace(" < ", "<").replace(" >", ">")
                    ),
                );
                    None
                }
            };
        match (ok, output, conns.as_slice(), envelopes.as_slice()) {
            (true, Some(output), [(ci, conn)], [(ei, _)]) => Some(Signature {
                conn: Param {
                    index: *ci,
                    ty: (*conn.ty).clone(),
                },
                envelope: *ei,
                output,
            }),
            _ => None,
        }
    }
}

fn pattern_name(pat: &Pat) -> String {
    match pat {
        Pat::Ident(p) => p.ident.to_string(),
        other => other.to_token_stream().to_string(),
    }
}

/// `Span::mixed_site()` located at `span`: generated locals stay invisible to the user's code,
/// while errors point at the user's tokens.
fn at(span: Span) -> Span {
    Span::mixed_site().located_at(span)
}

fn generate(options: &Options, function: &ItemFn, signature: &Signature) -> TokenStream {
    let krate: Path = options
        .krate
        .clone()
        .unwrap_or_else(|| parse_quote!(::outbox));
    let private = quote!(#krate::__private);
    let consumer = options
        .consumer
        .clone()
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

    let key_expr = match &options.key {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_types_are_recognised_by_name() {
        let ok = |ty: Type| result_ok_type(&ty).map(|t| t.to_token_stream().to_string());
        assert_eq!(ok(parse_quote!(Result<u8, E>)).as_deref(), Some("u8"));
        assert_eq!(
            ok(parse_quote!(diesel::QueryResult<()>)).as_deref(),
            Some("()")
        );
        assert_eq!(
            ok(parse_quote!(::std::io::Result<Vec<u8>>)).as_deref(),
            Some("Vec < u8 >")
        );
        assert_eq!(ok(parse_quote!(Option<u8>)), None);
        assert_eq!(ok(parse_quote!(Result)), None);
        assert_eq!(ok(parse_quote!(<T as Tr>::Result<u8>)), None);
    }

    #[test]
    fn parameters_are_classified_by_type() {
        let k = |ty: Type| match kind(&ty) {
            Kind::Connection => "connection",
            Kind::Envelope => "envelope",
            Kind::EnvelopeByReference => "envelope by reference",
            Kind::Other => "other",
        };
        assert_eq!(k(parse_quote!(&mut PgConnection)), "connection");
        assert_eq!(k(parse_quote!(&'a mut impl Connection)), "connection");
        assert_eq!(k(parse_quote!(&PgConnection)), "other");
        assert_eq!(k(parse_quote!(outbox::Envelope<E>)), "envelope");
        assert_eq!(k(parse_quote!(&Envelope<E>)), "envelope by reference");
        assert_eq!(k(parse_quote!(&mut Envelope<E>)), "envelope by reference");
        assert_eq!(k(parse_quote!(Vec<Envelope<E>>)), "other");
    }

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
        assert_eq!(options.consumer.unwrap().value(), "billing");
        assert!(options.key.is_none());
    }
}
