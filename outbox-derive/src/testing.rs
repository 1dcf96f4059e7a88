//! `#[outbox::test]`: a test with a fresh database. Reads the options and the function's one
//! parameter, reports every mistake at once, and wraps the body in code that creates the
//! database, opens the connection or pool the parameter asks for, and drops the database
//! when the test ends (a local's drop, so also when it panics).

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{FnArg, Item, ItemFn, LitStr, Pat, Path, Type};

use crate::ctxt::Ctxt;

const OPTIONS: &str = "expected one of `migrations`, `env`, `crate`";

#[derive(Default)]
struct Options {
    migrations: Option<LitStr>,
    env: Option<LitStr>,
    krate: Option<Path>,
}

fn parse_options(cx: &Ctxt, args: TokenStream) -> Options {
    let mut options = Options::default();
    let parser = syn::meta::parser(|meta| {
        let name = meta
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        match name.as_str() {
            "migrations" | "env" => {
                let lit: LitStr = match meta.value()?.parse() {
                    Ok(lit) => lit,
                    Err(err) => {
                        cx.syn_error(syn::Error::new(
                            err.span(),
                            format!(
                                "`{name}` takes a string literal, e.g. `{name} = \"{}\"`",
                                example(&name)
                            ),
                        ));
                        return Ok(());
                    }
                };
                if lit.value().trim().is_empty() {
                    cx.error_spanned_by(&lit, format!("`{name}` must not be empty"));
                }
                let slot = if name == "env" {
                    &mut options.env
                } else {
                    &mut options.migrations
                };
                if slot.is_some() {
                    cx.error_spanned_by(&meta.path, format!("duplicate test option `{name}`"));
                }
                *slot = Some(lit);
            }
            "crate" => {
                let path: Path = meta.value()?.parse()?;
                if options.krate.is_some() {
                    cx.error_spanned_by(&meta.path, "duplicate test option `crate`");
                }
                options.krate = Some(path);
            }
            _ => {
                cx.error_spanned_by(
                    &meta.path,
                    format!(
                        "unknown test option `{}`, {OPTIONS}",
                        meta.path.to_token_stream()
                    ),
                );
                // Skip its value, if any, to read the options after it.
                if meta.input.peek(syn::Token![=]) {
                    let _: syn::Expr = meta.value()?.parse()?;
                }
            }
        }
        Ok(())
    });
    if let Err(err) = parser.parse2(args) {
        cx.syn_error(err);
    }
    options
}

fn example(name: &str) -> &'static str {
    if name == "env" {
        "MY_TEST_DATABASE_URL"
    } else {
        "migrations"
    }
}

/// How the test takes its connection.
enum Param {
    /// `conn: &mut T`
    Borrowed(Box<Pat>, Type),
    /// `pool: T`
    Owned(Box<Pat>, Type),
}

fn read_param(cx: &Ctxt, function: &ItemFn) -> Option<Param> {
    let sig = &function.sig;
    if let Some(c) = &sig.constness {
        cx.error_spanned_by(c, "a test cannot be a `const fn`");
    }
    if !sig.generics.params.is_empty() {
        cx.error_spanned_by(&sig.generics, "a test cannot be generic");
    }
    let mut inputs = sig.inputs.iter();
    let Some(first) = inputs.next() else {
        cx.error_spanned_by(
            &sig.ident,
            "`#[outbox::test]` gives the test its database: take the connection or pool as the \
             one parameter, e.g. `conn: &mut PgConnection`",
        );
        return None;
    };
    for extra in inputs {
        cx.error_spanned_by(
            extra,
            "`#[outbox::test]` takes one parameter, the connection or pool",
        );
    }
    let FnArg::Typed(arg) = first else {
        cx.error_spanned_by(first, "a test takes no `self`");
        return None;
    };
    match &*arg.ty {
        Type::Reference(r) if r.mutability.is_some() => {
            Some(Param::Borrowed(arg.pat.clone(), (*r.elem).clone()))
        }
        Type::Reference(r) => {
            cx.error_spanned_by(
                r.and_token,
                "take the connection as `&mut`: Diesel runs queries on `&mut` connections",
            );
            None
        }
        Type::ImplTrait(t) => {
            cx.error_spanned_by(t, "name the connection's type: the test opens one of it");
            None
        }
        ty => Some(Param::Owned(arg.pat.clone(), ty.clone())),
    }
}

