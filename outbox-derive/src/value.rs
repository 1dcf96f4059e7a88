//! Reads the value after a key: `= "a string"`, `= 2`, `= some::path`, reporting a value of
//! the wrong kind and skipping what cannot be read so that parsing goes on with the next key.

use proc_macro2::{TokenStream, TokenTree};
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::{Expr, ExprLit, ExprUnary, Lit, LitInt, LitStr, Path, Token, UnOp};

use crate::attr::Key;
use crate::ctxt::Ctxt;
use crate::valid;

/// Consumes whatever follows a key up to the next top-level comma, so that parsing goes on
/// with the next key after a mistake.
pub(crate) fn take_rest(meta: &ParseNestedMeta) -> syn::Result<TokenStream> {
    meta.input.step(|cursor| {
        let mut rest = *cursor;
        let mut taken = TokenStream::new();
        while let Some((tt, next)) = rest.token_tree() {
            if matches!(&tt, TokenTree::Punct(p) if p.as_char() == ',') {
                break;
            }
            taken.extend([tt]);
            rest = next;
        }
        Ok((taken, rest))
    })
}

/// `= <expr>` after a key; reports a key written without a value.
fn expr_value(cx: &Ctxt, meta: &ParseNestedMeta, key: Key) -> syn::Result<Option<Expr>> {
    named_expr_value(cx, meta, key.name(), key.example())
}

/// `= <expr>` after the key `name`; reports a key written without a value, with `example` of
/// one written right.
pub(crate) fn named_expr_value(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    name: &str,
    example: &str,
) -> syn::Result<Option<Expr>> {
    if !meta.input.peek(Token![=]) {
        let (path, rest) = (&meta.path, take_rest(meta)?);
        let msg = format!("`{name}` needs a value, e.g. `{example}`");
        cx.error_spanned_by(quote!(#path #rest), msg);
        return Ok(None);
    }
    meta.input.parse::<Token![=]>()?;
    let mut expr: Expr = meta.input.parse()?;
    // A value passed through a `macro_rules!` `$x:expr` arrives wrapped in an invisible group.
    while let Expr::Group(group) = expr {
        expr = *group.expr;
    }
    Ok(Some(expr))
}

/// What `expr` is, for messages.
pub(crate) fn found(expr: &Expr) -> &'static str {
    match expr {
        Expr::Lit(ExprLit { lit, .. }) => match lit {
            Lit::Str(_) => "a string",
            Lit::Int(_) => "an integer",
            Lit::Float(_) => "a float",
            Lit::Bool(_) => "a boolean",
            Lit::Char(_) => "a character",
            Lit::Byte(_) => "a byte",
            Lit::ByteStr(_) => "a byte string",
            Lit::CStr(_) => "a C string",
            _ => "a literal",
        },
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => "a negative number",
        Expr::Path(_) => "a path",
        _ => "an expression",
    }
}

pub(crate) fn string_value(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    key: Key,
) -> syn::Result<Option<LitStr>> {
    Ok(expr_value(cx, meta, key)?.and_then(|expr| match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit),
        other => {
            let (name, example) = (key.name(), key.example());
            let msg = format!(
                "expected a string literal for `{name}`, found {}, e.g. `{example}`",
                found(&other)
            );
            cx.error_spanned_by(&other, msg);
            None
        }
    }))
}

pub(crate) fn version_value(cx: &Ctxt, meta: &ParseNestedMeta) -> syn::Result<Option<u32>> {
    let Some(expr) = expr_value(cx, meta, Key::Version)? else {
        return Ok(None);
    };
    let msg = match &expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => return Ok(int_version(cx, lit)),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => match lit.value().trim().parse::<u64>() {
            Ok(n) => format!(
                "expected an integer for `version`, found a string, write `version = {n}` without quotes"
            ),
            Err(_) => {
                "expected an integer for `version`, found a string, e.g. `version = 2`".to_owned()
            }
        },
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => valid::VERSION_AT_LEAST_1.to_owned(),
        other => format!(
            "expected an integer for `version`, found {}, e.g. `version = 2`",
            found(other)
        ),
    };
    cx.error_spanned_by(&expr, msg);
    Ok(None)
}

fn int_version(cx: &Ctxt, lit: &LitInt) -> Option<u32> {
    let suffix = lit.suffix();
    let result = match suffix {
        "" | "u8" | "u16" | "u32" | "u64" | "u128" | "i8" | "i16" | "i32" | "i64" | "i128" => {
            valid::version(lit.base10_digits())
        }
        _ => Err(format!(
            "`version` must be a plain integer, found the suffix `{suffix}`"
        )),
    };
    result.map_err(|msg| cx.error_spanned_by(lit, msg)).ok()
}

/// `crate = some::path` or `crate = "some::path"`.
pub(crate) fn crate_value(cx: &Ctxt, meta: &ParseNestedMeta) -> syn::Result<Option<Path>> {
    if !meta.input.peek(Token![=]) {
        return expr_value(cx, meta, Key::Crate).map(|_| None);
    }
    let value = meta.value()?;
    if value.peek(LitStr) {
        let lit: LitStr = value.parse()?;
        let path = lit.parse::<Path>().ok();
        if path.is_none() {
            let msg = format!(
                "`crate` must name a path, e.g. `crate = outbox_core`, found `{}`",
                lit.value()
            );
            cx.error_spanned_by(&lit, msg);
        }
        return Ok(path);
    }
    if value.peek(Lit) {
        let lit: Lit = value.parse()?;
        cx.error_spanned_by(&lit, "`crate` must name a path, e.g. `crate = outbox_core`");
        return Ok(None);
    }
    Ok(Some(value.call(Path::parse_mod_style)?))
}

/// `key = SomeType` (a type path such as `OrderCreatedV1` or `v1::OrderCreated`).
pub(crate) fn type_path_value(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    key: Key,
) -> syn::Result<Option<Path>> {
    let Some(expr) = expr_value(cx, meta, key)? else {
        return Ok(None);
    };
    let (name, example) = (key.name(), key.example());
    let msg = match &expr {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => {
            return Ok(Some(p.path.clone()));
        }
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) if lit.parse::<Path>().is_ok() => format!(
            "expected a type for `{name}`, found a string, write `{name} = {}` without quotes",
            lit.value().trim()
        ),
        other => format!(
            "expected a type for `{name}`, found {}, e.g. `{example}`",
            found(other)
        ),
    };
    cx.error_spanned_by(&expr, msg);
    Ok(None)
}
