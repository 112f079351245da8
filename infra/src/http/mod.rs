//! HTTP API v1: routing, error mapping, request parsing helpers.
//!
//! Every error is JSON `{"error": "...", "code": "snake_case"}`; client mistakes are 4xx.
//! An error is an [`ApiError`] made from a [`narad_wire::ErrorCode`], and its status is the
//! one the code has in that table: no handler picks a status or writes an error body itself.
//! Broker errors get their code in one place, [`broker_error_code`].

pub mod access;
pub mod access_keys;
mod ack;
pub mod budget;
pub(crate) mod consume;
pub mod error;
pub(crate) mod hot;
mod moves;
mod produce;
pub mod query;
mod remote_children;
pub mod remotes;
pub(crate) mod render;
mod roles;
pub(crate) mod sqs;
pub(crate) mod topics;
mod users;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use narad_core::broker::Broker;
use narad_wire::ErrorCode;
use serde::Serialize;

use crate::config::ServerConfig;
use crate::metrics::{HttpLabels, Metrics};

pub(crate) use error::set_data_dir_for_errors;
pub use error::{ApiError, ApiResult, broker_error_code, status_of};

/// Largest JSON body for topic and ack requests.
pub const MAX_JSON_BODY: usize = 1024 * 1024;
/// Largest body a route other than batch produce reads (a single produce's message).
pub use crate::config::MAX_BODY_LIMIT;

pub struct AppState {
    pub cfg: ServerConfig,
    pub broker: std::sync::OnceLock<Arc<Broker>>,
    pub ready: AtomicBool,
    pub shutting_down: AtomicBool,
    pub metrics: Arc<Metrics>,
    /// Reads history below the oldest local offset from the archive, when one is configured.
    pub archive: Option<Arc<narad_replay::ArchiveReader>>,
    /// Users and credential checks; `None` when security is off.
    pub auth: Option<Arc<narad_auth::Authenticator>>,
    /// Latched once the user store holds the root user (seeded or restored at start, or
    /// mirrored from a cluster's metastore): until then no credentials can be checked, and
    /// requests are told to retry (`503 not_ready`) rather than that their credentials are
    /// wrong.
    pub users_loaded: AtomicBool,
    /// Request bytes in flight, node-wide (`max_request_bytes_in_flight`).
    pub body_budget: budget::BodyBudget,
    /// Compiled JSON Schemas of topics, by topic incarnation and version.
    pub schemas: narad_schema::SchemaCache,
    /// What a restore from the archive did not bring back (users, fan-out links), shown as
    /// `/readyz` detail for as long as the process runs.
    pub restore_notice: std::sync::OnceLock<String>,
    /// This node's cluster membership (metastore, readiness), when `cluster_members` is set.
    pub cluster: Option<Arc<crate::cluster::ClusterNode>>,
    /// A cluster member's way to the partitions other members own (set once the broker is
    /// open).
    pub ingress: std::sync::OnceLock<Arc<crate::forward::Ingress>>,
    /// Remotes' keys and address guard.
    pub remotes: remotes::RemotesKit,
    /// A cluster member's partition mover, once the broker is open.
    pub mover: std::sync::OnceLock<Arc<crate::moves::Mover>>,
    pub move_metrics: Arc<crate::moves::MoveMetrics>,
    /// The SQS endpoint's signing keys, opened from access keys as requests use them.
    pub sqs_keys: sqs::SigningKeys,
}

impl AppState {
    /// The data plane requests go through: this node's broker alone, or (a cluster member's
    /// ingress is set before it serves) the members owning each partition.
    pub fn plane(&self) -> Result<crate::plane::Plane<'_>, ApiError> {
        let broker = self.broker()?;
        Ok(match self.ingress.get() {
            Some(ingress) => crate::plane::Plane::Cluster(ingress),
            None => crate::plane::Plane::Local(broker),
        })
    }

    pub fn broker(&self) -> Result<&Arc<Broker>, ApiError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(ApiError::new(
                ErrorCode::ShuttingDown,
                "the broker is shutting down",
            ));
        }
        self.broker.get().ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotReady,
                "the broker is still recovering its data; retry shortly",
            )
        })
    }
}

pub type SharedState = Arc<AppState>;

