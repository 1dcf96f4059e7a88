//! Whether a reader schema accepts every payload a writer schema describes, as serde decodes
//! JSON: unknown fields are ignored (unless the reader denies them), a field not in `required`
//! may be missing (an `Option`, or `#[serde(default)]`), an integer fits a float but not the
//! other way round, and an integer must fit the reader's width.
//!
//! Both schemas are normalized (`normalize.rs`) first. Each problem is one [`Issue`]; what it
//! means depends on which side is the old one ([`Dir`]), so messages are worded from there.

use serde_json::Value;

use super::normalize::def_name;

/// Which side of the comparison is the old (snapshot) schema.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dir {
    /// The reader is the new type, the writer the old one: old payloads, new code.
    Backward,
    /// The reader is the old type, the writer the new one: new payloads, old code.
    Forward,
}

/// One incompatibility, worded as a line of the check's output.
pub(crate) type Issue = String;

struct Side<'a> {
    root: &'a Value,
}

/// Every way `reader` refuses a payload that `writer` allows.
pub(crate) fn check(reader: &Value, writer: &Value, dir: Dir) -> Vec<Issue> {
    let mut out = Vec::new();
    let cx = Cx {
        r: Side { root: reader },
        w: Side { root: writer },
        dir,
    };
    cx.accepts(reader, writer, "", &mut out, 0);
    out
}

struct Cx<'a> {
    r: Side<'a>,
    w: Side<'a>,
    dir: Dir,
}

const MAX_DEPTH: usize = 48;

fn resolve<'a>(side: &Side<'a>, mut s: &'a Value) -> &'a Value {
    for _ in 0..8 {
        let Some(name) = s.get("$ref").and_then(Value::as_str).and_then(def_name) else {
            break;
        };
        match side.root.get("$defs").and_then(|d| d.get(name)) {
            Some(def) => s = def,
            None => break,
        }
    }
    s
}

fn alternatives(s: &Value) -> Option<&Vec<Value>> {
    s.get("oneOf")
        .or_else(|| s.get("anyOf"))
        .and_then(Value::as_array)
}

