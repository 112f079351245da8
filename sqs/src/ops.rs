//! The operations and their requests, as the AWS JSON 1.0 protocol sends them.
//!
//! Requests are read leniently where clients differ (members this endpoint does not know
//! are ignored: kombu sends some of an older API's), and strictly where a value is given:
//! a value of the wrong JSON type is a `SerializationException`, as AWS answers.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::attrs::WireAttribute;
use crate::error::{Kind, SqsError};

/// The path requests are sent to (the endpoint's root; a queue URL is only a name).
pub const PATH: &str = "/";

/// `X-Amz-Target`'s prefix.
pub const TARGET_PREFIX: &str = "AmazonSQS.";

/// The operations, named as in `X-Amz-Target` (after [`TARGET_PREFIX`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    CreateQueue,
    GetQueueUrl,
    ListQueues,
    DeleteQueue,
    GetQueueAttributes,
    SetQueueAttributes,
    PurgeQueue,
    SendMessage,
    SendMessageBatch,
    ReceiveMessage,
    DeleteMessage,
    DeleteMessageBatch,
    ChangeMessageVisibility,
    ChangeMessageVisibilityBatch,
    TagQueue,
    UntagQueue,
    ListQueueTags,
    ListDeadLetterSourceQueues,
    StartMessageMoveTask,
    ListMessageMoveTasks,
    CancelMessageMoveTask,
    AddPermission,
    RemovePermission,
}

impl Op {
    pub const ALL: [Op; 23] = [
        Op::CreateQueue,
        Op::GetQueueUrl,
        Op::ListQueues,
        Op::DeleteQueue,
        Op::GetQueueAttributes,
        Op::SetQueueAttributes,
        Op::PurgeQueue,
        Op::SendMessage,
        Op::SendMessageBatch,
        Op::ReceiveMessage,
        Op::DeleteMessage,
        Op::DeleteMessageBatch,
        Op::ChangeMessageVisibility,
        Op::ChangeMessageVisibilityBatch,
        Op::TagQueue,
        Op::UntagQueue,
        Op::ListQueueTags,
        Op::ListDeadLetterSourceQueues,
        Op::StartMessageMoveTask,
        Op::ListMessageMoveTasks,
        Op::CancelMessageMoveTask,
        Op::AddPermission,
        Op::RemovePermission,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::CreateQueue => "CreateQueue",
            Op::GetQueueUrl => "GetQueueUrl",
            Op::ListQueues => "ListQueues",
            Op::DeleteQueue => "DeleteQueue",
            Op::GetQueueAttributes => "GetQueueAttributes",
            Op::SetQueueAttributes => "SetQueueAttributes",
            Op::PurgeQueue => "PurgeQueue",
            Op::SendMessage => "SendMessage",
            Op::SendMessageBatch => "SendMessageBatch",
            Op::ReceiveMessage => "ReceiveMessage",
            Op::DeleteMessage => "DeleteMessage",
            Op::DeleteMessageBatch => "DeleteMessageBatch",
            Op::ChangeMessageVisibility => "ChangeMessageVisibility",
            Op::ChangeMessageVisibilityBatch => "ChangeMessageVisibilityBatch",
            Op::TagQueue => "TagQueue",
            Op::UntagQueue => "UntagQueue",
            Op::ListQueueTags => "ListQueueTags",
            Op::ListDeadLetterSourceQueues => "ListDeadLetterSourceQueues",
            Op::StartMessageMoveTask => "StartMessageMoveTask",
            Op::ListMessageMoveTasks => "ListMessageMoveTasks",
            Op::CancelMessageMoveTask => "CancelMessageMoveTask",
            Op::AddPermission => "AddPermission",
            Op::RemovePermission => "RemovePermission",
        }
    }

    /// The operation `X-Amz-Target` names.
    pub fn from_target(target: &str) -> Result<Op, SqsError> {
        let name = target.strip_prefix(TARGET_PREFIX).unwrap_or("");
        Op::ALL
            .into_iter()
            .find(|op| op.name() == name)
            .ok_or_else(|| {
                SqsError::new(
                    Kind::UnknownOperation,
                    format!(
                        "the target '{}' is not an operation of this endpoint",
                        target.chars().take(80).collect::<String>()
                    ),
                )
            })
    }
}

/// Parses a request body (`{}` when empty).
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, SqsError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| {
        SqsError::new(
            Kind::Serialization,
            format!("the request body is not a valid request: {e}"),
        )
    })
}

