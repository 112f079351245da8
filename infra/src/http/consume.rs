//! Consume: queue reads with a lease (long-poll), or replay reads that change nothing.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::IntoResponse;
use narad_core::broker::ReplayFrom;
use narad_wire::ErrorCode;

use super::query::{Query, parse_duration, parse_time_ms};
use super::{ApiError, ApiResult, SharedState, render};
use crate::reads::history;

use narad_wire::limits::MAX_CONSUME_BATCH;

/// Header set when the requested wait was longer than the server allows.
pub const WAIT_CLAMPED_HEADER: &str = "x-narad-wait-clamped";

/// The reply: one message alone, or `{"messages": [...]}` when `max` was given; its bytes are
/// held against the node's budget until written (`503 server_busy` when they do not fit).
async fn reply(
    state: &SharedState,
    held: &super::budget::Held,
    msgs: &[render::MessageJson<'_>],
    batch: bool,
) -> ApiResult {
    let text = if batch {
        render::batch_text(msgs)
    } else {
        render::message_text(&msgs[0])
    };
    super::budget::reply(&state.body_budget, held, StatusCode::OK, text).await
}

pub async fn consume(
    State(state): State<SharedState>,
    axum::Extension(caller): axum::Extension<super::access::Caller>,
    axum::Extension(held): axum::Extension<super::budget::Held>,
    Path(topic): Path<String>,
    uri: Uri,
) -> ApiResult {
    consume_parts(state, caller, held, topic, uri).await
}

/// [`consume`] from the request's parts: through the router, or as a hot route
/// ([`super::hot`]).
pub(super) async fn consume_parts(
    state: SharedState,
    caller: super::access::Caller,
    held: super::budget::Held,
    topic: String,
    uri: Uri,
) -> ApiResult {
    caller.require(narad_auth::Action::Consume, &topic)?;
    let q = Query::parse(
        uri.query(),
        &["wait", "max", "partition", "offset", "from_time"],
    )?;
    let broker = state.broker()?.clone();
    let max = match q.u64("max")? {
        None => None,
        Some(n) if (1..=MAX_CONSUME_BATCH).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                format!("max must be between 1 and {MAX_CONSUME_BATCH}, got {n}"),
            ));
        }
    };
    let partition = q.u32("partition")?;
    let offset = q.u64("offset")?;
    let from_time = match q.str("from_time") {
        None => None,
        Some(v) => Some(parse_time_ms(v).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidParameter,
                format!("from_time must be RFC 3339 or unix milliseconds, got '{v}'"),
            )
        })?),
    };
    let wait_raw = q.str("wait");
    let wait = match wait_raw {
        None | Some("") => Duration::ZERO,
        Some(v) => parse_duration(v).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidParameter,
                format!("wait must be a duration like 500ms, 2s or 1m, got '{v}'"),
            )
        })?,
    };

    if offset.is_some() || from_time.is_some() {
        let Some(p) = partition else {
            return Err(ApiError::new(
                ErrorCode::PartitionRequired,
                "a replay read (offset or from_time) needs partition",
            ));
        };
        if offset.is_some() && from_time.is_some() {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                "give offset or from_time, not both",
            ));
        }
        let from = match offset {
            Some(o) => ReplayFrom::Offset(o),
            None => ReplayFrom::TimeMs(from_time.unwrap_or_default()),
        };
        let n = max.unwrap_or(1);
        if let Some(ingress) = state.ingress() {
            // a cluster member: read on the partition's owner
            let msgs = ingress.replay(&topic, p, from, n).await?;
            if msgs.is_empty() {
                return Ok(StatusCode::NO_CONTENT.into_response());
            }
            let text = crate::forward::Taken::read(msgs).body(max.is_some());
            return super::budget::reply(&state.body_budget, &held, StatusCode::OK, text).await;
        }
        let recs = history(&broker, state.archive.as_deref(), &topic, p, from, n).await?;
        if recs.is_empty() {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let msgs: Vec<_> = recs.iter().map(|r| render::record(&topic, p, r)).collect();
        return reply(&state, &held, &msgs, max.is_some()).await;
    }

    let limit = Duration::from_millis(state.cfg.max_wait_ms);
    let clamped = wait > limit;
    let wait = wait.min(limit);
    // a wait ends as soon as the caller's grant is revoked (or the user deleted): nothing
    // is leased to a caller that may no longer consume (dropping the wait gives back what it
    // was handed)
    let revoked = revoked(&state, &caller, &topic);
    let mut resp = match state.ingress() {
        // a cluster member: every owner's partitions
        Some(ingress) => {
            let taken = tokio::select! {
                biased;
                e = revoked => return Err(e),
                r = ingress.consume(&topic, partition, max.unwrap_or(1), wait, caller.username()) => r?,
            };
            // (revoked in the same instant: dropping `taken` gives the messages back)
            still_allowed(&state, &caller, &topic)?;
            if taken.is_empty() {
                StatusCode::NO_CONTENT.into_response()
            } else {
                let text = taken.body(max.is_some());
                // (not sent: dropping `taken` gives the messages back)
                let resp =
                    super::budget::reply(&state.body_budget, &held, StatusCode::OK, text).await?;
                taken.sent();
                resp
            }
        }
        None => {
            let got = tokio::select! {
                biased;
                e = revoked => return Err(e),
                r = broker.consume(&topic, partition, max.unwrap_or(1), wait) => r?,
            };
            if let Err(e) = still_allowed(&state, &caller, &topic) {
                broker.give_back(&topic, &got);
                return Err(e);
            }
            if got.is_empty() {
                StatusCode::NO_CONTENT.into_response()
            } else {
                let msgs: Vec<_> = got.iter().map(|d| render::delivery(&topic, d)).collect();
                match reply(&state, &held, &msgs, max.is_some()).await {
                    Ok(resp) => resp,
                    Err(e) => {
                        // not handed out: the messages are deliverable again at once
                        broker.give_back(&topic, &got);
                        return Err(e);
                    }
                }
            }
        }
    };
    if clamped {
        let v = format!("{}ms", limit.as_millis());
        resp.headers_mut().insert(
            WAIT_CLAMPED_HEADER,
            HeaderValue::from_str(&v).expect("ascii header value"),
        );
    }
    Ok(resp)
}

/// Whether `caller` may still consume from `topic` as the users are now.
fn still_allowed(
    state: &SharedState,
    caller: &super::access::Caller,
    topic: &str,
) -> Result<(), ApiError> {
    match &state.auth {
        Some(auth) => caller.still_allowed(auth.store(), narad_auth::Action::Consume, topic),
        None => Ok(()),
    }
}

/// Resolves, with the refusal, once `caller` may no longer consume from `topic` (its grant
/// revoked, its user deleted or its password changed); never while it may. Checked at once
/// and again after every change of the users, which a member applies as it follows its
/// cluster.
async fn revoked(state: &SharedState, caller: &super::access::Caller, topic: &str) -> ApiError {
    let Some(auth) = state.auth.as_ref().filter(|_| caller.username().is_some()) else {
        return std::future::pending().await;
    };
    // (subscribed before the first check: no change between the two is missed)
    let mut changes = auth.store().subscribe();
    loop {
        if let Err(e) = caller.still_allowed(auth.store(), narad_auth::Action::Consume, topic) {
            return e;
        }
        if changes.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}
