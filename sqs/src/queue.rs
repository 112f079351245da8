//! Queues: names, URLs and ARNs, message ids, and the queue attributes a client may set.

use std::collections::BTreeMap;

use crate::error::{Kind, SqsError};
use crate::limits::*;

/// Where this endpoint's queues live: the account id and region their URLs and ARNs name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub account: String,
    pub region: String,
}

impl Endpoint {
    /// The queue's URL, on the host the request was sent to.
    pub fn url(&self, scheme: &str, host: &str, name: &str) -> String {
        format!("{scheme}://{host}/{}/{name}", self.account)
    }

    pub fn arn(&self, name: &str) -> String {
        format!("arn:aws:sqs:{}:{}:{name}", self.region, self.account)
    }

    /// The queue a queue URL names. Only its path counts (`/<account>/<name>`): clients
    /// keep URLs from other hosts, and AWS answers any host's URL with the queue it names.
    /// Another account's, or a URL that is not a queue's, is `QueueDoesNotExist`.
    pub fn queue_of_url<'a>(&self, url: &'a str) -> Result<&'a str, SqsError> {
        let path = match url.split_once("://") {
            Some((_, rest)) => rest.find('/').map_or("", |i| &rest[i..]),
            None => url,
        };
        let path = path.split(['?', '#']).next().unwrap_or("");
        let mut parts = path.trim_start_matches('/').split('/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(account), Some(name), None) if account == self.account && !name.is_empty() => {
                Ok(name)
            }
            _ => Err(no_such_queue()),
        }
    }

    /// The queue an ARN of this endpoint names.
    pub fn queue_of_arn<'a>(&self, arn: &'a str) -> Option<&'a str> {
        let rest = arn.strip_prefix("arn:aws:sqs:")?;
        let (region, rest) = rest.split_once(':')?;
        let (account, name) = rest.split_once(':')?;
        (region == self.region && account == self.account && !name.is_empty()).then_some(name)
    }
}

pub fn no_such_queue() -> SqsError {
    SqsError::new(
        Kind::QueueDoesNotExist,
        "The specified queue does not exist.",
    )
}

/// Checks a name given to `CreateQueue`: SQS's names (1 to 80 of `[A-Za-z0-9_-]`). A FIFO
/// queue's (`.fifo`) is refused as not supported yet.
pub fn check_new_name(name: &str) -> Result<(), SqsError> {
    if name.ends_with(".fifo") {
        return Err(fifo_unsupported());
    }
    let ok = !name.is_empty()
        && name.len() <= MAX_QUEUE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SqsError::new(
            Kind::InvalidParameterValue,
            format!(
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to {MAX_QUEUE_NAME} in length"
            ),
        ))
    }
}

pub fn fifo_unsupported() -> SqsError {
    SqsError::new(
        Kind::UnsupportedOperation,
        "FIFO queues are not supported by this endpoint yet: use a standard queue (at-least-once, ordered per partition)",
    )
}

/// A message's `MessageId`: the same on every delivery and in a replay, made from where the
/// record is (its topic's incarnation, partition and offset), so nothing is stored for it.
/// Formatted as a UUID: the topic id's 64 bits, then the partition's 8 and the offset's 56.
pub fn message_id(topic_id: u64, partition: u32, offset: u64) -> String {
    let low = (u64::from(partition as u8) << 56) | (offset & ((1 << 56) - 1));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        topic_id >> 32,
        (topic_id >> 16) & 0xffff,
        topic_id & 0xffff,
        low >> 48,
        low & 0xffff_ffff_ffff
    )
}

/// The queue attributes a client may set, checked (seconds and bytes as SQS counts them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSettings {
    pub visibility_timeout_s: Option<i64>,
    pub delay_s: Option<i64>,
    pub retention_s: Option<i64>,
    pub max_message_bytes: Option<i64>,
    pub receive_wait_s: Option<i64>,
}

/// Attributes only FIFO queues have.
const FIFO_ONLY: [&str; 4] = [
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
];

