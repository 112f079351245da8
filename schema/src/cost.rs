//! Static cost analysis of a topic schema, done before boon compiles it.
//!
//! boon has no step limit: a schema whose `$ref`s fan out (`allOf` of two `$ref: "#"` under a
//! property) makes the work per payload value double with every nesting level, and its regexes
//! are compiled with the `regex` crate's 10 MiB-per-regex default. So the schema is analysed
//! here, and refused when it is too costly:
//!
//! - **regexes**: every `pattern` and `patternProperties` key counts; at most
//!   [`MAX_REGEXES`], [`MAX_REGEX_SOURCE_BYTES`] of source in all, and each must compile
//!   within [`MAX_REGEX_COMPILED_BYTES`] (a trial compile with that size limit).
//! - **applicator graph**: subschemas are nodes; `allOf`/`anyOf`/`oneOf`/`not`/`if`/`then`/
//!   `else`/`dependentSchemas`/`$ref`… apply in place (to the same payload value), the others
//!   (`properties`, `items`, `additionalProperties`…) to a child value. A loop of in-place
//!   edges (a `$ref` back to an ancestor that does not descend into the payload) is refused.
//!   For every nesting depth `k` the analysis computes an upper bound on the schema keywords
//!   one payload value at depth `k` can be checked against ([`Cost::per_level`]); a schema
//!   where that bound passes [`MAX_CHECKS_PER_VALUE`] at any depth a payload can reach is
//!   refused. Fan-out in a recursion grows it exponentially, so it is refused at once.
//!
//! At produce time [`Cost::of_payload`] multiplies the payload's values per depth by that
//! bound: an estimate of the validation steps, checked against a budget before boon runs.
//!
//! The bound is conservative (a value is assumed to match every `patternProperties` key, and
//! `additionalProperties` too) and the `$ref` resolution is a superset of boon's: a fragment
//! is resolved against both the enclosing `$id` resource and the root, an anchor names every
//! node with that anchor, and a `$dynamicRef` reaches every matching `$dynamicAnchor`.

use std::collections::HashMap;

use serde_json::Value;

use super::SchemaError;

fn too_complex(why: String) -> SchemaError {
    SchemaError::TooComplex(why)
}

/// Most schema keywords one payload value may be checked against, at any depth.
pub const MAX_CHECKS_PER_VALUE: u64 = 1_000_000;
/// Most regexes (`pattern` values and `patternProperties` keys, each occurrence) in a schema.
pub const MAX_REGEXES: usize = 64;
/// Most bytes of regex source in a schema, all regexes together.
pub const MAX_REGEX_SOURCE_BYTES: usize = 32 * 1024;
/// Largest compiled form of one regex (the `regex` crate's `size_limit`).
pub const MAX_REGEX_COMPILED_BYTES: usize = 64 * 1024;
/// Most applicator edges in the graph (bounds the analysis itself).
const MAX_EDGES: usize = 1_000_000;
/// Payload depths analysed: serde_json refuses nesting beyond 128, keys sit one deeper.
pub const MAX_DEPTH: usize = 130;
/// A string costs one step per this many bytes on top of its one step as a value.
const STRING_BYTES_PER_STEP: usize = 64;

/// Keywords whose value is one subschema applied to the same payload value.
const IN_PLACE_ONE: &[&str] = &["not", "if", "then", "else"];
/// Keywords whose value is an array of subschemas applied to the same value.
const IN_PLACE_ARRAY: &[&str] = &["allOf", "anyOf", "oneOf"];
/// Keywords whose value is a map of subschemas applied to the same value.
const IN_PLACE_MAP: &[&str] = &["dependentSchemas", "dependencies"];
const REFS: &[&str] = &["$ref", "$dynamicRef", "$recursiveRef"];

/// Per-depth bound on the checks of one payload value.
#[derive(Debug, Clone)]
pub struct Cost {
    /// `per_level[k]`: most schema keywords a value nested `k` deep is checked against.
    pub per_level: Vec<u64>,
    /// Regexes in the schema (each occurrence).
    pub regexes: usize,
}

