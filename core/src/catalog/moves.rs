//! Partition moves in the catalog: which partitions are being moved where, each partition's
//! owner epoch, and the compare-and-set that hands a partition to its new owner.
//!
//! A move is three commands:
//! - [`CatalogCommand::SetMoveTarget`](super::CatalogCommand::SetMoveTarget) names the node a
//!   partition should move to (or clears it: the move is cancelled), only while the
//!   partition is still at the owner and epoch the proposer saw;
//! - the target copies the partition from its owner, which freezes it for the last bytes
//!   under a token it chose, and then proposes
//!   [`CompleteMove`](super::CatalogCommand::CompleteMove): the owner becomes the target and
//!   the owner epoch grows by one, only if the owner, the epoch and the target are those the
//!   target copied from and the owner has not thawed that token;
//! - an owner whose freeze ran out before it heard of a flip proposes
//!   [`ThawPartition`](super::CatalogCommand::ThawPartition) and accepts appends again only
//!   once that is committed: the log orders the thaw and the flip, so exactly one of them
//!   takes effect and no append lands on a copy that is about to be abandoned.

use serde::{Deserialize, Serialize};

use super::{Applied, Catalog, CatalogError, TopicMeta};

/// Tokens of thawed freezes a move remembers (a flip naming one is refused). A target makes
/// a new freeze only after its previous one ended, so a few are plenty; the oldest go first.
pub const MAX_THAWED: usize = 16;

/// A move of one partition in flight.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PartitionMove {
    /// This move's id (the proposer's random number): a flip names it, so a flip meant for
    /// a move that was cancelled cannot complete a later one.
    pub id: u64,
    /// The node the partition moves to.
    pub target: u64,
    /// When the move was asked for (the proposer's clock).
    pub since_ms: i64,
    /// Why: `admin`, `rebalance`, `decommission`.
    pub reason: String,
    /// Freeze tokens the owner thawed: a flip naming one of them is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thawed: Vec<u64>,
}

/// What was lost with a partition's owner, and where its rebuilt log starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LostTail {
    /// The owner epoch the partition was rebuilt at (the rebuild applies while the
    /// partition is still at it).
    pub epoch: u64,
    /// The lost owner.
    pub lost_node: u64,
    /// The first offset the archive did not hold.
    pub start: u64,
    /// One past the highest offset any live member had seen acknowledged (at least
    /// `start`): `start..seen_end` were lost (and any the lost member alone acknowledged
    /// after). The rebuilt log starts here, so no offset a client was told is handed out
    /// again for another record.
    pub seen_end: u64,
    /// When (the proposer's clock).
    pub at_ms: i64,
}

impl TopicMeta {
    /// Where partition `p`'s log must start on its owner when it was rebuilt from the
    /// archive at its current owner epoch: after every offset known acknowledged.
    pub fn rebuilt_start(&self, p: u32) -> Option<u64> {
        self.rebuilt
            .get(&p)
            .filter(|t| t.epoch == self.owner_epoch(p))
            .map(|t| t.seen_end)
    }

    /// Partition `p`'s owner epoch: 0 at create, one more at every completed move.
    pub fn owner_epoch(&self, p: u32) -> u64 {
        self.owner_epochs.get(p as usize).copied().unwrap_or(0)
    }

    /// Partition `p`'s owner (a cluster's topics only).
    pub fn owner_of(&self, p: u32) -> Option<u64> {
        self.owners.get(p as usize).copied()
    }
}

fn moving(m: String) -> CatalogError {
    CatalogError::MoveConflict(m)
}

fn partition_of(
    next: &Catalog,
    topic_id: u64,
    partition: u32,
) -> Result<&std::sync::Arc<TopicMeta>, CatalogError> {
    let t = next.by_id(topic_id)?;
    if partition >= t.config.partitions || t.owners.is_empty() {
        return Err(CatalogError::Invalid(format!(
            "topic '{}' has no partition {partition} with an owner",
            t.name
        )));
    }
    Ok(t)
}

pub(super) fn apply_set_target(
    next: &mut Catalog,
    topic_id: u64,
    partition: u32,
    expect_owner: u64,
    expect_epoch: u64,
    target: Option<(u64, u64, i64, &str)>,
) -> Result<Applied, CatalogError> {
    let t = partition_of(next, topic_id, partition)?;
    let (owner, epoch) = (t.owners[partition as usize], t.owner_epoch(partition));
    if owner != expect_owner || epoch != expect_epoch {
        return Err(moving(format!(
            "partition {partition} of '{}' is now at node {owner} (owner epoch {epoch}), not node {expect_owner} at epoch {expect_epoch}",
            t.name
        )));
    }
    let mut t = (**t).clone();
    match target {
        Some((id, target, since_ms, reason)) => {
            if target == owner {
                return Err(CatalogError::Invalid(format!(
                    "partition {partition} of '{}' is on node {target} already",
                    t.name
                )));
            }
            if t.moves.get(&partition).is_some_and(|m| m.target == target) {
                // asked again: the move in flight stands
                return Ok(Applied::Topic(std::sync::Arc::new(t)));
            }
            t.moves.insert(
                partition,
                PartitionMove {
                    id,
                    target,
                    since_ms,
                    reason: reason.to_owned(),
                    thawed: Vec::new(),
                },
            );
        }
        None => {
            t.moves.remove(&partition);
        }
    }
    let t = std::sync::Arc::new(t);
    next.topics.insert(t.name.clone(), t.clone());
    Ok(Applied::Topic(t))
}

