//! Remote children: `POST /v1/topics/{parent}/children` with a `remote`, their detach, pause
//! and resume, and the `force` rule on deletes (admin only: a remote child sends the parent's
//! records to another cluster).

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use narad_core::catalog::RemoteChild;
use narad_core::catalog::remote::MAX_LANES;
use narad_wire::ErrorCode;
use serde::Deserialize;

use super::access::Caller;
use super::query::Query;
use super::{ApiError, ApiResult, SharedState};

/// Longest one request to the remote may take during the attach checks.
const CHECK_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The body of a remote attach.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteAttach {
    pub child: String,
    pub remote: String,
    pub remote_topic: String,
    /// `attach` (default; also `latest`): records written from now on; `unconsumed`: from
    /// each partition's ack frontier (what consumers have not acked yet, and newer);
    /// `earliest`: everything the parent still holds.
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub lanes: Option<u8>,
}

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidField, msg)
}

/// What a link from `meta` makes its target topic the mirror of: this cluster's topic at its
/// epoch, while it is the primary (a demoted topic's link ships its tail to the primary that
/// replaced it, which is no mirror).
pub(super) async fn mirror_of(
    broker: &std::sync::Arc<narad_core::broker::Broker>,
    meta: &narad_core::broker::TopicMeta,
) -> Result<Option<narad_xregion::checks::MirrorOf>, ApiError> {
    if !meta.role.is_primary() {
        return Ok(None);
    }
    let cluster = broker.ensure_cluster_id().await?;
    Ok(Some(narad_xregion::checks::MirrorOf {
        cluster,
        topic: meta.id,
        epoch: meta.role.epoch(),
        dry: false,
    }))
}

