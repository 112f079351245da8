//! Topic configuration: fields, defaults, bounds, and what may change after creation.

use serde::{Deserialize, Serialize};

pub const MAX_PARTITIONS: u32 = 256;
pub const MAX_NAME_LEN: usize = 200;
/// Longest per-message delay, as in SQS.
pub const MAX_DELAY_MS: i64 = 15 * 60 * 1000;
/// Longest visibility timeout, as in SQS.
pub const MAX_VISIBILITY_MS: i64 = 12 * 60 * 60 * 1000;
pub const MIN_VISIBILITY_MS: i64 = 100;
/// Shortest non-zero retention.
pub const MIN_RETENTION_MS: i64 = 1000;
/// Hard ceiling for `max_message_bytes` (the HTTP layer's body limit follows it).
pub const MAX_MESSAGE_BYTES_LIMIT: u64 = 8 * 1024 * 1024;
pub const MAX_IN_FLIGHT_LIMIT: u32 = 1_000_000;

/// A topic's settings. Serialised as-is in the topic metadata and the HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicConfig {
    pub partitions: u32,
    pub visibility_timeout_ms: i64,
    /// Age after which whole sealed segments are deleted; 0 keeps data forever.
    pub retention_ms: i64,
    /// Per-partition size above which the oldest sealed segments are deleted; 0 = no limit.
    pub retention_bytes: u64,
    pub max_in_flight_per_partition: u32,
    /// Default delay applied to messages produced without their own `delay_ms`.
    pub delay_ms: i64,
    pub max_message_bytes: u64,
    /// Where a keyed message goes while its partition's owner is down (in a cluster).
    #[serde(default)]
    pub key_policy: KeyPolicy,
}

/// What a cluster member does with a keyed message whose partition's owner cannot be
/// reached. A single node owns every partition, so there it changes nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyPolicy {
    /// Availability over stickiness: the message goes to the next partition whose owner
    /// answers (its key's order with the messages before it is not kept meanwhile).
    #[default]
    Prefer,
    /// Stickiness over availability: the message is not moved; the produce answers
    /// `503 cluster_unavailable` with `Retry-After` until the owner is back.
    Strict,
}

impl Default for TopicConfig {
    fn default() -> Self {
        Self {
            partitions: 3,
            visibility_timeout_ms: 30_000,
            retention_ms: 7 * 24 * 60 * 60 * 1000,
            retention_bytes: 0,
            max_in_flight_per_partition: 1024,
            delay_ms: 0,
            max_message_bytes: 1024 * 1024,
            key_policy: KeyPolicy::Prefer,
        }
    }
}

/// A field that failed validation and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: &'static str,
    pub reason: String,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> InvalidField {
    InvalidField {
        field,
        reason: reason.into(),
    }
}

/// Whether `s` holds only the characters of topic names (and usernames, grant patterns):
/// `A-Z a-z 0-9 . _ -`.
pub fn is_name_chars(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

pub fn validate_name(name: &str) -> Result<(), InvalidField> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(invalid(
            "name",
            format!("must be 1 to {MAX_NAME_LEN} characters"),
        ));
    }
    if name == "." || name == ".." {
        return Err(invalid("name", "must not be '.' or '..'"));
    }
    if !is_name_chars(name) {
        return Err(invalid("name", "may contain only A-Z a-z 0-9 . _ -"));
    }
    Ok(())
}

impl TopicConfig {
    pub fn validate(&self) -> Result<(), InvalidField> {
        if !(1..=MAX_PARTITIONS).contains(&self.partitions) {
            return Err(invalid(
                "partitions",
                format!("must be between 1 and {MAX_PARTITIONS}"),
            ));
        }
        if !(MIN_VISIBILITY_MS..=MAX_VISIBILITY_MS).contains(&self.visibility_timeout_ms) {
            return Err(invalid(
                "visibility_timeout_ms",
                format!("must be between {MIN_VISIBILITY_MS} and {MAX_VISIBILITY_MS}"),
            ));
        }
        if self.retention_ms != 0 && self.retention_ms < MIN_RETENTION_MS {
            return Err(invalid(
                "retention_ms",
                format!("must be 0 (keep forever) or at least {MIN_RETENTION_MS}"),
            ));
        }
        if !(1..=MAX_IN_FLIGHT_LIMIT).contains(&self.max_in_flight_per_partition) {
            return Err(invalid(
                "max_in_flight_per_partition",
                format!("must be between 1 and {MAX_IN_FLIGHT_LIMIT}"),
            ));
        }
        if !(0..=MAX_DELAY_MS).contains(&self.delay_ms) {
            return Err(invalid(
                "delay_ms",
                format!("must be between 0 and {MAX_DELAY_MS} (15 minutes)"),
            ));
        }
        if !(1..=MAX_MESSAGE_BYTES_LIMIT).contains(&self.max_message_bytes) {
            return Err(invalid(
                "max_message_bytes",
                format!("must be between 1 and {MAX_MESSAGE_BYTES_LIMIT}"),
            ));
        }
        Ok(())
    }

    /// Applies a change; the partition count may only grow.
    pub fn patched(&self, patch: &TopicPatch) -> Result<Self, InvalidField> {
        if let Some(p) = patch.partitions
            && p < self.partitions
        {
            return Err(invalid(
                "partitions",
                format!("can only grow (currently {})", self.partitions),
            ));
        }
        let next = patch.apply_to(self.clone());
        next.validate()?;
        Ok(next)
    }
}

