//! SQS's errors as the AWS JSON 1.0 protocol carries them.
//!
//! An error is a 4xx (or 5xx) with the body `{"__type": "<namespace>#<shape>", "message":
//! "..."}` and the header `x-amzn-query-error: <query code>;Sender` (`;Receiver` for a 5xx).
//! botocore takes the error's code from the header and its exception class from the shape;
//! aws-sdk-rust matches on the header alone, so every error carries both.

use serde::Serialize;

/// The errors this endpoint answers, each with AWS's shape, query code and status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    QueueDoesNotExist,
    QueueNameExists,
    ReceiptHandleIsInvalid,
    InvalidParameterValue,
    MissingParameter,
    InvalidAttributeName,
    InvalidAttributeValue,
    InvalidMessageContents,
    MessageNotInflight,
    EmptyBatchRequest,
    TooManyEntriesInBatchRequest,
    BatchEntryIdsNotDistinct,
    InvalidBatchEntryId,
    BatchRequestTooLong,
    PurgeQueueInProgress,
    OverLimit,
    UnsupportedOperation,
    IncompleteSignature,
    InvalidClientTokenId,
    MissingAuthenticationToken,
    SignatureDoesNotMatch,
    RequestExpired,
    AccessDenied,
    UnknownOperation,
    Serialization,
    RequestThrottled,
    ServiceUnavailable,
    InternalFailure,
}

const SQS: &str = "com.amazonaws.sqs#";
const CORAL: &str = "com.amazon.coral.service#";

impl Kind {
    /// The `__type` of the body: namespace and shape.
    pub fn type_name(self) -> String {
        let (ns, shape) = match self {
            Self::QueueDoesNotExist => (SQS, "QueueDoesNotExist"),
            Self::QueueNameExists => (SQS, "QueueNameExists"),
            Self::ReceiptHandleIsInvalid => (SQS, "ReceiptHandleIsInvalid"),
            Self::InvalidParameterValue => (CORAL, "InvalidParameterValueException"),
            Self::MissingParameter => (CORAL, "MissingRequiredParameterException"),
            Self::InvalidAttributeName => (SQS, "InvalidAttributeName"),
            Self::InvalidAttributeValue => (SQS, "InvalidAttributeValue"),
            Self::InvalidMessageContents => (SQS, "InvalidMessageContents"),
            Self::MessageNotInflight => (SQS, "MessageNotInflight"),
            Self::EmptyBatchRequest => (SQS, "EmptyBatchRequest"),
            Self::TooManyEntriesInBatchRequest => (SQS, "TooManyEntriesInBatchRequest"),
            Self::BatchEntryIdsNotDistinct => (SQS, "BatchEntryIdsNotDistinct"),
            Self::InvalidBatchEntryId => (SQS, "InvalidBatchEntryId"),
            Self::BatchRequestTooLong => (SQS, "BatchRequestTooLong"),
            Self::PurgeQueueInProgress => (SQS, "PurgeQueueInProgress"),
            Self::OverLimit => (SQS, "OverLimit"),
            Self::UnsupportedOperation => (SQS, "UnsupportedOperation"),
            Self::IncompleteSignature => (CORAL, "IncompleteSignatureException"),
            Self::InvalidClientTokenId => (CORAL, "UnrecognizedClientException"),
            Self::MissingAuthenticationToken => (CORAL, "MissingAuthenticationTokenException"),
            Self::SignatureDoesNotMatch => (CORAL, "InvalidSignatureException"),
            Self::RequestExpired => (CORAL, "RequestExpired"),
            Self::AccessDenied => (CORAL, "AccessDeniedException"),
            Self::UnknownOperation => (CORAL, "UnknownOperationException"),
            Self::Serialization => (CORAL, "SerializationException"),
            Self::RequestThrottled => (SQS, "RequestThrottled"),
            Self::ServiceUnavailable => (CORAL, "ServiceUnavailableException"),
            Self::InternalFailure => (CORAL, "InternalFailure"),
        };
        format!("{ns}{shape}")
    }