pub(super) fn apply_complete(
    next: &mut Catalog,
    topic_id: u64,
    partition: u32,
    (move_id, source, target): (u64, u64, u64),
    expect_epoch: u64,
    token: u64,
) -> Result<Applied, CatalogError> {
    let t = partition_of(next, topic_id, partition)?;
    let (owner, epoch) = (t.owners[partition as usize], t.owner_epoch(partition));
    if owner != source || epoch != expect_epoch {
        return Err(moving(format!(
            "partition {partition} of '{}' is at node {owner} (owner epoch {epoch}), not node {source} at epoch {expect_epoch}",
            t.name
        )));
    }
    let Some(m) = t.moves.get(&partition) else {
        return Err(moving(format!(
            "partition {partition} of '{}' has no move in flight (cancelled?)",
            t.name
        )));
    };
    if m.id != move_id || m.target != target {
        return Err(moving(format!(
            "partition {partition} of '{}' now moves to node {} (move {:016x}), not node {target} (move {move_id:016x})",
            t.name, m.target, m.id
        )));
    }
    if m.thawed.contains(&token) {
        return Err(moving(format!(
            "node {source} thawed partition {partition} of '{}' before the flip: copy its tail again",
            t.name
        )));
    }
    let mut t = (**t).clone();
    let n = t.config.partitions as usize;
    if t.owner_epochs.len() < n {
        t.owner_epochs.resize(n, 0);
    }
    t.owners[partition as usize] = target;
    t.owner_epochs[partition as usize] = epoch + 1;
    // a partition an admin moved stays where it went: the planner leaves it (until
    // unpinned); one the planner or a decommission moved is the planner's again
    if m.reason == "admin" {
        t.pinned.insert(partition);
    } else {
        t.pinned.remove(&partition);
    }
    t.moves.remove(&partition);
    let t = std::sync::Arc::new(t);
    next.topics.insert(t.name.clone(), t.clone());
    Ok(Applied::Topic(t))
}

pub(super) fn apply_reassign_lost(
    next: &mut Catalog,
    topic_id: u64,
    partition: u32,
    (from, to): (u64, u64),
    expect_epoch: u64,
    tail: &LostTail,
) -> Result<Applied, CatalogError> {
    let t = partition_of(next, topic_id, partition)?;
    let (owner, epoch) = (t.owners[partition as usize], t.owner_epoch(partition));
    if owner != from || epoch != expect_epoch {
        return Err(moving(format!(
            "partition {partition} of '{}' is at node {owner} (owner epoch {epoch}), not node {from} at epoch {expect_epoch}",
            t.name
        )));
    }
    if to == from || tail.epoch != epoch + 1 || tail.lost_node != from || tail.seen_end < tail.start
    {
        return Err(CatalogError::Invalid(format!(
            "a malformed reassignment of partition {partition} of '{}'",
            t.name
        )));
    }
    let mut t = (**t).clone();
    let n = t.config.partitions as usize;
    if t.owner_epochs.len() < n {
        t.owner_epochs.resize(n, 0);
    }
    t.owners[partition as usize] = to;
    t.owner_epochs[partition as usize] = epoch + 1;
    t.moves.remove(&partition);
    t.rebuilt.insert(partition, tail.clone());
    let t = std::sync::Arc::new(t);
    next.topics.insert(t.name.clone(), t.clone());
    Ok(Applied::Topic(t))
}

pub(super) fn apply_thaw(
    next: &mut Catalog,
    topic_id: u64,
    partition: u32,
    (owner_expected, expect_epoch): (u64, u64),
    token: u64,
) -> Result<Applied, CatalogError> {
    let t = partition_of(next, topic_id, partition)?;
    let (owner, epoch) = (t.owners[partition as usize], t.owner_epoch(partition));
    if owner != owner_expected || epoch != expect_epoch {
        // the flip won: the thawing node no longer owns the partition
        return Err(moving(format!(
            "partition {partition} of '{}' moved to node {owner} (owner epoch {epoch})",
            t.name
        )));
    }
    let mut t = (**t).clone();
    if let Some(m) = t.moves.get_mut(&partition)
        && !m.thawed.contains(&token)
    {
        if m.thawed.len() >= MAX_THAWED {
            m.thawed.remove(0);
        }
        m.thawed.push(token);
    }
    let t = std::sync::Arc::new(t);
    next.topics.insert(t.name.clone(), t.clone());
    Ok(Applied::Topic(t))
}
