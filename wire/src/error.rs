//! The table of error codes: every `code` the HTTP API answers, its number and its status.
//!
//! One macro invocation below is the table; the enum, [`ErrorCode::ALL`], the string codes and
//! the statuses are all generated from it, so they cannot drift apart. `docs/api.md`
//! ("Error codes") lists the same rows and `wire/tests/documented.rs` fails when the two differ.
//!
//! **Numbers are never reused.** A code that is retired keeps its number (and its string)
//! reserved: move its row to [`RETIRED`] with the release that dropped it, and never give the
//! number or the string to another code. Clients may store, log or switch on either.
//!
//! Numbers are grouped by area (1000 request, 1100 authentication, 1200 topics, 1300 produce,
//! 1400 consume and ack, 1500 fan-out, 1600 schemas, 1700 users, 1800 node capacity and
//! lifecycle, 1900 server faults); a new code takes the next free number of its group.
//! (The wire codes of iggy, `core/common/src/error/iggy_error.rs`, work the same way.)

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Codes no longer answered, `(number, code)`: both stay reserved forever. None yet.
pub const RETIRED: &[(u16, &str)] = &[];

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $name:ident = $num:literal, $code:literal, $status:literal; )*) => {
        /// An error the HTTP API answers: `{"error": "<message>", "code": "<as_str()>"}` with
        /// status [`http_status`](Self::http_status).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $( $(#[$doc])* $name = $num, )*
        }

        impl ErrorCode {
            /// Every live code, in table order.
            pub const ALL: &'static [ErrorCode] = &[ $( ErrorCode::$name, )* ];

            /// The string code of the JSON body (`"topic_not_found"`); stable.
            pub const fn as_str(self) -> &'static str {
                match self { $( ErrorCode::$name => $code, )* }
            }

            /// The HTTP status this code is always answered with.
            pub const fn http_status(self) -> u16 {
                match self { $( ErrorCode::$name => $status, )* }
            }

            /// The code with this string, if it is a live one.
            pub fn from_code(s: &str) -> Option<Self> {
                match s { $( $code => Some(ErrorCode::$name), )* _ => None }
            }

            /// The code with this number, if it is a live one.
            pub const fn from_number(n: u16) -> Option<Self> {
                match n { $( $num => Some(ErrorCode::$name), )* _ => None }
            }
        }
    };
}