    /// The query-protocol code (the `x-amzn-query-error` header): what SDKs report as the
    /// error's code.
    pub fn query_code(self) -> &'static str {
        match self {
            Self::QueueDoesNotExist => "AWS.SimpleQueueService.NonExistentQueue",
            Self::QueueNameExists => "QueueAlreadyExists",
            Self::ReceiptHandleIsInvalid => "ReceiptHandleIsInvalid",
            Self::InvalidParameterValue => "InvalidParameterValue",
            Self::MissingParameter => "MissingParameter",
            Self::InvalidAttributeName => "InvalidAttributeName",
            Self::InvalidAttributeValue => "InvalidAttributeValue",
            Self::InvalidMessageContents => "InvalidMessageContents",
            Self::MessageNotInflight => "AWS.SimpleQueueService.MessageNotInflight",
            Self::EmptyBatchRequest => "AWS.SimpleQueueService.EmptyBatchRequest",
            Self::TooManyEntriesInBatchRequest => {
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
            }
            Self::BatchEntryIdsNotDistinct => "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            Self::InvalidBatchEntryId => "AWS.SimpleQueueService.InvalidBatchEntryId",
            Self::BatchRequestTooLong => "AWS.SimpleQueueService.BatchRequestTooLong",
            Self::PurgeQueueInProgress => "AWS.SimpleQueueService.PurgeQueueInProgress",
            Self::OverLimit => "OverLimit",
            Self::UnsupportedOperation => "AWS.SimpleQueueService.UnsupportedOperation",
            Self::IncompleteSignature => "IncompleteSignature",
            Self::InvalidClientTokenId => "InvalidClientTokenId",
            Self::MissingAuthenticationToken => "MissingAuthenticationToken",
            Self::SignatureDoesNotMatch => "SignatureDoesNotMatch",
            Self::RequestExpired => "RequestExpired",
            Self::AccessDenied => "AccessDenied",
            Self::UnknownOperation => "UnknownOperationException",
            Self::Serialization => "SerializationException",
            Self::RequestThrottled => "RequestThrottled",
            Self::ServiceUnavailable => "ServiceUnavailable",
            Self::InternalFailure => "InternalFailure",
        }
    }

    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Self::PurgeQueueInProgress
            | Self::OverLimit
            | Self::InvalidClientTokenId
            | Self::MissingAuthenticationToken
            | Self::SignatureDoesNotMatch
            | Self::AccessDenied
            | Self::RequestThrottled => 403,
            Self::ServiceUnavailable => 503,
            Self::InternalFailure => 500,
            _ => 400,
        }
    }
}

/// An error to answer: its kind and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsError {
    pub kind: Kind,
    pub message: String,
}

impl SqsError {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The answer's body.
    pub fn body(&self) -> String {
        #[derive(Serialize)]
        struct Body<'a> {
            #[serde(rename = "__type")]
            type_name: String,
            message: &'a str,
        }
        serde_json::to_string(&Body {
            type_name: self.kind.type_name(),
            message: &self.message,
        })
        .expect("an error serialises")
    }

    /// The `x-amzn-query-error` header's value.
    pub fn query_header(&self) -> String {
        let fault = if self.kind.status() >= 500 {
            "Receiver"
        } else {
            "Sender"
        };
        format!("{};{fault}", self.kind.query_code())
    }

    /// Whether the sender is at fault (a batch entry's `SenderFault`).
    pub fn sender_fault(&self) -> bool {
        self.kind.status() < 500
    }

    /// `InvalidParameterValue` for parameter `name` with value `value`, in AWS's words.
    pub fn invalid_value(name: &str, value: impl std::fmt::Display, reason: &str) -> Self {
        Self::new(
            Kind::InvalidParameterValue,
            format!("Value {value} for parameter {name} is invalid. Reason: {reason}"),
        )
    }

    pub fn missing(name: &str) -> Self {
        Self::new(
            Kind::MissingParameter,
            format!("The request must contain the parameter {name}."),
        )
    }
}

impl std::fmt::Display for SqsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.query_code(), self.message)
    }
}

impl std::error::Error for SqsError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_carries_its_shape_and_its_query_code() {
        let e = SqsError::new(
            Kind::QueueDoesNotExist,
            "The specified queue does not exist.",
        );
        let body: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(body["__type"], "com.amazonaws.sqs#QueueDoesNotExist");
        assert_eq!(body["message"], "The specified queue does not exist.");
        assert_eq!(
            e.query_header(),
            "AWS.SimpleQueueService.NonExistentQueue;Sender"
        );
        assert_eq!(e.kind.status(), 400);
        let busy = SqsError::new(Kind::ServiceUnavailable, "busy");
        assert_eq!(busy.query_header(), "ServiceUnavailable;Receiver");
        assert!(!busy.sender_fault());
        assert_eq!(Kind::PurgeQueueInProgress.status(), 403);
    }

    #[test]
    fn a_message_with_quotes_stays_json() {
        let e = SqsError::new(Kind::InvalidParameterValue, "bad \"x\"\n");
        let body: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(body["message"], "bad \"x\"\n");
    }
}
