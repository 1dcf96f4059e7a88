//! Generates what puts an event type in the catalog and decodes its older versions: the
//! `__outbox_registration` and `__outbox_upcast` methods, the link-time registration, and the
//! compile-time checks of each `upcast_from` source.

use proc_macro2::{Literal, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::{Path, spanned::Spanned};

use crate::ast::{Event, EventDef};
use crate::expand::{private, respan};

/// The methods that go into the `OutboxEvent` impl.
pub(crate) fn methods(event: &Event<'_>) -> TokenStream {
    let private = private(event);
    let is_enum = event.is_enum;
    let externally_tagged = is_enum && !serde_tagged(&event.input.attrs);
    let generic = !event.input.generics.params.is_empty();
    // The schema probe decides on a concrete type; a generic type has no single schema.
    let schema = if generic {
        quote!(#private::Option::None)
    } else {
        quote! {{
            use #private::{NoJsonSchema as _, ViaJsonSchema as _};
            (&#private::SchemaProbe::<Self>::NEW).outbox_schema()
        }}
    };
    let links = event.types.iter().filter_map(|def| {
        let source = def.upcast_from.as_ref()?;
        let event_type = &def.event_type;
        let source = spanned_path(source);
        Some(quote! {
            #private::UpcastLink {
                event_type: #event_type,
                source_type: ::core::any::type_name::<#source>(),
                source_version: #private::source_version(
                    <#source as #private::OutboxEvent>::EVENT_TYPES,
                    #event_type,
                ),
            }
        })
    });
    let registration = quote! {
        fn __outbox_registration() -> #private::Registration {
            #private::Registration {
                rust_type: ::core::any::type_name::<Self>(),
                event_types: <Self as #private::OutboxEvent>::EVENT_TYPES,
                is_enum: #is_enum,
                externally_tagged: #externally_tagged,
                upcasts: ::std::vec![#(#links),*],
                schema: #schema,
            }
        }
    };
    let arms: Vec<TokenStream> = event
        .types
        .iter()
        .filter_map(|def| upcast_arm(&private, def))
        .collect();
    if arms.is_empty() {
        return registration;
    }
    quote! {
        #registration

        fn __outbox_upcast(
            __outbox_event_type: &::core::primitive::str,
            __outbox_version: ::core::primitive::u32,
            __outbox_payload: &[::core::primitive::u8],
        ) -> #private::Option<#private::Result<Self, #private::UpcastFailure>> {
            match __outbox_event_type {
                #(#arms)*
                _ => #private::Option::None,
            }
        }
    }
}

/// Whether `#[serde(...)]` among `attrs` makes an enum internally or adjacently tagged
/// (`tag = ...`) or untagged: serde then writes no wrapper around a variant.
fn serde_tagged(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        match &attr.meta {
        syn::Meta::List(list) if list.path.is_ident("serde") => {
            list.tokens.clone().into_iter().any(|tt| {
                matches!(&tt, proc_macro2::TokenTree::Ident(i) if i == "tag" || i == "untagged")
            })
        }
        _ => false,
    }
    })
}

/// Decoding an older version of one event type: as the source when the version is the
/// source's, through the source's own chain when it is older, and as `Self` otherwise (a
/// version between the source's and ours, which no type of the chain describes).
fn upcast_arm(private: &TokenStream, def: &EventDef<'_>) -> Option<TokenStream> {
    let source = spanned_path(def.upcast_from.as_ref()?);
    let span = def.upcast_from.as_ref()?.span();
    let event_type = &def.event_type;
    let version = Literal::u32_suffixed(def.version);
    // Located at the source path, so that a missing `From` or `Deserialize` is reported there.
    let from = quote_spanned! {span=>
        match __outbox_source {
            #private::Result::Ok(__outbox_old) => #private::Result::Ok(
                <Self as ::core::convert::From<#source>>::from(__outbox_old),
            ),
            #private::Result::Err(__outbox_err) => #private::Result::Err(__outbox_err),
        }
    };
    let decode = quote_spanned!(span=> #private::decode_source::<#source>);
    Some(quote! {
        #event_type => {
            const __OUTBOX_SOURCE_TYPES: &[#private::EventType] =
                <#source as #private::OutboxEvent>::EVENT_TYPES;
            const __OUTBOX_SOURCE: ::core::primitive::u32 =
                #private::source_version(__OUTBOX_SOURCE_TYPES, #event_type);
            if __outbox_version >= #version || __outbox_version > __OUTBOX_SOURCE {
                return #private::Option::None;
            }
            let __outbox_source = if __outbox_version == __OUTBOX_SOURCE {
                #decode(__OUTBOX_SOURCE_TYPES, __outbox_event_type, __outbox_payload)
            } else {
                match <#source as #private::OutboxEvent>::__outbox_upcast(
                    __outbox_event_type,
                    __outbox_version,
                    __outbox_payload,
                ) {
                    #private::Option::Some(__outbox_result) => __outbox_result,
                    #private::Option::None => {
                        #decode(__OUTBOX_SOURCE_TYPES, __outbox_event_type, __outbox_payload)
                    }
                }
            };
            #private::Option::Some(#from)
        }
    })
}

