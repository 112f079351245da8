//! `narad_topic`: `POST/GET/PATCH/DELETE /v1/topics[/{topic}]` and the topic's JSON Schema.

use async_trait::async_trait;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use tf_provider::schema::{AttributeType, Block, Description, Schema};
use tf_provider::value::{Value, ValueEmpty};
use tf_provider::{AttributePath, Diagnostics, Resource, map};

use crate::util::*;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct TopicState {
    pub id: Value<String>,
    pub name: Value<String>,
    pub partitions: Value<i64>,
    pub visibility_timeout_ms: Value<i64>,
    pub retention_ms: Value<i64>,
    pub retention_bytes: Value<i64>,
    pub max_in_flight_per_partition: Value<i64>,
    pub delay_ms: Value<i64>,
    pub max_message_bytes: Value<i64>,
    pub key_policy: Value<String>,
    pub schema: Value<String>,
    pub schema_version: Value<i64>,
    pub created_at_ms: Value<i64>,
    pub force_destroy: Value<bool>,
}

pub struct TopicResource {
    pub shared: Shared,
}

/// The mutable numeric fields: (attribute and API field, lower bound, upper bound).
const NUMERIC: [(&str, i64, i64); 6] = [
    ("visibility_timeout_ms", 100, 43_200_000),
    ("retention_ms", 0, i64::MAX),
    ("retention_bytes", 0, i64::MAX),
    ("max_in_flight_per_partition", 1, 1_000_000),
    ("delay_ms", 0, 900_000),
    ("max_message_bytes", 1, 8_388_608),
];

impl TopicState {
    fn numeric(&self, field: &str) -> &Value<i64> {
        match field {
            "partitions" => &self.partitions,
            "visibility_timeout_ms" => &self.visibility_timeout_ms,
            "retention_ms" => &self.retention_ms,
            "retention_bytes" => &self.retention_bytes,
            "max_in_flight_per_partition" => &self.max_in_flight_per_partition,
            "delay_ms" => &self.delay_ms,
            "max_message_bytes" => &self.max_message_bytes,
            _ => unreachable!("{field}"),
        }
    }

    /// Takes what the broker answered (a topic object) into the state.
    fn absorb(&mut self, j: &Json) {
        let num = |k: &str| opt(j.get(k).and_then(Json::as_i64));
        self.id = opt(j.get("id").and_then(Json::as_str).map(str::to_string));
        self.name = opt(j.get("name").and_then(Json::as_str).map(str::to_string));
        self.partitions = num("partitions");
        self.visibility_timeout_ms = num("visibility_timeout_ms");
        self.retention_ms = num("retention_ms");
        self.retention_bytes = num("retention_bytes");
        self.max_in_flight_per_partition = num("max_in_flight_per_partition");
        self.delay_ms = num("delay_ms");
        self.max_message_bytes = num("max_message_bytes");
        self.key_policy = opt(j
            .get("key_policy")
            .and_then(Json::as_str)
            .map(str::to_string));
        self.created_at_ms = num("created_at_ms");
        self.schema_version = num("schema_version");
    }
}

fn validate_topic(diags: &mut Diagnostics, c: &TopicState) {
    check_topic_name(diags, &c.name, "name");
    check_range(diags, &c.partitions, "partitions", 1, 256);
    for (field, lo, hi) in NUMERIC {
        check_range(diags, c.numeric(field), field, lo, hi);
    }
    if let Value::Value(r) = &c.retention_ms
        && *r > 0
        && *r < 1000
    {
        diags.error(
            "Invalid retention_ms",
            format!("retention_ms = {r}: must be 0 (keep forever) or at least 1000"),
            AttributePath::new("retention_ms"),
        );
    }
    if let Value::Value(k) = &c.key_policy
        && k != "prefer"
        && k != "strict"
    {
        diags.error(
            "Invalid key_policy",
            format!("key_policy = \"{k}\": must be \"prefer\" or \"strict\""),
            AttributePath::new("key_policy"),
        );
    }
    if let Value::Value(s) = &c.schema {
        if s.len() > 256 * 1024 {
            diags.error(
                "Invalid schema",
                "a JSON Schema is at most 256 KiB",
                AttributePath::new("schema"),
            );
        }
        match serde_json::from_str::<Json>(s) {
            Ok(Json::Object(_)) | Ok(Json::Bool(_)) => {}
            Ok(_) => diags.error(
                "Invalid schema",
                "a JSON Schema is a JSON object (or a boolean)",
                AttributePath::new("schema"),
            ),
            Err(e) => diags.error(
                "Invalid schema",
                format!("schema is not JSON: {e}"),
                AttributePath::new("schema"),
            ),
        }
    }
}

