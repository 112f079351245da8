//! The SQS-compatible endpoint: `POST /` with `X-Amz-Target: AmazonSQS.<Operation>` and an
//! AWS JSON 1.0 body, on the API listener, so boto3, the AWS CLI and the AWS SDKs work
//! against Narad with only their endpoint changed. A queue is a topic: what is sent here is
//! consumable through the native API and the other way round (see docs/sqs.md).
//!
//! Requests do not go through the router: SQS signs requests (SigV4) where the native API
//! takes HTTP Basic, and answers errors in AWS's shape. They get the rest of what every
//! request gets: the transfer-coding check, the node's body budget and body deadlines, and
//! the request metrics (under the route `/`).
//!
//! - [`queues`]: create, find, list, delete, and queue attributes.
//! - [`messages`]: send, receive, delete and change visibility, single and batch.

mod auth;
mod messages;
mod queues;

pub use auth::SigningKeys;

use std::time::Instant;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use narad_sqs::ops::Op;
use narad_sqs::queue::Endpoint;
use narad_sqs::{Kind, SqsError};
use narad_wire::ErrorCode;

use super::access::Caller;
use super::budget::Held;
use super::{ApiError, SharedState, read_body};
use crate::metrics::HttpLabels;

/// The route's pattern: its metric label and body class.
pub const ROUTE: &str = narad_sqs::ops::PATH;

const CONTENT_TYPE: &str = "application/x-amz-json-1.0";

/// Whether a request is for this endpoint: a `POST /` with an `X-Amz-Target` (one naming
/// no SQS operation, or another service's, is answered `UnknownOperationException`).
pub fn is_sqs(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    method == Method::POST && path == ROUTE && headers.contains_key("x-amz-target")
}

/// Serves one SQS request.
pub async fn serve(state: &SharedState, mut req: Request) -> Response {
    let started = Instant::now();
    let has_body = !http_body::Body::is_end_stream(req.body());
    let mut body_read = false;
    let resp = match admit(state, &mut req) {
        Err(e) => {
            count_refused(state, &e);
            error_response(&e)
        }
        Ok((caller, pending)) => {
            req.extensions_mut().insert(caller.clone());
            let held = super::budget::limit(state, &mut req, Some(ROUTE));
            let resp = match handle(state, caller, pending, &held, req).await {
                Ok(resp) => resp,
                Err(e) => error_response(&e),
            };
            held.release();
            body_read = held.body_read();
            resp
        }
    };
    let mut resp = resp;
    // (as the router does: a body of known size is framed by Content-Length, not chunked)
    if !resp.headers().contains_key(header::CONTENT_LENGTH)
        && let Some(n) = http_body::Body::size_hint(resp.body()).exact()
    {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    if has_body && !body_read {
        // (answered before the body was read: the connection cannot be reused)
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if resp.status() == StatusCode::FORBIDDEN {
        super::access::count_refusal(state, &resp);
    }
    state.metrics.observe_http(
        &HttpLabels {
            route: ROUTE,
            method: "POST",
            status: resp.status().as_u16(),
        },
        started.elapsed().as_secs_f64(),
    );
    resp
}

/// Who the caller is (with security on, whose access key signed the request, the signature
/// itself still to be checked against the body), and the checks that need no body.
fn admit(
    state: &SharedState,
    req: &mut Request,
) -> Result<(Caller, Option<auth::Pending>), SqsError> {
    if let Some(e) = super::unsupported_transfer_coding(req) {
        return Err(SqsError::new(Kind::InvalidParameterValue, e.message));
    }
    // (no SDK compresses SQS requests: a compressed body would be read as garbage)
    if let Some(coding) = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .filter(|c| !c.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return Err(SqsError::new(
            Kind::InvalidParameterValue,
            format!(
                "Content-Encoding '{}' is not supported: send the request body uncompressed",
                String::from_utf8_lossy(coding.as_bytes())
                    .chars()
                    .take(40)
                    .collect::<String>()
            ),
        ));
    }
    let Some(authn) = &state.auth else {
        // (security off: any signature, or none, is taken)
        return Ok((Caller::Open, None));
    };
    if !super::access::users_loaded(state, authn) {
        return Err(SqsError::new(
            Kind::ServiceUnavailable,
            "the broker is still loading its users; retry shortly",
        ));
    }
    let (parts, body) = std::mem::take(req).into_parts();
    let checked = auth::before_body(&state.sqs_keys, state, authn, &parts);
    *req = Request::from_parts(parts, body);
    let pending = checked?;
    Ok((Caller::User(pending.user().clone()), Some(pending)))
}

/// Counts a request refused for its credentials.
fn count_refused(state: &SharedState, e: &SqsError) {
    let reason = match e.kind {
        Kind::MissingAuthenticationToken => "missing",
        Kind::IncompleteSignature | Kind::RequestExpired => "malformed",
        Kind::InvalidClientTokenId | Kind::SignatureDoesNotMatch => "bad_credentials",
        _ => return,
    };
    state
        .metrics
        .auth_refused
        .get_or_create(&crate::metrics::AuthLabels { reason })
        .inc();
}

/// What a request needs from its envelope.
struct Ctx<'a> {
    state: &'a SharedState,
    caller: Caller,
    held: &'a Held,
    endpoint: Endpoint,
    scheme: &'static str,
    host: String,
}

impl Ctx<'_> {
    fn url(&self, queue: &str) -> String {
        self.endpoint.url(self.scheme, &self.host, queue)
    }

    /// The topic a `QueueUrl` names.
    fn queue<'u>(&self, url: Option<&'u str>) -> Result<&'u str, SqsError> {
        let url = url.ok_or_else(|| SqsError::missing("QueueUrl"))?;
        self.endpoint.queue_of_url(url)
    }
}

