//! Generates the `OutboxEvent` impl from a checked [`Event`].

use proc_macro2::{Group, Literal, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::{DeriveInput, GenericParam, Generics, LitStr, Type, parse_quote};

use crate::ast::{Event, EventDef, Key};
use crate::ctxt::Ctxt;
use crate::{catalog, fallback};

/// `#[derive(OutboxEvent)]` on proc_macro2 tokens: the impl, or every error found together with
/// a fallback impl.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(err) => return err.into_compile_error(),
    };
    let cx = Ctxt::new();
    let event = Event::from_input(&cx, &input);
    match cx.check() {
        Ok(()) => expand(&event),
        Err(err) => fallback::expand(&event, &err),
    }
}

/// The impl of a valid input.
fn expand(event: &Event<'_>) -> TokenStream {
    let private = private(event);
    let ident = &event.input.ident;
    let generics = bounded_generics(event);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let aggregate = &event.aggregate;
    let descriptors = event.types.iter().map(|def| {
        let event_type = &def.event_type;
        let version = version(def);
        let topic = topic(&private, def.topic.as_ref());
        quote! {
            #private::EventType {
                aggregate_type: #aggregate,
                event_type: #event_type,
                version: #version,
                topic: #topic,
            }
        }
    });
    let body = |per_type: &dyn Fn(&EventDef<'_>) -> TokenStream| -> TokenStream {
        if !event.is_enum {
            return per_type(&event.types[0]);
        }
        let arms = event.types.iter().map(|def| {
            let variant = def.variant;
            let value = per_type(def);
            quote!(Self::#variant { .. } => #value,)
        });
        quote!(match self { #(#arms)* })
    };
    let event_type = body(&|def| def.event_type.to_token_stream());
    let event_version = body(&|def| version(def).into_token_stream());
    let topic = body(&|def| topic(&private, def.topic.as_ref()));
    let aggregate_id = aggregate_id(event, &private);
    let catalog_methods = catalog::methods(event);
    let catalog_items = catalog::items(event);
    quote! {
        #[automatically_derived]
        impl #impl_generics #private::OutboxEvent for #ident #ty_generics #where_clause {
            const AGGREGATE_TYPE: &'static ::core::primitive::str = #aggregate;
            const EVENT_TYPES: &'static [#private::EventType] = &[#(#descriptors),*];

            #[inline]
            fn aggregate_id(&self) -> #private::String {
                #aggregate_id
            }

            #[inline]
            fn event_type(&self) -> &'static ::core::primitive::str {
                #event_type
            }

            #[inline]
            fn event_version(&self) -> ::core::primitive::u32 {
                #event_version
            }

            #[inline]
            fn topic(&self) -> #private::Option<&'static ::core::primitive::str> {
                #topic
            }

            #catalog_methods
        }

        #catalog_items
    }
}

fn aggregate_id(event: &Event<'_>, private: &TokenStream) -> TokenStream {
    let binding = quote!(__outbox_id);
    if !event.is_enum {
        let key = event.types[0]
            .key
            .as_ref()
            .expect("checked: a struct has a key");
        let member = &key.member;
        let call = key_call(private, key.ty, &binding);
        return quote! {
            let #binding = &self.#member;
            #call
        };
    }
    let arms = event.types.iter().map(|def| {
        let variant = def.variant;
        let key: &Key<'_> = def.key.as_ref().expect("checked: every variant has a key");
        let member = &key.member;
        let call = key_call(private, key.ty, &binding);
        quote!(Self::#variant { #member: #binding, .. } => #call,)
    });
    quote!(match self { #(#arms)* })
}

/// `<Ty as AggregateKey>::to_key(binding)`, located at the field's type so that a type which
/// is no key is reported there, with `AggregateKey`'s own message.
pub(crate) fn key_call(private: &TokenStream, ty: &Type, binding: &TokenStream) -> TokenStream {
    let (first, last) = first_last_span(ty);
    let private = respan(private.clone(), first);
    let path = quote_spanned!(first=> <#ty as #private::AggregateKey>::to_key);
    let binding = respan(binding.clone(), last);
    quote_spanned!(last=> #path(#binding))
}

/// The spans of the first and the last token of `tokens`.
pub(crate) fn first_last_span(tokens: &impl ToTokens) -> (Span, Span) {
    let mut spans = tokens.to_token_stream().into_iter().map(|tt| tt.span());
    let first = spans.next().unwrap_or_else(Span::call_site);
    (first, spans.last().unwrap_or(first))
}

/// `tokens` with every span, groups included, set to `span`.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Group(group) => {
                let mut new = Group::new(group.delimiter(), respan(group.stream(), span));
                new.set_span(span);
                TokenTree::Group(new)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

/// `<crate>::__private`.
pub(crate) fn private(event: &Event<'_>) -> TokenStream {
    let krate = &event.krate;
    quote!(#krate::__private)
}

fn version(def: &EventDef<'_>) -> Literal {
    Literal::u32_suffixed(def.version)
}

fn topic(private: &TokenStream, topic: Option<&LitStr>) -> TokenStream {
    match topic {
        Some(topic) => quote!(#private::Option::Some(#topic)),
        None => quote!(#private::Option::None),
    }
}

/// The input's generics, plus, when it has type parameters, the bounds the impl needs:
/// `Self: Serialize` (the supertrait) and `Ty: AggregateKey` for an id whose type mentions a
/// parameter.
pub(crate) fn bounded_generics(event: &Event<'_>) -> Generics {
    let mut generics = event.input.generics.clone();
    let params: Vec<_> = generics
        .params
        .iter()
        .filter_map(|param| match param {
            GenericParam::Type(ty) => Some(ty.ident.clone()),
            _ => None,
        })
        .collect();
    if params.is_empty() {
        return generics;
    }
    let private = private(event);
    let ident = &event.input.ident;
    let (_, ty_generics, _) = event.input.generics.split_for_impl();
    let where_clause = generics.make_where_clause();
    where_clause
        .predicates
        .push(parse_quote!(#ident #ty_generics: #private::Serialize));
    for field in &event.key_fields {
        if mentions(field.ty.to_token_stream(), &params) {
            let ty = &field.ty;
            where_clause
                .predicates
                .push(parse_quote!(#ty: #private::AggregateKey));
        }
    }
    generics
}

fn mentions(tokens: TokenStream, params: &[syn::Ident]) -> bool {
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Ident(ident) => params.contains(&ident),
        TokenTree::Group(group) => mentions(group.stream(), params),
        _ => false,
    })
}
