//! A topic's role between clusters (`narad_core::catalog::role`): `POST .../mirror` (a
//! remote child's checks make the target topic its mirror), `POST .../promote` and
//! `POST .../demote` (an admin's failover and switchover).

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use narad_core::catalog::TopicRole;
use narad_core::catalog::role::{RoleRefusal, Source, decide_mirror, decide_promote};
use narad_wire::ErrorCode;
use serde::{Deserialize, Serialize};

use super::access::Caller;
use super::query::Query;
use super::topics::{RoleJson, role_json};
use super::{
    ApiError, ApiResult, MAX_JSON_BODY, SharedState, json_response, parse_json, read_body,
};

/// `POST /v1/topics/{topic}/mirror`: a remote child of `topic` on cluster `cluster`, at
/// `epoch`, asks this topic to become its mirror.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MirrorBody {
    source_cluster: String,
    source_topic: String,
    epoch: u64,
    /// Only say whether it would (`remote test`): nothing changes.
    #[serde(default)]
    dry_run: bool,
    /// The source's settings, which a mirror follows (never its partition count).
    #[serde(default)]
    settings: Option<MirrorSettings>,
    /// The source's newest JSON Schema versions, in order: the mirror appends those it
    /// lacks (a version it holds must be the same).
    #[serde(default)]
    schemas: Option<Vec<MirrorSchema>>,
    /// The source's fan-out children: a promote attaches them here.
    #[serde(default)]
    children: Option<Vec<narad_core::catalog::CarriedChild>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MirrorSettings {
    visibility_timeout_ms: i64,
    retention_ms: i64,
    retention_bytes: u64,
    delay_ms: i64,
    max_message_bytes: u64,
    key_policy: narad_core::topic::KeyPolicy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MirrorSchema {
    version: u32,
    schema: serde_json::Value,
}

/// Most schema versions one mirror request carries.
const MAX_SYNC_SCHEMAS: usize = narad_core::broker::MAX_SCHEMA_VERSIONS;

/// Brings mirror `topic`'s settings to the source's; the error, if the topic refuses them
/// (they do not validate here, say): reported, not fatal.
async fn follow_settings(
    broker: &std::sync::Arc<narad_core::broker::Broker>,
    topic: &str,
    s: &MirrorSettings,
) -> Option<String> {
    let cur = match broker.topic_meta(topic) {
        Ok(m) => m.config,
        Err(e) => return Some(e.to_string()),
    };
    let differs = |a: i64, b: i64| (a != b).then_some(a);
    let patch = narad_core::topic::TopicPatch {
        visibility_timeout_ms: differs(s.visibility_timeout_ms, cur.visibility_timeout_ms),
        retention_ms: differs(s.retention_ms, cur.retention_ms),
        retention_bytes: (s.retention_bytes != cur.retention_bytes).then_some(s.retention_bytes),
        delay_ms: differs(s.delay_ms, cur.delay_ms),
        max_message_bytes: (s.max_message_bytes != cur.max_message_bytes)
            .then_some(s.max_message_bytes),
        key_policy: (s.key_policy != cur.key_policy).then_some(s.key_policy),
        ..Default::default()
    };
    if patch.is_empty() {
        return None;
    }
    broker
        .alter_topic(topic, patch)
        .await
        .err()
        .map(|e| e.to_string())
}

/// Appends to mirror `topic` the source's schema versions it lacks, in order; a version it
/// holds must be the source's, and none may be skipped.
async fn follow_schemas(
    state: &SharedState,
    broker: &std::sync::Arc<narad_core::broker::Broker>,
    topic: &str,
    versions: &[MirrorSchema],
) -> Result<(), ApiError> {
    let mismatch = |m: String| ApiError::new(ErrorCode::SchemaIncompatible, m);
    if versions.len() > MAX_SYNC_SCHEMAS {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("schemas: at most {MAX_SYNC_SCHEMAS} versions"),
        ));
    }
    // where the mirror stands in the source's list: its latest schema is one of the sent
    // versions (by content: the two clusters number their versions each their own way),
    // and the versions after it are appended in order
    let held = broker.topic_meta(topic)?.schemas;
    let start = match held.last() {
        None => 0,
        Some(latest) => match versions.iter().rposition(|v| v.schema == latest.schema) {
            Some(k) => k + 1,
            None => {
                return Err(mismatch(format!(
                    "topic '{topic}' has a JSON Schema that is none of the source's latest versions: give it the source's"
                )));
            }
        },
    };
    for v in &versions[start..] {
        state.schemas.compile(v.schema.clone()).await.map_err(|e| {
            mismatch(format!(
                "the source's JSON Schema version {} does not compile here: {e}",
                v.version
            ))
        })?;
        // (the source checked its evolution already: the mirror follows it as it is; two
        // of the source's cursors may bring the same version at once: one appends it)
        let expect_last = broker
            .topic_meta(topic)?
            .schemas
            .last()
            .map(|h| h.schema.clone());
        if expect_last.as_ref() == Some(&v.schema) {
            continue;
        }
        let added = broker
            .add_schema_version(topic, v.schema.clone(), |old| {
                if old.last().map(|h| &h.schema) == expect_last.as_ref() {
                    Ok(())
                } else {
                    Err("the schema changed meanwhile".to_owned())
                }
            })
            .await;
        if added.is_err() {
            let now = broker.topic_meta(topic)?.schemas;
            if now.last().map(|h| &h.schema) != Some(&v.schema) {
                added?;
            }
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct RoleAnswer {
    failover: RoleJson,
    /// Whether this request changed the role (a repeated one or a dry run does not).
    changed: bool,
    /// A promote's view of the source, per source partition: what was received, what the
    /// source acknowledged that never arrived, how old its last progress is.
    #[serde(skip_serializing_if = "Option::is_none")]
    report: Option<narad_core::broker::MirrorReport>,
    /// A promote: the source's fan-out children it attached here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    children: Vec<CarriedOutcome>,
}

/// What a promote did with one of its source's fan-out children.
#[derive(Serialize)]
struct CarriedOutcome {
    name: String,
    delay_ms: i64,
    /// The topic did not exist here: it was created (with the source child's partition
    /// count and this cluster's default settings).
    created: bool,
    /// It is this topic's child now.
    attached: bool,
    /// Source partitions whose records all go to the child (nothing said what its
    /// consumers had processed there: those are delivered again).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unknown_partitions: Vec<u32>,
    /// No progress came from the source since this node started: every record the source
    /// sent goes to the child (delivered again if its consumers processed it there).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    no_progress: bool,
    /// Why it was not attached (the promote stands; promote again to retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize)]
struct NotDrainedBody {
    report: Option<narad_core::broker::MirrorReport>,
}

/// A promote waiting for its source to drain gives up this soon if the source's link sends
/// nothing (it sends its progress every 2 s when it runs).
const SOURCE_SILENT: std::time::Duration = std::time::Duration::from_secs(6);

/// How long `promote?wait_drained=true` waits by default, and at most.
const DRAIN_TIMEOUT_MS: u64 = 60_000;
const MAX_DRAIN_TIMEOUT_MS: u64 = 600_000;

#[derive(Serialize)]
struct FencedBody {
    role: RoleJson,
}

/// A link's request to `topic`: no query string, the `replicate` grant, and its JSON body
/// (at most `limit` bytes).
async fn link_request<T: serde::de::DeserializeOwned>(
    state: &SharedState,
    caller: &Caller,
    topic: &str,
    uri: &Uri,
    body: Body,
    limit: usize,
) -> Result<(std::sync::Arc<narad_core::broker::Broker>, T), ApiError> {
    Query::parse(uri.query(), &[])?;
    caller.require(narad_auth::Action::Replicate, topic)?;
    let broker = state.broker()?.clone();
    let body = read_body(body, limit).await?;
    Ok((broker, parse_json(&body)?))
}

fn hex16(v: &str, field: &str) -> Result<u64, ApiError> {
    (v.len() == 16 && v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| u64::from_str_radix(v, 16).ok())
        .flatten()
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidField,
                format!("{field}: must be an id in 16 lowercase hex digits"),
            )
        })
}