async fn handle(
    state: &SharedState,
    caller: Caller,
    pending: Option<auth::Pending>,
    held: &Held,
    req: Request,
) -> Result<Response, SqsError> {
    let (parts, body) = req.into_parts();
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|t| t.to_str().ok())
        .unwrap_or("");
    let op = Op::from_target(target)?;
    let body = read_body(body, narad_sqs::limits::MAX_REQUEST_BYTES)
        .await
        .map_err(|e| from_api(&e))?;
    // (signed: the signature checked now the body is in, and the caller taken again as the
    // users are now, so a key or grant removed while the body arrived counts)
    let caller = match &pending {
        None => caller,
        Some(p) => match auth::with_body(p, state, &parts, &body) {
            Ok(user) => Caller::User(user),
            Err(e) => {
                count_refused(state, &e);
                return Err(e);
            }
        },
    };
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.len() <= 255 && !h.contains(['/', ' ']))
        .unwrap_or("localhost")
        .to_owned();
    let ctx = Ctx {
        state,
        caller,
        held,
        endpoint: Endpoint {
            account: state.cfg.sqs_account_id.clone(),
            region: state.cfg.sqs_region.clone(),
        },
        scheme: if state.cfg.tls_cert_file.is_empty() {
            "http"
        } else {
            "https"
        },
        host,
    };
    match op {
        Op::CreateQueue => queues::create(&ctx, &body).await,
        Op::GetQueueUrl => queues::get_url(&ctx, &body),
        Op::ListQueues => queues::list(&ctx, &body),
        Op::DeleteQueue => queues::delete(&ctx, &body).await,
        Op::GetQueueAttributes => queues::get_attributes(&ctx, &body).await,
        Op::SetQueueAttributes => queues::set_attributes(&ctx, &body).await,
        Op::ListDeadLetterSourceQueues => queues::dead_letter_sources(&ctx, &body),
        Op::SendMessage => messages::send(&ctx, &body).await,
        Op::SendMessageBatch => messages::send_batch(&ctx, &body).await,
        Op::ReceiveMessage => messages::receive(&ctx, &body).await,
        Op::DeleteMessage => messages::delete(&ctx, &body).await,
        Op::DeleteMessageBatch => messages::delete_batch(&ctx, &body).await,
        Op::ChangeMessageVisibility => messages::change_visibility(&ctx, &body).await,
        Op::ChangeMessageVisibilityBatch => messages::change_visibility_batch(&ctx, &body).await,
        Op::PurgeQueue => queues::purge(&ctx, &body).await,
        Op::TagQueue
        | Op::UntagQueue
        | Op::ListQueueTags
        | Op::StartMessageMoveTask
        | Op::ListMessageMoveTasks
        | Op::CancelMessageMoveTask => Err(SqsError::new(
            Kind::UnsupportedOperation,
            format!("{} is not supported by this endpoint yet", op.name()),
        )),
        Op::AddPermission | Op::RemovePermission => Err(SqsError::new(
            Kind::UnsupportedOperation,
            format!(
                "{} is not supported: access to queues is Narad's users and grants (narad user grant)",
                op.name()
            ),
        )),
    }
}

