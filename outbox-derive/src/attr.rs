//! Reads `#[outbox(...)]` attributes: which keys are allowed where, their values, and the rules
//! a single value must follow. Rules that need the whole item (exactly one `aggregate_id`,
//! unique event types) live in `ast.rs`.

use proc_macro2::TokenTree;
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::{Attribute, Expr, ExprLit, ExprUnary, Lit, LitInt, LitStr, Path, Token, UnOp};

use crate::ctxt::Ctxt;

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

/// Every key `#[outbox(...)]` knows, whatever its position.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Aggregate,
    EventType,
    Version,
    Topic,
    Crate,
    AggregateId,
}

impl Key {
    const ALL: [Key; 6] = [
        Key::Aggregate,
        Key::EventType,
        Key::Version,
        Key::Topic,
        Key::Crate,
        Key::AggregateId,
    ];

    fn name(self) -> &'static str {
        match self {
            Key::Aggregate => "aggregate",
            Key::EventType => "event_type",
            Key::Version => "version",
            Key::Topic => "topic",
            Key::Crate => "crate",
            Key::AggregateId => "aggregate_id",
        }
    }

    /// An example of the key with a value, for messages.
    fn example(self) -> &'static str {
        match self {
            Key::Aggregate => "aggregate = \"order\"",
            Key::EventType => "event_type = \"OrderCreated\"",
            Key::Version => "version = 2",
            Key::Topic => "topic = \"orders\"",
            Key::Crate => "crate = outbox_core",
            Key::AggregateId => "aggregate_id",
        }
    }
}

impl Position {
    fn keys(self) -> &'static [Key] {
        match self {
            Position::Struct => &[
                Key::Aggregate,
                Key::EventType,
                Key::Version,
                Key::Topic,
                Key::Crate,
            ],
            Position::Enum => &[Key::Aggregate, Key::Version, Key::Topic, Key::Crate],
            Position::Variant => &[Key::EventType, Key::Version, Key::Topic],
            Position::StructField | Position::VariantField => &[Key::AggregateId],
        }
    }

    fn unknown_key_message(self, key: &str) -> String {
        let (what, expected) = match self {
            Position::Struct | Position::Enum => ("attribute", self.keys()),
            Position::Variant => ("variant attribute", self.keys()),
            Position::StructField | Position::VariantField => ("field attribute", self.keys()),
        };
        let list: Vec<String> = expected.iter().map(|k| format!("`{}`", k.name())).collect();
        let expected = match list.len() {
            1 => format!("expected {}", list[0]),
            _ => format!("expected one of {}", list.join(", ")),
        };
        format!("unknown outbox {what} `{key}`, {expected}")
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
            (Key::EventType, Position::Enum) => {
                return "`event_type` cannot be used on an enum: each variant is its own event \
                        type, set it on the variant instead"
                    .to_owned();
            }
            (Key::AggregateId, _) => "on the field that identifies the aggregate",
            (Key::Aggregate | Key::Crate, Position::Variant | Position::VariantField) => {
                "on the enum"
            }
            (Key::EventType, Position::VariantField) => "on the variant",
            (Key::Version | Key::Topic, Position::VariantField) => "on the variant or the enum",
            _ => "on the struct",
        };
        format!("`{}` cannot be used on {here}, only {there}", key.name())
    }
}

/// One key's value, remembering whether the key was written at all (a key given with an
/// invalid value is reported once, not again as missing).
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
        if self.seen {
            cx.error_spanned_by(path, format!("duplicate outbox attribute `{}`", key.name()));
            return;
        }
        self.seen = true;
        self.value = value;
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

/// A checked `version`: at least 1, at most `i32::MAX`.
pub(crate) struct Version {
    pub(crate) value: u32,
}

/// Everything `#[outbox(...)]` attributes at one position said. Keys that are not allowed at
/// that position stay unset (and were reported).
#[derive(Default)]
pub(crate) struct Attrs {
    pub(crate) aggregate: Slot<LitStr>,
    pub(crate) event_type: Slot<LitStr>,
    pub(crate) version: Slot<Version>,
    pub(crate) topic: Slot<LitStr>,
    pub(crate) krate: Slot<Path>,
    /// The `aggregate_id` path itself, to point at it.
    pub(crate) aggregate_id: Slot<Path>,
}