error_codes! {
    // ── 1000: the request itself ──
    /// The request is malformed in a way no more specific code names (a path segment that
    /// cannot be decoded, a query handle together with a body).
    InvalidRequest = 1001, "invalid_request", 400;
    /// A query parameter the route does not accept.
    UnknownParameter = 1002, "unknown_parameter", 400;
    /// A query parameter given more than once.
    DuplicateParameter = 1003, "duplicate_parameter", 400;
    /// Bad percent-encoding, or a query string that is not UTF-8.
    InvalidQuery = 1004, "invalid_query", 400;
    /// A query parameter with a value of the wrong form or out of range.
    InvalidParameter = 1005, "invalid_parameter", 400;
    /// An empty or malformed JSON body, an unknown field or a wrong type.
    InvalidJson = 1006, "invalid_json", 400;
    /// A JSON field with a value outside its bounds; the message is `<field>: <reason>`.
    InvalidField = 1007, "invalid_field", 400;
    /// The request body could not be read.
    BodyUnreadable = 1008, "body_unreadable", 400;
    /// The request body (or a batch once decompressed) is larger than the route reads.
    BodyTooLarge = 1009, "body_too_large", 413;
    /// The request body did not arrive whole within `body_read_timeout_ms`, or fell behind
    /// `body_min_bytes_per_s` after `body_grace_ms`.
    BodyTimeout = 1010, "body_timeout", 408;
    /// A `Content-Encoding` other than identity, zstd or gzip.
    UnsupportedEncoding = 1011, "unsupported_encoding", 415;
    /// A compressed body that cannot be decompressed.
    InvalidEncoding = 1012, "invalid_encoding", 400;
    /// No route has this path.
    RouteNotFound = 1013, "route_not_found", 404;
    /// The path exists, the method does not.
    MethodNotAllowed = 1014, "method_not_allowed", 405;
    /// A `Transfer-Encoding` other than `chunked` (`gzip, chunked`, say): the body's
    /// transfer coding is not one the server decodes.
    UnsupportedTransferEncoding = 1015, "unsupported_transfer_encoding", 501;

    // ── 1100: authentication and authorisation ──
    /// Credentials missing, malformed or wrong (with `WWW-Authenticate`).
    Unauthorized = 1101, "unauthorized", 401;
    /// The user lacks the grant, ownership or admin right the route needs.
    Forbidden = 1102, "forbidden", 403;
    /// Too many failed logins from this address for this username (with `Retry-After`).
    LoginThrottled = 1103, "login_throttled", 429;

    // ── 1200: topics and partitions ──
    /// The topic does not exist.
    TopicNotFound = 1201, "topic_not_found", 404;
    /// A topic of that name exists.
    TopicExists = 1202, "topic_exists", 409;
    /// A partition at or beyond the topic's `partitions`.
    PartitionOutOfRange = 1203, "partition_out_of_range", 400;
    /// A replay read without `partition`.
    PartitionRequired = 1204, "partition_required", 400;
    /// The node holds `max_topics` topics.
    TooManyTopics = 1205, "too_many_topics", 409;
    /// The change would take the node past `max_partitions`.
    TooManyPartitions = 1206, "too_many_partitions", 409;
    /// The caller owns `max_topics_per_user` topics.
    TooManyOwnedTopics = 1207, "too_many_owned_topics", 409;
    /// The request names (`Narad-Topic-Id`) another incarnation of the topic than the one
    /// of that name now: it was deleted and created again. Nothing was written.
    TopicReplaced = 1208, "topic_replaced", 409;

    // ── 1300: produce ──
    /// A batch with no message, more than `max_batch_messages`, or spanning more partitions
    /// than `max_open_logs`; or an ack batch with no handle or more than 100.
    InvalidBatch = 1301, "invalid_batch", 400;
    /// A message field is malformed (encoding, type, `delay_ms` range); names the message.
    InvalidMessage = 1302, "invalid_message", 400;
    /// An empty payload.
    EmptyMessage = 1303, "empty_message", 400;
    /// A key longer than 4096 bytes.
    InvalidKey = 1304, "invalid_key", 400;
    /// Too many message headers, or a name or value out of bounds.
    InvalidHeaders = 1305, "invalid_headers", 400;
    /// A payload larger than the topic's `max_message_bytes`.
    MessageTooLarge = 1306, "message_too_large", 413;

    // ── 1400: consume, replay and ack ──
    /// A receipt handle that is empty, malformed, forged or too long.
    InvalidReceiptHandle = 1401, "invalid_receipt_handle", 400;
    /// The lease is gone: expired, superseded, settled, or from before a restart.
    LeaseGone = 1402, "lease_gone", 410;
    /// A replay offset older than the oldest retained one (local and archive).
    OffsetTruncated = 1403, "offset_truncated", 410;
    /// Too many out-of-order acks pending on the partition; not applied.
    AckSetFull = 1404, "ack_set_full", 503;
    /// A replay read that needs the archive could not reach it.
    ArchiveUnavailable = 1405, "archive_unavailable", 503;

    // ── 1500: fan-out ──
    /// The fan-out change conflicts with the topics' links (or a produce to a delay child).
    FanoutConflict = 1501, "fanout_conflict", 409;
    /// The child to attach is missing, the parent itself, or has an invalid delay.
    InvalidChild = 1502, "invalid_child", 400;
    /// The topic is not a child of that parent.
    NotAChild = 1503, "not_a_child", 404;

    // ── 1600: JSON Schemas ──
    /// The schema is not a usable, self-contained JSON Schema.
    InvalidSchema = 1601, "invalid_schema", 400;
    /// The schema is over a cost limit.
    SchemaTooComplex = 1602, "schema_too_complex", 400;
    /// The new version is not an additive change, or the topic keeps 100 versions already.
    SchemaIncompatible = 1603, "schema_incompatible", 400;
    /// The topic has no schema version of that number.
    SchemaVersionNotFound = 1604, "schema_version_not_found", 404;
    /// A payload is not JSON or does not match the topic's schema; nothing was written.
    SchemaViolation = 1605, "schema_violation", 400;
    /// Validating the request's payloads would cost more than the budget.
    PayloadTooComplex = 1606, "payload_too_complex", 400;
    /// Every schema worker stayed busy for 2 s.
    SchemaBusy = 1607, "schema_busy", 503;
    /// The topic's stored schema cannot be compiled now.
    SchemaUnavailable = 1608, "schema_unavailable", 503;

    // ── 1700: users ──
    /// Security is off (`--dev`): there are no users.
    SecurityDisabled = 1701, "security_disabled", 409;
    /// A user of that name exists.
    UserExists = 1702, "user_exists", 409;
    /// The user does not exist.
    UserNotFound = 1703, "user_not_found", 404;
    /// The node holds 10,000 users.
    TooManyUsers = 1704, "too_many_users", 409;
    /// Hashing the password failed.
    HashFailed = 1705, "hash_failed", 500;
    /// The user has no access key of that id.
    AccessKeyNotFound = 1706, "access_key_not_found", 404;
    /// The user already holds the most access keys a user may (2): remove one first.
    TooManyAccessKeys = 1707, "too_many_access_keys", 409;

    // ── 1800: node capacity and lifecycle ──
    /// The broker is still recovering its data after start.
    NotReady = 1801, "not_ready", 503;
    /// Graceful shutdown has begun.
    ShuttingDown = 1802, "shutting_down", 503;
    /// The node holds `max_request_bytes_in_flight` bytes of requests already.
    ServerBusy = 1803, "server_busy", 503;
    /// `max_connections` connections are served and none is idle; the connection is closed.
    TooManyConnections = 1804, "too_many_connections", 503;
    /// `max_open_logs` partition logs are open and every one is in use.
    TooManyOpenLogs = 1805, "too_many_open_logs", 503;
    /// The process ran out of file descriptors.
    TooManyOpenFiles = 1806, "too_many_open_files", 503;

    // ── 1900: server faults ──
    /// The partition log is poisoned by a failed write or fsync, or closed; not written.
    StorageUnavailable = 1901, "storage_unavailable", 503;
    /// An I/O error, a failed recovery or a corrupt record.
    StorageFailed = 1902, "storage_failed", 500;
    /// Metadata (topics, users) could not be persisted; the change did not take effect.
    MetadataFailed = 1903, "metadata_failed", 500;
    /// An unexpected failure inside the server.
    InternalError = 1904, "internal_error", 500;
    /// A background task panicked (`/readyz`); the node stays not ready until it is restarted.
    TaskFailed = 1905, "task_failed", 503;

    // ── 2000: cluster ──
    /// The route is not yet served by a node in a cluster (the cluster's data plane is not
    /// built yet): only health, readiness, metrics and `/v1/cluster` are.
    ClusterUnsupported = 2001, "cluster_unsupported", 501;
    /// No metadata leader could take the change (an election, or no quorum); the message says
    /// whether it may still take effect.
    ClusterUnavailable = 2002, "cluster_unavailable", 503;
    /// No member of the cluster has this node id.
    MemberNotFound = 2003, "member_not_found", 404;
    /// The member cannot be removed: it leads, it would leave fewer than 3 voters, or the
    /// node is not in a cluster.
    MemberNotRemovable = 2004, "member_not_removable", 409;
    /// The partition is frozen for the last bytes of a move to another node (a second or
    /// so): retry. A member forwarding a produce retries by itself.
    PartitionMoving = 2005, "partition_moving", 503;
    /// A partition move could not be made or changed: the partition is no longer where the
    /// request saw it, the target is the owner already, or not a member.
    MoveConflict = 2006, "move_conflict", 409;
    /// No move of that partition is in flight.
    MoveNotFound = 2007, "move_not_found", 404;
    /// An ack, extend or nack was sent to the member holding the lease, which did not answer
    /// in time: it may or may not have been applied. (`503` always means not applied.)
    OutcomeUnknown = 2008, "outcome_unknown", 504;

    // ── 2100: remotes (other clusters topics are mirrored to) ──
    /// No remote of that name.
    RemoteNotFound = 2101, "remote_not_found", 404;
    /// A remote of that name (in any case) exists.
    RemoteExists = 2102, "remote_exists", 409;
    /// The remote changed since the version the request names (or read): read it again.
    RemoteChanged = 2103, "remote_changed", 409;
    /// The cluster keeps 64 remotes.
    TooManyRemotes = 2104, "too_many_remotes", 409;
    /// Remotes need security on and a `cluster_secret` of at least 32 bytes (their
    /// passwords are sealed under it); this node has neither or not both.
    RemotesUnavailable = 2105, "remotes_unavailable", 409;
    /// The remote's URL or addresses are refused by the address guard
    /// (`remotes_allowed_ports`, `remotes_allowed_hosts`, `remotes_allow_addresses`).
    DestinationRefused = 2106, "destination_refused", 400;
    /// The remote's stored password does not open with this node's cluster secrets (sealed
    /// under a secret this node does not have): set `cluster_secret_previous`, or give the
    /// password again.
    CredentialUnavailable = 2107, "credential_unavailable", 409;
    /// A remote child uses the remote: detach it first.
    RemoteInUse = 2108, "remote_in_use", 409;
    /// The parent or remote child still has records not shipped to the remote: wait for
    /// its lag to reach 0, or delete with `force=true` (what was abandoned is logged).
    Unshipped = 2109, "unshipped", 409;
    /// The remote child's target is this cluster, or a record's origin names the cluster it
    /// is sent to: a mirroring loop.
    LoopDetected = 2110, "loop_detected", 409;
    /// The remote failed a check at attach or resume (unreachable, security off, the
    /// credential refused or an admin's, the target topic missing or not writable).
    RemoteCheckFailed = 2111, "remote_check_failed", 409;
    /// The topic is a mirror of a topic on another cluster, or a demoted primary: it takes
    /// records only from its link and serves no queue (replay works). Promote it first.
    MirrorReadOnly = 2112, "mirror_read_only", 409;
    /// A link's epoch is older than the topic's: a mirror of the sender was promoted. The
    /// body's `role` is the topic's role now.
    Fenced = 2113, "fenced", 409;
    /// The topic is a mirror of another source, or takes no records from this link (a
    /// primary that never became its mirror).
    NotYourMirror = 2114, "not_your_mirror", 409;
    /// The topic's role forbids the change (a demoted topic is not promoted alone), or it
    /// changed meanwhile: look again.
    RoleConflict = 2115, "role_conflict", 409;
    /// `promote?wait_drained=true` timed out: the source was not demoted, or a record, an
    /// ack or a lease of it is still outstanding. Nothing changed; the body's `report` says
    /// what is missing.
    NotDrained = 2116, "not_drained", 409;
}