fn audit(caller: &Caller, action: &str, topic: &str, from: &TopicRole, to: &TopicRole) {
    tracing::warn!(
        component = "audit",
        actor = caller.username().unwrap_or("-"),
        action,
        subject = %topic,
        from = from.name(),
        from_epoch = from.epoch(),
        to = to.name(),
        to_epoch = to.epoch(),
        "topic role changed"
    );
}

/// Moves `topic` from role `now` to `role` (nothing when they are the same, or when `action`
/// is `None`: a dry run), audited as `action`; says whether it changed.
async fn change_role(
    broker: &std::sync::Arc<narad_core::broker::Broker>,
    caller: &Caller,
    topic: &str,
    now: TopicRole,
    role: TopicRole,
    action: Option<&str>,
) -> Result<bool, ApiError> {
    let changed = role != now;
    match action {
        Some(action) if changed => {
            broker.set_role(topic, now, role).await?;
            audit(caller, action, topic, &now, &role);
            Ok(true)
        }
        // (a dry run changes nothing)
        _ => Ok(false),
    }
}

/// [`change_role`], answered.
async fn change(
    broker: &std::sync::Arc<narad_core::broker::Broker>,
    caller: &Caller,
    topic: &str,
    now: TopicRole,
    role: TopicRole,
    action: Option<&str>,
    report: Option<narad_core::broker::MirrorReport>,
) -> ApiResult {
    let changed = change_role(broker, caller, topic, now, role, action).await?;
    Ok(json_response(
        StatusCode::OK,
        &RoleAnswer {
            failover: role_json(&role),
            changed,
            report,
            children: Vec::new(),
        },
    ))
}

