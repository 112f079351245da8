//! Topic administration: create, list, get (with partition stats), alter, delete.

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use narad_auth::Action;
use narad_core::broker::{Broker, LinkStart, TopicInfo, TopicMeta};
use narad_core::topic::{CreateTopic, TopicConfig, TopicPatch};
use narad_wire::ErrorCode;
use object_store::ObjectStoreExt as _;
use serde::Serialize;

use super::access::Caller;
use super::query::Query;
use super::{
    ApiError, ApiResult, MAX_JSON_BODY, SharedState, json_response, parse_json, read_body,
};
use crate::reads::{PartitionStatsJson, local_stats};
use narad_schema::SchemaError;

#[derive(Serialize)]
pub struct TopicJson<'a> {
    name: &'a str,
    id: String,
    created_at_ms: i64,
    #[serde(flatten)]
    config: &'a TopicConfig,
    /// Present when the topic is a fan-out child.
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout_delay_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a str>,
    /// Latest JSON Schema version, when the topic has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_version: Option<u32>,
    /// In a cluster: the node owning each partition.
    #[serde(skip_serializing_if = "<[u64]>::is_empty")]
    partition_owners: &'a [u64],
    /// `standalone`, `parent` (it has fan-out children) or `child`.
    role: &'static str,
    /// A parent's children that the caller may see, by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    children: Vec<String>,
    /// Primary, mirror of a topic on another cluster, or demoted, and the epoch.
    failover: RoleJson,
    /// In a cluster: partitions an admin moved by hand, which the planner leaves.
    #[serde(skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pinned_partitions: &'a std::collections::BTreeSet<u32>,
    /// A mirror: its source's fan-out children, which its promote attaches here.
    #[serde(skip_serializing_if = "<[narad_core::catalog::CarriedChild]>::is_empty")]
    carried_children: &'a [narad_core::catalog::CarriedChild],
}

/// A topic's role between clusters as the API shows it (ids in hex, as everywhere).
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct RoleJson {
    /// `primary`, `mirror` or `demoted`.
    role: &'static str,
    epoch: u64,
    /// A mirror's source.
    #[serde(skip_serializing_if = "Option::is_none")]
    mirror_of: Option<SourceJson>,
    /// A promoted mirror's old source, whose tail it still takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    promoted_from: Option<SourceJson>,
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct SourceJson {
    cluster: String,
    topic: String,
}

fn source_json(s: &narad_core::catalog::role::Source) -> SourceJson {
    SourceJson {
        cluster: format!("{:016x}", s.cluster),
        topic: format!("{:016x}", s.topic),
    }
}

pub fn role_json(r: &narad_core::catalog::TopicRole) -> RoleJson {
    use narad_core::catalog::TopicRole;
    let (mirror_of, promoted_from) = match r {
        TopicRole::Mirror { of, .. } => (Some(source_json(of)), None),
        TopicRole::Primary {
            promoted_from: Some(f),
            ..
        } => (None, Some(source_json(f))),
        _ => (None, None),
    };
    RoleJson {
        role: r.name(),
        epoch: r.epoch(),
        mirror_of,
        promoted_from,
    }
}

/// A topic as the API shows it to `caller`: the parent of a child is shown only to those who
/// may see the parent too (its name is not the child's business).
pub fn topic_json<'a>(m: &'a TopicMeta, caller: &Caller, broker: &Broker) -> TopicJson<'a> {
    topic_json_with(m, caller, broker, broker.child_names(&m.name))
}

