//! A fan-out child's link to its parent, as the catalog keeps it in the child's metadata.
//! The cursors that copy along it are the broker's (`broker::fanout`).

use serde::{Deserialize, Serialize};

/// Longest delay a child may have (one year).
pub const MAX_CHILD_DELAY_MS: i64 = 365 * 24 * 3_600_000;
/// A child's link to its parent, kept in the child's metadata.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ParentLink {
    pub parent: String,
    /// The parent's incarnation: a re-created parent is a different topic.
    pub parent_id: u64,
    pub delay_ms: i64,
    /// Changes on every attach: cursors of an earlier attachment are never resumed.
    pub epoch: u64,
    /// Where each parent partition's cursor starts (the parent's next offset at the attach,
    /// or 0 for its oldest record), durable with the link itself: in a cluster the cursors
    /// run on the parent partitions' owners, which learn of the link only from the catalog
    /// and take their start from here until their own cursor file exists. A partition with
    /// no entry (added to the parent after the attach) starts at its oldest record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub starts: Vec<u64>,
    /// A child a promote attached from its source's carried definition: what came from that
    /// source and its consumers of this child had processed there is not copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<Box<OriginFloor>>,
}

/// What a promoted topic's fan-out child leaves out: records its consumers on the old
/// primary had processed there. `below`: records that came from that source (their origin
/// names it), by the source's partition, below these origin offsets. `own` (a failback,
/// where the old source is the cluster this topic failed over to): this topic's records that
/// did not come from it, by this topic's partition, below these offsets (the old source's
/// consumers of the child processed them, as its progress said).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OriginFloor {
    pub source: super::role::Source,
    pub below: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own: Vec<u64>,
}