fn fenced(topic: &str, role: &TopicRole, epoch: u64) -> ApiResult {
    Ok(ApiError::new(
        ErrorCode::Fenced,
        format!(
            "topic '{topic}' is {}, newer than epoch {epoch}: it was promoted past the asker, whose link is fenced",
            role.describe()
        ),
    )
    .response_with(FencedBody {
        role: role_json(role),
    }))
}

pub async fn mirror(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    let (broker, b): (_, MirrorBody) =
        link_request(&state, &caller, &topic, &uri, body, MAX_JSON_BODY).await?;
    let source = Source {
        cluster: hex16(&b.source_cluster, "source_cluster")?,
        topic: hex16(&b.source_topic, "source_topic")?,
    };
    if broker.cluster_id() == Some(source.cluster) {
        return Err(ApiError::new(
            ErrorCode::LoopDetected,
            format!(
                "the source is this cluster ({:016x}): a topic does not mirror its own cluster",
                source.cluster
            ),
        ));
    }
    if b.epoch > narad_core::catalog::role::MAX_EPOCH {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("epoch: at most {}", narad_core::catalog::role::MAX_EPOCH),
        ));
    }
    let (now, child) = broker.with_topic_meta(&topic, |m| (m.role, m.parent.is_some()))?;
    if child {
        return Err(ApiError::new(
            ErrorCode::RoleConflict,
            format!(
                "topic '{topic}' is a fan-out child: it takes its parent's records, so it cannot be another cluster's mirror"
            ),
        ));
    }
    let role = match decide_mirror(now, source, b.epoch) {
        Ok(role) => role,
        Err(RoleRefusal::Fenced { role }) => return fenced(&topic, &role, b.epoch),
        Err(RoleRefusal::MirrorOfOther { of }) => {
            return Err(ApiError::new(
                ErrorCode::NotYourMirror,
                format!(
                    "topic '{topic}' mirrors topic {:016x} of cluster {:016x} already: promote it, or mirror to another topic",
                    of.topic, of.cluster
                ),
            ));
        }
        Err(RoleRefusal::NotAMirror { role }) => {
            return Err(ApiError::new(
                ErrorCode::RoleConflict,
                format!(
                    "topic '{topic}' is {}: a primary that took part in a failover follows another source only once an admin demoted it",
                    role.describe()
                ),
            ));
        }
    };
    if !matches!(now, TopicRole::Mirror { .. }) && !broker.child_names(&topic).is_empty() {
        return Err(ApiError::new(
            ErrorCode::RoleConflict,
            format!(
                "topic '{topic}' has fan-out children: detach them before it becomes a mirror (a mirror serves no queue, nor would they); its promote attaches its source's children"
            ),
        ));
    }
    let action = (!b.dry_run).then_some("topic_mirror");
    let answer = change(&broker, &caller, &topic, now, role, action, None).await?;
    if b.dry_run || (b.settings.is_none() && b.schemas.is_none() && b.children.is_none()) {
        return Ok(answer);
    }
    if let Some(versions) = &b.schemas {
        follow_schemas(&state, &broker, &topic, versions).await?;
    }
    // the source's children, those the link's user may replicate to (a promote creates or
    // attaches topics of those names here: the source names only topics it was let into)
    let mut children_error = None;
    // (a list this cluster cannot take is said in the answer: it does not stop the settings)
    let checked = b.children.as_ref().map(|children| {
        narad_core::catalog::CarriedChild::validate_list(children).map(|()| children)
    });
    if let Some(Err(m)) = &checked {
        children_error = Some(format!("fan-out children not carried: {m}"));
    }
    if let Some(Ok(children)) = checked {
        let (allowed, refused): (Vec<_>, Vec<_>) = children
            .iter()
            .cloned()
            .partition(|c| caller.allows(narad_auth::Action::Replicate, &c.name));
        if !refused.is_empty() {
            let names: Vec<&str> = refused.iter().map(|c| c.name.as_str()).collect();
            children_error = Some(format!(
                "fan-out children not carried: the link's user may not replicate to {names:?} here (grant it replicate on them)"
            ));
        }
        broker.set_carried_children(&topic, allowed).await?;
    }
    let settings_error = match &b.settings {
        Some(s) => follow_settings(&broker, &topic, s).await,
        None => None,
    };
    let settings_error = match (settings_error, children_error) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    let meta = broker.topic_meta(&topic)?;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({
            "failover": role_json(&meta.role),
            "changed": role != now,
            "schema_version": meta.schemas.last().map(|v| v.version),
            "settings_error": settings_error,
        }),
    ))
}

