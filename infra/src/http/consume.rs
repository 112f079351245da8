//! Consume: queue reads with a lease (long-poll), or replay reads that change nothing.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::IntoResponse;
use narad_core::broker::ReplayFrom;
use narad_wire::ErrorCode;

use super::query::{Query, parse_duration, parse_time_ms};
use super::{ApiError, ApiResult, SharedState};

use narad_wire::limits::MAX_CONSUME_BATCH;

/// Header set when the requested wait was longer than the server allows.
pub const WAIT_CLAMPED_HEADER: &str = "x-narad-wait-clamped";

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
    // (shutting down: said before anything else)
    state.broker()?;
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
        let plane = state.plane()?;
        let archive = state.archive.as_deref();
        return match plane
            .replay(archive, &topic, p, from, n, max.is_some())
            .await?
        {
            None => Ok(StatusCode::NO_CONTENT.into_response()),
            Some(text) => {
                super::budget::reply(&state.body_budget, &held, StatusCode::OK, text).await
            }
        };
    }

    let limit = Duration::from_millis(state.cfg.max_wait_ms);
    let clamped = wait > limit;
    let wait = wait.min(limit);
    // a wait ends as soon as the caller's grant is revoked (or the user deleted): nothing
    // is leased to a caller that may no longer consume (dropping the wait gives back what it
    // was handed)
    let revoked = revoked(&state, &caller, &topic);
    let plane = state.plane()?;
    let got = tokio::select! {
        biased;
        e = revoked => return Err(e),
        r = plane.consume(&topic, partition, max.unwrap_or(1), wait, caller.username()) => r?,
    };
    // (revoked in the same instant: what was taken is given back)
    if let Err(e) = still_allowed(&state, &caller, &topic) {
        got.give_back();
        return Err(e);
    }
    let mut resp = if got.is_empty() {
        StatusCode::NO_CONTENT.into_response()
    } else {
        // (not sent: what was taken is given back)
        got.reply(&state.body_budget, &held, max.is_some()).await?
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
pub(super) fn still_allowed(
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
pub(super) async fn revoked(
    state: &SharedState,
    caller: &super::access::Caller,
    topic: &str,
) -> ApiError {
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
