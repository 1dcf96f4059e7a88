//! Walks the derive input into the model the code is generated from, checking the rules that
//! involve more than one attribute: a required `aggregate`, exactly one `aggregate_id` per
//! struct or variant, unique event types, no empty enums and no unions.

use std::collections::HashMap;

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::{
    Data, DeriveInput, Field, Fields, Ident, Index, LitStr, Member, Path, Type, parse_quote,
};

use crate::attr::{self, Position};
use crate::ctxt::Ctxt;

/// A derive input read as an event type. Built even when errors were reported, with
/// placeholders where a value was missing or invalid, so that the fallback can use it.
pub(crate) struct Event<'a> {
    pub(crate) input: &'a DeriveInput,
    /// The path the generated code reaches `__private` through.
    pub(crate) krate: Path,
    pub(crate) aggregate: LitStr,
    pub(crate) is_enum: bool,
    pub(crate) is_union: bool,
    /// One per struct, one per variant of an enum, in declaration order.
    pub(crate) types: Vec<EventDef<'a>>,
    /// Every field marked `aggregate_id`, even one too many, so that its type is checked
    /// on the error path too.
    pub(crate) key_fields: Vec<&'a Field>,
}

/// One event type: the struct itself, or one variant.
pub(crate) struct EventDef<'a> {
    /// `None` for a struct.
    pub(crate) variant: Option<&'a Ident>,
    pub(crate) event_type: LitStr,
    pub(crate) version: u32,
    pub(crate) topic: Option<LitStr>,
    /// `None` only if an error was reported.
    pub(crate) key: Option<Key<'a>>,
    /// `#[outbox(upcast_from = Source)]`: older versions are decoded as `Source`, then
    /// converted with `From`.
    pub(crate) upcast_from: Option<Path>,
}

/// The field marked `#[outbox(aggregate_id)]`.
pub(crate) struct Key<'a> {
    pub(crate) member: Member,
    pub(crate) ty: &'a Type,
}

impl<'a> Event<'a> {
    pub(crate) fn from_input(cx: &Ctxt, input: &'a DeriveInput) -> Self {
        let is_enum = matches!(input.data, Data::Enum(_));
        let position = if is_enum {
            Position::Enum
        } else {
            Position::Struct
        };
        let attrs = attr::parse(cx, &input.attrs, position);
        let mut event = Event {
            input,
            krate: attrs
                .krate
                .value()
                .cloned()
                .unwrap_or_else(|| parse_quote!(::outbox)),
            aggregate: attrs
                .aggregate
                .value()
                .cloned()
                .unwrap_or_else(|| LitStr::new("", Span::call_site())),
            is_enum,
            is_union: false,
            types: Vec::new(),
            key_fields: Vec::new(),
        };
        let version = attrs.version.value().copied().unwrap_or(1);
        let topic = attrs.topic.value().cloned();
        let ident = &input.ident;
        if !attrs.aggregate.seen() && !matches!(input.data, Data::Union(_)) {
            cx.error_spanned_by(
                ident,
                "missing `#[outbox(aggregate = \"...\")]`, every event belongs to an \
                 aggregate type, e.g. `#[outbox(aggregate = \"order\")]`",
            );
        }
        match &input.data {
            Data::Union(data) => {
                event.is_union = true;
                cx.error_spanned_by(
                    data.union_token,
                    "`OutboxEvent` cannot be derived for a union, use a struct or an enum",
                );
                return event;
            }
            Data::Struct(data) => {
                let key = event.find_key(cx, &data.fields, Position::StructField, || {
                    cx.error_spanned_by(
                        ident,
                        format!(
                            "struct `{ident}` has no field marked `#[outbox(aggregate_id)]`, \
                             mark the field that identifies the aggregate"
                        ),
                    )
                });
                let upcast_from = checked_upcast(cx, input, attrs.upcast_from.value());
                event.types.push(EventDef {
                    variant: None,
                    event_type: explicit_or_name(attrs.event_type.value(), ident),
                    version,
                    topic,
                    key,
                    upcast_from,
                });
            }
            Data::Enum(data) => {
                if data.variants.is_empty() {
                    cx.error_spanned_by(
                        ident,
                        format!(
                            "enum `{ident}` has no variants, so no event types; \
                             add one variant per event"
                        ),
                    );
                }
                let mut seen: HashMap<String, &Ident> = HashMap::new();
                for variant in &data.variants {
                    let vattrs = attr::parse(cx, &variant.attrs, Position::Variant);
                    let name = &variant.ident;
                    let key = event.find_key(cx, &variant.fields, Position::VariantField, || {
                        let msg = if variant.fields.is_empty() {
                            format!(
                                "variant `{name}` has no field to be the aggregate id, \
                                 every variant needs a field marked `#[outbox(aggregate_id)]`"
                            )
                        } else {
                            format!(
                                "variant `{name}` has no field marked `#[outbox(aggregate_id)]`, \
                                 every variant needs one"
                            )
                        };
                        cx.error_spanned_by(name, msg)
                    });
                    let event_type = explicit_or_name(vattrs.event_type.value(), name);
                    // An invalid explicit event type was reported already; do not compare it.
                    if !vattrs.event_type.seen() || vattrs.event_type.value().is_some() {
                        check_unique(cx, &mut seen, &event_type, name, vattrs.event_type.seen());
                    }
                    event.types.push(EventDef {
                        variant: Some(name),
                        event_type,
                        version: vattrs.version.value().copied().unwrap_or(version),
                        topic: vattrs.topic.value().cloned().or_else(|| topic.clone()),
                        key,
                        upcast_from: checked_upcast(cx, input, vattrs.upcast_from.value()),
                    });
                }
            }
        }
        event
    }

