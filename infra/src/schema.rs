//! JSON Schema per topic: compile (boon, drafts 4 to 2020-12), validate payloads at accept
//! time, and the additive-only evolution rule.
//!
//! Schemas are self-contained: a `$ref` to anything outside the schema (a file, a URL) is
//! refused at compile time, so a schema can never make the broker read its disk or the
//! network.

use std::collections::HashMap;
use std::sync::Arc;

use narad_core::broker::{SchemaVersion, TopicMeta};
use parking_lot::Mutex;
use serde_json::Value;

/// Largest schema document, in bytes of JSON.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Longest violation message returned to a client.
const MAX_ERROR_CHARS: usize = 512;
/// Compiled schemas kept; beyond this the cache starts over.
const CACHE_CAPACITY: usize = 4096;
const LOCATION: &str = "urn:narad:topic-schema";

pub struct Compiled {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

struct NoRemoteRefs;

impl boon::UrlLoader for NoRemoteRefs {
    fn load(&self, url: &str) -> Result<Value, Box<dyn std::error::Error>> {
        Err(
            format!("external $ref '{url}' is not allowed: a topic schema must be self-contained")
                .into(),
        )
    }
}

fn truncate(mut s: String) -> String {
    if s.chars().count() > MAX_ERROR_CHARS {
        s = s.chars().take(MAX_ERROR_CHARS).collect::<String>() + "...";
    }
    s
}

/// Compiles a schema as given by a client; the error says why it is not a usable schema.
pub fn compile(schema: &Value) -> Result<Compiled, String> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err("schema: must be a JSON Schema object".into());
    }
    let size = serde_json::to_vec(schema).map_or(usize::MAX, |v| v.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(format!("schema: larger than {MAX_SCHEMA_BYTES} bytes"));
    }
    let schema = schema.clone();
    // boon asserts on its internal invariants in debug builds; a client's schema must never
    // take a request down with it
    let compiled = std::panic::catch_unwind(move || {
        let mut c = boon::Compiler::new();
        c.use_loader(Box::new(NoRemoteRefs));
        c.add_resource(LOCATION, schema)
            .map_err(|e| format!("{e:#}"))?;
        let mut schemas = boon::Schemas::new();
        let index = c
            .compile(LOCATION, &mut schemas)
            .map_err(|e| format!("{e:#}"))?;
        Ok::<_, String>(Compiled { schemas, index })
    });
    match compiled {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(truncate(format!("schema: invalid JSON Schema: {e}"))),
        Err(_) => Err("schema: invalid JSON Schema (it could not be compiled)".into()),
    }
}

impl Compiled {
    /// Checks one payload: it must be JSON and match the schema.
    pub fn check(&self, payload: &[u8]) -> Result<(), String> {
        let v: Value = serde_json::from_slice(payload)
            .map_err(|e| format!("payload is not valid JSON ({e}); this topic has a schema"))?;
        self.schemas
            .validate(&v, self.index)
            .map_err(|e| truncate(format!("payload violates the topic schema: {e:#}")))
    }
}

/// Compiled schemas by (topic incarnation, version).
#[derive(Default)]
pub struct SchemaCache {
    map: Mutex<HashMap<(u64, u32), Arc<Compiled>>>,
}

impl SchemaCache {
    /// The validator of the topic's latest schema version; `None` when it has none.
    pub fn latest(&self, meta: &TopicMeta) -> Option<Result<Arc<Compiled>, String>> {
        let v = meta.schemas.last()?;
        let key = (meta.id, v.version);
        if let Some(c) = self.map.lock().get(&key) {
            return Some(Ok(c.clone()));
        }
        let compiled = match compile(&v.schema) {
            Ok(c) => Arc::new(c),
            Err(e) => return Some(Err(e)),
        };
        let mut map = self.map.lock();
        if map.len() >= CACHE_CAPACITY {
            map.clear();
        }
        map.insert(key, compiled.clone());
        Some(Ok(compiled))
    }
}

/// Whether a schema uses references anywhere (`$ref`, `$dynamicRef`, `$recursiveRef`).
fn has_refs(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| {
            matches!(k.as_str(), "$ref" | "$dynamicRef" | "$recursiveRef") || has_refs(v)
        }),
        Value::Array(a) => a.iter().any(has_refs),
        _ => false,
    }
}

/// Keywords that describe but do not constrain: free to change between versions.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "$comment",
    "examples",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
];