/// [`topic_json`] with the topic's children already known (a list looks them all up once).
fn topic_json_with<'a>(
    m: &'a TopicMeta,
    caller: &Caller,
    broker: &Broker,
    mut children: Vec<String>,
) -> TopicJson<'a> {
    let role = match (&m.parent, children.is_empty()) {
        (Some(_), _) => "child",
        (None, false) => "parent",
        (None, true) => "standalone",
    };
    // children the caller may not use are not named to it
    children.retain(|c| {
        broker
            .with_topic_meta(c, |t| caller.may_see(t))
            .unwrap_or(false)
    });
    let parent = m.parent.as_ref().filter(|l| {
        broker
            .with_topic_meta(&l.parent, |p| caller.may_see(p))
            .unwrap_or(false)
    });
    TopicJson {
        name: &m.name,
        id: format!("{:016x}", m.id),
        created_at_ms: m.created_at_ms,
        config: &m.config,
        parent: parent.map(|l| l.parent.as_str()),
        fanout_delay_ms: parent.map(|l| l.delay_ms),
        owner: m.owner.as_deref(),
        schema_version: m.schemas.last().map(|v| v.version),
        partition_owners: &m.owners,
        role,
        children,
        failover: role_json(&m.role),
        carried_children: &m.carried_children,
        pinned_partitions: &m.pinned,
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AttachBody {
    child: String,
    #[serde(default)]
    delay_ms: i64,
    /// `latest` (default: start at the parent's tail) or `earliest` (backfill what the parent
    /// still holds).
    #[serde(default)]
    from: Option<String>,
}

fn from_earliest(from: Option<&str>) -> Result<bool, ApiError> {
    match from {
        None | Some("latest") => Ok(false),
        Some("earliest") => Ok(true),
        Some(other) => Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("from: must be \"latest\" or \"earliest\", got \"{other}\""),
        )),
    }
}

/// Where a new link to `parent` starts: on a cluster member, `latest` is the tails its
/// partitions' owners report (this member cannot read them).
async fn link_start(
    state: &SharedState,
    parent: &str,
    earliest: bool,
) -> Result<LinkStart, ApiError> {
    if earliest {
        return Ok(LinkStart::Earliest);
    }
    state.plane()?.link_from_latest(parent).await
}

/// `POST /v1/topics/{parent}/children`: attach an existing topic as a child.
pub async fn attach(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(parent): Path<String>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let broker = state.broker()?.clone();
    caller.manage_topic(&broker, &parent)?;
    let body = read_body(body, MAX_JSON_BODY).await?;
    let fields: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
    if fields.contains_key("remote") {
        let a: super::remote_children::RemoteAttach = parse_json(&body)?;
        super::remote_children::attach(&state, &caller, &parent, a).await?;
        return children_response(&state, &caller, &parent).await;
    }
    let a: AttachBody = parse_json(&body)?;
    narad_core::topic::validate_name(&a.child)
        .map_err(|e| ApiError::new(ErrorCode::InvalidChild, format!("child: {}", e.reason)))?;
    // both ends: attaching someone else's topic would change what it receives. The URL's
    // topic exists; a missing child is a fault of the body, so 400 rather than 404 (a 404
    // on a path whose topic exists reads as "that topic is gone", to clients and tools).
    caller.manage_topic(&broker, &a.child).map_err(|e| {
        if e.code == ErrorCode::TopicNotFound {
            ApiError::new(
                ErrorCode::InvalidChild,
                format!("child topic '{}' does not exist", a.child),
            )
        } else {
            e
        }
    })?;
    let earliest = from_earliest(a.from.as_deref())?;
    let start = link_start(&state, &parent, earliest).await?;
    broker
        .attach_child(&parent, &a.child, a.delay_ms, start)
        .await?;
    children_response(&state, &caller, &parent).await
}

