//! JSON Schema per topic: compile (boon, drafts 4 to 2020-12), validate payloads at accept
//! time, and the additive-only evolution rule.
//!
//! Schemas are self-contained: a `$ref` to anything outside the schema (a file, a URL) is
//! refused at compile time, so a schema can never make the broker read its disk or the
//! network.
//!
//! Cost is bounded at every step, because boon itself has no step or memory limit:
//!
//! ```text
//!  create/PATCH ─► size ─► cost::analyse (regexes, $ref fan-out) ─► boon compile
//!                          └──────── on a schema worker, under a timeout ───────┘
//!  produce ─► delay, size (broker's order) ─► parse ─► Cost::of_payload ≤ budget ─► boon
//!             inline when small; otherwise parse + validate run on a schema worker
//! ```
//!
//! Schema workers are threads (with a large stack: boon recurses per nesting level) under one
//! semaphore of as many permits as the machine has cores: a permit is held until the work
//! really ends (also after its caller gave up on a timeout), so runaway work can never occupy
//! more than that many threads, and the async workers that answer `/healthz` are never the
//! ones doing large validations.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_core::broker::{SchemaVersion, TopicMeta};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::Semaphore;

mod cost;

pub use cost::{
    MAX_CHECKS_PER_VALUE, MAX_REGEX_COMPILED_BYTES, MAX_REGEX_SOURCE_BYTES, MAX_REGEXES,
};

/// Largest schema document, in bytes of JSON.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Most estimated validation steps one produce request may cost, all its messages together
/// (see [`cost`]): about a second of boon's work on one core.
pub const MAX_VALIDATION_STEPS: u64 = 20_000_000;
/// A request estimated below this many steps, with at most [`INLINE_BYTES`] of payload, is
/// validated on the async worker: cheaper than a hop to a blocking thread.
const INLINE_STEPS: u64 = 20_000;
const INLINE_BYTES: usize = 64 * 1024;
/// Longest wait for a schema worker; beyond it the request is answered 503 `schema_busy`.
pub const WORKER_WAIT: Duration = Duration::from_secs(2);
/// Longest compile; beyond it the schema is refused (400 `schema_too_complex`).
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest validation of one request (a backstop: the step budget should end it sooner).
pub const VALIDATE_TIMEOUT: Duration = Duration::from_secs(10);
/// Stack of a schema worker thread. boon recurses per nesting level: a schema nested 64
/// deep (the most a 1 MiB JSON body can hold) or a payload nested 128 deep needs a few MiB in
/// a debug build; only touched pages are committed.
const WORKER_STACK: usize = 32 * 1024 * 1024;
/// Payloads nested deeper than this are validated on a schema worker even when small: the
/// async workers have 2 MiB stacks.
const INLINE_DEPTH: usize = 16;
/// Longest violation message returned to a client.
const MAX_ERROR_CHARS: usize = 512;
/// Compiled schemas kept, by count and by weight (schema bytes, plus the regex size limit per
/// regex); the least recently used go first.
const CACHE_CAPACITY: usize = 1024;
const CACHE_WEIGHT: usize = 256 * 1024 * 1024;
const LOCATION: &str = "urn:narad:topic-schema";

/// Why a schema cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// Not a valid, self-contained JSON Schema.
    #[error("{0}")]
    Invalid(String),
    /// Valid, but too costly to compile or to validate against (or compiling took too long).
    #[error("schema too complex: {0}")]
    TooComplex(String),
    /// Every schema worker stayed busy for [`WORKER_WAIT`].
    #[error("{0}")]
    Busy(String),
}

/// Why payloads were refused.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Message `.0` is not JSON, or violates the schema.
    #[error("{1}")]
    Violation(usize, String),
    /// Checking would cost more than the budget (message `.0`, when one is to blame).
    #[error("{1}")]
    TooComplex(Option<usize>, String),
    #[error("{0}")]
    Busy(String),
}