/// Attaches a remote child to `parent` once the remote passed its checks for the target
/// topic; answers like a local attach (the children list).
pub async fn attach(
    state: &SharedState,
    caller: &Caller,
    parent: &str,
    a: RemoteAttach,
) -> Result<(), ApiError> {
    caller.require_admin()?;
    let broker = state.broker()?.clone();
    narad_core::topic::validate_name(&a.child)
        .map_err(|e| ApiError::new(ErrorCode::InvalidChild, format!("child: {}", e.reason)))?;
    narad_core::topic::validate_name(&a.remote_topic)
        .map_err(|e| invalid(format!("remote_topic: {}", e.reason)))?;
    let lanes = a.lanes.unwrap_or(1);
    if !(1..=MAX_LANES).contains(&lanes) {
        return Err(invalid(format!("lanes: must be between 1 and {MAX_LANES}")));
    }
    let from = a.from.as_deref().unwrap_or("attach");
    if !matches!(from, "attach" | "latest" | "unconsumed" | "earliest") {
        return Err(invalid(format!(
            "from: must be \"attach\", \"unconsumed\" or \"earliest\", got \"{from}\""
        )));
    }
    let meta = broker.topic_meta(parent)?;
    // a missing remote is a fault of the body: 400, as a missing child topic is (a 404 on a
    // path whose topic exists reads as "that topic is gone")
    narad_core::catalog::remote::validate_remote_name(&a.remote)
        .map_err(|e| invalid(format!("remote: {e}")))?;
    let remote = broker
        .remote(&a.remote)
        .map_err(|_| invalid(format!("remote: no remote is named '{}'", a.remote)))?;
    // everything this cluster would refuse, before the checks change anything there (and
    // no other attach from here in between: see `attaching`)
    let _attaching = state.remotes.attaching.lock().await;
    let child = RemoteChild {
        name: a.child.clone(),
        parent: parent.to_owned(),
        parent_id: meta.id,
        remote: remote.name.clone(),
        remote_id: remote.id,
        remote_topic: a.remote_topic.clone(),
        target_id: 0,
        lanes,
        epoch: narad_core::random_u64() | 1,
        starts: Vec::new(),
        paused: false,
        skips: Vec::new(),
        created_at_ms: {
            use narad_core::clock::Clock as _;
            narad_core::clock::SystemClock.now_ms()
        },
    };
    broker.precheck_attach_remote(&child)?;
    let keys = state.remotes.keys.as_deref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::RemotesUnavailable,
            state.remotes.unavailable.clone(),
        )
    })?;
    let client =
        narad_xregion::remote::client(&remote, keys, &state.remotes.guard, CHECK_REQUEST_TIMEOUT)
            .map_err(|e| {
            ApiError::new(
                ErrorCode::RemoteCheckFailed,
                format!("remote '{}': {} ({e})", remote.name, e.state()),
            )
        })?;
    let mirror = mirror_of(&broker, &meta).await?;
    let report = narad_xregion::checks::check(
        &client,
        narad_xregion::checks::Target {
            topic: Some(&a.remote_topic),
            parent_id: Some(meta.id),
            schema: Some(meta.schemas.last().map(|v| &v.schema)),
            mirror,
            carries_users: remote.carry_users,
        },
    )
    .await;
    let target_id = report
        .topic_id
        .as_deref()
        .and_then(|id| u64::from_str_radix(id, 16).ok());
    let (true, Some(target_id)) = (report.ok, target_id) else {
        let failed = report.checks.iter().find(|c| !c.ok);
        let code = if report.state == "loop_detected" {
            ErrorCode::LoopDetected
        } else {
            ErrorCode::RemoteCheckFailed
        };
        return Err(ApiError::new(
            code,
            format!(
                "remote '{}' failed the check '{}' ({}): {}",
                remote.name,
                failed.map_or("-", |c| c.name),
                report.state,
                failed.map_or("", |c| c.detail.as_str())
            ),
        ));
    };
    let starts = match from {
        "earliest" => Vec::new(),
        f => state.plane()?.positions(&meta, f == "unconsumed").await?,
    };
    let child = RemoteChild {
        target_id,
        starts,
        ..child
    };
    broker.attach_remote(child).await?;
    tracing::info!(
        component = "audit",
        actor = caller.username().unwrap_or("-"),
        action = "remote_child_attach",
        subject = %a.child,
        parent,
        remote = %remote.name,
        remote_topic = %a.remote_topic,
        from,
        "remote child attached"
    );
    Ok(())
}

/// Records of `parent` not yet shipped to remote child `child`, over every owner of its
/// partitions; `None` if an owner could not be asked (then nobody can say it is 0).
async fn unshipped(
    state: &SharedState,
    parent: &str,
    child: &str,
) -> Result<Option<u64>, ApiError> {
    let (list, missing) = state.plane()?.children(parent).await?;
    if !missing.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        list.iter()
            .find(|c| c.name == child)
            .map_or(0, |c| c.lag_messages),
    ))
}

/// The force rule: with records not shipped, refused unless `force`; forced, the count
/// abandoned is in the audit line.
async fn check_unshipped(
    state: &SharedState,
    caller: &Caller,
    parent: &str,
    child: &RemoteChild,
    force: bool,
) -> Result<(), ApiError> {
    let lag = unshipped(state, parent, &child.name).await?;
    if lag == Some(0) {
        return Ok(());
    }
    let what = match lag {
        Some(n) => format!("{n} records"),
        None => {
            "an unknown number of records (an owner of the parent's partitions could not be asked)"
                .to_owned()
        }
    };
    if !force {
        return Err(ApiError::new(
            ErrorCode::Unshipped,
            format!(
                "remote child '{}' of '{parent}' has {what} not shipped to remote '{}' yet: wait for its lag to reach 0, or force it to abandon them (`--force` in the CLI, `force=true` in the API)",
                child.name, child.remote
            ),
        ));
    }
    tracing::warn!(
        component = "audit",
        actor = caller.username().unwrap_or("-"),
        action = "remote_child_abandon",
        subject = %child.name,
        parent,
        remote = %child.remote,
        abandoned = %what,
        "records not shipped were abandoned (force=true)"
    );
    Ok(())
}

