//! Reads `#[outbox(...)]` attributes: which keys are allowed where, and what each says. Values
//! are read in `value.rs` and checked in `valid.rs`; rules that need the whole item
//! (exactly one `aggregate_id`, unique event types) are in `ast.rs`.

use syn::meta::ParseNestedMeta;
use syn::{Attribute, LitStr, Path};

use crate::ctxt::Ctxt;
use crate::valid::{self, TopicKey};
use crate::value::{crate_value, string_value, take_rest, type_path_value, version_value};

/// Where an `#[outbox(...)]` attribute sits; decides which keys it accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// On a struct (or a union, which is rejected separately).
    Struct,
    /// On an enum.
    Enum,
    /// On a variant of an enum.
    Variant,
    /// On a field of a struct.
    StructField,
    /// On a field of an enum variant.
    VariantField,
}

/// Defines [`Key`] and `Key::ALL`, its variants in this order, from one list.
macro_rules! keys {
    ($($key:ident),* $(,)?) => {
        /// Every key `#[outbox(...)]` knows, whatever its position.
        #[derive(Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Key {
            $($key),*
        }

        impl Key {
            const ALL: &[Key] = &[$(Key::$key),*];
        }
    };
}

keys!(
    Aggregate,
    EventType,
    Version,
    Topic,
    Crate,
    AggregateId,
    UpcastFrom,
);

use Key::*;

impl Key {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Aggregate => "aggregate",
            EventType => "event_type",
            Version => "version",
            Topic => "topic",
            Crate => "crate",
            AggregateId => "aggregate_id",
            UpcastFrom => "upcast_from",
        }
    }

    /// The key with an example value, for messages.
    pub(crate) fn example(self) -> &'static str {
        match self {
            Aggregate => "aggregate = \"order\"",
            EventType => "event_type = \"OrderCreated\"",
            Version => "version = 2",
            Topic => "topic = \"orders\"",
            Crate => "crate = outbox_core",
            AggregateId => "aggregate_id",
            UpcastFrom => "upcast_from = OrderCreatedV1",
        }
    }
}

impl Position {
    fn keys(self) -> &'static [Key] {
        match self {
            Position::Struct => &[Aggregate, EventType, Version, Topic, Crate, UpcastFrom],
            Position::Enum => &[Aggregate, Version, Topic, Crate],
            Position::Variant => &[EventType, Version, Topic, UpcastFrom],
            Position::StructField | Position::VariantField => &[AggregateId],
        }
    }

    fn unknown_key_message(self, key: &str) -> String {
        let what = match self {
            Position::Struct | Position::Enum => "attribute",
            Position::Variant => "variant attribute",
            Position::StructField | Position::VariantField => "field attribute",
        };
        let names: Vec<String> = self
            .keys()
            .iter()
            .map(|k| format!("`{}`", k.name()))
            .collect();
        let expected = match names.as_slice() {
            [one] => format!("expected {one}"),
            _ => format!("expected one of {}", names.join(", ")),
        };
        let hint = match self.keys().iter().find(|k| looks_like(key, k.name())) {
            Some(k) => format!("; did you mean `{}`?", k.name()),
            None => String::new(),
        };
        format!("unknown outbox {what} `{key}`, {expected}{hint}")
    }

    /// The message for a key that is valid somewhere, but not here.
    fn misplaced_key_message(self, key: Key) -> String {
        let here = match self {
            Position::Struct => "a struct",
            Position::Enum => "an enum",
            Position::Variant => "a variant",
            Position::StructField | Position::VariantField => "a field",
        };
        let there = match (key, self) {
            (EventType, Position::Enum) => {
                return "`event_type` cannot be used on an enum: each variant is its own event \
                        type, set it on the variant instead"
                    .to_owned();
            }
            (UpcastFrom, Position::Enum) => {
                return "`upcast_from` cannot be used on an enum: each variant is its own event \
                        type, set it on the variant whose older version it converts"
                    .to_owned();
            }
            (AggregateId, _) => "on the field that identifies the aggregate",
            (Aggregate | Crate, Position::Variant | Position::VariantField) => "on the enum",
            (EventType | UpcastFrom, Position::VariantField) => "on the variant",
            (Version | Topic, Position::VariantField) => "on the variant or the enum",
            _ => "on the struct",
        };
        format!("`{}` cannot be used on {here}, only {there}", key.name())
    }
}