/// Reads a request body of at most `limit` bytes (413 beyond).
pub async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
        let (mut too_large, mut spent, mut late) = (false, false, false);
        while let Some(s) = source {
            too_large |= s.is::<http_body_util::LengthLimitError>();
            spent |= s.is::<budget::BudgetSpent>();
            late |= s.is::<budget::BodyTimeout>();
            source = s.source();
        }
        if spent {
            budget::spent()
        } else if late {
            ApiError::new(
                ErrorCode::BodyTimeout,
                "the request body did not arrive within body_read_timeout_ms, or fell behind body_min_bytes_per_s after body_grace_ms",
            )
        } else if too_large {
            ApiError::new(
                ErrorCode::BodyTooLarge,
                format!("request body exceeds {limit} bytes"),
            )
        } else {
            ApiError::new(
                ErrorCode::BodyUnreadable,
                format!("could not read request body: {e}"),
            )
        }
    })
}

/// Parses a strict JSON body (unknown fields and trailing data are errors).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    parse_json_borrowed(body)
}

/// [`parse_json`] for types that borrow from the body (no copies of strings without escapes).
pub fn parse_json_borrowed<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidJson,
            "request body is empty; a JSON object is required",
        ));
    }
    // every body is an object (serde would otherwise take an array for a struct, its
    // fields by position)
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            ErrorCode::InvalidJson,
            "invalid JSON body: a JSON object is required",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(ErrorCode::InvalidJson, format!("invalid JSON body: {e}")))
}

pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    json_text_response(
        status,
        serde_json::to_string(value).expect("response serialises"),
    )
}

/// A response whose body is already JSON text.
pub fn json_text_response(status: StatusCode, body: String) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Every route the server answers, as `(method, path pattern)`. The OpenAPI test compares
/// this list with `docs/openapi.yaml`.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/v1/cluster"),
    ("DELETE", "/v1/cluster/members/{node_id}"),
    ("POST", "/v1/cluster/members/{node_id}/decommission"),
    ("DELETE", "/v1/cluster/members/{node_id}/decommission"),
    ("POST", "/v1/cluster/members/{node_id}/forget"),
    ("POST", "/v1/cluster/rebalance"),
    ("POST", "/v1/cluster/moves"),
    ("GET", "/v1/cluster/moves"),
    ("DELETE", "/v1/cluster/moves/{topic}/{partition}"),
    ("DELETE", "/v1/cluster/moves/{topic}/{partition}/pin"),
    ("POST", "/v1/topics"),
    ("GET", "/v1/topics"),
    ("GET", "/v1/topics/{topic}"),
    ("PATCH", "/v1/topics/{topic}"),
    ("DELETE", "/v1/topics/{topic}"),
    ("POST", "/v1/topics/{topic}/produce"),
    ("POST", "/v1/topics/{topic}/produce/batch"),
    ("GET", "/v1/topics/{topic}/consume"),
    ("POST", "/v1/topics/{topic}/ack"),
    ("POST", "/v1/topics/{topic}/children"),
    ("GET", "/v1/topics/{topic}/children"),
    ("DELETE", "/v1/topics/{topic}/children/{child}"),
    ("POST", "/v1/topics/{topic}/children/{child}/pause"),
    ("POST", "/v1/topics/{topic}/children/{child}/resume"),
    ("POST", "/v1/topics/{topic}/children/{child}/skip"),
    ("POST", "/v1/topics/{topic}/mirror"),
    ("POST", "/v1/topics/{topic}/progress"),
    ("POST", "/v1/topics/{topic}/promote"),
    ("POST", "/v1/topics/{topic}/demote"),
    ("GET", "/v1/topics/{topic}/schema"),
    ("POST", "/v1/users"),
    ("GET", "/v1/users"),
    ("GET", "/v1/users/{username}"),
    ("DELETE", "/v1/users/{username}"),
    ("PUT", "/v1/users/{username}/grants"),
    ("PUT", "/v1/users/{username}/password"),
    ("POST", "/v1/users/{username}/access-keys"),
    ("GET", "/v1/users/{username}/access-keys"),
    ("DELETE", "/v1/users/{username}/access-keys/{key_id}"),
    ("PUT", "/v1/carried-users"),
    ("POST", "/v1/remotes"),
    ("GET", "/v1/remotes"),
    ("GET", "/v1/remotes/{name}"),
    ("PATCH", "/v1/remotes/{name}"),
    ("DELETE", "/v1/remotes/{name}"),
    ("POST", "/v1/remotes/{name}/test"),
    ("POST", "/v1/cluster/reencrypt-remotes"),
];

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/cluster", get(cluster_status))
        .route(
            "/v1/cluster/members/{node_id}",
            axum::routing::delete(remove_member),
        )
        .route(
            "/v1/cluster/members/{node_id}/decommission",
            post(moves::decommission).delete(moves::decommission),
        )
        .route("/v1/cluster/members/{node_id}/forget", post(moves::forget))
        .route("/v1/cluster/rebalance", post(moves::rebalance))
        .route("/v1/cluster/moves", post(moves::create).get(moves::list))
        .route(
            "/v1/cluster/moves/{topic}/{partition}",
            axum::routing::delete(moves::cancel),
        )
        .route(
            "/v1/cluster/moves/{topic}/{partition}/pin",
            axum::routing::delete(moves::unpin),
        )
        .route("/v1/topics", post(topics::create).get(topics::list))
        .route(
            "/v1/topics/{topic}",
            get(topics::get).patch(topics::alter).delete(topics::delete),
        )
        .route("/v1/topics/{topic}/produce", post(produce::single))
        .route("/v1/topics/{topic}/produce/batch", post(produce::batch))
        .route(
            "/v1/topics/{topic}/consume",
            get(consume::consume)
                .head(consume_not_allowed)
                .fallback(consume_not_allowed),
        )
        .route("/v1/topics/{topic}/ack", post(ack::ack))
        .route(
            "/v1/topics/{topic}/children",
            post(topics::attach).get(topics::children),
        )
        .route(
            "/v1/topics/{topic}/children/{child}",
            axum::routing::delete(topics::detach),
        )
        .route(
            "/v1/topics/{topic}/children/{child}/pause",
            post(remote_children::pause),
        )
        .route(
            "/v1/topics/{topic}/children/{child}/resume",
            post(remote_children::resume),
        )
        .route(
            "/v1/topics/{topic}/children/{child}/skip",
            post(remote_children::skip),
        )
        .route("/v1/topics/{topic}/mirror", post(roles::mirror))
        .route("/v1/topics/{topic}/progress", post(roles::progress))
        .route("/v1/topics/{topic}/promote", post(roles::promote))
        .route("/v1/topics/{topic}/demote", post(roles::demote))
        .route("/v1/topics/{topic}/schema", get(topics::schema))
        .route("/v1/users", post(users::create).get(users::list))
        .route(
            "/v1/users/{username}",
            get(users::get).delete(users::delete),
        )
        .route("/v1/users/{username}/grants", put(users::set_grants))
        .route("/v1/users/{username}/password", put(users::set_password))
        .route(
            "/v1/users/{username}/access-keys",
            post(access_keys::create).get(access_keys::list),
        )
        .route(
            "/v1/users/{username}/access-keys/{key_id}",
            axum::routing::delete(access_keys::delete),
        )
        .route("/v1/carried-users", put(users::carried))
        .route("/v1/remotes", post(remotes::create).get(remotes::list))
        .route(
            "/v1/remotes/{name}",
            get(remotes::get)
                .patch(remotes::patch)
                .delete(remotes::delete),
        )
        .route("/v1/remotes/{name}/test", post(remotes::test))
        .route("/v1/cluster/reencrypt-remotes", post(remotes::reencrypt))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), front))
        .with_state(state)
}