impl ErrorCode {
    /// The code's number; never reused (see the module docs).
    pub const fn number(self) -> u16 {
        self as u16
    }

    /// Whether the same request may succeed later unchanged (the status is 503 or 429, which
    /// carry `Retry-After`).
    pub const fn is_retryable(self) -> bool {
        matches!(self.http_status(), 429 | 503)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no live code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCode(pub String);

impl fmt::Display for UnknownCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown error code '{}'", self.0)
    }
}

impl std::error::Error for UnknownCode {}

impl FromStr for ErrorCode {
    type Err = UnknownCode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_code(s).ok_or_else(|| UnknownCode(s.to_owned()))
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Every error body: `{"error": "<human message>", "code": "<code>"}`.
///
/// `code` is kept as a string so that a client reads a body with a code newer than itself;
/// [`ErrorBody::known_code`] gives the typed code when it is one this build knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub code: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            code: code.as_str().to_owned(),
        }
    }

    pub fn known_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_code(&self.code)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn numbers_are_unique_and_not_retired() {
        let mut seen = HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.number()), "number {} used twice", c.number());
            assert!(
                !RETIRED.iter().any(|(n, _)| *n == c.number()),
                "{c} reuses the retired number {}",
                c.number()
            );
            assert_eq!(ErrorCode::from_number(c.number()), Some(*c));
        }
    }

    #[test]
    fn strings_are_unique_snake_case_and_not_retired() {
        let mut seen = HashSet::new();
        for c in ErrorCode::ALL {
            let s = c.as_str();
            assert!(seen.insert(s), "code {s} used twice");
            assert!(
                !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s} is not snake_case"
            );
            assert!(
                !RETIRED.iter().any(|(_, r)| *r == s),
                "{s} reuses a retired code"
            );
        }
    }

    #[test]
    fn strings_round_trip() {
        for c in ErrorCode::ALL {
            assert_eq!(c.as_str().parse::<ErrorCode>(), Ok(*c));
            assert_eq!(c.to_string(), c.as_str());
            let json = serde_json::to_string(c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), *c);
        }
        assert_eq!(
            "no_such_code".parse::<ErrorCode>(),
            Err(UnknownCode("no_such_code".into()))
        );
        assert!(serde_json::from_str::<ErrorCode>("\"no_such_code\"").is_err());
    }

    #[test]
    fn every_status_is_an_error_status() {
        for c in ErrorCode::ALL {
            assert!(
                (400..600).contains(&c.http_status()),
                "{c}: {}",
                c.http_status()
            );
        }
    }

    #[test]
    fn all_lists_every_variant_once() {
        // `ALL` is generated with the enum; this pins its length to the distinct numbers so a
        // hand edit of the macro cannot drop a variant from it.
        let distinct: HashSet<_> = ErrorCode::ALL.iter().collect();
        assert_eq!(distinct.len(), ErrorCode::ALL.len());
        let mut numbers: Vec<u16> = ErrorCode::ALL.iter().map(|c| c.number()).collect();
        let sorted = {
            let mut s = numbers.clone();
            s.sort_unstable();
            s
        };
        assert_eq!(numbers, sorted, "the table is kept in number order");
        numbers.dedup();
        assert_eq!(numbers.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn an_unknown_code_in_a_body_is_read() {
        let b: ErrorBody =
            serde_json::from_str(r#"{"error": "from the future", "code": "new_thing"}"#).unwrap();
        assert_eq!(b.known_code(), None);
        assert_eq!(b.code, "new_thing");
        let b: ErrorBody = serde_json::from_str(r#"{"error": "x", "code": "lease_gone"}"#).unwrap();
        assert_eq!(b.known_code(), Some(ErrorCode::LeaseGone));
        assert_eq!(
            serde_json::to_string(&ErrorBody::new(ErrorCode::NotReady, "not ready")).unwrap(),
            r#"{"error":"not ready","code":"not_ready"}"#
        );
    }
}
