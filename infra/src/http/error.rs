//! The API's errors: one type, [`ApiError`] (a code from the table in `narad-wire` and a
//! message for humans), rendered as `{"error": message, "code": code}` with the status the
//! table gives the code; and the broker's errors mapped onto it, server-side failures
//! logged (rate-limited) with their paths kept from clients.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use narad_core::broker::BrokerError;
use narad_core::log::LogError;
use narad_wire::{ErrorBody, ErrorCode};
use serde::Serialize;

/// An error answer: its code (which decides the status, from the table in `narad-wire`) and a
/// message for humans. Every error the API answers is one of these, rendered as
/// `{"error": message, "code": code}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// `Retry-After` seconds: 1 on every 503 (set by [`ApiError::new`]), the throttle's wait
    /// on `429 login_throttled`.
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retry_after: (code.http_status() == 503).then_some(1),
        }
    }

    /// The status the table gives this error's code.
    pub fn status(&self) -> StatusCode {
        status_of(self.code)
    }
}

/// A code's status as `http`'s type (every status in the table is a valid one).
pub fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.http_status()).expect("the error table holds valid HTTP statuses")
}

impl ApiError {
    /// The error's answer with more fields beside `error` and `code` (`extra` serialises as
    /// a JSON object), same status and headers.
    pub fn response_with<T: Serialize>(self, extra: T) -> Response {
        #[derive(Serialize)]
        struct WithExtra<T> {
            #[serde(flatten)]
            body: ErrorBody,
            #[serde(flatten)]
            extra: T,
        }
        let body = WithExtra {
            body: ErrorBody::new(self.code, self.message.clone()),
            extra,
        };
        let bytes = serde_json::to_vec(&body).expect("error body serialises");
        self.respond(bytes)
    }

    fn respond(self, body: Vec<u8>) -> Response {
        let mut resp = (self.status(), body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&ErrorBody::new(self.code, self.message.clone()))
            .expect("error body serialises");
        self.respond(body)
    }
}

/// The table's code for each broker error. Exhaustive, with no catch-all: a new
/// `BrokerError` variant does not compile until it is given a code.
pub fn broker_error_code(e: &BrokerError) -> ErrorCode {
    match e {
        BrokerError::TopicNotFound(_) => ErrorCode::TopicNotFound,
        BrokerError::TopicExists(_) => ErrorCode::TopicExists,
        BrokerError::InvalidField(_) => ErrorCode::InvalidField,
        BrokerError::InvalidMessage { .. } => ErrorCode::InvalidMessage,
        BrokerError::MessageTooLarge { .. } => ErrorCode::MessageTooLarge,
        BrokerError::PartitionOutOfRange { .. } => ErrorCode::PartitionOutOfRange,
        BrokerError::HandleMalformed(_) => ErrorCode::InvalidReceiptHandle,
        BrokerError::LeaseGone(_) => ErrorCode::LeaseGone,
        BrokerError::OffsetTruncated { .. } => ErrorCode::OffsetTruncated,
        BrokerError::AckSetFull(_) => ErrorCode::AckSetFull,
        BrokerError::ShuttingDown => ErrorCode::ShuttingDown,
        BrokerError::FanoutConflict(_) => ErrorCode::FanoutConflict,
        BrokerError::FanoutInvalid(_) => ErrorCode::InvalidChild,
        BrokerError::FanoutNotChild(_) => ErrorCode::NotAChild,
        BrokerError::SchemaIncompatible(_) => ErrorCode::SchemaIncompatible,
        // A bound the node was configured with: a client's request, not a fault of the
        // server; it passes once topics are deleted (or the bound is raised).
        BrokerError::TooManyTopics { .. } => ErrorCode::TooManyTopics,
        BrokerError::TooManyPartitions { .. } => ErrorCode::TooManyPartitions,
        BrokerError::TooManyOwnedTopics { .. } => ErrorCode::TooManyOwnedTopics,
        BrokerError::TooManyOpenLogs { .. } => ErrorCode::TooManyOpenLogs,
        // (never retryable: the batch is what has to change)
        BrokerError::BatchSpansTooManyLogs { .. } => ErrorCode::InvalidBatch,
        // Out of file descriptors: the node is short of a resource, not broken; it passes
        // once descriptors are given back (idle logs close, clients disconnect, topics are
        // deleted), so 503 + Retry-After.
        e if e.is_out_of_descriptors() => ErrorCode::TooManyOpenFiles,
        BrokerError::Storage(LogError::Poisoned(_) | LogError::Closed) => {
            ErrorCode::StorageUnavailable
        }
        BrokerError::Storage(
            LogError::Io { .. }
            | LogError::Recovery(_)
            | LogError::Truncated { .. }
            | LogError::Corrupt { .. },
        ) => ErrorCode::StorageFailed,
        BrokerError::Meta(_) => ErrorCode::MetadataFailed,
        BrokerError::ClusterUnavailable(_) => ErrorCode::ClusterUnavailable,
        // (routing that was right a moment ago: the partition moved; the caller retries)
        BrokerError::NotOwner { .. } => ErrorCode::PartitionMoving,
        BrokerError::ClusterUnsupported(_) => ErrorCode::ClusterUnsupported,
        BrokerError::PartitionMoving { .. } => ErrorCode::PartitionMoving,
        BrokerError::MoveConflict(_) => ErrorCode::MoveConflict,
        BrokerError::RemoteExists(_) => ErrorCode::RemoteExists,
        BrokerError::RemoteNotFound(_) => ErrorCode::RemoteNotFound,
        BrokerError::RemoteChanged(_) => ErrorCode::RemoteChanged,
        BrokerError::TooManyRemotes { .. } => ErrorCode::TooManyRemotes,
        BrokerError::RemoteInUse(_) => ErrorCode::RemoteInUse,
        BrokerError::Unshipped(_) => ErrorCode::Unshipped,
        BrokerError::MirrorReadOnly(_) => ErrorCode::MirrorReadOnly,
        BrokerError::Fenced(_) => ErrorCode::Fenced,
        BrokerError::RoleConflict(_) => ErrorCode::RoleConflict,
        BrokerError::LoopDetected(_) => ErrorCode::LoopDetected,
    }
}