async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorCode::RouteNotFound,
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// Any method but `GET` on consume, `HEAD` among them: the router would serve a `HEAD` as a
/// `GET` without its body, and a consume leases what it returns, so `curl -I` or a monitoring
/// probe would hide messages for their visibility timeout and count a delivery with no
/// receipt handle sent (found by a black-box review). Every 405 here says `Allow: GET` (the
/// router's own would list HEAD too).
async fn consume_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    let mut resp = method_not_allowed(method, uri).await.into_response();
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    resp
}

/// What every request through the router goes through, in one middleware (one boxed
/// future, not three): see [`serve`].
async fn front(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let route = route_pattern(req.extensions().get::<MatchedPath>());
    serve(&state, route, req, |req| next.run(req)).await
}

/// Serves a request whose route is known (`route`: its pattern, `None` when none matched):
/// authentication, then the body budget (for authenticated requests only), the handler,
/// JSON errors, and the request's metrics. The router's middleware and the hot routes
/// ([`hot`]) both come here, so a request is treated alike whichever way it was routed.
pub(crate) async fn serve<F, Fut>(
    state: &SharedState,
    route: Option<&'static str>,
    mut req: Request,
    handler: F,
) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let method = method_label(req.method());
    let started = Instant::now();
    let has_body = !http_body::Body::is_end_stream(req.body());
    let (resp, body_read) = match unsupported_transfer_coding(&req) {
        Some(refused) => (refused.into_response(), false),
        None => match access::authenticate(state, &mut req).await {
            Err(refused) => (refused, false),
            Ok(()) => match budget::refuse_announced_overflow(state, &req, route) {
                Some(too_large) => (too_large.into_response(), false),
                None => {
                    let held = budget::limit(state, &mut req, route);
                    let resp = handler(req).await;
                    held.release();
                    access::count_refusal(state, &resp);
                    (resp, held.body_read())
                }
            },
        },
    };
    let mut resp = json_errors(resp).await;
    if has_body && !body_read {
        // Answered before the body was read (refused, a bad query, too large, too slow):
        // what is left of it cannot be told apart from a next request, so hyper closes the
        // connection after this answer unless the rest had already arrived. Said, so that
        // a keep-alive client does not send its next request into a closing socket.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let labels = HttpLabels {
        route: route.unwrap_or("unmatched"),
        method,
        status: resp.status().as_u16(),
    };
    state
        .metrics
        .observe_http(&labels, started.elapsed().as_secs_f64());
    resp
}