/// Reads the attributes of `CreateQueue` or `SetQueueAttributes`.
pub fn parse_settings(attrs: &BTreeMap<String, String>) -> Result<QueueSettings, SqsError> {
    let mut s = QueueSettings::default();
    for (name, value) in attrs {
        let int = |lo: i64, hi: i64| -> Result<i64, SqsError> {
            value
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|v| (lo..=hi).contains(v))
                .ok_or_else(|| {
                    SqsError::new(
                        Kind::InvalidAttributeValue,
                        format!("Invalid value for the parameter {name}."),
                    )
                })
        };
        match name.as_str() {
            "VisibilityTimeout" => s.visibility_timeout_s = Some(int(0, MAX_VISIBILITY_S)?),
            "DelaySeconds" => s.delay_s = Some(int(0, MAX_DELAY_S)?),
            "MessageRetentionPeriod" => {
                s.retention_s = Some(int(MIN_RETENTION_S, MAX_RETENTION_S)?);
            }
            "MaximumMessageSize" => {
                s.max_message_bytes =
                    Some(int(MIN_MESSAGE_BYTES as i64, MAX_MESSAGE_BYTES as i64)?);
            }
            "ReceiveMessageWaitTimeSeconds" => s.receive_wait_s = Some(int(0, MAX_WAIT_S)?),
            "FifoQueue" if value.eq_ignore_ascii_case("false") => {}
            n if FIFO_ONLY.contains(&n) => return Err(fifo_unsupported()),
            "RedrivePolicy" | "RedriveAllowPolicy" => {
                return Err(SqsError::new(
                    Kind::InvalidAttributeName,
                    format!("{name}: dead-letter queues are not supported by this endpoint yet."),
                ));
            }
            "Policy"
            | "KmsMasterKeyId"
            | "KmsDataKeyReusePeriodSeconds"
            | "SqsManagedSseEnabled" => {
                return Err(SqsError::new(
                    Kind::InvalidAttributeName,
                    format!(
                        "{name} is not supported: access is Narad's users and grants, and data at rest is the broker's disk and bucket"
                    ),
                ));
            }
            _ => {
                return Err(SqsError::new(
                    Kind::InvalidAttributeName,
                    format!("Unknown Attribute {name}."),
                ));
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep() -> Endpoint {
        Endpoint {
            account: "000000000000".into(),
            region: "us-east-1".into(),
        }
    }

    #[test]
    fn a_queue_is_named_by_its_urls_path_on_any_host() {
        let ep = ep();
        let url = ep.url("http", "127.0.0.1:9000", "jobs");
        assert_eq!(url, "http://127.0.0.1:9000/000000000000/jobs");
        assert_eq!(ep.queue_of_url(&url), Ok("jobs"));
        assert_eq!(
            ep.queue_of_url("https://sqs.us-east-1.amazonaws.com/000000000000/jobs"),
            Ok("jobs")
        );
        assert_eq!(ep.queue_of_url("/000000000000/jobs"), Ok("jobs"));
        for bad in [
            "http://h/111111111111/jobs",
            "http://h/000000000000/",
            "http://h/000000000000/a/b",
            "http://h",
            "",
            "jobs",
        ] {
            assert_eq!(
                ep.queue_of_url(bad).map_err(|e| e.kind),
                Err(Kind::QueueDoesNotExist),
                "{bad}"
            );
        }
        assert_eq!(ep.queue_of_arn(&ep.arn("dlq")), Some("dlq"));
        assert_eq!(
            ep.queue_of_arn("arn:aws:sqs:eu-west-1:000000000000:dlq"),
            None
        );
    }

    #[test]
    fn names_are_sqss_and_fifo_is_refused_clearly() {
        assert!(check_new_name("jobs_1-a").is_ok());
        assert_eq!(
            check_new_name("jobs.fifo").unwrap_err().kind,
            Kind::UnsupportedOperation
        );
        for bad in ["", "a.b", "a b", &"x".repeat(81)] {
            assert_eq!(
                check_new_name(bad).unwrap_err().kind,
                Kind::InvalidParameterValue
            );
        }
    }

    #[test]
    fn message_ids_differ_for_every_record_and_look_like_uuids() {
        let a = message_id(0x0123_4567_89ab_cdef, 2, 7);
        assert_eq!(a, "01234567-89ab-cdef-0200-000000000007");
        assert_ne!(a, message_id(0x0123_4567_89ab_cdef, 1, 7));
        assert_ne!(a, message_id(0x0123_4567_89ab_cdef, 2, 8));
        assert_ne!(a, message_id(0x0123_4567_89ab_cdee, 2, 7));
        assert_eq!(message_id(u64::MAX, 255, (1 << 56) - 1).len(), 36);
    }

    #[test]
    fn settings_are_checked_against_sqss_ranges() {
        let attrs = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>()
        };
        let s = parse_settings(&attrs(&[
            ("VisibilityTimeout", "0"),
            ("DelaySeconds", "900"),
            ("MessageRetentionPeriod", "60"),
            ("MaximumMessageSize", "1024"),
            ("ReceiveMessageWaitTimeSeconds", "20"),
            ("FifoQueue", "false"),
        ]))
        .unwrap();
        assert_eq!(s.visibility_timeout_s, Some(0));
        assert_eq!(s.receive_wait_s, Some(20));
        for (k, v, kind) in [
            ("VisibilityTimeout", "43201", Kind::InvalidAttributeValue),
            ("DelaySeconds", "-1", Kind::InvalidAttributeValue),
            ("MessageRetentionPeriod", "59", Kind::InvalidAttributeValue),
            ("MaximumMessageSize", "1048577", Kind::InvalidAttributeValue),
            (
                "ReceiveMessageWaitTimeSeconds",
                "x",
                Kind::InvalidAttributeValue,
            ),
            ("FifoQueue", "true", Kind::UnsupportedOperation),
            ("Nope", "1", Kind::InvalidAttributeName),
        ] {
            assert_eq!(
                parse_settings(&attrs(&[(k, v)])).unwrap_err().kind,
                kind,
                "{k}={v}"
            );
        }
    }
}