async fn children_response(state: &SharedState, caller: &Caller, parent: &str) -> ApiResult {
    let broker = state.broker()?;
    // on a cluster member, each owner of the parent's partitions knows its cursors' lag
    let (mut list, missing) = state.plane()?.children(parent).await?;
    // children the caller may not use are not named to it (a remote child is the
    // parent's: whoever sees the parent sees it)
    list.retain(|c| {
        c.remote.is_some()
            || broker
                .with_topic_meta(&c.name, |m| caller.may_see(m))
                .unwrap_or(false)
    });
    let mut body = serde_json::json!({"parent": parent, "children": list});
    if !missing.is_empty() {
        // (their cursors' lag is not in the figures)
        body["partitions_unavailable"] = serde_json::json!(missing);
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// `GET /v1/topics/{parent}/children`: children with their lag.
pub async fn children(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(parent): Path<String>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.see_topic(state.broker()?, &parent)?;
    children_response(&state, &caller, &parent).await
}

/// `DELETE /v1/topics/{parent}/children/{child}`: detach; the child keeps its data.
pub async fn detach(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path((parent, child)): Path<(String, String)>,
    uri: Uri,
) -> ApiResult {
    let q = Query::parse(uri.query(), &["force"])?;
    let force = q.bool("force")?.unwrap_or(false);
    let broker = state.broker()?.clone();
    caller.manage_topic(&broker, &parent)?;
    if super::remote_children::detach(&state, &caller, &parent, &child, force)
        .await?
        .is_some()
    {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    caller.see_topic(&broker, &child)?;
    broker.detach_child(&parent, &child).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Serialize)]
struct TopicDetailsJson<'a> {
    #[serde(flatten)]
    topic: TopicJson<'a>,
    waiters: usize,
    partition_stats: Vec<PartitionStatsJson>,
    /// In a cluster: partitions whose owner could not be asked now (their figures are left
    /// out).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partitions_unavailable: Vec<u32>,
}

pub async fn create(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let broker = state.broker()?.clone();
    let body = read_body(body, MAX_JSON_BODY).await?;
    // `name` beside the settings; the settings are parsed strictly (unknown fields are a 400).
    let mut fields: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
    // the creator is the owner, whatever the body says (the original Narad ignored the
    // field too, and its clients may send it)
    fields.remove("owner");
    let name = match fields.remove("name") {
        Some(serde_json::Value::String(n)) => n,
        Some(_) => {
            return Err(ApiError::new(
                ErrorCode::InvalidField,
                "name: must be a string",
            ));
        }
        None => return Err(ApiError::new(ErrorCode::InvalidField, "name: is required")),
    };
    narad_core::topic::validate_name(&name)
        .map_err(|e| ApiError::new(ErrorCode::InvalidField, e.to_string()))?;
    caller.require(Action::Create, &name)?;
    let schema = take_schema(&state, &mut fields).await?;
    // `parent` (+ `fanout_delay_ms`, `from`): create and attach in one step
    let parent = match fields.remove("parent") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(p)) => Some(p),
        Some(_) => {
            return Err(ApiError::new(
                ErrorCode::InvalidField,
                "parent: must be a string",
            ));
        }
    };
    let delay = match fields.remove("fanout_delay_ms") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(v.as_i64().ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidField,
                "fanout_delay_ms: must be an integer",
            )
        })?),
    };
    let from = match fields.remove("from") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(f)) => Some(f),
        Some(_) => {
            return Err(ApiError::new(
                ErrorCode::InvalidField,
                "from: must be a string",
            ));
        }
    };
    if parent.is_none() && (delay.is_some() || from.is_some()) {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            "fanout_delay_ms and from need parent",
        ));
    }
    let earliest = from_earliest(from.as_deref())?;
    let mut settings: TopicPatch = serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| ApiError::new(ErrorCode::InvalidJson, format!("invalid JSON body: {e}")))?;
    if let Some(p) = &parent {
        narad_core::topic::validate_name(p)
            .map_err(|e| ApiError::new(ErrorCode::InvalidField, format!("parent: {}", e.reason)))?;
        if *p == name {
            return Err(ApiError::new(
                ErrorCode::InvalidChild,
                "a topic cannot be its own parent",
            ));
        }
        caller.manage_topic(&broker, p)?; // 403/404 before anything is created
        // a child made in one step gets its parent's partition count unless it says
        // otherwise, so keys land partition for partition
        if settings.partitions.is_none() {
            settings.partitions = Some(broker.topic_meta(p)?.config.partitions);
        }
    }
    let req = CreateTopic {
        name,
        settings,
        owner: caller.owner(),
        schema,
        count_against_owner: !caller.is_admin(),
    };
    // a child is created with its link in one step: all or nothing, crash included
    let meta = match parent {
        None => broker.create_topic(req).await?,
        Some(p) => {
            let start = link_start(&state, &p, earliest).await?;
            broker
                .create_child(req, &p, delay.unwrap_or(0), start)
                .await?
        }
    };
    Ok(json_response(
        StatusCode::CREATED,
        &topic_json(&meta, &caller, &broker),
    ))
}

