//! Topic administration, fan-out children and schema bodies.

use serde::{Deserialize, Serialize};

/// A topic's settings as the server reports them (every field present).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    pub partitions: u32,
    pub visibility_timeout_ms: i64,
    pub retention_ms: i64,
    pub retention_bytes: u64,
    pub max_in_flight_per_partition: u32,
    pub delay_ms: i64,
    pub max_message_bytes: u64,
    /// `prefer` or `strict`: where a keyed message goes while its owner is down (cluster).
    pub key_policy: String,
}

/// Settings a create or change gives; absent ones take the server defaults (create) or stay
/// as they are (change).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight_per_partition: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_policy: Option<String>,
}

/// Where a new fan-out child starts copying its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// At the parent's tail (the default).
    Latest,
    /// At the oldest record the parent still holds.
    Earliest,
}

/// The body of `POST /v1/topics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateTopic {
    pub name: String,
    #[serde(flatten)]
    pub settings: TopicSettings,
    /// A JSON Schema every produced payload must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// Create as a fan-out child of this topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout_delay_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<StartFrom>,
}

impl CreateTopic {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            settings: TopicSettings::default(),
            schema: None,
            parent: None,
            fanout_delay_ms: None,
            from: None,
        }
    }
}

/// The body of `PATCH /v1/topics/{topic}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AlterTopic {
    #[serde(flatten)]
    pub settings: TopicSettings,
    /// A new schema version (additive changes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
}

/// A topic object (create, change, list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    pub name: String,
    /// 16 lowercase hex digits: the incarnation, new on every create.
    pub id: String,
    pub created_at_ms: i64,
    #[serde(flatten)]
    pub config: TopicConfig,
    /// Present on a fan-out child, to those who may see the parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout_delay_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The latest JSON Schema version, when the topic has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u32>,
    /// In a cluster: the node id owning each partition (absent on a single node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_owners: Vec<u64>,
    /// `standalone`, `parent` (it has fan-out children) or `child`.
    pub role: String,
    /// A parent's children that the caller may see.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    /// The topic's role between clusters (absent from brokers that predate roles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<Failover>,
}

/// A topic's role between clusters: `primary` takes produces and leases, `mirror` takes
/// records only from its source's link (replay only), `demoted` neither.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failover {
    pub role: String,
    pub epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_of: Option<FailoverSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_from: Option<FailoverSource>,
}

/// A topic on another cluster, by ids (16 lowercase hex digits each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverSource {
    pub cluster: String,
    pub topic: String,
}

/// One page of `GET /v1/topics`. `T` is [`Topic`], or a raw value to keep each topic's JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicList<T = Topic> {
    pub topics: Vec<T>,
    /// `""` when there are no more topics.
    pub next_page_token: String,
}

/// One partition's statistics in `GET /v1/topics/{topic}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStats {
    pub partition: u32,
    pub oldest_offset: u64,
    pub next_offset: u64,
    /// Every offset below it is acked.
    pub frontier: u64,
    pub unacked: u64,
    pub in_flight: u64,
    pub delayed: u64,
    pub acked_ahead: u64,
    pub bytes: u64,
    pub segments: u64,
    pub open: bool,
}

/// `GET /v1/topics/{topic}`: the topic with its partitions' statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicDetails {
    #[serde(flatten)]
    pub topic: Topic,
    pub waiters: u64,
    pub partition_stats: Vec<PartitionStats>,
}

/// The body of `POST /v1/topics/{parent}/children`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachChild {
    pub child: String,
    #[serde(default)]
    pub delay_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<StartFrom>,
}

/// A fan-out child with its lag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Child {
    pub name: String,
    pub delay_ms: i64,
    /// Parent records not yet copied.
    pub lag_messages: u64,
    /// Delay children: how far behind its due time the oldest uncopied due record is.
    pub due_lag_seconds: f64,
}

/// `GET /v1/topics/{parent}/children` (and the `200` of an attach).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Children {
    pub parent: String,
    pub children: Vec<Child>,
}

/// One JSON Schema version of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaVersion {
    pub version: u32,
    pub created_at_ms: i64,
    pub schema: serde_json::Value,
}

/// `GET /v1/topics/{topic}/schema` without `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaVersions {
    pub topic: String,
    /// `null` without a schema.
    pub latest: Option<u32>,
    pub versions: Vec<SchemaVersion>,
}