fn required(s: &serde_json::Map<String, Value>) -> Vec<&str> {
    s.get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The additive-only rule: a new version may add optional top-level properties (and change
/// annotations such as `description`); every other keyword, every existing property's
/// definition and the `required` list stay exactly as they were. So removing a property,
/// changing a type, adding or dropping a required field, or tightening anything else is
/// refused.
pub fn check_evolution(old: &[SchemaVersion], new: &Value) -> Result<(), String> {
    let Some(prev) = old.last() else {
        return Ok(());
    };
    let refused = |why: String| Err(format!("schema change refused: {why}"));
    let (Some(p), Some(n)) = (prev.schema.as_object(), new.as_object()) else {
        if prev.schema != *new {
            return refused("a boolean schema cannot change".into());
        }
        return Ok(());
    };
    let (old_req, new_req) = (required(p), required(n));
    if let Some(added) = new_req.iter().find(|r| !old_req.contains(r)) {
        return refused(format!(
            "'{added}' became required (new fields must be optional)"
        ));
    }
    if let Some(dropped) = old_req.iter().find(|r| !new_req.contains(r)) {
        return refused(format!(
            "'{dropped}' is no longer required (consumers rely on it)"
        ));
    }
    // a `$ref` can point into an annotation and make it constrain: then annotations are
    // held to the same rule as everything else
    let annotations_free = !has_refs(&prev.schema) && !has_refs(new);
    let keys: std::collections::BTreeSet<&String> = p.keys().chain(n.keys()).collect();
    for k in keys {
        let annotation = annotations_free && ANNOTATIONS.contains(&k.as_str());
        if k == "properties" || annotation || p.get(k) == n.get(k) {
            continue;
        }
        return refused(match k.as_str() {
            "type" => "the top-level type changed".into(),
            "required" => "the required list changed".into(),
            _ => format!("keyword '{k}' changed (only new optional properties may be added)"),
        });
    }
    let empty = serde_json::Map::new();
    let props = |m: &serde_json::Map<String, Value>| {
        m.get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_else(|| empty.clone())
    };
    let (old_props, new_props) = (props(p), props(n));
    if n.get("properties").is_some_and(|v| !v.is_object()) {
        return refused("properties must be an object".into());
    }
    for (name, old_def) in &old_props {
        let Some(new_def) = new_props.get(name) else {
            return refused(format!(
                "property '{name}' was removed (changes must be additive)"
            ));
        };
        if old_def.get("type") != new_def.get("type") {
            return refused(format!("the type of property '{name}' changed"));
        }
        if old_def != new_def {
            return refused(format!(
                "the definition of property '{name}' changed (existing properties stay as they are)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v(schema: Value) -> Vec<SchemaVersion> {
        vec![SchemaVersion {
            version: 1,
            created_at_ms: 0,
            schema,
        }]
    }

    #[test]
    fn validates_payloads() {
        let c = compile(&json!({
            "type": "object",
            "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["id"]
        }))
        .unwrap();
        assert!(c.check(br#"{"id": 3}"#).is_ok());
        let e = c.check(br#"{"id": "x"}"#).unwrap_err();
        assert!(e.contains("/id"), "{e}");
        assert!(c.check(br#"{"note": "no id"}"#).is_err());
        assert!(c.check(b"not json").unwrap_err().contains("not valid JSON"));
    }

    #[test]
    fn refuses_bad_and_external_schemas() {
        assert!(compile(&json!(3)).is_err());
        assert!(compile(&json!({"type": "no-such-type"})).is_err());
        assert!(compile(&json!({"$ref": "file:///etc/passwd"})).is_err());
        assert!(compile(&json!({"$ref": "http://127.0.0.1:1/x.json"})).is_err());
        assert!(compile(&json!({"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"})).is_ok());
    }

    #[test]
    fn evolution_is_additive_only() {
        let base = json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]});
        let old = v(base.clone());
        assert!(check_evolution(&old, &base).is_ok());
        let add_optional = json!({"type": "object", "properties": {"id": {"type": "integer"}, "n": {"type": "string"}}, "required": ["id"]});
        assert!(check_evolution(&old, &add_optional).is_ok());
        let removed = json!({"type": "object", "properties": {}, "required": ["id"]});
        assert!(
            check_evolution(&old, &removed)
                .unwrap_err()
                .contains("removed")
        );
        let retyped =
            json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]});
        assert!(
            check_evolution(&old, &retyped)
                .unwrap_err()
                .contains("type")
        );
        let new_required = json!({"type": "object", "properties": {"id": {"type": "integer"}, "n": {"type": "string"}}, "required": ["id", "n"]});
        assert!(
            check_evolution(&old, &new_required)
                .unwrap_err()
                .contains("required")
        );
        assert!(check_evolution(&[], &removed).is_ok());
        // anything else that could refuse what was valid is refused too
        let closed = json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": false});
        assert!(
            check_evolution(&old, &closed)
                .unwrap_err()
                .contains("additionalProperties")
        );
        let narrowed = json!({"type": "object", "properties": {"id": {"type": "integer", "minimum": 5}}, "required": ["id"]});
        assert!(
            check_evolution(&old, &narrowed)
                .unwrap_err()
                .contains("definition")
        );
        let described = json!({"type": "object", "description": "orders", "properties": {"id": {"type": "integer"}}, "required": ["id"]});
        assert!(check_evolution(&old, &described).is_ok());
        assert!(check_evolution(&v(json!(true)), &json!(false)).is_err());
        // an annotation a `$ref` points into constrains: it may not change
        let via_ref = json!({"readOnly": true, "properties": {"id": {"$ref": "#/readOnly"}}});
        let flipped = json!({"readOnly": false, "properties": {"id": {"$ref": "#/readOnly"}}});
        assert!(check_evolution(&v(via_ref), &flipped).is_err());
    }
}
