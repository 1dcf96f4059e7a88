//! What is generated when the input has errors: the errors, and an impl that compiles whatever
//! the mistakes were, so that code using the type reports nothing more (thiserror's approach).

use proc_macro2::TokenStream;
use quote::quote;

use crate::ast::Event;
use crate::expand::{bounded_generics, key_call, private};

/// `errors` plus a placeholder impl whose methods are unreachable. The types of the fields
/// marked `aggregate_id` are still checked, so a field type that is no key is reported in the
/// same build as the attribute mistakes.
pub(crate) fn expand(event: &Event<'_>, errors: &syn::Error) -> TokenStream {
    let errors = errors.to_compile_error();
    if event.is_union {
        // serde cannot derive `Serialize` for a union, so an impl of `OutboxEvent` (whose
        // supertrait it is) would almost surely add an error of its own.
        return errors;
    }
    let private = private(event);
    let ident = &event.input.ident;
    let generics = bounded_generics(event);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let key_checks = event.key_fields.iter().map(|field| {
        let call = key_call(&private, &field.ty, &quote!(__outbox_id));
        quote!(let _ = |__outbox_id| #call;)
    });
    quote! {
        #errors

        #[automatically_derived]
        impl #impl_generics #private::OutboxEvent for #ident #ty_generics #where_clause {
            const AGGREGATE_TYPE: &'static ::core::primitive::str = "";
            const EVENT_TYPES: &'static [#private::EventType] = &[];

            fn aggregate_id(&self) -> #private::String {
                #(#key_checks)*
                ::core::unreachable!()
            }

            fn event_type(&self) -> &'static ::core::primitive::str {
                ::core::unreachable!()
            }

            fn event_version(&self) -> ::core::primitive::u32 {
                ::core::unreachable!()
            }
        }
    }
}