/// The items that go next to the impl: the link-time registration of a non-generic type, and
/// the compile-time checks of each upcast source.
pub(crate) fn items(event: &Event<'_>) -> TokenStream {
    if !event.input.generics.params.is_empty() {
        return TokenStream::new();
    }
    let private = private(event);
    let ident = &event.input.ident;
    let checks = event
        .types
        .iter()
        .filter_map(|def| source_check(event, def));
    quote! {
        // linkme places the entry with `#[link_section]`, which the `unsafe_code` lint counts.
        #[allow(unsafe_code)]
        const _: () = {
            #[#private::linkme::distributed_slice(#private::REGISTRATIONS)]
            #[linkme(crate = #private::linkme)]
            static __OUTBOX_REGISTRATION: fn() -> #private::Registration =
                <#ident as #private::OutboxEvent>::__outbox_registration;
        };
        #(#checks)*
    }
}

/// `const _: () = ...` failing compilation, at the source path, unless the source carries the
/// same event type of the same aggregate at a lower version. Versions going strictly down
/// along `upcast_from` also rule out cycles.
fn source_check(event: &Event<'_>, def: &EventDef<'_>) -> Option<TokenStream> {
    let path = def.upcast_from.as_ref()?;
    let span = path.span();
    let private = respan(private(event), span);
    let source = spanned_path(path);
    let name = path_text(path);
    let event_type = def.event_type.value();
    let aggregate = event.aggregate.value();
    let version = def.version;
    let missing = format!(
        "`upcast_from = {name}`: `{name}` does not carry event type `{event_type}`; the source \
         of an upcast is an older version of the same event type"
    );
    let other_aggregate = format!(
        "`upcast_from = {name}`: `{name}`'s `{event_type}` belongs to another aggregate than \
         `{aggregate}`; the source of an upcast is an older version of the same event"
    );
    let not_lower = format!(
        "`upcast_from = {name}`: `{name}`'s version of `{event_type}` must be lower than \
         {version}; versions go down along an upcast chain, which also rules out cycles"
    );
    Some(quote_spanned! {span=>
        const _: () = {
            match #private::find_event_type(
                <#source as #private::OutboxEvent>::EVENT_TYPES,
                #event_type,
            ) {
                #private::Option::None => ::core::panic!(#missing),
                #private::Option::Some(__outbox_source) => {
                    if !#private::str_eq(__outbox_source.aggregate_type, #aggregate) {
                        ::core::panic!(#other_aggregate)
                    }
                    if __outbox_source.version >= #version {
                        ::core::panic!(#not_lower)
                    }
                }
            }
        };
    })
}

/// The source path, with its own spans: a type error in it is reported at the path.
fn spanned_path(path: &Path) -> TokenStream {
    path.to_token_stream()
}

fn path_text(path: &Path) -> String {
    let segments: Vec<String> = path
        .segments
        .iter()
        .map(|s| s.to_token_stream().to_string().replace(' ', ""))
        .collect();
    let prefix = if path.leading_colon.is_some() {
        "::"
    } else {
        ""
    };
    format!("{prefix}{}", segments.join("::"))
}