/// `#[outbox::test(...)]` on proc_macro2 tokens.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let options = parse_options(&cx, args);
    let function = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(function)) => function,
        Ok(other) => {
            cx.syn_error(syn::Error::new(
                other_span(&other),
                "`#[outbox::test]` applies to a test function",
            ));
            let mut out = item;
            out.extend(cx.check().err().map(syn::Error::into_compile_error));
            return out;
        }
        Err(err) => {
            cx.syn_error(err);
            let mut out = item;
            out.extend(cx.check().err().map(syn::Error::into_compile_error));
            return out;
        }
    };
    let param = read_param(&cx, &function);
    match (cx.check(), param) {
        (Ok(()), Some(param)) => generate(&options, &function, &param),
        (result, _) => {
            // The function as written, as a plain function: its body's own errors are still
            // reported (and its imports used), and nothing about the attribute twice.
            let mut out = TokenStream::new();
            if let Err(err) = result {
                out.extend(err.into_compile_error());
            }
            let mut function = function;
            function.sig.constness = None;
            out.extend(quote! {
                #[allow(dead_code)]
                #function
            });
            out
        }
    }
}

fn other_span(item: &Item) -> Span {
    match item {
        Item::Struct(s) => s.struct_token.span,
        Item::Enum(e) => e.enum_token.span,
        Item::Mod(m) => m.mod_token.span,
        Item::Const(c) => c.const_token.span,
        Item::Static(s) => s.static_token.span,
        other => other.span(),
    }
}

fn generate(options: &Options, function: &ItemFn, param: &Param) -> TokenStream {
    let krate = options
        .krate
        .as_ref()
        .map(ToTokens::to_token_stream)
        .unwrap_or_else(|| quote!(::outbox));
    let private = quote!(#krate::testing::__private);
    let env = match &options.env {
        Some(lit) => quote!(::core::option::Option::Some(#lit)),
        None => quote!(::core::option::Option::None),
    };
    let migrations = match &options.migrations {
        Some(lit) => quote!(::core::option::Option::Some(::core::concat!(
            ::core::env!("CARGO_MANIFEST_DIR"),
            "/",
            #lit
        ))),
        None => quote!(::core::option::Option::None),
    };
    let attrs = &function.attrs;
    let vis = &function.vis;
    let ident = &function.sig.ident;
    let output = &function.sig.output;
    let body = &function.block;
    let (pat, ty, bind) = match param {
        Param::Borrowed(pat, ty) => (pat, ty, quote!(&mut __outbox_conn)),
        Param::Owned(pat, ty) => (pat, ty, quote!(__outbox_conn)),
    };
    let arg_ty = match param {
        Param::Borrowed(..) => quote!(&mut #ty),
        Param::Owned(..) => quote!(#ty),
    };
    // The database and the connection are made by a function beside the test, which is not
    // stripped with it outside `cfg(test)`, so that a type the kit cannot open is reported
    // (once, at the type) in every build.
    let ty_span = ty.span();
    let setup = quote::format_ident!("__outbox_test_setup_{}", ident);
    let db_ty = quote!(#krate::testing::TestDatabase);
    if function.sig.asyncness.is_some() {
        let call = quote_spanned!(ty_span=> #private::async_setup::<#ty>);
        quote! {
            #[doc(hidden)]
            #[allow(dead_code, non_snake_case)]
            fn #setup() -> ::std::pin::Pin<
                ::std::boxed::Box<dyn ::core::future::Future<Output = (#db_ty, #ty)>>,
            > {
                #call(#env, #migrations)
            }
            #(#attrs)*
            #[::core::prelude::v1::test]
            #vis fn #ident() #output {
                let __outbox_runtime = #private::runtime();
                // Dropped when the test ends, also when it panics: the database goes with it.
                let (__outbox_db, __outbox_conn) = __outbox_runtime.block_on(#setup());
                __outbox_runtime.block_on(async move {
                    #[allow(unused_mut)]
                    let mut __outbox_conn = __outbox_conn;
                    #[allow(unused_mut)]
                    let #pat: #arg_ty = #bind;
                    #body
                })
            }
        }
    } else {
        let call = quote_spanned!(ty_span=> #private::sync_setup::<#ty>);
        quote! {
            #[doc(hidden)]
            #[allow(dead_code, non_snake_case)]
            fn #setup() -> (#db_ty, #ty) {
                #call(#env, #migrations)
            }
            #(#attrs)*
            #[::core::prelude::v1::test]
            #vis fn #ident() #output {
                // Dropped when the test ends, also when it panics: the database goes with it
                // (the connection first).
                #[allow(unused_mut)]
                let (__outbox_db, mut __outbox_conn) = #setup();
                #[allow(unused_mut)]
                let #pat: #arg_ty = #bind;
                #body
            }
        }
    }
}