/// Two schema texts that are the same JSON.
fn same_json(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Json>(a),
        serde_json::from_str::<Json>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The topic's latest schema as the broker has it, or `None` without one.
async fn latest_schema(
    api: &crate::client::Api,
    name: &str,
) -> Result<Option<Json>, crate::client::ApiError> {
    let j = api.get(&format!("/v1/topics/{name}/schema")).await?;
    let Some(latest) = j.get("latest").and_then(Json::as_i64) else {
        return Ok(None);
    };
    Ok(j.get("versions")
        .and_then(Json::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("version").and_then(Json::as_i64) == Some(latest))
        })
        .and_then(|v| v.get("schema").cloned()))
}

impl TopicResource {
    /// Reads the topic; `Ok(None)` when it is gone. `prior_schema` is kept as written when
    /// the broker's latest schema is the same JSON (so formatting never shows as drift).
    async fn fetch(
        &self,
        api: &crate::client::Api,
        name: &str,
        prior: &TopicState,
    ) -> Result<Option<TopicState>, crate::client::ApiError> {
        let j = match api.get(&format!("/v1/topics/{name}")).await {
            Ok(j) => j,
            Err(e) if e.is("topic_not_found") => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut s = prior.clone();
        s.absorb(&j);
        s.schema = if s.schema_version.is_value() {
            match latest_schema(api, name).await? {
                Some(server) => match &prior.schema {
                    Value::Value(text) if same_json(text, &server.to_string()) => {
                        Value::Value(text.clone())
                    }
                    _ => Value::Value(server.to_string()),
                },
                None => Value::Null,
            }
        } else {
            Value::Null
        };
        Ok(Some(s))
    }
}

#[async_trait]
impl Resource for TopicResource {
    type State<'a> = TopicState;
    type PrivateState<'a> = ValueEmpty;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        use AttributeType::{Bool, Number, String as Str};
        let n = |d: &str| attr(Number, OptionalComputed, d);
        Some(Schema {
            version: 1,
            block: Block {
                version: 1,
                description: Description::plain(
                    "A Narad topic. `name` forces replacement; `partitions` grows in place and \
                     forces replacement when shrunk; every other setting is updated in place.",
                ),
                attributes: map! {
                    "id" => attr(Str, Computed, "The topic's incarnation id (16 hex digits), new on every create."),
                    "name" => attr(Str, Required, "Topic name, ^[A-Za-z0-9._-]{1,200}$. Forces replacement."),
                    "partitions" => attr(Number, OptionalComputed, "1..=256 (server default 3). Growing is in place; shrinking forces replacement (the topic and its data are deleted)."),
                    "visibility_timeout_ms" => n("Lease length, 100..=43200000."),
                    "retention_ms" => n("0 (keep forever) or >= 1000."),
                    "retention_bytes" => n("Per partition, 0 = no limit."),
                    "max_in_flight_per_partition" => n("1..=1000000."),
                    "delay_ms" => n("Default delay of messages without their own, 0..=900000."),
                    "max_message_bytes" => n("1..=8388608."),
                    "key_policy" => attr(Str, OptionalComputed, "\"prefer\" or \"strict\"."),
                    "schema" => attr(Str, OptionalComputed, "A JSON Schema (JSON text, e.g. jsonencode({...})). A change adds a version (additive changes only); it cannot be removed. A fan-out child follows its parent's."),
                    "schema_version" => attr(Number, Computed, "The latest schema version, null without a schema."),
                    "created_at_ms" => attr(Number, Computed, "Creation time, unix ms."),
                    "force_destroy" => attr(Bool, Optional, "Delete even while a remote child of this topic has records not shipped (DELETE ?force=true)."),
                },
                ..Default::default()
            },
        })
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: TopicState) -> Option<()> {
        validate_topic(diags, &config);
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        state: TopicState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(TopicState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let name = known(&state.name)?;
        match self.fetch(&api, &name, &state).await {
            Ok(Some(mut s)) => {
                if let (Value::Value(old), Value::Value(new)) = (&state.id, &s.id)
                    && old != new
                {
                    diags.root_warning(
                        format!("Topic '{name}' was deleted and created again outside Terraform"),
                        format!("incarnation {old} is gone; the topic now is {new}"),
                    );
                }
                s.force_destroy = state.force_destroy;
                Some((s, private))
            }
            Ok(None) => None,
            Err(e) => {
                api_error(diags, &format!("reading topic '{name}'"), &e);
                Some((state, private))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        diags: &mut Diagnostics,
        proposed: TopicState,
        _config: TopicState,
        _meta: ValueEmpty,
    ) -> Option<(TopicState, ValueEmpty)> {
        validate_topic(diags, &proposed);
        let mut s = proposed;
        s.id = Value::Unknown;
        s.created_at_ms = Value::Unknown;
        s.schema_version = if s.schema.is_null() {
            Value::Null
        } else {
            Value::Unknown
        };
        s.partitions = or_unknown(s.partitions);
        s.visibility_timeout_ms = or_unknown(s.visibility_timeout_ms);
        s.retention_ms = or_unknown(s.retention_ms);
        s.retention_bytes = or_unknown(s.retention_bytes);
        s.max_in_flight_per_partition = or_unknown(s.max_in_flight_per_partition);
        s.delay_ms = or_unknown(s.delay_ms);
        s.max_message_bytes = or_unknown(s.max_message_bytes);
        s.key_policy = or_unknown(s.key_policy);
        // the topic may adopt a parent's schema later: null until known
        Some((s, ValueEmpty::Null))
    }

    async fn plan_update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: TopicState,
        proposed: TopicState,
        _config: TopicState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(TopicState, ValueEmpty, Vec<AttributePath>)> {
        validate_topic(diags, &proposed);
        let mut replace = vec![];
        let mut s = proposed;
        if s.name != prior.name {
            replace.push(AttributePath::new("name"));
        }
        if let (Value::Value(old), Value::Value(new)) = (&prior.partitions, &s.partitions)
            && new < old
        {
            replace.push(AttributePath::new("partitions"));
            diags.warning(
                "Shrinking partitions replaces the topic",
                format!(
                    "partitions can only grow ({old} -> {new}): the topic is deleted, with \
                         its data and queue state, and created again"
                ),
                AttributePath::new("partitions"),
            );
        }
        match (&prior.schema, &s.schema) {
            (a, b) if a == b => {}
            (_, Value::Value(new)) => {
                // a new text: a new version unless it is the same JSON
                if !matches!(&prior.schema, Value::Value(old) if same_json(old, new)) {
                    s.schema_version = Value::Unknown;
                }
            }
            _ => s.schema_version = Value::Unknown,
        }
        Some((s, private, replace))
    }

    async fn plan_destroy<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior: TopicState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<ValueEmpty> {
        Some(private)
    }

    async fn create<'a>(
        &self,
        diags: &mut Diagnostics,
        planned: TopicState,
        _config: TopicState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(TopicState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let name = known(&planned.name)?;
        let mut body = serde_json::Map::new();
        body.insert("name".into(), json!(name));
        for field in std::iter::once("partitions").chain(NUMERIC.iter().map(|f| f.0)) {
            if let Value::Value(n) = planned.numeric(field) {
                body.insert(field.into(), json!(n));
            }
        }
        if let Value::Value(k) = &planned.key_policy {
            body.insert("key_policy".into(), json!(k));
        }
        if let Value::Value(text) = &planned.schema {
            match serde_json::from_str::<Json>(text) {
                Ok(schema) => {
                    body.insert("schema".into(), schema);
                }
                Err(e) => {
                    diags.error(
                        "Invalid schema",
                        e.to_string(),
                        AttributePath::new("schema"),
                    );
                    return None;
                }
            }
        }
        let created = match api
            .call(Method::POST, "/v1/topics", Some(&Json::Object(body)))
            .await
        {
            Ok(j) => j.unwrap_or(Json::Null),
            Err(e) => {
                api_error(diags, &format!("creating topic '{name}'"), &e);
                return None;
            }
        };
        let mut s = planned.clone();
        s.absorb(&created);
        if planned.schema.is_null() {
            s.schema_version = Value::Null;
        }
        Some((s, private))
    }

    async fn update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: TopicState,
        planned: TopicState,
        _config: TopicState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(TopicState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let name = known(&prior.name)?;
        let mut body = serde_json::Map::new();
        for field in std::iter::once("partitions").chain(NUMERIC.iter().map(|f| f.0)) {
            if let Value::Value(n) = planned.numeric(field)
                && prior.numeric(field) != planned.numeric(field)
            {
                body.insert(field.into(), json!(n));
            }
        }
        if let Value::Value(k) = &planned.key_policy
            && prior.key_policy != planned.key_policy
        {
            body.insert("key_policy".into(), json!(k));
        }
        if let Value::Value(text) = &planned.schema {
            let same = matches!(&prior.schema, Value::Value(old) if same_json(old, text));
            if !same {
                match serde_json::from_str::<Json>(text) {
                    Ok(schema) => {
                        body.insert("schema".into(), schema);
                    }
                    Err(e) => {
                        diags.error(
                            "Invalid schema",
                            e.to_string(),
                            AttributePath::new("schema"),
                        );
                        return None;
                    }
                }
            }
        }
        let mut s = planned.clone();
        if !body.is_empty() {
            match api
                .call(
                    Method::PATCH,
                    &format!("/v1/topics/{name}"),
                    Some(&Json::Object(body)),
                )
                .await
            {
                Ok(j) => s.absorb(&j.unwrap_or(Json::Null)),
                Err(e) => {
                    api_error(diags, &format!("updating topic '{name}'"), &e);
                    return None;
                }
            }
        }
        if s.schema.is_null() {
            s.schema_version = Value::Null;
        }
        Some((s, private))
    }

    async fn destroy<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: TopicState,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<()> {
        let api = self.shared.api(diags)?;
        let name = known(&prior.name)?;
        let force = matches!(prior.force_destroy, Value::Value(true));
        let path = if force {
            format!("/v1/topics/{name}?force=true")
        } else {
            format!("/v1/topics/{name}")
        };
        destroy_at(
            &api,
            diags,
            &path,
            &["topic_not_found"],
            &format!("deleting topic '{name}'"),
        )
        .await
    }

    async fn import<'a>(
        &self,
        diags: &mut Diagnostics,
        id: String,
    ) -> Option<(TopicState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        match self.fetch(&api, &id, &TopicState::default()).await {
            Ok(Some(s)) => Some((s, ValueEmpty::Null)),
            Ok(None) => {
                diags.root_error(
                    "Cannot import narad_topic",
                    format!("no topic is named '{id}' (import by the topic's name)"),
                );
                None
            }
            Err(e) => {
                api_error(diags, &format!("importing topic '{id}'"), &e);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_texts_compare_as_json() {
        assert!(same_json(
            r#"{"type":"object","a":1}"#,
            r#"{ "a": 1, "type": "object" }"#
        ));
        assert!(!same_json(r#"{"type":"object"}"#, r#"{"type":"array"}"#));
    }

    #[test]
    fn limits_are_checked_at_plan_time() {
        let mut d = Diagnostics::default();
        let ok = TopicState {
            name: Value::Value("orders".into()),
            partitions: Value::Value(256),
            retention_ms: Value::Value(0),
            ..Default::default()
        };
        validate_topic(&mut d, &ok);
        assert!(d.errors.is_empty());
        for bad in [
            TopicState {
                name: Value::Value("..".into()),
                ..Default::default()
            },
            TopicState {
                partitions: Value::Value(257),
                ..Default::default()
            },
            TopicState {
                retention_ms: Value::Value(999),
                ..Default::default()
            },
            TopicState {
                delay_ms: Value::Value(900_001),
                ..Default::default()
            },
            TopicState {
                key_policy: Value::Value("loose".into()),
                ..Default::default()
            },
            TopicState {
                schema: Value::Value("[1]".into()),
                ..Default::default()
            },
        ] {
            let mut d = Diagnostics::default();
            validate_topic(&mut d, &bad);
            assert_eq!(d.errors.len(), 1, "{bad:?}");
        }
    }
}