/// The largest version: versions are stored in a signed 32-bit column.
const MAX_VERSION: u64 = i32::MAX as u64;
/// The longest Kafka topic name.
const MAX_TOPIC_LEN: usize = 249;

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
    let Some(key) = Key::ALL.into_iter().find(|k| path.is_ident(k.name())) else {
        let name = path_to_string(path);
        cx.error_spanned_by(path, position.unknown_key_message(&name));
        return skip_value(meta);
    };
    if !position.keys().contains(&key) {
        cx.error_spanned_by(path, position.misplaced_key_message(key));
        return skip_value(meta);
    }
    match key {
        Key::Aggregate | Key::Topic => {
            let value = string_value(cx, meta, key)?.filter(|lit| check_topic_name(cx, lit, key));
            let slot = if key == Key::Aggregate {
                &mut out.aggregate
            } else {
                &mut out.topic
            };
            slot.set(cx, path, key, value);
        }
        Key::EventType => {
            let value = string_value(cx, meta, key)?.filter(|lit| check_event_type(cx, lit));
            out.event_type.set(cx, path, key, value);
        }
        Key::Version => {
            let value = version_value(cx, meta)?;
            out.version.set(cx, path, key, value);
        }
        Key::Crate => {
            let value = crate_value(cx, meta)?;
            out.krate.set(cx, path, key, value);
        }
        Key::AggregateId => {
            let rest = take_rest(meta)?;
            if !rest.is_empty() {
                cx.error_spanned_by(
                    &rest,
                    "`aggregate_id` is a flag and takes no value, write `#[outbox(aggregate_id)]`",
                );
            }
            out.aggregate_id.set(cx, path, key, Some(path.clone()));
        }
    }
    Ok(())
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