/// A topic to create: its name and the settings that differ from the server's defaults.
#[derive(Debug, Clone, Default)]
pub struct CreateTopic {
    pub name: String,
    pub settings: TopicPatch,
    /// The creating user (name and id), when security is on.
    pub owner: Option<(String, u64)>,
    /// A JSON Schema (already checked by the caller) that becomes version 1.
    pub schema: Option<serde_json::Value>,
    /// Count the topic against its owner's `max_topics_per_user` (false for admins, whose
    /// creates only the node-wide bounds limit).
    pub count_against_owner: bool,
}

impl CreateTopic {
    pub fn resolve(&self, defaults: &TopicConfig) -> Result<TopicConfig, InvalidField> {
        validate_name(&self.name)?;
        let cfg = self.settings.apply_to(defaults.clone());
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Topic settings, each optional: the body of a change, and of a create beside its `name`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicPatch {
    pub partitions: Option<u32>,
    pub visibility_timeout_ms: Option<i64>,
    pub retention_ms: Option<i64>,
    pub retention_bytes: Option<u64>,
    pub max_in_flight_per_partition: Option<u32>,
    pub delay_ms: Option<i64>,
    pub max_message_bytes: Option<u64>,
    pub key_policy: Option<KeyPolicy>,
}

impl TopicPatch {
    /// `base` with every given field replaced (not validated).
    fn apply_to(&self, mut base: TopicConfig) -> TopicConfig {
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { base.$f = v; } )* };
        }
        set!(
            partitions,
            visibility_timeout_ms,
            retention_ms,
            retention_bytes,
            max_in_flight_per_partition,
            delay_ms,
            max_message_bytes,
            key_policy
        );
        base
    }

    pub fn is_empty(&self) -> bool {
        self.partitions.is_none()
            && self.visibility_timeout_ms.is_none()
            && self.retention_ms.is_none()
            && self.retention_bytes.is_none()
            && self.max_in_flight_per_partition.is_none()
            && self.delay_ms.is_none()
            && self.max_message_bytes.is_none()
            && self.key_policy.is_none()
    }
}

/// Stable key → partition mapping: FNV-1a 32-bit of the key bytes, modulo the partition count
/// (FNV-1a is also what the Go original uses, so keys group the same way).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in key {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "orders.eu-1_x", &"x".repeat(200)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "é", &"x".repeat(201)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_validate_and_bounds_hold() {
        let d = TopicConfig::default();
        d.validate().unwrap();
        let c = |f: fn(&mut TopicPatch)| {
            let mut c = CreateTopic {
                name: "t".into(),
                ..Default::default()
            };
            f(&mut c.settings);
            c.resolve(&d)
        };
        assert!(c(|c| c.partitions = Some(0)).is_err());
        assert!(c(|c| c.partitions = Some(257)).is_err());
        assert!(c(|c| c.partitions = Some(256)).is_ok());
        assert!(c(|c| c.delay_ms = Some(MAX_DELAY_MS + 1)).is_err());
        assert!(c(|c| c.retention_ms = Some(0)).is_ok());
        assert!(c(|c| c.retention_ms = Some(5)).is_err());
        assert!(c(|c| c.visibility_timeout_ms = Some(0)).is_err());
        assert_eq!(
            c(|c| c.max_in_flight_per_partition = Some(0))
                .unwrap_err()
                .field,
            "max_in_flight_per_partition"
        );
    }

    /// Settings kept before `key_policy` existed read as `prefer`; it is written by name,
    /// set by a change, and an unknown policy is refused.
    #[test]
    fn key_policy_defaults_to_prefer_and_is_set_by_name() {
        let old = r#"{"partitions":3,"visibility_timeout_ms":30000,"retention_ms":0,
            "retention_bytes":0,"max_in_flight_per_partition":1,"delay_ms":0,
            "max_message_bytes":1}"#;
        let c: TopicConfig = serde_json::from_str(old).unwrap();
        assert_eq!(c.key_policy, KeyPolicy::Prefer);
        let patch: TopicPatch = serde_json::from_str(r#"{"key_policy":"strict"}"#).unwrap();
        assert!(!patch.is_empty());
        let strict = c.patched(&patch).unwrap();
        assert_eq!(strict.key_policy, KeyPolicy::Strict);
        let json = serde_json::to_value(&strict).unwrap();
        assert_eq!(json["key_policy"], "strict");
        assert_eq!(serde_json::from_value::<TopicConfig>(json).unwrap(), strict);
        assert!(serde_json::from_str::<TopicPatch>(r#"{"key_policy":"sticky"}"#).is_err());
    }

    #[test]
    fn partitions_only_grow() {
        let d = TopicConfig::default();
        let grow = TopicPatch {
            partitions: Some(5),
            ..Default::default()
        };
        assert_eq!(d.patched(&grow).unwrap().partitions, 5);
        let shrink = TopicPatch {
            partitions: Some(2),
            ..Default::default()
        };
        assert!(d.patched(&shrink).is_err());
    }

    #[test]
    fn key_hash_is_stable() {
        // FNV-1a 32 reference values
        assert_eq!(partition_for_key(b"", u32::MAX), 0x811c_9dc5);
        assert_eq!(partition_for_key(b"a", u32::MAX), 0xe40c_292c);
        let p = partition_for_key(b"user-1", 3);
        for _ in 0..10 {
            assert_eq!(partition_for_key(b"user-1", 3), p);
        }
    }
}