pub struct Compiled {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
    cost: cost::Cost,
    /// Cache weight.
    weight: usize,
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
/// This is the expensive step: call it through [`SchemaCache::compile`] from async code.
pub fn compile(schema: &Value) -> Result<Compiled, SchemaError> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(SchemaError::Invalid(
            "schema: must be a JSON Schema object".into(),
        ));
    }
    let size = serde_json::to_vec(schema).map_or(usize::MAX, |v| v.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(SchemaError::Invalid(format!(
            "schema: larger than {MAX_SCHEMA_BYTES} bytes"
        )));
    }
    // before boon: boon compiles regexes without a tight size limit and validates without a
    // step limit
    let cost = cost::analyse(schema, LOCATION)?;
    let weight = size.saturating_add(cost.regexes.saturating_mul(MAX_REGEX_COMPILED_BYTES));
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
        Ok::<_, String>((schemas, index))
    });
    match compiled {
        Ok(Ok((schemas, index))) => Ok(Compiled {
            schemas,
            index,
            cost,
            weight,
        }),
        Ok(Err(e)) => Err(SchemaError::Invalid(truncate(format!(
            "schema: invalid JSON Schema: {e}"
        )))),
        Err(_) => Err(SchemaError::Invalid(
            "schema: invalid JSON Schema (it could not be compiled)".into(),
        )),
    }
}

impl Compiled {
    /// Checks one payload: it must be JSON and match the schema. No step budget: for tests
    /// and trusted input; requests go through [`SchemaCache::check`].
    pub fn check(&self, payload: &[u8]) -> Result<(), String> {
        let v: Value = serde_json::from_slice(payload).map_err(not_json)?;
        self.validate(&v)
    }

    fn validate(&self, v: &Value) -> Result<(), String> {
        self.schemas
            .validate(v, self.index)
            .map_err(|e| truncate(format!("payload violates the topic schema: {e:#}")))
    }

    /// Estimated validation steps of one payload (see [`cost::Cost::of_payload`]).
    pub fn steps(&self, v: &Value) -> Result<u64, String> {
        self.cost.of_payload(v).map(|(steps, _)| steps)
    }

    /// Parses every payload and prices its validation against the request's budget.
    fn measure(&self, payloads: &[Bytes]) -> Result<(Vec<Value>, u64, usize), CheckError> {
        let mut total = 0u64;
        let mut deepest = 0;
        let mut values = Vec::with_capacity(payloads.len());
        for (i, p) in payloads.iter().enumerate() {
            let v: Value =
                serde_json::from_slice(p).map_err(|e| CheckError::Violation(i, not_json(e)))?;
            let (steps, depth) = self
                .cost
                .of_payload(&v)
                .map_err(|e| CheckError::TooComplex(Some(i), e))?;
            deepest = deepest.max(depth);
            total = total.saturating_add(steps);
            if total > MAX_VALIDATION_STEPS {
                return Err(CheckError::TooComplex(
                    Some(i),
                    format!(
                        "checking the payload against the topic schema would take about {total} steps (counting the request's earlier messages); a request may take at most {MAX_VALIDATION_STEPS}: send fewer, smaller or less deeply nested values"
                    ),
                ));
            }
            values.push(v);
        }
        Ok((values, total, deepest))
    }

    fn validate_all(&self, values: &[Value]) -> Result<(), CheckError> {
        for (i, v) in values.iter().enumerate() {
            self.validate(v).map_err(|e| CheckError::Violation(i, e))?;
        }
        Ok(())
    }
}

fn not_json(e: serde_json::Error) -> String {
    format!("payload is not valid JSON ({e}); this topic has a schema")
}

/// What the cache knows of a topic's latest schema.
pub enum Lookup {
    /// The topic has no schema.
    None,
    Hit(Arc<Compiled>),
    /// Not compiled yet: compile with [`SchemaCache::compile_latest`].
    Miss {
        key: (u64, u32),
        schema: Value,
    },
}

#[derive(Default)]
struct Lru {
    map: HashMap<(u64, u32), (Arc<Compiled>, u64)>,
    tick: u64,
    weight: usize,
}

impl Lru {
    fn get(&mut self, key: (u64, u32)) -> Option<Arc<Compiled>> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(&key).map(|(c, used)| {
            *used = tick;
            c.clone()
        })
    }

    fn insert(&mut self, key: (u64, u32), c: Arc<Compiled>) {
        self.tick += 1;
        if let Some((old, _)) = self.map.remove(&key) {
            self.weight -= old.weight;
        }
        while !self.map.is_empty()
            && (self.map.len() >= CACHE_CAPACITY || self.weight + c.weight > CACHE_WEIGHT)
        {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some((old, _)) = self.map.remove(&oldest) {
                self.weight -= old.weight;
            }
        }
        self.weight += c.weight;
        self.map.insert(key, (c, self.tick));
    }
}

