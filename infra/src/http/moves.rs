//! Partition moves: `/v1/cluster/moves...` (admin only).
//!
//! A move is asked for here and recorded in the catalog (through Raft); the target member's
//! mover does the rest (`crate::moves`). `GET` shows every move in flight, with the phase
//! and the bytes copied its target reports.

use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use narad_core::catalog::TopicMeta;
use narad_wire::ErrorCode;
use serde::{Deserialize, Serialize};

use super::access::Caller;
use super::query::Query;
use super::{
    ApiError, ApiResult, MAX_JSON_BODY, SharedState, json_response, parse_json, read_body,
};
use crate::moves::Progress;
use narad_cluster::rpc::ops::MOVE_PROGRESS;

/// How long `GET /v1/cluster/moves` waits for a target's progress.
const PROGRESS_DEADLINE: Duration = Duration::from_secs(2);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveRequest {
    topic: String,
    partition: u32,
    to: u64,
}

#[derive(Serialize)]
struct MoveJson {
    topic: String,
    partition: u32,
    id: String,
    from: u64,
    to: u64,
    owner_epoch: u64,
    reason: String,
    since_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_copied: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
}

fn moves_of(t: &TopicMeta) -> impl Iterator<Item = MoveJson> + '_ {
    t.moves.iter().map(|(&p, m)| MoveJson {
        topic: t.name.clone(),
        partition: p,
        id: format!("{:016x}", m.id),
        from: t.owner_of(p).unwrap_or(0),
        to: m.target,
        owner_epoch: t.owner_epoch(p),
        reason: m.reason.clone(),
        since_ms: m.since_ms,
        phase: None,
        bytes_copied: None,
        attempts: None,
        last_error: None,
    })
}

/// A partition number from a path.
fn partition_number(p: &str) -> Result<u32, ApiError> {
    // its canonical form only: `str::parse` also takes "+1" and "01", other names of 1
    let canonical =
        !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()) && (p == "0" || !p.starts_with('0'));
    canonical.then(|| p.parse().ok()).flatten().ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidField,
            format!("partition: '{p}' is not a partition number (0, 1, 2, ...)"),
        )
    })
}

/// This node's cluster membership; a single node answers `409` with `code` (as removing a
/// member does: there is nothing to move or remove, and the request is not wrong in form).
fn cluster_of(
    state: &SharedState,
    code: ErrorCode,
) -> Result<&std::sync::Arc<crate::cluster::ClusterNode>, ApiError> {
    state.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            code,
            "this node is not in a cluster (no cluster_members configured): there is nothing to move",
        )
    })
}

fn audit(caller: &Caller, action: &str, topic: &str, partition: u32, to: Option<u64>) {
    tracing::info!(
        component = "audit",
        user = caller.username().unwrap_or("-"),
        action,
        topic,
        partition,
        to = to.unwrap_or(0),
        "partition move"
    );
}

/// `POST /v1/cluster/moves` `{"topic","partition","to"}`: moves a partition to member `to`.
/// `202` once the move is recorded; it runs in the background (see `GET`).
pub async fn create(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let node = cluster_of(&state, ErrorCode::MoveConflict)?.clone();
    let broker = state.broker()?.clone();
    let body = read_body(body, MAX_JSON_BODY).await?;
    let req: MoveRequest = parse_json(&body)?;
    let voters: Vec<u64> = node
        .meta
        .view()
        .membership
        .membership()
        .voter_ids()
        .collect();
    if !voters.contains(&req.to) {
        return Err(ApiError::new(
            ErrorCode::MoveConflict,
            format!(
                "node {} is not a voting member of the cluster (voters: {voters:?})",
                req.to
            ),
        ));
    }
    let meta = broker.topic_meta(&req.topic)?;
    if req.partition < meta.config.partitions && meta.owner_of(req.partition) == Some(req.to) {
        return Err(ApiError::new(
            ErrorCode::MoveConflict,
            format!(
                "partition {} of '{}' is on node {} already",
                req.partition, req.topic, req.to
            ),
        ));
    }
    let t = broker
        .set_move_target(&req.topic, req.partition, Some(req.to), "admin")
        .await?;
    audit(
        &caller,
        "partition_move",
        &req.topic,
        req.partition,
        Some(req.to),
    );
    let m = moves_of(&t)
        .find(|m| m.partition == req.partition)
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::MoveConflict,
                "the move was recorded and has completed or been cancelled since",
            )
        })?;
    Ok(json_response(StatusCode::ACCEPTED, &m))
}