/// Whether an unknown key is probably a slip for `known`: a typo (one edit away, two for longer
/// keys), or the known key with a word added or dropped (`aggregate_type`, `type`, `id`).
pub(crate) fn looks_like(unknown: &str, known: &str) -> bool {
    let words = |s: &str| s.split('_').map(str::to_owned).collect::<Vec<_>>();
    let (u, k) = (words(unknown), words(known));
    let slack = if known.len() >= 6 { 2 } else { 1 };
    edit_distance(unknown, known) <= slack
        || (u.len() != k.len() && (u.starts_with(&k) || k.ends_with(&u) || u.ends_with(&k)))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// One key's value, remembering whether the key was written at all: a key given with an
/// invalid value is reported once, not again as missing.
pub(crate) struct Slot<T> {
    seen: bool,
    value: Option<T>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            seen: false,
            value: None,
        }
    }
}

impl<T> Slot<T> {
    fn set(&mut self, cx: &Ctxt, path: &Path, key: Key, value: Option<T>) {
        if self.mark(cx, path, &format!("outbox attribute `{}`", key.name())) {
            self.value = value;
        }
    }

    /// Reads the key's value with `read` and keeps it. A key written before is reported as
    /// `duplicate {what}` first; its value is still read (so that its own mistakes are
    /// reported) and dropped.
    pub(crate) fn read(
        &mut self,
        cx: &Ctxt,
        path: &Path,
        what: &str,
        read: impl FnOnce() -> syn::Result<Option<T>>,
    ) -> syn::Result<()> {
        let first = self.mark(cx, path, what);
        let value = read()?;
        if first {
            self.value = value;
        }
        Ok(())
    }

    /// Marks the key as written; whether it is the first time (if not, reports it).
    fn mark(&mut self, cx: &Ctxt, path: &Path, what: &str) -> bool {
        if self.seen {
            cx.error_spanned_by(path, format!("duplicate {what}"));
            return false;
        }
        self.seen = true;
        true
    }

    /// Whether the key was written, valid or not.
    pub(crate) fn seen(&self) -> bool {
        self.seen
    }

    /// The value, if the key was written with a valid one.
    pub(crate) fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }
}

/// Everything the `#[outbox(...)]` attributes at one position said. Keys not allowed at that
/// position stay unset (and were reported).
#[derive(Default)]
pub(crate) struct Attrs {
    pub(crate) aggregate: Slot<LitStr>,
    pub(crate) event_type: Slot<LitStr>,
    pub(crate) version: Slot<u32>,
    pub(crate) topic: Slot<LitStr>,
    pub(crate) krate: Slot<Path>,
    /// The `aggregate_id` path itself, to point at it.
    pub(crate) aggregate_id: Slot<Path>,
    /// The type older versions are converted from.
    pub(crate) upcast_from: Slot<Path>,
}

/// Reads every `#[outbox(...)]` among `attrs`, reporting each problem to `cx` and going on.
pub(crate) fn parse(cx: &Ctxt, attrs: &[Attribute], position: Position) -> Attrs {
    let mut out = Attrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("outbox")) {
        if let Err(err) = attr.parse_nested_meta(|meta| parse_key(cx, &meta, position, &mut out)) {
            cx.syn_error(err);
        }
    }
    out
}

fn parse_key(
    cx: &Ctxt,
    meta: &ParseNestedMeta,
    position: Position,
    out: &mut Attrs,
) -> syn::Result<()> {
    let path = &meta.path;
    let Some(key) = Key::ALL.iter().copied().find(|k| path.is_ident(k.name())) else {
        cx.error_spanned_by(path, position.unknown_key_message(&path_to_string(path)));
        return take_rest(meta).map(drop);
    };
    if !position.keys().contains(&key) {
        cx.error_spanned_by(path, position.misplaced_key_message(key));
        return take_rest(meta).map(drop);
    }
    let topic_key = |key| match key {
        Aggregate => TopicKey::Aggregate,
        _ => TopicKey::Topic,
    };
    match key {
        Aggregate | Topic => {
            let value = string_value(cx, meta, key)?
                .filter(|lit| check(cx, lit, valid::topic_name(topic_key(key), &lit.value())));
            let slot = if key == Aggregate {
                &mut out.aggregate
            } else {
                &mut out.topic
            };
            slot.set(cx, path, key, value);
        }
        EventType => {
            let value = string_value(cx, meta, key)?
                .filter(|lit| check(cx, lit, valid::event_type(&lit.value())));
            out.event_type.set(cx, path, key, value);
        }
        Version => {
            let value = version_value(cx, meta)?;
            out.version.set(cx, path, key, value);
        }
        Crate => {
            let value = crate_value(cx, meta)?;
            out.krate.set(cx, path, key, value);
        }
        UpcastFrom => {
            let value = type_path_value(cx, meta, key)?;
            out.upcast_from.set(cx, path, key, value);
        }
        AggregateId => {
            let rest = take_rest(meta)?;
            if !rest.is_empty() {
                let msg =
                    "`aggregate_id` is a flag and takes no value, write `#[outbox(aggregate_id)]`";
                cx.error_spanned_by(&rest, msg);
            }
            out.aggregate_id.set(cx, path, key, Some(path.clone()));
        }
    }
    Ok(())
}