    /// Finds the one field marked `aggregate_id` among `fields`; calls `missing` if there is
    /// none and reports every marked field after the first.
    fn find_key(
        &mut self,
        cx: &Ctxt,
        fields: &'a Fields,
        position: Position,
        missing: impl FnOnce(),
    ) -> Option<Key<'a>> {
        let mut key: Option<(Key<'a>, String)> = None;
        for (index, field) in fields.iter().enumerate() {
            let attrs = attr::parse(cx, &field.attrs, position);
            let Some(flag) = attrs.aggregate_id.value() else {
                continue;
            };
            self.key_fields.push(field);
            let (member, name) = match &field.ident {
                Some(ident) => (Member::Named(ident.clone()), format!("`{}`", ident.unraw())),
                None => (Member::Unnamed(Index::from(index)), format!("{index}")),
            };
            match &key {
                None => {
                    key = Some((
                        Key {
                            member,
                            ty: &field.ty,
                        },
                        name,
                    ));
                }
                Some((_, first)) => cx.error_spanned_by(
                    flag,
                    format!(
                        "duplicate `aggregate_id`, field {first} is already the aggregate id; \
                         an event has exactly one"
                    ),
                ),
            }
        }
        if key.is_none() {
            missing();
        }
        key.map(|(key, _)| key)
    }
}

/// The explicit event type, or the name of the struct or variant.
fn explicit_or_name(explicit: Option<&LitStr>, ident: &Ident) -> LitStr {
    explicit
        .cloned()
        .unwrap_or_else(|| LitStr::new(&ident.unraw().to_string(), ident.span()))
}

fn check_unique<'a>(
    cx: &Ctxt,
    seen: &mut HashMap<String, &'a Ident>,
    event_type: &LitStr,
    variant: &'a Ident,
    explicit: bool,
) {
    let value = event_type.value();
    if let Some(first) = seen.get(&value) {
        let msg = format!("duplicate event type `{value}`, variant `{first}` already has it");
        if explicit {
            cx.error_spanned_by(event_type, msg);
        } else {
            cx.error_spanned_by(
                variant,
                format!("{msg} (the event type defaults to the variant's name)"),
            );
        }
    } else {
        seen.insert(value, variant);
    }
}

/// The upcast source, unless it is the type itself (an upcast goes from an older version to a
/// newer one, so a type is never its own source) or the type is generic (the source's version
/// is checked at compile time, which needs one concrete type).
fn checked_upcast(cx: &Ctxt, input: &DeriveInput, source: Option<&Path>) -> Option<Path> {
    let source = source?;
    let ident = &input.ident;
    if source.is_ident("Self") || source.is_ident(ident) {
        cx.error_spanned_by(
            source,
            format!(
                "`{ident}` cannot be upcast from itself: `upcast_from` names the type of an \
                 older version, e.g. `upcast_from = {ident}V1`"
            ),
        );
        return None;
    }
    if !input.generics.params.is_empty() {
        cx.error_spanned_by(
            source,
            "`upcast_from` cannot be used on a generic type: the chain of versions is checked \
             at compile time on one concrete type",
        );
        return None;
    }
    Some(source.clone())
}