/// `501 unsupported_transfer_encoding` for a body framed with any transfer coding but one
/// `chunked`. hyper undoes the chunking of `Transfer-Encoding: gzip, chunked` and hands over
/// the gzip bytes as if they were the body, so without this check they would be stored as the
/// message (RFC 9112 §6.1: a server that does not understand a transfer coding answers 501).
/// Compression belongs in `Content-Encoding`. Checked before authentication: it is about the
/// framing, like hyper's own 400s, and costs one header lookup.
fn unsupported_transfer_coding(req: &Request) -> Option<ApiError> {
    let mut chunked = 0;
    let mut other = false;
    for value in req.headers().get_all(header::TRANSFER_ENCODING) {
        for coding in value
            .as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
        {
            if coding.eq_ignore_ascii_case(b"chunked") {
                chunked += 1;
            } else if !coding.is_empty() {
                other = true;
            }
        }
    }
    // `chunked, chunked` too: hyper undoes one chunking, and the other would be stored
    (other || chunked > 1).then(|| {
        ApiError::new(
            ErrorCode::UnsupportedTransferEncoding,
            "only the chunked transfer coding is supported; send compressed bodies with \
             Content-Encoding",
        )
    })
}

/// The matched route's pattern from [`ROUTES`] (a fixed set: a metric label with no copy
/// per request), or `None`.
fn route_pattern(matched: Option<&MatchedPath>) -> Option<&'static str> {
    matched.and_then(|m| {
        ROUTES
            .iter()
            .find(|(_, pattern)| *pattern == m.as_str())
            .map(|(_, pattern)| *pattern)
    })
}

/// The method as a metric label: one of the methods HTTP defines, or `other`. A client may
/// send any token as a method (even unauthenticated), and every label value is a time series
/// kept forever, so only a fixed set may ever reach the registry.
fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// Errors produced outside the handlers (axum's own rejections of a malformed path, say) come
/// as plain text; every error the API answers is JSON with a code from the table, so they are
/// rewrapped here. The status is the code's: axum only answers 400 (a path it cannot decode)
/// and 500 (a missing extension: a bug) this way, which keep theirs.
async fn json_errors(resp: Response) -> Response {
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let status = resp.status();
    if status.as_u16() < 400 || is_json {
        return resp;
    }
    let text = axum::body::to_bytes(resp.into_body(), 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let code = plain_error_code(status);
    if status_of(code) != status {
        tracing::debug!(%status, %code, "a plain-text error answered with its code's status");
    }
    let message = if text.trim().is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text.trim().to_owned()
    };
    ApiError::new(code, message).into_response()
}

/// The code of an error status that came without a code.
fn plain_error_code(status: StatusCode) -> ErrorCode {
    match status {
        StatusCode::NOT_FOUND => ErrorCode::RouteNotFound,
        StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::BodyTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedEncoding,
        s if s.is_server_error() => ErrorCode::InternalError,
        _ => ErrorCode::InvalidRequest,
    }
}

async fn healthz(State(state): State<SharedState>) -> Response {
    if state.shutting_down.load(Ordering::Acquire) {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": "shutting down"}),
        );
    }
    json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
}