/// The data directory of the server this process runs, as error messages to clients name it
/// (see [`client_message`]). Set once at start; a second server in the same process (as some
/// tests run) keeps its paths in its messages.
static DATA_DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records the server's data directory for [`client_message`]. Only an absolute path is kept:
/// a relative one is what the operator typed and says nothing about the host.
pub(crate) fn set_data_dir_for_errors(dir: &std::path::Path) {
    if let Some(d) = dir.to_str().filter(|d| d.starts_with('/') && d.len() > 1) {
        let _ = DATA_DIR.set(d.trim_end_matches('/').to_owned());
    }
}

/// A storage error's message as a client sees it: the server's data directory becomes
/// `<data-dir>` (the full path goes to the server's log only). The file and position stay, so
/// an operator told of the error knows where to look.
fn client_message(msg: &str, dir: Option<&str>) -> String {
    match dir {
        Some(d) => msg.replace(&format!("{d}/"), "<data-dir>/"),
        None => msg.to_owned(),
    }
}

/// The server-side failures requests are answered with (storage, metadata, file
/// descriptors): a client can ask again as fast as it likes, so at most 20 lines per 10 s,
/// the rest counted into the next (the answers and `narad_http_requests_total` count every
/// one).
static SERVER_FAILURES_LOGGED: narad_core::loggate::LogGate =
    narad_core::loggate::LogGate::new(20, Duration::from_secs(10));

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        let code = broker_error_code(&e);
        let full = e.to_string();
        let what = match code {
            ErrorCode::TooManyOpenFiles => "out of file descriptors",
            ErrorCode::StorageUnavailable | ErrorCode::StorageFailed => "storage failure",
            ErrorCode::MetadataFailed => "metadata failure",
            // a client's own mistake or a state it can act on: the message is all it needs
            _ => return Self::new(code, full),
        };
        if let Some(suppressed) = SERVER_FAILURES_LOGGED.admit() {
            tracing::error!(error = %full, suppressed, "{what}");
        }
        // (the log line has the whole path; the client gets it under <data-dir>)
        let msg = client_message(&full, DATA_DIR.get().map(String::as_str));
        if code == ErrorCode::TooManyOpenFiles {
            // the answer names the cause: the message alone reads like any I/O error
            let msg = format!(
                "the server has run out of file descriptors (its open-files limit, RLIMIT_NOFILE, is reached): {msg}; retry shortly"
            );
            return Self::new(code, msg);
        }
        Self::new(code, msg)
    }
}

pub type ApiResult = Result<Response, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storage_error_names_the_file_under_the_data_dir_not_the_host_path() {
        let msg = "corrupt record in /srv/narad/data/topics/t/p00000/00000000000000000126.log: corrupt frame at byte 40".to_owned();
        assert_eq!(
            client_message(&msg, Some("/srv/narad/data")),
            "corrupt record in <data-dir>/topics/t/p00000/00000000000000000126.log: corrupt frame at byte 40"
        );
        // a directory that only starts the same way is not the data directory
        assert_eq!(client_message(&msg, Some("/srv/narad/da")), msg);
        assert_eq!(client_message(&msg, None), msg);
    }
}
