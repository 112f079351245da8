//! Ack, extend and nack: one handle in the query string, or up to 100 in a JSON body.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use narad_core::broker::AckAction;
use narad_wire::{AckResult, AckResults, ErrorCode};
use serde::Deserialize;

use super::query::Query;
use super::{
    ApiError, ApiResult, MAX_JSON_BODY, SharedState, json_response, parse_json, read_body,
};
use narad_wire::limits::MAX_BATCH_ACK;

/// The settle action `extend` names, by the one mapping the API and its clients share.
fn action(extend: Option<&str>) -> Result<AckAction, ApiError> {
    let extend = extend.unwrap_or("");
    match narad_wire::Settle::from_extend(extend) {
        Some(narad_wire::Settle::Ack) => Ok(AckAction::Ack),
        Some(narad_wire::Settle::Extend) => Ok(AckAction::Extend),
        Some(narad_wire::Settle::Nack) => Ok(AckAction::Nack),
        None => Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!("extend must be true or 1 (extend), 0 (nack) or false (ack), got '{extend}'"),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchAck {
    receipt_handles: Vec<String>,
    #[serde(default)]
    extend: Option<serde_json::Value>,
}

pub async fn ack(
    State(state): State<SharedState>,
    axum::Extension(caller): axum::Extension<super::access::Caller>,
    Path(topic): Path<String>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    ack_parts(state, caller, topic, uri, body).await
}

/// [`ack`] from the request's parts: through the router, or as a hot route ([`super::hot`]).
pub(super) async fn ack_parts(
    state: SharedState,
    caller: super::access::Caller,
    topic: String,
    uri: Uri,
    body: Body,
) -> ApiResult {
    caller.require(narad_auth::Action::Consume, &topic)?;
    let q = Query::parse(uri.query(), &["receipt_handle", "extend"])?;
    let broker = state.broker()?.clone();
    let body = read_body(body, MAX_JSON_BODY).await?;
    if q.has("receipt_handle") {
        if !body.is_empty() {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "give one receipt_handle in the query string or a JSON body with receipt_handles, not both",
            ));
        }
        let handle = q.str("receipt_handle").unwrap_or_default();
        if handle.is_empty() {
            return Err(ApiError::new(
                ErrorCode::InvalidReceiptHandle,
                "receipt_handle is empty",
            ));
        }
        let act = action(q.str("extend"))?;
        state.plane()?.settle(&topic, handle, act).await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    if body.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidReceiptHandle,
            "receipt_handle is required (query string), or a JSON body {\"receipt_handles\": [...]}",
        ));
    }
    if q.has("extend") {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "for a batch ack put extend in the JSON body",
        ));
    }
    let req: BatchAck = parse_json(&body)?;
    if req.receipt_handles.is_empty() || req.receipt_handles.len() > MAX_BATCH_ACK {
        return Err(ApiError::new(
            ErrorCode::InvalidBatch,
            format!("receipt_handles must hold 1 to {MAX_BATCH_ACK} handles"),
        ));
    }
    let extend = match &req.extend {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Bool(b)) => Some(if *b { "true" } else { "false" }.to_owned()),
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            return Err(ApiError::new(
                ErrorCode::InvalidField,
                format!("extend: expected true, false, 0 or 1, got {other}"),
            ));
        }
    };
    let act = action(extend.as_deref())?;
    // The topic must exist: a batch against an unknown topic is a 404, not 410s.
    broker.check_topic(&topic)?;
    let results = state
        .plane()?
        .settle_many(&topic, &req.receipt_handles, act)
        .await
        .into_iter()
        .map(|r| match r {
            Ok(()) => AckResult::applied(),
            Err(e) => AckResult::failed(e.code, e.message),
        })
        .collect();
    Ok(json_response(StatusCode::OK, &AckResults { results }))
}