/// `POST /v1/topics/{topic}/progress`: the body of a link's consumer progress.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressBody {
    /// The source's partition.
    partition: u32,
    frontier: u64,
    #[serde(default)]
    acked: Vec<(u64, u64)>,
    /// The partition's end at the source, where the link's cursor stands, the records
    /// leased there, and the source's partition count (all four, or none).
    #[serde(default)]
    end: Option<u64>,
    #[serde(default)]
    shipped: Option<u64>,
    #[serde(default)]
    leased: Option<u64>,
    #[serde(default)]
    partitions: Option<u32>,
    /// Acked records at the source not yet looked at for this topic's own records.
    #[serde(default)]
    unreturned: u64,
    /// This topic's own records (`[partition, start, end)` of its offsets) that came back
    /// from the source and were processed there: a failback settles them here.
    #[serde(default)]
    returned: Vec<(u32, u64, u64)>,
    /// Per fan-out child of the source: the offset of this partition below which the
    /// child's consumers processed every record.
    #[serde(default)]
    children: Vec<(String, u64)>,
    /// A failback: per child, where this topic's own records its consumers there have not
    /// processed begin (per partition of this topic).
    #[serde(default)]
    children_returned: Vec<(String, Vec<(u32, u64)>)>,
}

/// Largest progress body (4096 ranges of two numbers and then some).
const MAX_PROGRESS_BODY: usize = 256 << 10;

