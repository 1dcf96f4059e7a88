//! What `#[idempotent]` needs of the function's signature: the connection, the `Envelope`,
//! and a `Result` to return; every reason it cannot be wrapped is reported.

use quote::ToTokens;
use syn::{FnArg, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Type};

use crate::ctxt::Ctxt;

/// One parameter of the function: its position and its type.
pub(super) struct Param {
    pub(super) index: usize,
    pub(super) ty: Type,
}

/// What the wrapping needs of the function's signature.
pub(super) struct Signature {
    pub(super) conn: Param,
    /// The position of the `Envelope` parameter.
    pub(super) envelope: usize,
    /// The function's `Result` type, as the body returns it.
    pub(super) output: Type,
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

/// Whether `found` (the parameters of one kind) holds exactly one; otherwise reports `none`
/// at the parameter list, or `more(name of the first)` at each further one.
fn exactly_one(
    cx: &Ctxt,
    found: &[(usize, &syn::PatType)],
    params: proc_macro2::Span,
    none: &str,
    more: impl Fn(&str) -> String,
) -> bool {
    match found {
        [] => {
            cx.syn_error(syn::Error::new(params, none));
            false
        }
        [_] => true,
        [(_, first), rest @ ..] => {
            let first = pattern_name(&first.pat);
            for (_, extra) in rest {
                cx.error_spanned_by(&extra.ty, more(&first));
            }
            false
        }
    }
}

impl Signature {
    /// Reads the signature, reporting every reason it cannot be wrapped; `None` if there is
    /// one.
    pub(super) fn read(cx: &Ctxt, function: &ItemFn) -> Option<Signature> {
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
        ok &= exactly_one(
            cx,
            &conns,
            params,
            "an `#[idempotent]` function takes a Diesel connection, e.g. \
             `conn: &mut PgConnection`: none of its parameters is a `&mut` reference",
            |first| {
                format!(
                    "only one parameter of an `#[idempotent]` function can be a `&mut` \
                     reference: it is the Diesel connection, and `{first}` already is one"
                )
            },
        );
        ok &= exactly_one(
            cx,
            &envelopes,
            params,
            "an `#[idempotent]` function takes the message as an `Envelope<E>`, e.g. \
             `event: Envelope<OrderCreated>`: none of its parameters is one",
            |first| {
                format!(
                    "an `#[idempotent]` function handles one message: `{first}` is already \
                     its `Envelope`"
                )
            },
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

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
}