/// Compiled JSON Schemas by (topic incarnation, version), and the workers that compile and
/// validate.
pub struct SchemaCache {
    lru: Mutex<Lru>,
    workers: Arc<Semaphore>,
}

impl Default for SchemaCache {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self::with_workers(cores)
    }
}

/// Why offloaded work produced nothing.
enum Offload {
    Busy,
    TimedOut,
    Panicked,
}

impl SchemaCache {
    pub fn with_workers(workers: usize) -> Self {
        Self {
            lru: Mutex::default(),
            workers: Arc::new(Semaphore::new(workers.max(1))),
        }
    }

    /// Runs `f` on a schema worker thread under a permit, which it holds until `f` returns
    /// (also when the caller stopped waiting): at most as many runaway jobs as permits.
    async fn offload<T: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Offload> {
        let permit = tokio::time::timeout(WORKER_WAIT, self.workers.clone().acquire_owned())
            .await
            .map_err(|_| Offload::Busy)?
            .map_err(|_| Offload::Busy)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        // a thread of its own rather than tokio's blocking pool: boon recurses per nesting
        // level of the schema and of the payload, deeper than a 2 MiB stack allows
        std::thread::Builder::new()
            .name("narad-schema".into())
            .stack_size(WORKER_STACK)
            .spawn(move || {
                let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
                drop(permit);
                let _ = tx.send(out);
            })
            .map_err(|e| {
                tracing::warn!(error = %e, "could not start a schema worker thread");
                Offload::Busy
            })?;
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => Err(Offload::TimedOut),
            Ok(Ok(Ok(out))) => Ok(out),
            Ok(Ok(Err(_)) | Err(_)) => Err(Offload::Panicked),
        }
    }

    /// Compiles a client's schema on a schema worker.
    pub async fn compile(&self, schema: Value) -> Result<Arc<Compiled>, SchemaError> {
        let out = self
            .offload(COMPILE_TIMEOUT, move || compile(&schema).map(Arc::new))
            .await;
        match out {
            Ok(r) => r,
            Err(Offload::Busy) => Err(SchemaError::Busy(format!(
                "every schema worker stayed busy for {} s; retry shortly",
                WORKER_WAIT.as_secs()
            ))),
            Err(Offload::TimedOut) => Err(SchemaError::TooComplex(format!(
                "compiling it took longer than {} s",
                COMPILE_TIMEOUT.as_secs()
            ))),
            Err(Offload::Panicked) => Err(SchemaError::Invalid(
                "schema: invalid JSON Schema (it could not be compiled)".into(),
            )),
        }
    }

    /// The topic's latest schema version, compiled if cached (cheap: call under the topic's
    /// metadata lock).
    pub fn lookup(&self, meta: &TopicMeta) -> Lookup {
        let Some(v) = meta.schemas.last() else {
            return Lookup::None;
        };
        let key = (meta.id, v.version);
        match self.lru.lock().get(key) {
            Some(c) => Lookup::Hit(c),
            None => Lookup::Miss {
                key,
                schema: v.schema.clone(),
            },
        }
    }

    /// Compiles a stored schema after a [`Lookup::Miss`] and caches it.
    pub async fn compile_latest(
        &self,
        key: (u64, u32),
        schema: Value,
    ) -> Result<Arc<Compiled>, SchemaError> {
        let c = self.compile(schema).await?;
        self.lru.lock().insert(key, c.clone());
        Ok(c)
    }

    /// Checks every payload of a produce request: JSON, within the step budget, valid.
    /// Small requests are checked here; the rest on a schema worker.
    pub async fn check(
        &self,
        compiled: Arc<Compiled>,
        payloads: Vec<Bytes>,
    ) -> Result<(), CheckError> {
        let bytes: usize = payloads.iter().map(Bytes::len).sum();
        let out = if bytes <= INLINE_BYTES {
            let (values, steps, depth) = compiled.measure(&payloads)?;
            if steps <= INLINE_STEPS && depth <= INLINE_DEPTH {
                return compiled.validate_all(&values);
            }
            self.offload(VALIDATE_TIMEOUT, move || compiled.validate_all(&values))
                .await
        } else {
            self.offload(VALIDATE_TIMEOUT, move || {
                let (values, _, _) = compiled.measure(&payloads)?;
                compiled.validate_all(&values)
            })
            .await
        };
        match out {
            Ok(r) => r,
            Err(Offload::Busy) => Err(CheckError::Busy(format!(
                "every schema worker stayed busy for {} s; retry shortly",
                WORKER_WAIT.as_secs()
            ))),
            Err(Offload::TimedOut) => Err(CheckError::TooComplex(
                None,
                format!(
                    "checking the payloads against the topic schema took longer than {} s",
                    VALIDATE_TIMEOUT.as_secs()
                ),
            )),
            Err(Offload::Panicked) => Err(CheckError::TooComplex(
                None,
                "the payloads could not be checked against the topic schema".into(),
            )),
        }
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

    fn nested(depth: usize, leaf: Value, wrap: impl Fn(Value) -> Value) -> Value {
        (0..depth).fold(leaf, |v, _| wrap(v))
    }

    #[tokio::test]
    async fn deep_schemas_and_payloads_do_not_overflow_a_stack() {
        let cache = SchemaCache::with_workers(2);
        // 64 levels of properties: as deep as a 1 MiB JSON body can nest it
        let deep = nested(
            63,
            json!({"type": "integer"}),
            |s| json!({"properties": {"a": s}}),
        );
        cache.compile(deep).await.unwrap();
        let tree = cache
            .compile(json!({"type": "object", "properties": {"a": {"$ref": "#"}}}))
            .await
            .unwrap();
        let payload = nested(120, json!({}), |v| json!({"a": v}));
        let bytes = Bytes::from(serde_json::to_vec(&payload).unwrap());
        assert!(
            bytes.len() < INLINE_BYTES,
            "small, but deep: still off the async worker"
        );
        cache.check(tree, vec![bytes]).await.unwrap();
    }

    #[tokio::test]
    async fn over_budget_payloads_are_refused_before_validation() {
        let cache = SchemaCache::with_workers(2);
        let patterns: serde_json::Map<String, Value> = (0..60)
            .map(|i| (format!("^k{i}x"), json!({"type": "integer"})))
            .collect();
        let c = cache
            .compile(json!({"patternProperties": patterns}))
            .await
            .unwrap();
        let keys: serde_json::Map<String, Value> = (0..200_000)
            .map(|i| (format!("key{i}"), json!(i)))
            .collect();
        let payload = Bytes::from(serde_json::to_vec(&keys).unwrap());
        let started = std::time::Instant::now();
        let e = cache.check(c.clone(), vec![payload]).await.unwrap_err();
        assert!(matches!(e, CheckError::TooComplex(Some(0), _)), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // the budget is per request: many small messages add up
        let small = Bytes::from(
            serde_json::to_vec(
                &keys
                    .iter()
                    .take(2000)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<serde_json::Map<_, _>>(),
            )
            .unwrap(),
        );
        let e = cache.check(c, vec![small; 100]).await.unwrap_err();
        assert!(
            matches!(e, CheckError::TooComplex(Some(i), _) if i > 0),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_busy_worker_pool_answers_busy() {
        let cache = SchemaCache::with_workers(1);
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let hold = cache.offload(Duration::from_secs(30), move || wait.recv());
        let busy = async {
            // the first job holds the only permit until released
            let r = cache.compile(json!({"type": "string"})).await;
            release.send(()).unwrap();
            r
        };
        let (held, r) = tokio::join!(hold, busy);
        assert!(held.is_ok());
        assert!(matches!(r, Err(SchemaError::Busy(_))), "{:?}", r.err());
    }

    #[test]
    fn the_cache_is_bounded_and_keeps_what_is_used() {
        let mut lru = Lru::default();
        let c = Arc::new(compile(&json!({"type": "string"})).unwrap());
        lru.insert((0, 1), c.clone());
        for i in 1..(CACHE_CAPACITY as u64 * 2) {
            lru.insert((i, 1), c.clone());
            assert!(
                lru.get((0, 1)).is_some(),
                "used every time: never the oldest"
            );
        }
        assert!(lru.map.len() <= CACHE_CAPACITY);
        assert_eq!(lru.weight, lru.map.len() * c.weight);
        assert!(lru.get((1, 1)).is_none(), "least recently used went first");
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

/// `cargo test -p narad-infra calibrate -- --ignored --nocapture`: how many estimated steps
/// boon validates per second, to set [`MAX_VALIDATION_STEPS`].
#[cfg(test)]
mod calibrate {
    use super::*;
    use serde_json::json;

    #[test]
    #[ignore]
    fn steps_per_second() {
        let cases = [
            (
                json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 50}}, "required": ["id"]}}}}),
                json!({"items": (0..100_000).map(|i| json!({"id": i, "name": "abc"})).collect::<Vec<_>>()}),
            ),
            (
                json!({"patternProperties": (0..60).map(|i| (format!("^k{i}x"), json!({"type": "integer"}))).collect::<serde_json::Map<_, _>>()}),
                Value::Object(
                    (0..100_000)
                        .map(|i| (format!("key{i}"), json!(i)))
                        .collect(),
                ),
            ),
            (
                json!({"type": "object", "properties": {"left": {"$ref": "#"}, "right": {"$ref": "#"}, "v": {"type": "integer"}}}),
                {
                    let mut v = json!({"v": 1});
                    for _ in 0..20 {
                        v = json!({"left": v, "v": 2});
                    }
                    v
                },
            ),
        ];
        for (s, p) in cases {
            let c = compile(&s).unwrap();
            let steps = c.steps(&p).unwrap();
            let t = std::time::Instant::now();
            let r = c.validate(&p);
            let el = t.elapsed();
            eprintln!(
                "steps {steps} took {el:?}: {:.1} M steps/s ({})",
                steps as f64 / el.as_secs_f64() / 1e6,
                r.is_ok()
            );
        }
    }

    /// What the attacks of issue 11 cost boon before the limits (run by hand; slow).
    #[test]
    #[ignore]
    fn attacks_without_limits() {
        let boon_compile = |s: Value| {
            let mut c = boon::Compiler::new();
            c.add_resource(LOCATION, s).unwrap();
            let mut schemas = boon::Schemas::new();
            let index = c.compile(LOCATION, &mut schemas).unwrap();
            (schemas, index)
        };
        let bomb = json!({"type": "object", "properties": {"a": {"allOf": [{"$ref": "#"}, {"$ref": "#"}]}}});
        let (schemas, index) = boon_compile(bomb.clone());
        let payload = (0..22).fold(json!({}), |v, _| json!({"a": v}));
        let t = std::time::Instant::now();
        let _ = schemas.validate(&payload, index);
        eprintln!(
            "fan-out bomb, {} byte payload: boon {:?}",
            serde_json::to_vec(&payload).unwrap().len(),
            t.elapsed()
        );
        let t = std::time::Instant::now();
        let e = compile(&bomb).err();
        eprintln!("fan-out bomb refused in {:?}: {e:?}", t.elapsed());
        let props: serde_json::Map<String, Value> = (0..20)
            .map(|i| {
                (
                    format!("p{i}"),
                    json!({"pattern": format!("^[\\p{{L}}\\p{{N}}]{{{}}}$", 90 + i % 10)}),
                )
            })
            .collect();
        let heavy = json!({"properties": props});
        let t = std::time::Instant::now();
        drop(boon_compile(heavy.clone()));
        eprintln!("20 heavy regexes: boon compile {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let e = compile(&heavy).err();
        eprintln!("20 heavy regexes refused in {:?}: {e:?}", t.elapsed());
        let patterns: serde_json::Map<String, Value> =
            (0..3000).map(|i| (format!("^k{i}_"), json!({}))).collect();
        let pp = json!({"patternProperties": patterns});
        let (schemas, index) = boon_compile(pp.clone());
        let keys: serde_json::Map<String, Value> =
            (0..2000).map(|i| (format!("key{i}"), json!(i))).collect();
        let t = std::time::Instant::now();
        let _ = schemas.validate(&Value::Object(keys), index);
        eprintln!("3000 patternProperties x 2000 keys: boon {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let e = compile(&pp).err();
        eprintln!("3000 patternProperties refused in {:?}: {e:?}", t.elapsed());
    }
}