/// `POST /v1/topics/{topic}/progress`: a link tells its mirror what the source's consumers
/// acked on one source partition (with the batches' headers: `Narad-Topic-Id`,
/// `Narad-Link`); the mirror settles the records it covers. `204`.
pub async fn progress(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Body,
) -> ApiResult {
    use super::produce::{FencedBody, LINK_HEADER, Refused, check_intake, link_of};
    let (broker, b): (_, ProgressBody) =
        link_request(&state, &caller, &topic, &uri, body, MAX_PROGRESS_BODY).await?;
    let link = link_of(&headers)?.ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidHeaders,
            format!("{LINK_HEADER} is required: progress comes from a remote child's link"),
        )
    })?;
    let (id, role) = broker.with_topic_meta(&topic, |m| (m.id, m.role))?;
    if let Some(want) = headers.get("narad-topic-id")
        && want.to_str().ok() != Some(format!("{id:016x}").as_str())
    {
        return Err(ApiError::new(
            ErrorCode::TopicReplaced,
            format!(
                "topic '{topic}' is incarnation {id:016x}, not the one named: it was deleted and created again"
            ),
        ));
    }
    match check_intake(&caller, Some(role), &topic, Some(link)) {
        Ok(Some(narad_core::catalog::role::LinkIntake::Mirrored)) => {}
        // (the old primary's tail: its consumers' progress means nothing here any more)
        Ok(_) => return Ok(axum::http::StatusCode::NO_CONTENT.into_response()),
        Err(Refused::Plain(e)) => return Err(e),
        Err(Refused::Fenced(e, role)) => {
            return Ok(e.response_with(FencedBody {
                role: role_json(&role),
            }));
        }
    }
    let end = match (b.end, b.shipped, b.leased, b.partitions) {
        (None, None, None, None) => None,
        (Some(end), Some(shipped), Some(leased), Some(partitions))
            if shipped <= end
                && b.partition < partitions
                && partitions <= narad_core::broker::progress_max_origin_partitions() =>
        {
            Some(narad_core::broker::SourceEnd {
                end,
                shipped,
                leased,
                unreturned: b.unreturned,
                partitions,
                demoted: link.tail,
                at_ms: 0,
            })
        }
        _ => {
            return Err(ApiError::new(
                ErrorCode::InvalidField,
                "end, shipped, leased and partitions go together, with shipped at most end and partition below partitions",
            ));
        }
    };
    if !b.returned.is_empty() {
        broker
            .settle_returned(&topic, link.source, &b.returned)
            .await?;
    }
    let progress = narad_core::broker::PartitionProgress {
        frontier: b.frontier,
        acked: b.acked,
        children: b.children,
        children_returned: b.children_returned,
    };
    broker
        .take_mirror_progress(&topic, link.source, b.partition, progress.clone(), end)
        .await?;
    // a cluster: the members owning the mirror's other partitions settle theirs
    let missed = state
        .plane()?
        .share_mirror_progress(&topic, |meta| {
            crate::forward::codec::MirrorProgressRequest {
                topic: topic.clone(),
                topic_id: meta.id,
                catalog: 0,
                source: link.source,
                partition: b.partition,
                progress,
                end,
                returned: b.returned,
            }
        })
        .await?;
    if !missed.is_empty() {
        tracing::debug!(topic = %topic, members = ?missed, "members that did not take a mirror's progress (the source sends it again)");
    }
    Ok(axum::http::StatusCode::NO_CONTENT.into_response())
}

/// Mirror `topic`'s report of its source: this member's, merged in a cluster with the
/// other members' owning its partitions.
async fn mirror_report(
    state: &SharedState,
    broker: &std::sync::Arc<narad_core::broker::Broker>,
    topic: &str,
) -> Result<Option<narad_core::broker::MirrorReport>, ApiError> {
    let mine = broker.mirror_report(topic).await?;
    let Some((theirs, settled, unanswered)) =
        state.plane()?.others_mirror_reports(topic, false).await?
    else {
        return Ok(mine);
    };
    if mine.is_none() && theirs.is_empty() {
        return Ok(None);
    }
    let mut merged = narad_core::broker::MirrorReport::merge(mine.into_iter().chain(theirs));
    merged.settled += settled;
    merged.unanswered = unanswered;
    Ok(Some(merged))
}