/// A `200` with `value` as its body.
fn ok(value: &serde_json::Value) -> Response {
    ok_text(value.to_string())
}

/// A `200` with `text` (JSON) as its body.
fn ok_text(text: String) -> Response {
    with_headers(StatusCode::OK, text)
}

fn with_headers(status: StatusCode, text: String) -> Response {
    let mut resp = (status, text).into_response();
    set_headers(resp.headers_mut());
    resp
}

fn set_headers(h: &mut HeaderMap) {
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    let id = request_id();
    h.insert(
        "x-amzn-requestid",
        HeaderValue::from_str(&id).expect("hex and dashes"),
    );
}

/// A request id in the UUID form SDKs log: unique in the process (a random base drawn once,
/// and a count), without a random draw per request.
fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(narad_core::random_u64);
    narad_sqs::queue::message_id(base, 0, COUNT.fetch_add(1, Ordering::Relaxed))
}

fn error_response(e: &SqsError) -> Response {
    let status = StatusCode::from_u16(e.kind.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = with_headers(status, e.body());
    if let Ok(v) = HeaderValue::from_str(&e.query_header()) {
        resp.headers_mut().insert("x-amzn-query-error", v);
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// A native error as SQS says it.
fn from_api(e: &ApiError) -> SqsError {
    let kind = match e.code {
        ErrorCode::TopicNotFound | ErrorCode::TopicReplaced => {
            return narad_sqs::queue::no_such_queue();
        }
        ErrorCode::TopicExists => Kind::QueueNameExists,
        ErrorCode::Forbidden | ErrorCode::Unauthorized => Kind::AccessDenied,
        ErrorCode::InvalidReceiptHandle => Kind::ReceiptHandleIsInvalid,
        ErrorCode::LeaseGone => Kind::MessageNotInflight,
        ErrorCode::LoginThrottled => Kind::RequestThrottled,
        ErrorCode::OutcomeUnknown => {
            return SqsError::new(
                Kind::InternalFailure,
                format!(
                    "outcome unknown: the request may or may not have been applied ({}); retrying may apply it twice",
                    e.message
                ),
            );
        }
        c => match c.http_status() {
            503 => Kind::ServiceUnavailable,
            500..=599 => Kind::InternalFailure,
            _ => Kind::InvalidParameterValue,
        },
    };
    SqsError::new(kind, e.message.clone())
}

impl From<ApiError> for SqsError {
    fn from(e: ApiError) -> Self {
        from_api(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_post_to_the_root_naming_sqs_is_sqs() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-amz-target",
            HeaderValue::from_static("AmazonSQS.SendMessage"),
        );
        assert!(is_sqs(&Method::POST, "/", &h));
        assert!(!is_sqs(&Method::GET, "/", &h));
        assert!(!is_sqs(&Method::POST, "/v1/topics", &h));
        h.insert(
            "x-amz-target",
            HeaderValue::from_static("DynamoDB_20120810.GetItem"),
        );
        assert!(
            is_sqs(&Method::POST, "/", &h),
            "answered: not an SQS operation"
        );
        assert!(!is_sqs(&Method::POST, "/", &HeaderMap::new()));
    }

    #[test]
    fn native_errors_become_awss() {
        let e = from_api(&ApiError::new(ErrorCode::TopicNotFound, "x"));
        assert_eq!(e.kind, Kind::QueueDoesNotExist);
        assert_eq!(
            from_api(&ApiError::new(ErrorCode::ServerBusy, "x")).kind,
            Kind::ServiceUnavailable
        );
        assert_eq!(
            from_api(&ApiError::new(ErrorCode::StorageFailed, "x")).kind,
            Kind::InternalFailure
        );
        assert_eq!(
            from_api(&ApiError::new(ErrorCode::OutcomeUnknown, "x")).kind,
            Kind::InternalFailure
        );
        assert_eq!(
            from_api(&ApiError::new(ErrorCode::MessageTooLarge, "x")).kind,
            Kind::InvalidParameterValue
        );
        assert_eq!(
            from_api(&ApiError::new(ErrorCode::Forbidden, "x")).kind,
            Kind::AccessDenied
        );
    }
}