pub async fn list(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult {
    let q = Query::parse(uri.query(), &["limit", "page_token"])?;
    let broker = state.broker()?;
    let limit = match q.u64("limit")? {
        None => 100,
        Some(0) => {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                "limit must be at least 1",
            ));
        }
        Some(n) => n.min(1000) as usize,
    };
    let mut cursor = q
        .str("page_token")
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    // only topics the caller may use: read on until the page is full or the list ends
    let mut visible: Vec<TopicMeta> = Vec::new();
    let mut next = String::new();
    'pages: loop {
        let (page, more) = broker.list_topics(cursor.as_deref(), limit);
        for t in page {
            cursor = Some(t.name.clone());
            if !caller.may_see(&t) {
                continue;
            }
            if visible.len() == limit {
                // one more visible topic exists: the page ends here
                next = visible.last().map(|v| v.name.clone()).unwrap_or_default();
                break 'pages;
            }
            visible.push(t);
        }
        if !more {
            break;
        }
    }
    let index = broker.children_index();
    let items: Vec<_> = visible
        .iter()
        .map(|t| {
            let children = index.get(&t.name).cloned().unwrap_or_default();
            topic_json_with(t, &caller, broker, children)
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({"topics": items, "next_page_token": next}),
    ))
}

pub async fn get(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
) -> ApiResult {
    let q = Query::parse(uri.query(), &["partition"])?;
    let broker = state.broker()?;
    caller.see_topic(broker, &topic)?;
    let info: TopicInfo = broker.topic_info(&topic)?;
    let only = q.u32("partition")?;
    if let Some(p) = only
        && p >= info.meta.config.partitions
    {
        return Err(ApiError::new(
            ErrorCode::PartitionOutOfRange,
            format!(
                "partition {p} is out of range: the topic has {} partitions",
                info.meta.config.partitions
            ),
        ));
    }
    let mut stats = local_stats(broker, &info, only);
    // a cluster member: the other partitions' figures from their owners
    let (theirs, partitions_unavailable) = state.plane()?.others_stats(&info.meta, only).await;
    if !theirs.is_empty() {
        stats.extend(theirs);
        stats.sort_by_key(|s| s.partition);
    }
    Ok(json_response(
        StatusCode::OK,
        &TopicDetailsJson {
            topic: topic_json(&info.meta, &caller, broker),
            waiters: info.waiters,
            partition_stats: stats,
            partitions_unavailable,
        },
    ))
}