async fn readyz(State(state): State<SharedState>) -> Response {
    // a background task that panicked is not restarted (see narad_core::supervisor): the
    // node stays not ready, and says which task, until it is restarted
    let failed = state.metrics.core.tasks.failed();
    if !failed.is_empty() {
        let message = format!(
            "background task failed: {}; restart the node",
            failed.join(", ")
        );
        return ApiError::new(ErrorCode::TaskFailed, message)
            .response_with(serde_json::json!({ "failed_tasks": failed }));
    }
    if let Some(c) = &state.cluster
        && let Err(why) = c.ready()
    {
        return ApiError::new(ErrorCode::NotReady, format!("not ready: {why}")).into_response();
    }
    // a member's partitions are served once checked against what the cluster acknowledged
    if let Some(why) = state.mover.get().and_then(|m| m.unverified()) {
        return ApiError::new(ErrorCode::NotReady, format!("not ready: {why}")).into_response();
    }
    if state.ready.load(Ordering::Acquire) && !state.shutting_down.load(Ordering::Acquire) {
        let body = match state.restore_notice.get() {
            Some(detail) => serde_json::json!({"status": "ready", "detail": detail}),
            None => serde_json::json!({"status": "ready"}),
        };
        json_response(StatusCode::OK, &body)
    } else {
        ApiError::new(ErrorCode::NotReady, "not ready").into_response()
    }
}

/// `GET /v1/cluster` (admin): the node's view of its cluster — leader, term, members, how
/// far this node applied. A single node (no `cluster_members`) answers as a cluster of one.
async fn cluster_status(
    State(state): State<SharedState>,
    axum::Extension(caller): axum::Extension<access::Caller>,
    uri: axum::http::Uri,
) -> ApiResult {
    caller.require_admin()?;
    query::Query::parse(uri.query(), &[])?;
    let body = match &state.cluster {
        Some(c) => c.status(),
        // no cluster_members: a cluster of one, which always leads itself
        None => serde_json::json!({
            "node_id": 0,
            "single_node": true,
            "leader": 0,
            "term": 0,
            "state": "Leader",
            "ready": state.ready.load(Ordering::Acquire),
            "members": [{"node_id": 0, "voter": true}],
        }),
    };
    Ok(json_response(StatusCode::OK, &body))
}

/// `DELETE /v1/cluster/members/{node_id}` (admin): removes a member (through the leader,
/// after it confirms its leadership with a quorum). Refused for the leader itself and when
/// fewer than three voters would be left.
async fn remove_member(
    State(state): State<SharedState>,
    axum::Extension(caller): axum::Extension<access::Caller>,
    axum::extract::Path(node_id): axum::extract::Path<String>,
    uri: axum::http::Uri,
) -> ApiResult {
    caller.require_admin()?;
    query::Query::parse(uri.query(), &[])?;
    let id = node_id_param(&node_id)?;
    let Some(c) = &state.cluster else {
        return Err(ApiError::new(
            ErrorCode::MemberNotRemovable,
            "this node is not in a cluster (no cluster_members configured)",
        ));
    };
    use narad_cluster::meta::RemoveError;
    match c
        .meta
        .remove_member(id, crate::cluster::PROPOSE_DEADLINE)
        .await
    {
        Ok(()) => {
            tracing::info!(
                component = "audit",
                user = caller.username().unwrap_or("-"),
                node_id = id,
                "cluster member removed"
            );
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Err(RemoveError::NotFound(m)) => Err(ApiError::new(ErrorCode::MemberNotFound, m)),
        Err(RemoveError::NotRemovable(m)) => Err(ApiError::new(ErrorCode::MemberNotRemovable, m)),
        Err(RemoveError::Unavailable(m)) => Err(ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!(
                "the leader could not be asked to remove node {id} (the change may still take effect): {m}"
            ),
        )),
    }
}

/// A `{node_id}` path parameter: a node id, 1 or more.
pub(super) fn node_id_param(node_id: &str) -> Result<u64, ApiError> {
    node_id.parse().ok().filter(|id| *id > 0).ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidField,
            format!("node_id: '{node_id}' is not a node id (1 or more)"),
        )
    })
}

async fn metrics(
    State(state): State<SharedState>,
    axum::Extension(caller): axum::Extension<access::Caller>,
) -> ApiResult {
    caller.require_admin()?;
    Ok(metrics_text(&state))
}

/// `/metrics` on the separate metrics listener: no authentication (see `metrics_addr`).
pub fn metrics_router(state: SharedState) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(state): State<SharedState>| async move { metrics_text(&state) }),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

fn metrics_text(state: &AppState) -> Response {
    let m = &state.metrics;
    m.request_bytes_in_flight
        .set(state.body_budget.in_use() as i64);
    if let Some(b) = state.broker.get() {
        m.tail_cache_bytes.set(b.tail_cache_used() as i64);
    }
    if let Some(c) = &state.cluster {
        c.observe();
    }
    let text = state.metrics.render(state.broker.get().map(Arc::as_ref));
    let mut resp = (StatusCode::OK, text).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    resp
}