/// `GET /v1/cluster/moves`: every move in flight, with its target's progress where the
/// target answers.
pub async fn list(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let node = cluster_of(&state, ErrorCode::MoveConflict)?.clone();
    let broker = state.broker()?.clone();
    let catalog = broker.catalog();
    let mut moves: Vec<MoveJson> = catalog.topics().flat_map(|t| moves_of(t)).collect();
    let mut targets: Vec<u64> = moves.iter().map(|m| m.to).collect();
    targets.sort_unstable();
    targets.dedup();
    let asks = targets.into_iter().map(|id| {
        let node = node.clone();
        let mover = state.mover.get().cloned();
        async move {
            if id == node.node_id() {
                return mover.map(|m| m.progress()).unwrap_or_default();
            }
            let Some(addr) = node.meta.addr_of(id) else {
                return Vec::new();
            };
            match node
                .meta
                .rpc()
                .call(
                    id,
                    &addr,
                    MOVE_PROGRESS,
                    bytes::Bytes::new(),
                    PROGRESS_DEADLINE,
                )
                .await
            {
                Ok(b) => serde_json::from_slice::<Vec<Progress>>(&b).unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        }
    });
    let progress: Vec<Progress> = futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect();
    for m in &mut moves {
        if let Some(p) = progress.iter().find(|p| {
            p.topic == m.topic
                && p.partition == m.partition
                && format!("{:016x}", p.move_id) == m.id
        }) {
            m.phase = Some(p.phase.clone());
            m.bytes_copied = Some(p.bytes_copied);
            m.attempts = Some(p.attempts);
            m.last_error.clone_from(&p.last_error);
        }
    }
    // the partitions an admin placed by hand, which the planner leaves
    let pinned: Vec<serde_json::Value> = catalog
        .topics()
        .flat_map(|t| {
            t.pinned.iter().map(
                |&p| serde_json::json!({"topic": t.name, "partition": p, "owner": t.owner_of(p)}),
            )
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "moves": moves, "pinned": pinned }),
    ))
}