/// `DELETE /v1/topics/{parent}/children/{child}` for a remote child: `Ok(None)` if `child`
/// is not one (the caller detaches a local child).
pub async fn detach(
    state: &SharedState,
    caller: &Caller,
    parent: &str,
    child: &str,
    force: bool,
) -> Result<Option<()>, ApiError> {
    let broker = state.broker()?.clone();
    let Some(c) = broker
        .remote_children(parent)
        .into_iter()
        .find(|c| c.name == child)
    else {
        return Ok(None);
    };
    caller.require_admin()?;
    check_unshipped(state, caller, parent, &c, force).await?;
    broker.detach_remote(&c.name, c.epoch).await?;
    tracing::info!(
        component = "audit",
        actor = caller.username().unwrap_or("-"),
        action = "remote_child_detach",
        subject = %c.name,
        parent,
        "remote child detached"
    );
    Ok(Some(()))
}

/// A parent about to be deleted: each of its remote children must have shipped everything,
/// unless `force`.
pub async fn check_parent_delete(
    state: &SharedState,
    caller: &Caller,
    parent: &str,
    force: bool,
) -> Result<(), ApiError> {
    let broker = state.broker()?.clone();
    for c in broker.remote_children(parent) {
        check_unshipped(state, caller, parent, &c, force).await?;
    }
    Ok(())
}

/// `POST /v1/topics/{parent}/children/{child}/skip[?partition=P&offset=O]`: skips a record
/// the remote refused (`rejected_record`, `record_too_large`): the one named, else every one
/// blocking a cursor now. Each skip is durable before the cursor moves past it, and audited.
pub async fn skip(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path((parent, child)): Path<(String, String)>,
    uri: Uri,
) -> ApiResult {
    let q = Query::parse(uri.query(), &["partition", "offset"])?;
    caller.require_admin()?;
    let named = match (q.u32("partition")?, q.u64("offset")?) {
        (Some(p), Some(o)) => Some(narad_core::broker::BlockedRecord {
            partition: p,
            offset: o,
        }),
        (None, None) => None,
        _ => {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                "partition and offset go together",
            ));
        }
    };
    let broker = state.broker()?.clone();
    let c = remote_child(&broker, &parent, &child)?;
    let (list, _) = state.plane()?.children(&parent).await?;
    let blocked: Vec<narad_core::broker::BlockedRecord> = list
        .into_iter()
        .find(|i| i.name == child)
        .and_then(|i| i.remote)
        .map(|r| r.blocked)
        .unwrap_or_default();
    let skip: Vec<_> = match named {
        // only a record that is blocked now: an admin never skips one by mistake
        Some(r) if blocked.contains(&r) => vec![r],
        Some(r) => {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                format!(
                    "record {} of partition {} is not blocking '{child}' now",
                    r.offset, r.partition
                ),
            ));
        }
        None => blocked,
    };
    for r in &skip {
        broker
            .skip_remote(&c.name, c.epoch, r.partition, r.offset)
            .await?;
        tracing::warn!(
            component = "audit",
            actor = caller.username().unwrap_or("-"),
            action = "remote_child_skip",
            subject = %c.name,
            parent = %parent,
            partition = r.partition,
            offset = r.offset,
            "a record the remote refused was skipped: it will never reach the remote"
        );
    }
    Ok(super::json_response(
        StatusCode::OK,
        &serde_json::json!({ "skipped": skip }),
    ))
}