impl Cost {
    /// Estimated validation steps for one payload, and its deepest nesting; `Err` when it is
    /// nested deeper than analysed.
    pub fn of_payload(&self, v: &Value) -> Result<(u64, usize), String> {
        let mut steps = 0u64;
        let mut deepest = 0;
        let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
        let string_units = |s: &str| 1 + (s.len() / STRING_BYTES_PER_STEP) as u64;
        while let Some((v, depth)) = stack.pop() {
            let Some(&per) = self.per_level.get(depth) else {
                return Err(format!("payload is nested deeper than {MAX_DEPTH} levels"));
            };
            deepest = deepest.max(depth);
            let units = match v {
                Value::String(s) => string_units(s),
                _ => 1,
            };
            steps = steps.saturating_add(units.saturating_mul(per));
            match v {
                Value::Array(a) => stack.extend(a.iter().map(|c| (c, depth + 1))),
                Value::Object(m) => {
                    let key_per = self.per_level.get(depth + 1).copied().unwrap_or(u64::MAX);
                    for (k, c) in m {
                        steps = steps.saturating_add(string_units(k).saturating_mul(key_per));
                        stack.push((c, depth + 1));
                    }
                }
                _ => {}
            }
        }
        Ok((steps, deepest))
    }
}

#[derive(Default)]
struct Node {
    weight: u64,
    in_place: Vec<usize>,
    /// `properties`: one of them applies to a given child.
    props: Vec<usize>,
    /// `patternProperties`, `additionalProperties`, `unevaluatedProperties`: all may apply.
    obj_all: Vec<usize>,
    /// `propertyNames`: applies to the key.
    names: Vec<usize>,
    /// `prefixItems` / array-form `items`: one applies to a given item.
    tuple: Vec<usize>,
    /// `items`, `additionalItems`, `contains`, `unevaluatedItems`: all may apply.
    arr_all: Vec<usize>,
}

struct Graph<'a> {
    root: &'a Value,
    location: &'a str,
    ids: HashMap<String, usize>,
    nodes: Vec<Node>,
    queue: Vec<(String, &'a Value)>,
    /// anchor name -> pointers (`$anchor`, `$dynamicAnchor`, draft-4..7 `"$id": "#name"`).
    anchors: HashMap<String, Vec<String>>,
    /// `$id` (or draft-4 `id`) -> pointer, for resources embedded in the schema.
    resources: Vec<(String, String)>,
    recursive_anchors: Vec<String>,
    edges: usize,
    regexes: Vec<&'a str>,
}

fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(h) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
        {
            out.push(h);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The resource id a schema object declares, if any (`$id`, or draft-4 `id`, not `#name`).
fn resource_id(v: &Value) -> Option<&str> {
    let m = v.as_object()?;
    ["$id", "id"]
        .iter()
        .filter_map(|k| m.get(*k)?.as_str())
        .find(|id| !id.starts_with('#'))
}

fn last_segment(uri: &str) -> &str {
    let uri = uri.split('#').next().unwrap_or(uri).trim_end_matches('/');
    uri.rsplit(['/', ':']).next().unwrap_or(uri)
}

impl<'a> Graph<'a> {
    fn new(root: &'a Value, location: &'a str) -> Self {
        let mut g = Graph {
            root,
            location,
            ids: HashMap::new(),
            nodes: Vec::new(),
            queue: Vec::new(),
            anchors: HashMap::new(),
            resources: Vec::new(),
            recursive_anchors: Vec::new(),
            edges: 0,
            regexes: Vec::new(),
        };
        g.index(root, String::new());
        g
    }

    /// Records every anchor and embedded resource (a superset: enum values included).
    fn index(&mut self, v: &'a Value, ptr: String) {
        let mut stack = vec![(v, ptr)];
        while let Some((v, ptr)) = stack.pop() {
            match v {
                Value::Object(m) => {
                    for k in ["$anchor", "$dynamicAnchor"] {
                        if let Some(a) = m.get(k).and_then(Value::as_str) {
                            self.anchors
                                .entry(a.to_owned())
                                .or_default()
                                .push(ptr.clone());
                        }
                    }
                    for k in ["$id", "id"] {
                        if let Some(id) = m.get(k).and_then(Value::as_str) {
                            if let Some(a) = id.strip_prefix('#') {
                                self.anchors
                                    .entry(a.to_owned())
                                    .or_default()
                                    .push(ptr.clone());
                            } else if let Some((_, a)) = id.split_once('#')
                                && !a.is_empty()
                            {
                                self.anchors
                                    .entry(a.to_owned())
                                    .or_default()
                                    .push(ptr.clone());
                                self.resources.push((id.to_owned(), ptr.clone()));
                            } else {
                                self.resources.push((id.to_owned(), ptr.clone()));
                            }
                        }
                    }
                    if m.get("$recursiveAnchor") == Some(&Value::Bool(true)) {
                        self.recursive_anchors.push(ptr.clone());
                    }
                    for (k, c) in m {
                        stack.push((c, format!("{ptr}/{}", escape(k))));
                    }
                }
                Value::Array(a) => {
                    for (i, c) in a.iter().enumerate() {
                        stack.push((c, format!("{ptr}/{i}")));
                    }
                }
                _ => {}
            }
        }
    }

    /// The pointer of the nearest enclosing `$id` resource of `ptr` (the root's is "").
    fn resource_of(&self, ptr: &str) -> String {
        let mut v = self.root;
        let mut at = String::new();
        let mut resource = String::new();
        for token in ptr.split('/').skip(1) {
            let next = match v {
                Value::Object(m) => m.get(&unescape(token)),
                Value::Array(a) => token.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            };
            let Some(next) = next else { break };
            v = next;
            at.push('/');
            at.push_str(token);
            if resource_id(v).is_some() {
                resource = at.clone();
            }
        }
        resource
    }

    /// Follows a decoded JSON pointer fragment from `base`; the pointer of what it names.
    fn follow(&self, base: &str, fragment: &str) -> Option<String> {
        let mut v = self.root.pointer(base)?;
        let mut ptr = base.to_owned();
        for token in fragment.split('/').skip(1) {
            let token = unescape(token);
            v = match v {
                Value::Object(m) => m.get(&token)?,
                Value::Array(a) => a.get(token.parse::<usize>().ok()?)?,
                _ => return None,
            };
            ptr.push('/');
            ptr.push_str(&escape(&token));
        }
        Some(ptr)
    }

    /// Every node a reference may name (a superset of what boon resolves it to).
    fn targets(&self, keyword: &str, r: &str, from: &str) -> Result<Vec<String>, SchemaError> {
        let (base, fragment) = r.split_once('#').unwrap_or((r, ""));
        let fragment = percent_decode(fragment);
        let bases: Vec<String> = if base.is_empty() {
            vec![self.resource_of(from), String::new()]
        } else if base == self.location {
            vec![String::new()]
        } else {
            let seg = last_segment(base);
            self.resources
                .iter()
                .filter(|(id, _)| {
                    let id = id.split('#').next().unwrap_or(id);
                    id == base || (!seg.is_empty() && last_segment(id) == seg)
                })
                .map(|(_, p)| p.clone())
                .collect()
        };
        if bases.is_empty() {
            return Err(SchemaError::Invalid(format!(
                "schema: {keyword} '{r}' names nothing within the schema"
            )));
        }
        let mut out = Vec::new();
        if fragment.is_empty() {
            out.extend(bases);
        } else if fragment.starts_with('/') {
            out.extend(bases.iter().filter_map(|b| self.follow(b, &fragment)));
        } else if let Some(named) = self.anchors.get(&fragment) {
            out.extend(named.iter().cloned());
        }
        if keyword == "$recursiveRef" {
            out.extend(self.recursive_anchors.iter().cloned());
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn node(&mut self, ptr: String) -> Result<usize, SchemaError> {
        if let Some(&id) = self.ids.get(&ptr) {
            return Ok(id);
        }
        let Some(v) = self.root.pointer(&ptr) else {
            return Err(SchemaError::Invalid(format!(
                "schema: no schema at '#{ptr}'"
            )));
        };
        let id = self.nodes.len();
        self.nodes.push(Node::default());
        self.ids.insert(ptr.clone(), id);
        self.queue.push((ptr, v));
        Ok(id)
    }

    fn edge(&mut self, ptr: String) -> Result<usize, SchemaError> {
        self.edges += 1;
        if self.edges > MAX_EDGES {
            return Err(too_complex(format!(
                "the schema has more than {MAX_EDGES} subschema references"
            )));
        }
        self.node(ptr)
    }

    fn build(&mut self) -> Result<(), SchemaError> {
        self.node(String::new())?;
        while let Some((ptr, v)) = self.queue.pop() {
            let id = self.ids[&ptr];
            let n = self.expand(&ptr, v)?;
            self.nodes[id] = n;
        }
        Ok(())
    }

    fn expand(&mut self, ptr: &str, v: &'a Value) -> Result<Node, SchemaError> {
        let mut n = Node {
            weight: 1,
            ..Node::default()
        };
        let Value::Object(m) = v else {
            return Ok(n);
        };
        let at = |k: &str| format!("{ptr}/{}", escape(k));
        for (k, val) in m {
            let k = k.as_str();
            n.weight = n.weight.saturating_add(1);
            if IN_PLACE_ONE.contains(&k)
                || matches!(k, "additionalProperties" | "unevaluatedProperties")
                || matches!(k, "propertyNames" | "additionalItems" | "contains")
                || k == "unevaluatedItems"
                || (k == "items" && !val.is_array())
            {
                if !(val.is_object() || val.is_boolean()) {
                    continue;
                }
                let c = self.edge(at(k))?;
                match k {
                    "additionalProperties" | "unevaluatedProperties" => n.obj_all.push(c),
                    "propertyNames" => n.names.push(c),
                    "additionalItems" | "contains" | "unevaluatedItems" | "items" => {
                        n.arr_all.push(c);
                    }
                    _ => n.in_place.push(c),
                }
            } else if IN_PLACE_ARRAY.contains(&k) || k == "prefixItems" || k == "items" {
                let Some(a) = val.as_array() else { continue };
                n.weight = n.weight.saturating_add(a.len() as u64);
                for (i, sub) in a.iter().enumerate() {
                    if !(sub.is_object() || sub.is_boolean()) {
                        continue;
                    }
                    let c = self.edge(format!("{}/{i}", at(k)))?;
                    if IN_PLACE_ARRAY.contains(&k) {
                        n.in_place.push(c);
                    } else {
                        n.tuple.push(c);
                    }
                }
            } else if IN_PLACE_MAP.contains(&k) || k == "properties" || k == "patternProperties" {
                let Some(o) = val.as_object() else { continue };
                n.weight = n.weight.saturating_add(o.len() as u64);
                for (name, s) in o {
                    if k == "patternProperties" {
                        self.regexes.push(name);
                    }
                    if !(s.is_object() || s.is_boolean()) {
                        continue;
                    }
                    let c = self.edge(format!("{}/{}", at(k), escape(name)))?;
                    match k {
                        "properties" => n.props.push(c),
                        "patternProperties" => n.obj_all.push(c),
                        _ => n.in_place.push(c),
                    }
                }
            } else if REFS.contains(&k) {
                let Some(r) = val.as_str() else { continue };
                for t in self.targets(k, r, ptr)? {
                    let c = self.edge(t)?;
                    n.in_place.push(c);
                }
            } else if k == "contentSchema" && (val.is_object() || val.is_boolean()) {
                // applied only with content assertions (off), but compiled
                self.edge(at(k))?;
            } else if matches!(k, "$defs" | "definitions") {
                // not applied, but boon compiles them (and their regexes)
                let Some(o) = val.as_object() else { continue };
                for name in o.keys() {
                    self.edge(format!("{}/{}", at(k), escape(name)))?;
                }
            } else {
                if k == "pattern"
                    && let Some(p) = val.as_str()
                {
                    self.regexes.push(p);
                }
                n.weight = n.weight.saturating_add(json_nodes(val));
            }
        }
        Ok(n)
    }

    /// Nodes ordered so that every in-place target comes before its source; `Err` on a loop.
    fn order(&self) -> Result<Vec<usize>, SchemaError> {
        const NEW: u8 = 0;
        const OPEN: u8 = 1;
        const DONE: u8 = 2;
        let mut state = vec![NEW; self.nodes.len()];
        let mut order = Vec::with_capacity(self.nodes.len());
        for start in 0..self.nodes.len() {
            if state[start] != NEW {
                continue;
            }
            let mut stack = vec![(start, 0usize)];
            state[start] = OPEN;
            while let Some(top) = stack.last_mut() {
                let (u, i) = *top;
                if let Some(&t) = self.nodes[u].in_place.get(i) {
                    top.1 += 1;
                    match state[t] {
                        NEW => {
                            state[t] = OPEN;
                            stack.push((t, 0));
                        }
                        OPEN => {
                            let ptr = self
                                .ids
                                .iter()
                                .find(|(_, i)| **i == t)
                                .map_or("", |(p, _)| p.as_str());
                            return Err(too_complex(format!(
                                "a reference loops back to '#{ptr}' without descending into the payload"
                            )));
                        }
                        _ => {}
                    }
                } else {
                    state[u] = DONE;
                    order.push(u);
                    stack.pop();
                }
            }
        }
        Ok(order)
    }
}

fn json_nodes(v: &Value) -> u64 {
    let mut n = 0u64;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        n += 1;
        match v {
            Value::Array(a) => stack.extend(a),
            Value::Object(m) => {
                n += m.len() as u64;
                stack.extend(m.values());
            }
            _ => {}
        }
    }
    n
}

/// The `\cX` control escapes boon accepts (ECMA-262) spelled so the `regex` crate parses them.
fn control_escapes(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.peek().copied() {
                Some('c') => {
                    chars.next();
                    match chars.peek().copied() {
                        Some(l) if l.is_ascii_alphabetic() => {
                            chars.next();
                            out.push_str(&format!("\\x{:02x}", (l as u8) % 32));
                        }
                        _ => out.push_str("\\c"),
                    }
                }
                Some(n) => {
                    chars.next();
                    out.push('\\');
                    out.push(n);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn check_regexes(regexes: &[&str]) -> Result<(), SchemaError> {
    if regexes.len() > MAX_REGEXES {
        return Err(too_complex(format!(
            "the schema has {} regexes (pattern, patternProperties); at most {MAX_REGEXES} are allowed",
            regexes.len()
        )));
    }
    let total: usize = regexes.iter().map(|r| r.len()).sum();
    if total > MAX_REGEX_SOURCE_BYTES {
        return Err(too_complex(format!(
            "the schema's regexes add up to {total} bytes; at most {MAX_REGEX_SOURCE_BYTES} are allowed"
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for r in regexes {
        if !seen.insert(*r) {
            continue;
        }
        let built = regex::RegexBuilder::new(&control_escapes(r))
            .size_limit(MAX_REGEX_COMPILED_BYTES)
            .build();
        if let Err(regex::Error::CompiledTooBig(_)) = built {
            let shown: String = r.chars().take(64).collect();
            return Err(too_complex(format!(
                "regex '{shown}' compiles to more than {MAX_REGEX_COMPILED_BYTES} bytes (bounded repetitions of large classes such as '.' or '\\p{{L}}' multiply)"
            )));
        }
        // a syntax error is boon's to report, in its own words
    }
    Ok(())
}

/// Analyses a schema; `Err` says why it is too costly to compile or to validate against.
pub fn analyse(schema: &Value, location: &str) -> Result<Cost, SchemaError> {
    let mut g = Graph::new(schema, location);
    g.build()?;
    check_regexes(&g.regexes)?;
    let order = g.order()?;
    let n = g.nodes.len();
    let mut per_level = Vec::with_capacity(MAX_DEPTH + 1);
    let sum = |h: &[u64], ids: &[usize]| ids.iter().fold(0u64, |acc, &c| acc.saturating_add(h[c]));
    let max = |h: &[u64], ids: &[usize]| ids.iter().map(|&c| h[c]).max().unwrap_or(0);
    let mut cur = vec![0u64; n];
    for &u in &order {
        cur[u] = g.nodes[u]
            .weight
            .saturating_add(sum(&cur, &g.nodes[u].in_place));
    }
    per_level.push(cur[0]);
    let mut next = vec![0u64; n];
    while per_level.len() <= MAX_DEPTH {
        let worst = per_level.iter().copied().max().unwrap_or(0);
        if worst > MAX_CHECKS_PER_VALUE {
            let depth = per_level.iter().position(|&c| c == worst).unwrap_or(0);
            return Err(too_complex(format!(
                "a payload value nested {depth} levels deep would be checked against more than {MAX_CHECKS_PER_VALUE} schema keywords (do several $refs apply to the same value, e.g. allOf of two refs to the root?)"
            )));
        }
        for &u in &order {
            let nd = &g.nodes[u];
            let obj = max(&cur, &nd.props).saturating_add(sum(&cur, &nd.obj_all));
            let arr = max(&cur, &nd.tuple).saturating_add(sum(&cur, &nd.arr_all));
            let child = obj.max(arr).max(sum(&cur, &nd.names));
            next[u] = child.saturating_add(sum(&next, &nd.in_place));
        }
        per_level.push(next[0]);
        if next == cur || next.iter().all(|&c| c == 0) {
            // a steady state: every deeper level costs the same
            let last = next[0];
            per_level.resize(MAX_DEPTH + 1, last);
        }
        std::mem::swap(&mut cur, &mut next);
    }
    let worst = per_level.iter().copied().max().unwrap_or(0);
    if worst > MAX_CHECKS_PER_VALUE {
        return Err(too_complex(format!(
            "a payload value would be checked against more than {MAX_CHECKS_PER_VALUE} schema keywords"
        )));
    }
    Ok(Cost {
        per_level,
        regexes: g.regexes.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LOC: &str = "urn:test";

    #[test]
    fn plain_schemas_cost_little() {
        let c = analyse(
            &json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}),
            LOC,
        )
        .unwrap();
        assert!(c.per_level[0] < 20, "{:?}", &c.per_level[..3]);
        assert!(c.per_level[1] < 5);
        assert_eq!(c.per_level[5], 0);
        let (steps, depth) = c.of_payload(&json!({"id": 3})).unwrap();
        assert_eq!(depth, 1);
        assert!(steps < 40, "{steps}");
    }

    #[test]
    fn recursion_without_fan_out_is_linear() {
        // a binary tree: left and right each recurse, but one value is only one of them
        let tree = json!({
            "type": "object",
            "properties": {"left": {"$ref": "#"}, "right": {"$ref": "#"}, "v": {"type": "integer"}},
            "additionalProperties": false
        });
        let c = analyse(&tree, LOC).unwrap();
        assert_eq!(c.per_level[10], c.per_level[100]);
        let list = json!({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"});
        analyse(&list, LOC).unwrap();
    }

    #[test]
    fn fan_out_in_recursion_is_refused() {
        let bomb = json!({"properties": {"a": {"allOf": [{"$ref": "#"}, {"$ref": "#"}]}}});
        let e = analyse(&bomb, LOC).unwrap_err().to_string();
        assert!(e.contains("checked against more than"), "{e}");
        // the same through $defs, an anchor, and anyOf over items
        let via_defs = json!({"$defs": {"x": {"items": {"anyOf": [{"$ref": "#/$defs/x"}, {"$ref": "#/$defs/x"}]}}}, "$ref": "#/$defs/x"});
        assert!(analyse(&via_defs, LOC).is_err());
        let via_anchor = json!({"$anchor": "top", "additionalProperties": {"oneOf": [{"$ref": "#top"}, {"$ref": "#top"}]}});
        assert!(analyse(&via_anchor, LOC).is_err());
    }

    #[test]
    fn diamonds_without_recursion_are_refused() {
        // 40 levels of allOf [d(i+1), d(i+1)]: 2^40 paths to the last one, on one value
        let mut defs = serde_json::Map::new();
        for i in 0..40 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"allOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert("d40".into(), json!({"type": "integer"}));
        let s = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(analyse(&s, LOC).is_err());
    }

    #[test]
    fn in_place_loops_are_refused() {
        let e = analyse(&json!({"anyOf": [{"type": "string"}, {"$ref": "#"}]}), LOC)
            .unwrap_err()
            .to_string();
        assert!(e.contains("loops back"), "{e}");
    }

    #[test]
    fn regexes_are_bounded() {
        let many: serde_json::Map<String, Value> = (0..MAX_REGEXES + 1)
            .map(|i| (format!("^p{i}$"), json!({"type": "string"})))
            .collect();
        let e = analyse(&json!({"patternProperties": many}), LOC)
            .unwrap_err()
            .to_string();
        assert!(e.contains("regexes"), "{e}");
        let heavy = json!({"properties": {"a": {"pattern": ".{500}"}}});
        let e = analyse(&heavy, LOC).unwrap_err().to_string();
        assert!(e.contains("compiles to more than"), "{e}");
        // the \c escape boon accepts does not hide a heavy regex from the trial compile
        let hidden = json!({"pattern": "\\cA.{500}"});
        assert!(analyse(&hidden, LOC).is_err());
        assert!(
            analyse(
                &json!({"pattern": "^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$"}),
                LOC
            )
            .is_ok()
        );
    }

    #[test]
    fn payload_cost_counts_values_by_depth() {
        let c = analyse(
            &json!({"patternProperties": {"^a": {}, "^b": {}, "^c": {}}}),
            LOC,
        )
        .unwrap();
        let (small, _) = c.of_payload(&json!({"a": 1})).unwrap();
        let keys: serde_json::Map<String, Value> =
            (0..1000).map(|i| (format!("k{i}"), json!(1))).collect();
        let (big, _) = c.of_payload(&Value::Object(keys)).unwrap();
        assert!(big > 500 * small, "{big} vs {small}");
    }

    #[test]
    fn unresolvable_refs_are_refused_and_embedded_ids_followed() {
        assert!(analyse(&json!({"$ref": "other.json"}), LOC).is_err());
        let embedded = json!({
            "$defs": {"item": {"$id": "http://example.com/item.json", "type": "integer"}},
            "items": {"$ref": "http://example.com/item.json"}
        });
        analyse(&embedded, LOC).unwrap();
        analyse(
            &json!({"$ref": "urn:test#/$defs/a", "$defs": {"a": {}}}),
            LOC,
        )
        .unwrap();
    }
}