/// Reports `result`'s problem at `lit`; whether there was none.
fn check<T>(cx: &Ctxt, lit: &LitStr, result: Result<T, String>) -> bool {
    result.map_err(|msg| cx.error_spanned_by(lit, msg)).is_ok()
}

fn path_to_string(path: &Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let prefix = if path.leading_colon.is_some() {
        "::"
    } else {
        ""
    };
    format!("{prefix}{}", segments.join("::"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slips_are_recognised() {
        assert!(looks_like("aggregate_type", "aggregate"));
        assert!(looks_like("aggregate_key", "aggregate"));
        assert!(looks_like("aggregateid", "aggregate_id"));
        assert!(looks_like("id", "aggregate_id"));
        assert!(looks_like("type", "event_type"));
        assert!(looks_like("evnt_type", "event_type"));
        assert!(looks_like("versions", "version"));
        assert!(looks_like("verison", "version"));
        assert!(looks_like("topik", "topic"));
        assert!(!looks_like("tpoic", "topic"));
        assert!(!looks_like("colour", "topic"));
        assert!(!looks_like("name", "event_type"));
        assert!(!looks_like("aggregate", "aggregate_id"));
    }

    #[test]
    fn unknown_key_messages_list_the_keys_of_the_position() {
        assert_eq!(
            Position::Variant.unknown_key_message("colour"),
            "unknown outbox variant attribute `colour`, expected one of `event_type`, `version`, `topic`, `upcast_from`"
        );
        assert_eq!(
            Position::StructField.unknown_key_message("id"),
            "unknown outbox field attribute `id`, expected `aggregate_id`; did you mean `aggregate_id`?"
        );
    }

    fn parse_struct(attrs: syn::DeriveInput) -> (Attrs, Vec<String>) {
        let cx = Ctxt::new();
        let out = parse(&cx, &attrs.attrs, Position::Struct);
        let errors = match cx.check() {
            Ok(()) => Vec::new(),
            Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
        };
        (out, errors)
    }

    #[test]
    fn values_are_read() {
        let (attrs, errors) = parse_struct(syn::parse_quote! {
            #[outbox(aggregate = "order", event_type = "OrderCreated", version = 3u32)]
            #[outbox(topic = "orders", crate = "::outbox_core")]
            struct S;
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(attrs.aggregate.value().unwrap().value(), "order");
        assert_eq!(attrs.event_type.value().unwrap().value(), "OrderCreated");
        assert_eq!(attrs.version.value(), Some(&3));
        assert_eq!(attrs.topic.value().unwrap().value(), "orders");
        let krate = attrs.krate.value().unwrap();
        assert_eq!(quote::quote!(#krate).to_string(), ":: outbox_core");
    }

    #[test]
    fn every_mistake_is_reported_and_parsing_goes_on() {
        let (attrs, errors) = parse_struct(syn::parse_quote! {
            #[outbox(colour(red, green), version = "x", aggregate = "a", aggregate = 1, topic)]
            struct S;
        });
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(errors[0].starts_with("unknown outbox attribute `colour`"));
        assert!(errors[1].starts_with("expected an integer for `version`"));
        // The second `aggregate` is both of the wrong kind and a duplicate.
        assert!(errors[2].starts_with("expected a string literal for `aggregate`"));
        assert_eq!(errors[3], "duplicate outbox attribute `aggregate`");
        assert!(errors[4].starts_with("`topic` needs a value"));
        assert_eq!(attrs.aggregate.value().unwrap().value(), "a");
        assert!(attrs.version.seen() && attrs.version.value().is_none());
    }
}