pub async fn alter(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let broker = state.broker()?.clone();
    let current = caller.manage_topic(&broker, &topic)?;
    let body = read_body(body, MAX_JSON_BODY).await?;
    let mut fields: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
    let schema = take_schema(&state, &mut fields).await?;
    let unchanged = |s: &serde_json::Value| current.schemas.last().is_some_and(|v| v.schema == *s);
    if let Some(s) = schema.as_ref().filter(|s| !unchanged(s)) {
        // everything that can refuse the schema is checked before any setting changes (and
        // again under the metadata lock)
        if current.parent.is_some() {
            return Err(narad_core::broker::BrokerError::FanoutConflict(format!(
                "'{topic}' is a fan-out child: it receives its parent's records as they are, so it cannot have its own schema"
            ))
            .into());
        }
        if current.schemas.len() >= narad_core::broker::MAX_SCHEMA_VERSIONS {
            return Err(ApiError::new(
                ErrorCode::SchemaIncompatible,
                format!(
                    "topic '{topic}' already has {} schema versions, the most it may keep",
                    narad_core::broker::MAX_SCHEMA_VERSIONS
                ),
            ));
        }
        narad_schema::check_evolution(&current.schemas, s)
            .map_err(|e| ApiError::new(ErrorCode::SchemaIncompatible, e))?;
    }
    let mut meta = current;
    if !fields.is_empty() || schema.is_none() {
        let patch: TopicPatch =
            serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| {
                ApiError::new(ErrorCode::InvalidJson, format!("invalid JSON body: {e}"))
            })?;
        meta = broker.alter_topic(&topic, patch).await?;
    }
    if let Some(s) = schema {
        let unchanged = meta.schemas.last().is_some_and(|v| v.schema == s);
        if !unchanged {
            meta = broker
                .add_schema_version(&topic, s.clone(), |old| {
                    narad_schema::check_evolution(old, &s)
                })
                .await?;
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &topic_json(&meta, &caller, &broker),
    ))
}

/// Takes `schema` out of a create or change body and checks that it compiles within the
/// cost limits (on a schema worker: compiling can take a while).
async fn take_schema(
    state: &SharedState,
    fields: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<Option<serde_json::Value>, ApiError> {
    match fields.remove("schema") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(s) => {
            state
                .schemas
                .compile(s.clone())
                .await
                .map_err(|e| match e {
                    SchemaError::Invalid(m) => ApiError::new(ErrorCode::InvalidSchema, m),
                    SchemaError::TooComplex(_) => {
                        ApiError::new(ErrorCode::SchemaTooComplex, e.to_string())
                    }
                    SchemaError::Busy(m) => ApiError::new(ErrorCode::SchemaBusy, m),
                })?;
            Ok(Some(s))
        }
    }
}

/// `GET /v1/topics/{topic}/schema`: every version, oldest first (`?version=N` for one).
pub async fn schema(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
) -> ApiResult {
    let q = Query::parse(uri.query(), &["version"])?;
    let meta = caller.see_topic(state.broker()?, &topic)?;
    if let Some(v) = q.u32("version")? {
        let found = meta
            .schemas
            .iter()
            .find(|s| s.version == v)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::SchemaVersionNotFound,
                    format!("topic '{topic}' has no schema version {v}"),
                )
            })?;
        return Ok(json_response(StatusCode::OK, found));
    }
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({
            "topic": topic,
            "latest": meta.schemas.last().map(|v| v.version),
            "versions": meta.schemas,
        }),
    ))
}

pub async fn delete(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
) -> ApiResult {
    let q = Query::parse(uri.query(), &["force"])?;
    let force = q.bool("force")?.unwrap_or(false);
    delete_topic(&state, &caller, &topic, force).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Deletes `topic` for `caller` (its owner or an admin); `force`: even when remote children
/// still read it.
pub(super) async fn delete_topic(
    state: &SharedState,
    caller: &Caller,
    topic: &str,
    force: bool,
) -> Result<(), ApiError> {
    let broker = state.broker()?.clone();
    caller.manage_topic(&broker, topic)?;
    super::remote_children::check_parent_delete(state, caller, topic, force).await?;
    broker.delete_topic(topic).await?;
    if let Some(reader) = &state.archive {
        // A node restored from the archive must not bring the topic back. Its objects stay
        // until a new incarnation of the name replaces them (docs/archive-format.md).
        let a = reader.archive();
        if let Err(e) = a.store.delete(&a.topic_manifest_path(topic)).await
            && !matches!(e, object_store::Error::NotFound { .. })
        {
            tracing::warn!(topic = %topic, error = %e, "could not remove the deleted topic's _topic.json from the archive; a restore from it would bring the topic back");
        }
    }
    Ok(())
}
