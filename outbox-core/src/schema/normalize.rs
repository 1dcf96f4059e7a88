//! The comparable form of a JSON Schema: references inlined, annotations dropped, keys sorted.
//! Two schemas with the same normalized form accept the same payloads, whatever their doc
//! comments or the names of their nested types.

use serde_json::{Map, Value};

/// Keywords that describe a schema without changing what it accepts.
const ANNOTATIONS: [&str; 10] = [
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "examples",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// `schema` with every non-recursive `$ref` inlined and annotations dropped. A recursive
/// reference stays a `$ref`, and the `$defs` it needs are kept (normalized).
pub(crate) fn normalize(schema: &Value) -> Value {
    let defs = schema.get("$defs").cloned().unwrap_or(Value::Null);
    let mut kept: Vec<String> = Vec::new();
    let mut stack: Vec<String> = Vec::new();
    let mut out = inline(schema, &defs, &mut stack, &mut kept);
    if let Value::Object(map) = &mut out {
        map.remove("$defs");
        let mut needed = Map::new();
        let mut i = 0;
        while i < kept.len() {
            let name = kept[i].clone();
            if let Some(def) = defs.get(&name) {
                let mut stack = vec![name.clone()];
                needed.insert(name, inline(def, &defs, &mut stack, &mut kept));
            }
            i += 1;
        }
        if !needed.is_empty() {
            map.insert("$defs".to_owned(), Value::Object(sorted(needed)));
        }
    }
    out
}

fn inline(value: &Value, defs: &Value, stack: &mut Vec<String>, kept: &mut Vec<String>) -> Value {
    match value {
        Value::Object(map) => {
            if let Some(name) = map.get("$ref").and_then(Value::as_str).and_then(def_name)
                && let Some(def) = defs.get(name)
            {
                {
                    if stack.iter().any(|s| s == name) {
                        if !kept.iter().any(|k| k == name) {
                            kept.push(name.to_owned());
                        }
                        return Value::Object(Map::from_iter([(
                            "$ref".to_owned(),
                            Value::String(format!("#/$defs/{name}")),
                        )]));
                    }
                    stack.push(name.to_owned());
                    let mut inlined = inline(def, defs, stack, kept);
                    stack.pop();
                    // Keywords next to a `$ref` (2020-12 allows them) apply too.
                    if let Value::Object(target) = &mut inlined {
                        for (k, v) in map {
                            if k != "$ref" && !ANNOTATIONS.contains(&k.as_str()) {
                                target.insert(k.clone(), inline(v, defs, stack, kept));
                            }
                        }
                    }
                    return inlined;
                }
            }
            let mut out = Map::new();
            for (k, v) in map {
                if ANNOTATIONS.contains(&k.as_str()) || k == "$defs" {
                    continue;
                }
                // Property names are data, not keywords: keep them all, whatever they are called.
                let v = if k == "properties" {
                    match v {
                        Value::Object(props) => Value::Object(
                            props
                                .iter()
                                .map(|(name, s)| (name.clone(), inline(s, defs, stack, kept)))
                                .collect(),
                        ),
                        other => other.clone(),
                    }
                } else {
                    inline(v, defs, stack, kept)
                };
                out.insert(k.clone(), v);
            }
            Value::Object(sorted(out))
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| inline(v, defs, stack, kept)).collect())
        }
        other => other.clone(),
    }
}

/// `Name` of `#/$defs/Name` (or the older `#/definitions/Name`).
pub(crate) fn def_name(reference: &str) -> Option<&str> {
    reference
        .strip_prefix("#/$defs/")
        .or_else(|| reference.strip_prefix("#/definitions/"))
}

/// `map` with its keys in order, whether or not serde_json keeps insertion order.
fn sorted(map: Map<String, Value>) -> Map<String, Value> {
    let mut entries: Vec<(String, Value)> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().collect()
}

/// Up to `limit` places where `a` and `b` differ, as JSON pointers.
pub(crate) fn differences(a: &Value, b: &Value, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    diff(a, b, String::new(), &mut out, limit);
    out
}

fn diff(a: &Value, b: &Value, at: String, out: &mut Vec<String>, limit: usize) {
    if out.len() >= limit || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let here = format!("{at}/{k}");
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => diff(p, q, here, out, limit),
                    (Some(_), None) => out.push(format!("{here} removed")),
                    (None, Some(_)) => out.push(format!("{here} added")),
                    (None, None) => {}
                }
                if out.len() >= limit {
                    return;
                }
            }
        }
        _ => out.push(format!("{} changed", if at.is_empty() { "/" } else { &at })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refs_are_inlined_and_annotations_dropped() {
        let a = json!({
            "$schema": "x", "title": "A", "type": "object",
            "properties": {"addr": {"$ref": "#/$defs/Address", "description": "where"},
                           "title": {"type": "string"}},
            "$defs": {"Address": {"type": "object", "description": "d",
                                  "properties": {"city": {"type": "string"}}}}
        });
        let b = json!({
            "type": "object",
            "properties": {"title": {"type": "string"},
                           "addr": {"$ref": "#/$defs/Place"}},
            "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}}
        });
        assert_eq!(normalize(&a), normalize(&b));
        assert_eq!(
            normalize(&a)["properties"]["addr"]["properties"]["city"],
            json!({"type": "string"})
        );
    }

    #[test]
    fn a_recursive_type_keeps_its_definition() {
        let s = json!({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
            "properties": {"next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}}}});
        let n = normalize(&s);
        assert_eq!(
            n["properties"]["next"]["anyOf"][0],
            json!({"$ref": "#/$defs/Node"})
        );
        assert!(n["$defs"]["Node"].is_object(), "{n}");
    }
}
