//! Typed ids for the keys of the cluster's tables.
//!
//! A member id, a topic incarnation id and a delivery token id are all `u64` on the wire and
//! in the catalog; a table keyed by a bare `(u64, u64)` compiles just as well with its two
//! halves swapped. These wrappers make such a key say what it holds. They cost nothing: each
//! is its integers, compared and hashed as they are.

use std::fmt;

/// A cluster member's id (the catalog's node id; `1` on a single node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u64);

/// A topic's incarnation id: a topic deleted and made again under the same name has
/// another, so nothing kept for the old one applies to the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicId(pub u64);

/// One partition of one topic incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId {
    pub topic: TopicId,
    pub partition: u32,
}

impl PartitionId {
    pub fn new(topic_id: u64, partition: u32) -> Self {
        Self {
            topic: TopicId(topic_id),
            partition,
        }
    }
}

/// An id another member made (a wait it registered here, a delivery token it left): unique
/// only together with that member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RemoteId {
    pub member: NodeId,
    pub id: u64,
}

impl RemoteId {
    pub fn new(member: u64, id: u64) -> Self {
        Self {
            member: NodeId(member),
            id,
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}