/// `field `a.b`` or `the payload`.
fn place(path: &str) -> String {
    if path.is_empty() {
        "the payload".to_owned()
    } else {
        format!("field `{path}`")
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

impl Cx<'_> {
    fn old_new<'v>(&self, reader: &'v Value, writer: &'v Value) -> (&'v Value, &'v Value) {
        match self.dir {
            Dir::Backward => (writer, reader),
            Dir::Forward => (reader, writer),
        }
    }

    fn accepts(&self, r: &Value, w: &Value, path: &str, out: &mut Vec<Issue>, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        let (r, w) = (resolve(&self.r, r), resolve(&self.w, w));
        if r == w || accepts_anything(r) {
            return;
        }
        if let Some(w_alts) = alternatives(w) {
            for alt in w_alts {
                self.accepts_alternative(r, alt, path, out, depth);
            }
            return;
        }
        if let Some(values) = literal_values(w) {
            for value in values {
                if !self.accepts_value(r, value) {
                    out.push(self.value_gone(value, path));
                }
            }
            return;
        }
        if let Some(r_alts) = alternatives(r) {
            // The writer is one shape; some alternative of the reader must take all of it.
            let mut best: Option<Vec<Issue>> = None;
            for alt in r_alts {
                let mut issues = Vec::new();
                self.accepts(alt, w, path, &mut issues, depth + 1);
                if best.as_ref().is_none_or(|b| issues.len() < b.len()) {
                    best = Some(issues);
                }
            }
            out.extend(best.unwrap_or_default());
            return;
        }
        self.accepts_typed(r, w, path, out, depth);
    }

    /// One alternative of the writer (an enum variant, or one arm of an `Option`).
    fn accepts_alternative(
        &self,
        r: &Value,
        alt: &Value,
        path: &str,
        out: &mut Vec<Issue>,
        d: usize,
    ) {
        let alt = resolve(&self.w, alt);
        let label = variant_label(alt);
        if let (Some(r_alts), Some(label)) = (alternatives(r), label.as_deref()) {
            match r_alts
                .iter()
                .find(|a| variant_label(resolve(&self.r, a)).as_deref() == Some(label))
            {
                Some(r_alt) => self.accepts(r_alt, alt, path, out, d + 1),
                // Unit variants may be grouped in one `enum` alternative: any taker will do.
                None if r_alts.iter().any(|a| {
                    let mut issues = Vec::new();
                    self.accepts(a, alt, path, &mut issues, d + 1);
                    issues.is_empty()
                }) => {}
                None => out.push(self.variant_gone(label, path)),
            }
            return;
        }
        let mut issues = Vec::new();
        self.accepts(r, alt, path, &mut issues, d + 1);
        match label {
            // The reader is an enum without that variant (e.g. only unit variants are left).
            Some(label) if !issues.is_empty() => out.push(self.variant_gone(&label, path)),
            _ => out.extend(issues),
        }
    }

    fn accepts_typed(&self, r: &Value, w: &Value, path: &str, out: &mut Vec<Issue>, d: usize) {
        let (rt, wt) = (type_set(r), type_set(w));
        let refused: Vec<&str> = wt
            .iter()
            .copied()
            .filter(|t| !(rt.contains(t) || (*t == "integer" && rt.contains(&"number"))))
            .collect();
        if !refused.is_empty() || (wt.is_empty() && !rt.is_empty()) {
            out.push(self.type_changed(r, w, path));
            return;
        }
        if wt.contains(&"integer") && rt.contains(&"integer") {
            let (rr, wr) = (int_range(r), int_range(w));
            if wr.0 < rr.0 || wr.1 > rr.1 {
                out.push(self.type_changed(r, w, path));
                return;
            }
        }
        if wt.contains(&"string")
            && let Some(rf) = r.get("format")
            && w.get("format") != Some(rf)
        {
            out.push(self.type_changed(r, w, path));
            return;
        }
        if wt.contains(&"object") {
            self.accepts_object(r, w, path, out, d);
        }
        if wt.contains(&"array") {
            if let (Some(ri), Some(wi)) = (r.get("items"), w.get("items")) {
                self.accepts(ri, wi, &format!("{path}[]"), out, d + 1);
            }
            if let (Some(Value::Array(rp)), Some(Value::Array(wp))) =
                (r.get("prefixItems"), w.get("prefixItems"))
            {
                for (i, (ri, wi)) in rp.iter().zip(wp).enumerate() {
                    self.accepts(ri, wi, &format!("{path}[{i}]"), out, d + 1);
                }
            }
        }
    }

    fn accepts_object(&self, r: &Value, w: &Value, path: &str, out: &mut Vec<Issue>, d: usize) {
        let empty = serde_json::Map::new();
        let rp = r
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let wp = w
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let required = |s: &Value, name: &str| {
            s.get("required")
                .and_then(Value::as_array)
                .is_some_and(|r| r.iter().any(|n| n == name))
        };
        // Fields the writer has and the reader does not: ignored, refused, or a map's entries.
        let mut gone: Vec<&String> = Vec::new();
        for (name, ws) in wp {
            if let Some(rs) = rp.get(name) {
                // An optional field that became required is one change, reported below; the
                // null its `Option` allowed is part of it.
                let ws = &if required(r, name) && !required(w, name) {
                    without_null(resolve(&self.w, ws))
                } else {
                    ws.clone()
                };
                self.accepts(rs, ws, &join(path, name), out, d + 1);
                continue;
            }
            match r.get("additionalProperties") {
                Some(Value::Bool(false)) => out.push(match self.dir {
                    Dir::Backward => format!(
                        "{} removed, and the new type refuses unknown fields \
                         (`deny_unknown_fields`), so old payloads that have it are refused",
                        place(&join(path, name))
                    ),
                    Dir::Forward => format!(
                        "{} added, and the old type refuses unknown fields \
                         (`deny_unknown_fields`)",
                        place(&join(path, name))
                    ),
                }),
                Some(extra @ Value::Object(_)) => {
                    self.accepts(extra, ws, &join(path, name), out, d + 1)
                }
                _ => gone.push(name),
            }
        }
        for (name, rs) in rp {
            if !required(r, name) {
                continue;
            }
            let field = join(path, name);
            if wp.contains_key(name) {
                if !required(w, name) {
                    out.push(match self.dir {
                        Dir::Backward => format!(
                            "{} became required; old payloads may lack it (make it an `Option` \
                             or give it `#[serde(default)]`)",
                            place(&field)
                        ),
                        Dir::Forward => {
                            format!("{} became optional; old readers require it", place(&field))
                        }
                    });
                }
                continue;
            }
            // A required field the writer does not have: added (backward) or removed (forward),
            // or one side of a rename when a field of the same shape went the other way.
            let renamed = gone.iter().position(|g| {
                wp.get(*g).map(|s| resolve(&self.w, s)) == Some(resolve(&self.r, rs))
            });
            let other = renamed.map(|i| gone.remove(i));
            out.push(match (self.dir, other) {
                (Dir::Backward, Some(old)) => format!(
                    "field `{}` renamed to `{name}`; old payloads have no `{name}` (keep the old \
                     name with `#[serde(alias = \"{old}\")]`, or upcast from the old version's type)",
                    join(path, old)
                ),
                (Dir::Backward, None) => format!(
                    "required {} added without a default; old payloads do not have it (make it \
                     an `Option` or give it `#[serde(default)]`)",
                    place(&field)
                ),
                (Dir::Forward, Some(new)) => {
                    format!("field `{field}` renamed to `{new}`; old readers require `{name}`")
                }
                (Dir::Forward, None) => {
                    format!("{} removed; old readers require it", place(&field))
                }
            });
        }
    }

    fn accepts_value(&self, r: &Value, value: &Value) -> bool {
        let r = resolve(&self.r, r);
        if accepts_anything(r) {
            return true;
        }
        if let Some(values) = literal_values(r) {
            return values.contains(&value);
        }
        if let Some(alts) = alternatives(r) {
            return alts.iter().any(|a| self.accepts_value(a, value));
        }
        let t = match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        let rt = type_set(r);
        rt.contains(&t) || (t == "integer" && rt.contains(&"number"))
    }

    fn value_gone(&self, value: &Value, path: &str) -> Issue {
        match value {
            Value::String(s) => self.variant_gone(s, path),
            other => match self.dir {
                Dir::Backward => format!("{}: value {other} no longer accepted", place(path)),
                Dir::Forward => format!(
                    "{}: value {other} added; old readers refuse it",
                    place(path)
                ),
            },
        }
    }

    fn variant_gone(&self, label: &str, path: &str) -> Issue {
        let at = if path.is_empty() {
            String::new()
        } else {
            format!(" of field `{path}`")
        };
        match self.dir {
            Dir::Backward => {
                format!("enum variant `{label}`{at} removed; old payloads may hold it")
            }
            Dir::Forward => format!("enum variant `{label}`{at} added; old readers refuse it"),
        }
    }

    fn type_changed(&self, r: &Value, w: &Value, path: &str) -> Issue {
        let (old, new) = self.old_new(r, w);
        format!(
            "{}: type changed from {} to {}",
            place(path),
            describe(old),
            describe(new)
        )
    }
}

