//! SQS's limits and defaults (standard queues), as AWS documents them.

/// A message's body and attributes together, at most (and `MaximumMessageSize`'s default).
pub const MAX_MESSAGE_BYTES: u64 = 1_048_576;
/// `MaximumMessageSize`'s smallest value.
pub const MIN_MESSAGE_BYTES: u64 = 1_024;
/// Entries in one batch call.
pub const MAX_BATCH_ENTRIES: usize = 10;
/// A batch's bodies and attributes together, at most.
pub const MAX_BATCH_BYTES: usize = 1_048_576;
/// A batch entry's id: 1 to this many of `[A-Za-z0-9_-]`.
pub const MAX_BATCH_ID_CHARS: usize = 80;
/// `VisibilityTimeout`, seconds: 0 to this (12 hours); 30 by default.
pub const MAX_VISIBILITY_S: i64 = 43_200;
pub const DEFAULT_VISIBILITY_S: i64 = 30;
/// `DelaySeconds`: 0 to this (15 minutes).
pub const MAX_DELAY_S: i64 = 900;
/// `WaitTimeSeconds` and `ReceiveMessageWaitTimeSeconds`: 0 to this.
pub const MAX_WAIT_S: i64 = 20;
/// `MessageRetentionPeriod`, seconds: this range; 4 days by default.
pub const MIN_RETENTION_S: i64 = 60;
pub const MAX_RETENTION_S: i64 = 1_209_600;
pub const DEFAULT_RETENTION_S: i64 = 345_600;
/// `MaxNumberOfMessages`: 1 to this; 1 by default.
pub const MAX_RECEIVE: i64 = 10;
/// Message attributes per message.
pub const MAX_ATTRIBUTES: usize = 10;
/// An attribute's name: 1 to this many of `[A-Za-z0-9_.-]`.
pub const MAX_ATTRIBUTE_NAME: usize = 256;
/// An attribute's data type, at most (`String`, `Number` or `Binary`, and a custom suffix).
pub const MAX_DATA_TYPE: usize = 256;
/// A queue's name: 1 to this many of `[A-Za-z0-9_-]`.
pub const MAX_QUEUE_NAME: usize = 80;
/// `ListQueues`'s `MaxResults`: 1 to this; the most an answer without it lists.
pub const MAX_LIST_RESULTS: i64 = 1_000;
/// Tags per queue, and a tag's key and value, at most.
pub const MAX_TAGS: usize = 50;
pub const MAX_TAG_KEY: usize = 128;
pub const MAX_TAG_VALUE: usize = 256;
/// A request's body, at most: a 1 MiB message escaped as `\uXXXX` by the SDKs (botocore
/// escapes every non-ASCII character) is up to six bytes per byte, but a character of more
/// than one byte escapes to fewer per byte; three times the largest message and room for
/// the rest of the request covers every message SQS accepts.
pub const MAX_REQUEST_BYTES: usize = 3 * 1_048_576 + 64 * 1_024;
/// How far a signed request's time may be from the server's, either way.
pub const MAX_CLOCK_SKEW_S: i64 = 15 * 60;