/// A required member, or `MissingParameter` naming it.
pub fn required<T>(v: Option<T>, name: &str) -> Result<T, SqsError> {
    v.ok_or_else(|| SqsError::missing(name))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CreateQueue {
    pub queue_name: Option<String>,
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// (the SQS model names this member `tags`, in lower case, unlike every other)
    #[serde(default, rename = "tags", alias = "Tags")]
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetQueueUrl {
    pub queue_name: Option<String>,
    #[serde(rename = "QueueOwnerAWSAccountId")]
    pub queue_owner_aws_account_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListQueues {
    pub queue_name_prefix: Option<String>,
    pub max_results: Option<i64>,
    pub next_token: Option<String>,
}

/// The requests that name only a queue (`DeleteQueue`, `PurgeQueue`, `ListQueueTags`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct QueueOnly {
    pub queue_url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetQueueAttributes {
    pub queue_url: Option<String>,
    #[serde(default)]
    pub attribute_names: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SetQueueAttributes {
    pub queue_url: Option<String>,
    pub attributes: Option<BTreeMap<String, String>>,
}

/// (the entry's members spelled out, not a flattened [`SendEntry`]: serde reads a flattened
/// struct through a buffered map, a measurable share of a send)
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendMessage {
    pub queue_url: Option<String>,
    pub message_body: Option<String>,
    pub delay_seconds: Option<i64>,
    #[serde(default)]
    pub message_attributes: BTreeMap<String, WireAttribute>,
    #[serde(default)]
    pub message_system_attributes: BTreeMap<String, WireAttribute>,
    pub message_deduplication_id: Option<String>,
    pub message_group_id: Option<String>,
}

impl SendMessage {
    /// The queue and the message.
    pub fn split(self) -> (Option<String>, SendEntry) {
        (
            self.queue_url,
            SendEntry {
                id: None,
                message_body: self.message_body,
                delay_seconds: self.delay_seconds,
                message_attributes: self.message_attributes,
                message_system_attributes: self.message_system_attributes,
                message_deduplication_id: self.message_deduplication_id,
                message_group_id: self.message_group_id,
            },
        )
    }
}

/// One message to send (a `SendMessage`, or one entry of a batch).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendEntry {
    pub id: Option<String>,
    pub message_body: Option<String>,
    pub delay_seconds: Option<i64>,
    #[serde(default)]
    pub message_attributes: BTreeMap<String, WireAttribute>,
    #[serde(default)]
    pub message_system_attributes: BTreeMap<String, WireAttribute>,
    pub message_deduplication_id: Option<String>,
    pub message_group_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendMessageBatch {
    pub queue_url: Option<String>,
    pub entries: Option<Vec<SendEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ReceiveMessage {
    pub queue_url: Option<String>,
    pub max_number_of_messages: Option<i64>,
    pub visibility_timeout: Option<i64>,
    pub wait_time_seconds: Option<i64>,
    /// (deprecated by AWS for [`Self::message_system_attribute_names`]; both are read)
    #[serde(default)]
    pub attribute_names: Vec<String>,
    #[serde(default)]
    pub message_system_attribute_names: Vec<String>,
    #[serde(default)]
    pub message_attribute_names: Vec<String>,
    pub receive_request_attempt_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeleteMessage {
    pub queue_url: Option<String>,
    pub receipt_handle: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ChangeMessageVisibility {
    pub queue_url: Option<String>,
    pub receipt_handle: Option<String>,
    pub visibility_timeout: Option<i64>,
}

/// One entry of `DeleteMessageBatch` or `ChangeMessageVisibilityBatch`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HandleEntry {
    pub id: Option<String>,
    pub receipt_handle: Option<String>,
    pub visibility_timeout: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HandleBatch {
    pub queue_url: Option<String>,
    pub entries: Option<Vec<HandleEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TagQueue {
    pub queue_url: Option<String>,
    pub tags: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct UntagQueue {
    pub queue_url: Option<String>,
    pub tag_keys: Option<Vec<String>>,
}

/// Checks a batch's entry ids: some entries, at most ten, each id well formed and used once.
/// `entry_name` is the entry's shape in AWS's message (`SendMessageBatchRequestEntry`).
pub fn check_batch_ids<'a>(
    ids: impl ExactSizeIterator<Item = Option<&'a str>>,
    entry_name: &str,
) -> Result<(), SqsError> {
    use crate::limits::{MAX_BATCH_ENTRIES, MAX_BATCH_ID_CHARS};
    let n = ids.len();
    if n == 0 {
        return Err(SqsError::new(
            Kind::EmptyBatchRequest,
            format!("There should be at least one {entry_name} in the request."),
        ));
    }
    if n > MAX_BATCH_ENTRIES {
        return Err(SqsError::new(
            Kind::TooManyEntriesInBatchRequest,
            format!(
                "Maximum number of entries per request are {MAX_BATCH_ENTRIES}. You have sent {n}."
            ),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(n);
    for id in ids {
        let Some(id) = id else {
            return Err(SqsError::missing("Id"));
        };
        let ok = !id.is_empty()
            && id.len() <= MAX_BATCH_ID_CHARS
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
        if !ok {
            return Err(SqsError::new(
                Kind::InvalidBatchEntryId,
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long.",
            ));
        }
        if !seen.insert(id) {
            return Err(SqsError::new(
                Kind::BatchEntryIdsNotDistinct,
                format!("Id {id} repeated."),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_is_found_by_its_target() {
        for op in Op::ALL {
            assert_eq!(Op::from_target(&format!("AmazonSQS.{}", op.name())), Ok(op));
        }
        for bad in [
            "",
            "AmazonSQS.",
            "SendMessage",
            "AmazonSQS.sendmessage",
            "Other.SendMessage",
        ] {
            assert_eq!(
                Op::from_target(bad).map_err(|e| e.kind),
                Err(Kind::UnknownOperation),
                "{bad}"
            );
        }
    }

    #[test]
    fn create_queue_tags_are_read_under_the_models_name() {
        let r: CreateQueue = parse(br#"{"QueueName":"q","tags":{"env":"prod"}}"#).unwrap();
        assert_eq!(r.tags.get("env").map(String::as_str), Some("prod"));
        let r: CreateQueue = parse(br#"{"QueueName":"q","Tags":{"env":"prod"}}"#).unwrap();
        assert_eq!(r.tags.len(), 1);
    }

    #[test]
    fn requests_parse_leniently_but_values_are_typed() {
        let r: ReceiveMessage =
            parse(br#"{"QueueUrl":"u","MaxNumberOfMessages":10,"AttributeName":["x"],"Other":1}"#)
                .unwrap();
        assert_eq!(r.max_number_of_messages, Some(10));
        let bad: Result<ReceiveMessage, _> = parse(br#"{"MaxNumberOfMessages":"ten"}"#);
        assert_eq!(bad.map_err(|e| e.kind).err(), Some(Kind::Serialization));
        let empty: ListQueues = parse(b"").unwrap();
        assert!(empty.queue_name_prefix.is_none());
        for garbage in [&b"["[..], b"null", b"1", b"\"x\"", b"{\"QueueUrl\": 1}"] {
            let r: Result<QueueOnly, _> = parse(garbage);
            assert!(r.is_err(), "{:?}", String::from_utf8_lossy(garbage));
        }
    }

    #[test]
    fn batch_ids_are_checked_in_awss_words() {
        let ids = |v: &[&'static str]| v.iter().map(|s| Some(*s)).collect::<Vec<_>>();
        let check = |v: Vec<Option<&str>>| check_batch_ids(v.into_iter(), "Entry");
        assert!(check(ids(&["a", "b-1", "C_2"])).is_ok());
        let e = check(vec![]).unwrap_err();
        assert_eq!(e.kind, Kind::EmptyBatchRequest);
        assert_eq!(
            e.message,
            "There should be at least one Entry in the request."
        );
        let many: Vec<_> = (0..20).map(|_| Some("x")).collect();
        let e = check(many).unwrap_err();
        assert_eq!(e.kind, Kind::TooManyEntriesInBatchRequest);
        assert_eq!(
            e.message,
            "Maximum number of entries per request are 10. You have sent 20."
        );
        let e = check(ids(&["id_1", "id_2", "id_2", "id_1"])).unwrap_err();
        assert_eq!(e.kind, Kind::BatchEntryIdsNotDistinct);
        assert_eq!(e.message, "Id id_2 repeated.");
        assert_eq!(
            check(ids(&["a.b"])).unwrap_err().kind,
            Kind::InvalidBatchEntryId
        );
        let long = "x".repeat(81);
        assert_eq!(
            check(vec![Some(long.as_str())]).unwrap_err().kind,
            Kind::InvalidBatchEntryId
        );
        assert_eq!(check(vec![None]).unwrap_err().kind, Kind::MissingParameter);
    }
}