/// `s` without the `null` an `Option` adds (`"type": [T, "null"]` or `anyOf: [T, null]`).
fn without_null(s: &Value) -> Value {
    let mut s = s.clone();
    if let Some(Value::Array(types)) = s.get_mut("type") {
        types.retain(|t| t != "null");
    }
    let null = serde_json::json!({"type": "null"});
    if let Some(Value::Array(alts)) = s.get_mut("anyOf") {
        alts.retain(|a| *a != null);
        if let [only] = alts.as_slice() {
            return only.clone();
        }
    }
    s
}

/// `{}` or `true`: no constraint at all.
fn accepts_anything(s: &Value) -> bool {
    match s {
        Value::Bool(b) => *b,
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

/// The `enum` values or the `const` of a schema.
fn literal_values(s: &Value) -> Option<Vec<&Value>> {
    if let Some(Value::Array(values)) = s.get("enum") {
        return Some(values.iter().collect());
    }
    s.get("const").map(|c| vec![c])
}

/// The JSON types a schema allows (`type` as a string or a list).
fn type_set(s: &Value) -> Vec<&str> {
    match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// The integers a schema allows: its `format` (as schemars writes Rust's integer types) narrowed
/// by `minimum`/`maximum`.
fn int_range(s: &Value) -> (i128, i128) {
    let (mut lo, mut hi) = match s.get("format").and_then(Value::as_str) {
        Some("int8") => (i8::MIN as i128, i8::MAX as i128),
        Some("int16") => (i16::MIN as i128, i16::MAX as i128),
        Some("int32") => (i32::MIN as i128, i32::MAX as i128),
        Some("int64" | "int") => (i64::MIN as i128, i64::MAX as i128),
        Some("uint8") => (0, u8::MAX as i128),
        Some("uint16") => (0, u16::MAX as i128),
        Some("uint32") => (0, u32::MAX as i128),
        Some("uint64" | "uint") => (0, u64::MAX as i128),
        _ => (i128::MIN, i128::MAX),
    };
    if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
        lo = lo.max(min.ceil() as i128);
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
        hi = hi.min(max.floor() as i128);
    }
    (lo, hi)
}

/// The name of the enum variant an alternative stands for: the one required property of an
/// externally tagged variant, the `const` of an internally or adjacently tagged one, the value
/// of a unit variant.
fn variant_label(alt: &Value) -> Option<String> {
    if let Some(Value::String(s)) = alt.get("const") {
        return Some(s.clone());
    }
    if let Some(Value::Array(values)) = alt.get("enum")
        && let [Value::String(s)] = values.as_slice()
    {
        return Some(s.clone());
    }
    let props = alt.get("properties")?.as_object()?;
    for p in props.values() {
        if let Some(Value::String(tag)) = p.get("const") {
            return Some(tag.clone());
        }
    }
    match alt.get("required").and_then(Value::as_array)?.as_slice() {
        [Value::String(only)] if props.len() == 1 => Some(only.clone()),
        _ => None,
    }
}

/// A schema in a few words: `integer (int64)`, `string or null`, `one of "a", "b"`.
fn describe(s: &Value) -> String {
    if let Some(values) = literal_values(s) {
        let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        return format!("one of {}", values.join(", "));
    }
    if let Some(alts) = alternatives(s) {
        let parts: Vec<String> = alts.iter().map(describe).collect();
        return parts.join(" or ");
    }
    let types = type_set(s);
    if types.is_empty() {
        return if s.get("$ref").is_some() {
            "a recursive type".into()
        } else {
            "anything".into()
        };
    }
    let mut parts = Vec::new();
    for t in types {
        let detail = match t {
            "integer" | "number" | "string" => s.get("format").and_then(Value::as_str),
            _ => None,
        };
        parts.push(match (t, detail) {
            (t, Some(f)) => format!("{t} ({f})"),
            ("array", None) => match s.get("items") {
                Some(items) => format!("array of {}", describe(items)),
                None => "array".to_owned(),
            },
            (t, None) => t.to_owned(),
        });
    }
    parts.join(" or ")
}