/// Settles every record of mirror `topic` its source's progress covers, on every member
/// owning its partitions, and drops the indexes (a promote's last step before the flip).
async fn settle_mirror(
    state: &SharedState,
    broker: &std::sync::Arc<narad_core::broker::Broker>,
    topic: &str,
) -> Result<(u64, Vec<u64>), ApiError> {
    let mut settled = broker.settle_mirror_progress(topic).await?;
    let mut unanswered = Vec::new();
    if let Some((_, theirs, missed)) = state.plane()?.others_mirror_reports(topic, true).await? {
        settled += theirs;
        unanswered = missed;
    }
    Ok((settled, unanswered))
}

/// `POST /v1/topics/{topic}/promote[?force=true]`: a mirror becomes the primary at one epoch
/// more (its source's link is fenced from now on, and the source's tail is still taken). A
/// demoted topic is promoted only with `force` (two primaries if its replacement lives on).
pub async fn promote(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
) -> ApiResult {
    let q = Query::parse(uri.query(), &["force", "wait_drained", "timeout_ms"])?;
    caller.require_admin()?;
    let force = q.bool("force")?.unwrap_or(false);
    let wait_drained = q.bool("wait_drained")?.unwrap_or(false);
    let timeout_ms = q.u64("timeout_ms")?.unwrap_or(DRAIN_TIMEOUT_MS);
    if timeout_ms > MAX_DRAIN_TIMEOUT_MS {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!("timeout_ms: at most {MAX_DRAIN_TIMEOUT_MS}"),
        ));
    }
    let broker = state.broker()?.clone();
    let now = broker.with_topic_meta(&topic, |m| m.role)?;
    // a planned switchover: the source was demoted; wait until every record and every ack
    // it had is here
    let started = std::time::Instant::now();
    let deadline = started + std::time::Duration::from_millis(timeout_ms);
    let mut report = None;
    if matches!(now, TopicRole::Mirror { .. }) {
        let mut waiting = false;
        loop {
            report = mirror_report(&state, &broker, &topic).await?;
            let drained = report.as_ref().is_some_and(|r| r.drained);
            if !wait_drained || drained {
                break;
            }
            if !waiting {
                waiting = true;
                tracing::info!(topic = %topic, timeout_ms, "the promote waits until its source is drained (every record and ack of the demoted source here)");
            }
            // a source whose link runs sends its progress every 2 s even when nothing
            // changed: silence means nothing is coming, so say so now rather than at the
            // timeout
            let heard = report.as_ref().is_some_and(|r| {
                r.partitions.iter().any(|p| {
                    p.progress_age_ms
                        .is_some_and(|a| a <= SOURCE_SILENT.as_millis() as i64)
                })
            });
            if !heard && started.elapsed() >= SOURCE_SILENT {
                let e = ApiError::new(
                    ErrorCode::NotDrained,
                    format!(
                        "topic '{topic}' heard nothing from its source for {} s: its link is not running (look at the source's remote child: narad topic children there), or the source sends no progress (mirror_progress_interval_ms=0); nothing was changed",
                        SOURCE_SILENT.as_secs()
                    ),
                );
                return Ok(e.response_with(NotDrainedBody { report }));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                let e = ApiError::new(
                    ErrorCode::NotDrained,
                    format!(
                        "topic '{topic}' was not drained within {timeout_ms} ms: demote the source first (narad topic demote there); every source partition must report from the demoted source, with no record missing and none leased (nothing was changed)"
                    ),
                );
                return Ok(e.response_with(NotDrainedBody { report }));
            }
            // (in a cluster the progress may reach another member, and silence is looked
            // at again: soon)
            let wait = left.min(std::time::Duration::from_millis(250));
            broker.mirror_progress_wait(wait).await;
        }
    }
    // the source's last progress first: the new primary's queue holds only what the
    // source's consumers had not acked
    let (settled, unanswered) = if matches!(now, TopicRole::Mirror { .. }) {
        settle_mirror(&state, &broker, &topic).await?
    } else {
        (0, Vec::new())
    };
    if settled > 0 {
        tracing::info!(topic = %topic, settled, "records the source's consumers had acked are settled before the promote");
    }
    if !unanswered.is_empty() {
        tracing::warn!(topic = %topic, members = ?unanswered, "members owning partitions of the mirror did not answer the promote's last settle: records there the source's consumers acked are delivered again");
    }
    if let Some(r) = report.as_mut() {
        r.settled += settled;
        for m in unanswered {
            if !r.unanswered.contains(&m) {
                r.unanswered.push(m);
            }
        }
    }
    let role = match decide_promote(now) {
        Ok(role) => role,
        Err(TopicRole::Demoted { epoch })
            if force && epoch < narad_core::catalog::role::MAX_EPOCH =>
        {
            TopicRole::Primary {
                epoch: epoch + 1,
                promoted_from: None,
            }
        }
        Err(role) => {
            return Err(ApiError::new(
                ErrorCode::RoleConflict,
                format!(
                    "topic '{topic}' is {}: make it the mirror of the topic that replaced it first (attach a remote child to it from there), then promote it; force=true makes it a primary as it is",
                    role.describe()
                ),
            ));
        }
    };
    if let Some(r) = &report {
        let unreceived: u64 = r.partitions.iter().map(|p| p.unreceived).sum();
        if unreceived > 0 {
            tracing::warn!(topic = %topic, unreceived, "promoted with records the source acknowledged that this mirror never received (as of the source's last report)");
        }
    }
    let changed = change_role(&broker, &caller, &topic, now, role, Some("topic_promote")).await?;
    // the source's fan-out children, attached here (a repeated promote retries those that
    // were not)
    let source = match (now, role) {
        (TopicRole::Mirror { of, .. }, _)
        | (
            _,
            TopicRole::Primary {
                promoted_from: Some(of),
                ..
            },
        ) => Some(of),
        _ => None,
    };
    let children = match source {
        Some(source) => {
            attach_carried(&state, &broker, &caller, &topic, source, report.as_ref()).await
        }
        None => Vec::new(),
    };
    Ok(json_response(
        StatusCode::OK,
        &RoleAnswer {
            failover: role_json(&role),
            changed,
            report,
            children,
        },
    ))
}

