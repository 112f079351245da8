//! The SQS protocol for Narad, without I/O: what the SQS-compatible endpoint reads and
//! answers, so that boto3, the AWS CLI and the AWS SDKs work against a Narad broker
//! unchanged. The endpoint itself (routing, the broker calls) is in `narad-infra`.
//!
//! - [`ops`]: the operations (`X-Amz-Target`) and their requests (AWS JSON 1.0).
//! - [`error`]: AWS-shaped errors: the body's `__type` and the `x-amzn-query-error` header.
//! - [`attrs`]: message attributes, checked, and kept as the record's headers.
//! - [`md5`]: the body and attribute digests the SDKs check.
//! - [`queue`]: queue names, URLs, ARNs, message ids and settable queue attributes.
//! - [`sigv4`]: AWS Signature Version 4: a request's signature checked (and made, for clients).
//! - [`limits`]: SQS's limits and defaults.

pub mod attrs;
pub mod error;
pub mod limits;
pub mod md5;
pub mod ops;
pub mod queue;
pub mod sigv4;

pub use error::{Kind, SqsError};