/// The remote child `child` of `parent`: `404 topic_not_found` without the parent, `409
/// fanout_conflict` for a local child of it (these routes are for remote children: the
/// request names a child that exists, on the wrong route), else `404 not_a_child`.
fn remote_child(
    broker: &narad_core::broker::Broker,
    parent: &str,
    child: &str,
) -> Result<std::sync::Arc<RemoteChild>, ApiError> {
    broker.topic_meta(parent)?;
    if let Some(c) = broker
        .remote_children(parent)
        .into_iter()
        .find(|c| c.name == child)
    {
        return Ok(c);
    }
    let local = broker
        .with_topic_meta(child, |m| {
            m.parent.as_ref().is_some_and(|l| l.parent == parent)
        })
        .unwrap_or(false);
    if local {
        return Err(ApiError::new(
            ErrorCode::FanoutConflict,
            format!(
                "'{child}' is a local child of '{parent}': pause, resume and skip are for remote children (a local child is detached with DELETE)"
            ),
        ));
    }
    Err(ApiError::new(
        ErrorCode::NotAChild,
        format!("'{child}' is not a remote child of '{parent}'"),
    ))
}

/// `POST /v1/topics/{parent}/children/{child}/pause`: the child's cursors ship nothing until
/// it is resumed (its lag grows; the parent keeps the records as its retention allows).
pub async fn pause(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path((parent, child)): Path<(String, String)>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    pause_or_resume(&state, &caller, &parent, &child, true).await
}

/// `POST /v1/topics/{parent}/children/{child}/resume`: runs the checks again, then ships from
/// where the child paused.
pub async fn resume(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path((parent, child)): Path<(String, String)>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    pause_or_resume(&state, &caller, &parent, &child, false).await
}

async fn pause_or_resume(
    state: &SharedState,
    caller: &Caller,
    parent: &str,
    child: &str,
    paused: bool,
) -> ApiResult {
    caller.require_admin()?;
    let broker = state.broker()?.clone();
    let c = remote_child(&broker, parent, child)?;
    if !paused {
        // resuming runs the checks again: the target may have changed while paused
        let remote = broker.remote(&c.remote)?;
        let parent_schema = broker
            .topic_meta(parent)?
            .schemas
            .last()
            .map(|v| v.schema.clone());
        if let Some(keys) = state.remotes.keys.as_deref()
            && let Ok(client) = narad_xregion::remote::client(
                &remote,
                keys,
                &state.remotes.guard,
                CHECK_REQUEST_TIMEOUT,
            )
        {
            let report = narad_xregion::checks::check(
                &client,
                narad_xregion::checks::Target {
                    topic: Some(&c.remote_topic),
                    parent_id: Some(c.parent_id),
                    schema: Some(parent_schema.as_ref()),
                    mirror: match broker.topic_meta(parent) {
                        Ok(meta) => mirror_of(&broker, &meta).await?,
                        Err(_) => None,
                    },
                    carries_users: remote.carry_users,
                },
            )
            .await;
            let replaced = report
                .topic_id
                .as_deref()
                .and_then(|id| u64::from_str_radix(id, 16).ok())
                .is_some_and(|id| id != c.target_id);
            if !report.ok || replaced {
                let why = if replaced {
                    "target_replaced: the target topic was deleted and created again; detach and attach again".to_owned()
                } else {
                    let failed = report.checks.iter().find(|c| !c.ok);
                    format!(
                        "{} ({})",
                        failed.map_or("-", |c| c.detail.as_str()),
                        report.state
                    )
                };
                return Err(ApiError::new(
                    ErrorCode::RemoteCheckFailed,
                    format!("remote child '{child}' not resumed: {why}"),
                ));
            }
        }
    }
    broker.pause_remote(&c.name, c.epoch, paused).await?;
    // answered once every owner of the parent's partitions has applied it
    state.plane()?.owners_applied(parent).await?;
    tracing::info!(
        component = "audit",
        actor = caller.username().unwrap_or("-"),
        action = if paused { "remote_child_pause" } else { "remote_child_resume" },
        subject = %c.name,
        parent,
        "remote child changed"
    );
    Ok(StatusCode::NO_CONTENT.into_response())
}