/// Consumes whatever follows a key up to the next top-level comma.
fn take_rest(meta: &ParseNestedMeta) -> syn::Result<proc_macro2::TokenStream> {
    meta.input.step(|cursor| {
        let mut rest = *cursor;
        let mut taken = proc_macro2::TokenStream::new();
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

fn skip_value(meta: &ParseNestedMeta) -> syn::Result<()> {
    take_rest(meta).map(drop)
}

/// `= <expr>` after a key; reports a key written without a value.
fn expr_value(cx: &Ctxt, meta: &ParseNestedMeta, key: Key) -> syn::Result<Option<Expr>> {
    if !meta.input.peek(Token![=]) {
        let rest = take_rest(meta)?;
        let msg = format!("`{}` needs a value, e.g. `{}`", key.name(), key.example());
        let path = &meta.path;
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

fn found(expr: &Expr) -> &'static str {
    match expr {
        Expr::Lit(ExprLit { lit, .. }) => match lit {
            Lit::Str(_) => "a string",
            Lit::Int(_) => "an integer",
            Lit::Float(_) => "a float",
            Lit::Bool(_) => "a boolean",
            _ => "a literal of another kind",
        },
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => "a negative number",
        Expr::Path(_) => "a path",
        _ => "an expression",
    }
}

fn string_value(cx: &Ctxt, meta: &ParseNestedMeta, key: Key) -> syn::Result<Option<LitStr>> {
    Ok(expr_value(cx, meta, key)?.and_then(|expr| match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit),
        other => {
            let msg = format!(
                "expected a string literal for `{}`, found {}, e.g. `{}`",
                key.name(),
                found(&other),
                key.example()
            );
            cx.error_spanned_by(&other, msg);
            None
        }
    }))
}

fn version_value(cx: &Ctxt, meta: &ParseNestedMeta) -> syn::Result<Option<Version>> {
    let Some(expr) = expr_value(cx, meta, Key::Version)? else {
        return Ok(None);
    };
    match &expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => Ok(check_version(cx, lit)),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => {
            let hint = match lit.value().trim().parse::<u64>() {
                Ok(n) => format!("write `version = {n}` without quotes"),
                Err(_) => "e.g. `version = 2`".to_owned(),
            };
            cx.error_spanned_by(
                lit,
                format!("expected an integer for `version`, found a string, {hint}"),
            );
            Ok(None)
        }
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => {
            cx.error_spanned_by(&expr, "`version` must be at least 1");
            Ok(None)
        }
        other => {
            let msg = format!(
                "expected an integer for `version`, found {}, e.g. `version = 2`",
                found(other)
            );
            cx.error_spanned_by(other, msg);
            Ok(None)
        }
    }
}

fn check_version(cx: &Ctxt, lit: &LitInt) -> Option<Version> {
    if !matches!(
        lit.suffix(),
        "" | "u8" | "u16" | "u32" | "u64" | "i8" | "i16" | "i32" | "i64"
    ) {
        cx.error_spanned_by(
            lit,
            format!(
                "`version` must be a plain integer, found the suffix `{}`",
                lit.suffix()
            ),
        );
        return None;
    }
    // Digits that do not fit a u64 are certainly too large.
    let value = lit.base10_parse::<u64>().unwrap_or(u64::MAX);
    if value == 0 {
        cx.error_spanned_by(lit, "`version` must be at least 1, versions start at 1");
        return None;
    }
    if value > MAX_VERSION {
        cx.error_spanned_by(
            lit,
            format!(
                "`version` must be at most {MAX_VERSION} (it is stored as a signed 32-bit integer)"
            ),
        );
        return None;
    }
    Some(Version {
        value: value as u32,
    })
}

/// `crate = some::path` or `crate = "some::path"`.
fn crate_value(cx: &Ctxt, meta: &ParseNestedMeta) -> syn::Result<Option<Path>> {
    if !meta.input.peek(Token![=]) {
        return expr_value(cx, meta, Key::Crate).map(|_| None);
    }
    let value = meta.value()?;
    if value.peek(LitStr) {
        let lit: LitStr = value.parse()?;
        return Ok(match lit.parse::<Path>() {
            Ok(path) => Some(path),
            Err(_) => {
                let msg = format!(
                    "`crate` must name a path, e.g. `crate = outbox_core`, found `{}`",
                    lit.value()
                );
                cx.error_spanned_by(&lit, msg);
                None
            }
        });
    }
    if value.peek(Lit) {
        let lit: Lit = value.parse()?;
        cx.error_spanned_by(&lit, "`crate` must name a path, e.g. `crate = outbox_core`");
        return Ok(None);
    }
    Ok(Some(value.call(Path::parse_mod_style)?))
}

/// The rules of a Kafka topic name, for `aggregate` (the default topic) and `topic`.
fn check_topic_name(cx: &Ctxt, lit: &LitStr, key: Key) -> bool {
    let value = lit.value();
    let name = key.name();
    let why = match key {
        Key::Aggregate => " (the aggregate names the default topic)",
        _ => "",
    };
    let problem = if value.is_empty() {
        format!("`{name}` must not be empty")
    } else if value == "." || value == ".." {
        format!("`{name}` cannot be `{value}`, Kafka reserves it{why}")
    } else if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        format!(
            "`{name}` contains {c:?}, which a Kafka topic name cannot contain{why}; \
             use ASCII letters, digits, `.`, `_` or `-`"
        )
    } else if value.len() > MAX_TOPIC_LEN {
        format!(
            "`{name}` is {} characters long, a Kafka topic name has at most {MAX_TOPIC_LEN}{why}",
            value.len()
        )
    } else {
        return true;
    };
    cx.error_spanned_by(lit, problem);
    false
}

fn check_event_type(cx: &Ctxt, lit: &LitStr) -> bool {
    let value = lit.value();
    let problem = if value.is_empty() {
        "`event_type` must not be empty".to_owned()
    } else if value.trim().is_empty() {
        "`event_type` must not be blank".to_owned()
    } else if value.trim() != value {
        format!(
            "`event_type` must not start or end with whitespace, write `{:?}`",
            value.trim()
        )
    } else if let Some(c) = value.chars().find(|c| c.is_control()) {
        format!("`event_type` must not contain control characters, found {c:?}")
    } else {
        return true;
    };
    cx.error_spanned_by(lit, problem);
    false
}