/// A failback: where child `name`'s copy of promoted `topic`'s own records (those not from
/// its source) starts per partition, from what every source partition said of the child's
/// consumers there (`tails`: the topic's partition ends now; an own record below them
/// predates the failover). Empty (every own record goes to the child) unless every source
/// partition said it.
fn own_floor(report: &narad_core::broker::MirrorReport, name: &str, tails: &[u64]) -> Vec<u64> {
    let mut own = tails.to_vec();
    if report.partitions.is_empty() {
        return Vec::new();
    }
    for p in &report.partitions {
        let Some((_, at)) = p.children_returned.iter().find(|(n, _)| n == name) else {
            return Vec::new();
        };
        for &(q, o) in at {
            if let Some(x) = own.get_mut(q as usize) {
                *x = (*x).min(o);
            }
        }
    }
    own
}

/// Attaches promoted `topic`'s carried children (its source's fan-out children) here,
/// creating those that do not exist, each leaving out the records from `source` its
/// consumers had processed there as `report` last said; forgets those attached. Never
/// fails: the promote is done by now, so what could not be done is said per child (and a
/// repeated promote tries again), never as an error that would say the promote was not.
async fn attach_carried(
    state: &SharedState,
    broker: &std::sync::Arc<narad_core::broker::Broker>,
    caller: &Caller,
    topic: &str,
    source: Source,
    report: Option<&narad_core::broker::MirrorReport>,
) -> Vec<CarriedOutcome> {
    let Ok(meta) = broker.topic_meta(topic) else {
        return Vec::new();
    };
    let carried = meta.carried_children.clone();
    if carried.is_empty() {
        return Vec::new();
    }
    let partitions = report
        .map(|r| {
            r.partitions
                .iter()
                .map(|p| p.partition + 1)
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    // this topic's own records (a failback): those below its tails now predate the
    // failover; where the source said its children's consumers stand among them
    let tails: Option<Vec<u64>> = match state.plane() {
        Ok(plane) => plane.tails(&meta).await.ok(),
        Err(_) => None,
    };
    let mut out = Vec::new();
    let mut left = Vec::new();
    for c in carried {
        let mut below = vec![0u64; partitions as usize];
        let mut unknown = Vec::new();
        for (p, b) in below.iter_mut().enumerate() {
            let said = report
                .and_then(|r| r.partitions.iter().find(|x| x.partition == p as u32))
                .and_then(|x| x.children.iter().find(|(n, _)| *n == c.name))
                .map(|(_, o)| *o);
            match said {
                Some(o) => *b = o,
                None => unknown.push(p as u32),
            }
        }

        let own = match (report, &tails) {
            (Some(r), Some(tails)) => own_floor(r, &c.name, tails),
            _ => Vec::new(),
        };
        let start = narad_core::broker::LinkStart::Carried(narad_core::broker::OriginFloor {
            source,
            below,
            own,
        });
        let mut outcome = CarriedOutcome {
            name: c.name.clone(),
            delay_ms: c.delay_ms,
            created: false,
            attached: false,
            unknown_partitions: unknown,
            no_progress: partitions == 0,
            error: None,
        };
        let existing = broker.with_topic_meta(&c.name, |m| m.parent.clone());
        let result = match existing {
            Ok(Some(link)) if link.parent == topic => {
                // (attached by an earlier promote)
                outcome.unknown_partitions.clear();
                outcome.no_progress = false;
                Ok(())
            }
            Ok(Some(_)) => Err(format!("'{}' is a child of another topic here", c.name)),
            Ok(None) => broker
                .attach_child(topic, &c.name, c.delay_ms, start)
                .await
                .map_err(|e| e.to_string()),
            Err(_) => {
                let req = narad_core::topic::CreateTopic {
                    name: c.name.clone(),
                    settings: narad_core::topic::TopicPatch {
                        partitions: Some(c.partitions),
                        ..Default::default()
                    },
                    owner: caller.owner(),
                    schema: None,
                    count_against_owner: false,
                };
                match broker.create_child(req, topic, c.delay_ms, start).await {
                    Ok(_) => {
                        outcome.created = true;
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        match result {
            Ok(()) => {
                outcome.attached = true;
                tracing::info!(topic, child = %c.name, created = outcome.created, unknown_partitions = ?outcome.unknown_partitions, "the source's fan-out child attached to the promoted topic");
            }
            Err(e) => {
                tracing::warn!(topic, child = %c.name, error = %e, "the source's fan-out child was not attached to the promoted topic (promote again to retry)");
                outcome.error = Some(e);
                left.push(c);
            }
        }
        out.push(outcome);
    }
    if let Err(e) = broker.set_carried_children(topic, left).await {
        // (those attached are attached: a repeated promote finds them so and skips them)
        tracing::warn!(topic, error = %e, "the carried children attached were not forgotten; a repeated promote skips them");
    }
    out
}

/// `POST /v1/topics/{topic}/demote`: a primary stops taking produces and leases (a planned
/// switchover: its links ship what they hold, then the mirror is promoted).
pub async fn demote(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let broker = state.broker()?.clone();
    let now = broker.with_topic_meta(&topic, |m| m.role)?;
    let role = match now {
        TopicRole::Primary { epoch, .. } => TopicRole::Demoted { epoch },
        TopicRole::Demoted { .. } => now,
        TopicRole::Mirror { .. } => {
            return Err(ApiError::new(
                ErrorCode::RoleConflict,
                format!(
                    "topic '{topic}' is {}: only a primary is demoted",
                    now.describe()
                ),
            ));
        }
    };
    change(
        &broker,
        &caller,
        &topic,
        now,
        role,
        Some("topic_demote"),
        None,
    )
    .await
}