/// `DELETE /v1/cluster/moves/{topic}/{partition}`: cancels the move of that partition. A
/// move whose flip already committed is done: nothing to cancel (`404`).
pub async fn cancel(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path((topic, partition)): Path<(String, String)>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    cluster_of(&state, ErrorCode::MoveConflict)?;
    let broker = state.broker()?.clone();
    let partition = partition_number(&partition)?;
    let meta = broker.topic_meta(&topic)?;
    if !meta.moves.contains_key(&partition) {
        return Err(ApiError::new(
            ErrorCode::MoveNotFound,
            format!("no move of partition {partition} of '{topic}' is in flight"),
        ));
    }
    broker
        .set_move_target(&topic, partition, None, "admin")
        .await?;
    audit(&caller, "partition_move_cancel", &topic, partition, None);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /v1/cluster/moves/{topic}/{partition}/pin`: a partition an admin moved is the
/// planner's to place again (`404` if it was not pinned).
pub async fn unpin(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path((topic, partition)): Path<(String, String)>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    cluster_of(&state, ErrorCode::MoveConflict)?;
    let broker = state.broker()?.clone();
    let partition = partition_number(&partition)?;
    if !broker.unpin(&topic, partition).await? {
        return Err(ApiError::new(
            ErrorCode::MoveNotFound,
            format!("partition {partition} of '{topic}' is not pinned"),
        ));
    }
    audit(&caller, "partition_unpin", &topic, partition, None);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/cluster/rebalance`: one pass of the leader's planner now, balancing even with
/// `cluster_auto_rebalance` off; answers the moves it asked for.
pub async fn rebalance(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    cluster_of(&state, ErrorCode::MoveConflict)?;
    state.broker()?;
    let mover = state
        .mover
        .get()
        .ok_or_else(|| crate::moves::unavailable("the member is still opening; retry"))?;
    let planned = mover.rebalance().await?;
    tracing::info!(
        component = "audit",
        user = caller.username().unwrap_or("-"),
        action = "cluster_rebalance",
        moves = planned.len(),
        "rebalance"
    );
    Ok(json_response(
        StatusCode::ACCEPTED,
        &serde_json::json!({ "moves": planned }),
    ))
}

/// `POST|DELETE /v1/cluster/members/{node_id}/decommission`: starts (or calls off) draining
/// a member: its partitions move to the others (no produce is refused meanwhile), then the
/// leader removes it from the cluster, handing on its leadership first if it leads.
pub async fn decommission(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    method: axum::http::Method,
    Path(node_id): Path<String>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let node = cluster_of(&state, ErrorCode::MemberNotRemovable)?.clone();
    let broker = state.broker()?.clone();
    let id = super::node_id_param(&node_id)?;
    let voters: Vec<u64> = node
        .meta
        .view()
        .membership
        .membership()
        .voter_ids()
        .collect();
    let draining = method == axum::http::Method::POST;
    if !draining && !voters.contains(&id) && !broker.catalog().draining().contains(&id) {
        return Err(ApiError::new(
            ErrorCode::MemberNotFound,
            format!("node {id} is not a member being decommissioned"),
        ));
    }
    if draining {
        if !voters.contains(&id) {
            return Err(ApiError::new(
                ErrorCode::MemberNotFound,
                format!("node {id} is not a voting member of the cluster"),
            ));
        }
        let others = broker
            .catalog()
            .draining()
            .iter()
            .filter(|d| **d != id)
            .count();
        if voters.len() - others <= 3 {
            return Err(ApiError::new(
                ErrorCode::MemberNotRemovable,
                format!(
                    "the cluster has {} voters{}: it keeps at least three, so add a member before decommissioning one",
                    voters.len(),
                    if others > 0 {
                        " (some already leaving)"
                    } else {
                        ""
                    }
                ),
            ));
        }
    }
    broker.set_draining(id, draining).await?;
    tracing::info!(
        component = "audit",
        user = caller.username().unwrap_or("-"),
        action = if draining {
            "member_decommission"
        } else {
            "member_decommission_cancel"
        },
        node_id = id,
        "decommission"
    );
    let owned: usize = broker
        .catalog()
        .topics()
        .map(|t| t.owners.iter().filter(|o| **o == id).count())
        .sum();
    Ok(json_response(
        StatusCode::ACCEPTED,
        &serde_json::json!({ "node_id": id, "draining": draining, "partitions_to_move": if draining { owned } else { 0 } }),
    ))
}

/// `POST /v1/cluster/members/{node_id}/forget`: the member is lost for good; its partitions
/// go to live members, rebuilt from the archive, and what the archive did not hold is
/// reported lost. Refused while the member answers, and without an archive.
pub async fn forget(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(node_id): Path<String>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    cluster_of(&state, ErrorCode::MemberNotRemovable)?;
    state.broker()?;
    let id = super::node_id_param(&node_id)?;
    let mover = state
        .mover
        .get()
        .ok_or_else(|| crate::moves::unavailable("the member is still opening; retry"))?;
    let done = mover.forget(id).await?;
    let lost: u64 = done.iter().map(|f| f.lost_at_least).sum();
    tracing::warn!(
        component = "audit",
        user = caller.username().unwrap_or("-"),
        action = "member_forget",
        node_id = id,
        partitions = done.len(),
        lost_at_least = lost,
        "member forgotten"
    );
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "node_id": id, "partitions": done, "lost_at_least": lost }),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_partition_in_a_path_has_one_name() {
        assert_eq!(super::partition_number("0").ok(), Some(0));
        assert_eq!(super::partition_number("17").ok(), Some(17));
        for other in ["+1", "01", "00", "", "-1", "1.0", " 1", "4294967296"] {
            assert!(super::partition_number(other).is_err(), "{other}");
        }
    }
}
