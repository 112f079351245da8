//! The mover's decisions, without I/O: whether a move is still wanted, when the catch-up
//! stops and the freeze comes, whether a flip committed, and what to do with a flip whose
//! answer was lost. The mover (`super`) makes the calls; every choice it acts on is made
//! here from what the calls answered, so each can be tested alone.

use narad_core::catalog::TopicMeta;

use super::{FREEZE_WHEN_LEFT, MAX_CATCH_UP_PASSES};

/// A move a member works on: (topic incarnation, partition, move id).
pub(super) type MoveKey = (u64, u32, u64);

/// The source to copy from (the partition's owner now) when the catalog `meta` still wants
/// move `key` to go to member `me`; `None` when it was cancelled, replaced by another move,
/// sent elsewhere, or the topic is another incarnation.
pub(super) fn wanted_from(meta: &TopicMeta, key: MoveKey, me: u64) -> Option<u64> {
    let (topic_id, p, move_id) = key;
    let m = meta.moves.get(&p)?;
    if meta.id != topic_id || m.id != move_id || m.target != me {
        return None;
    }
    meta.owner_of(p)
}

/// Whether the catalog's topic `now` (if it still has one of that name) says the flip of
/// partition `p` of incarnation `topic_id` to `me` committed: `me` owns it, one owner epoch
/// past `epoch` (the epoch the move froze at).
pub(super) fn flipped(now: Option<&TopicMeta>, topic_id: u64, p: u32, me: u64, epoch: u64) -> bool {
    now.is_some_and(|t| {
        t.id == topic_id && t.owner_of(p) == Some(me) && t.owner_epoch(p) == epoch + 1
    })
}

/// The catch-up before the freeze: passes of copying while the source serves, until what a
/// pass copied is small ([`FREEZE_WHEN_LEFT`]: the freeze will be short), or producers
/// outpace the copy (three passes that did not shrink: freeze anyway, for longer), or
/// [`MAX_CATCH_UP_PASSES`] were made.
#[derive(Debug, Default)]
pub(super) struct CatchUp {
    passes: usize,
    last: Option<u64>,
    growing: u32,
}

impl CatchUp {
    /// A pass copied `copied` bytes: whether to freeze now.
    pub(super) fn freeze_after(&mut self, copied: u64) -> bool {
        self.passes += 1;
        if copied <= FREEZE_WHEN_LEFT {
            return true;
        }
        if self.last.is_some_and(|l| copied >= l) {
            self.growing += 1;
            if self.growing >= 3 {
                return true;
            }
        }
        self.last = Some(copied);
        self.passes >= MAX_CATCH_UP_PASSES
    }
}

/// What the catalog says of a flip whose answer was lost (read after a read index).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Resolution {
    /// It committed: the partition is this member's.
    Committed,
    /// It did not commit and still can: the source owns the partition at the move's epoch,
    /// the move is the same and its freeze was not thawed. Proposed again (applied once).
    ProposeAgain,
    /// It did not commit and never will (the move changed, the freeze was thawed, the
    /// topic is gone or another incarnation).
    Lost,
}

/// The flip of move `move_id` (partition `p` of incarnation `topic_id`, frozen at owner
/// epoch `epoch` under freeze `token`, from `source` to `me`), judged from the catalog's
/// topic `now`.
pub(super) fn resolve(
    now: Option<&TopicMeta>,
    (topic_id, p, move_id): MoveKey,
    me: u64,
    source: u64,
    epoch: u64,
    token: u64,
) -> Resolution {
    if flipped(now, topic_id, p, me, epoch) {
        return Resolution::Committed;
    }
    match now {
        Some(t)
            if t.id == topic_id
                && t.owner_of(p) == Some(source)
                && t.owner_epoch(p) == epoch
                && t.moves
                    .get(&p)
                    .is_some_and(|m| m.id == move_id && !m.thawed.contains(&token)) =>
        {
            Resolution::ProposeAgain
        }
        _ => Resolution::Lost,
    }
}

#[cfg(test)]
mod tests {
    use narad_core::catalog::PartitionMove;
    use narad_core::topic::TopicConfig;

    use super::*;

    const ME: u64 = 2;
    const SOURCE: u64 = 1;

    /// Topic 7, partition 0 owned by `owner` at `epoch`, moving to `target` (move 42) if set.
    fn topic(owner: u64, epoch: u64, target: Option<u64>, thawed: &[u64]) -> TopicMeta {
        TopicMeta {
            id: 7,
            name: "t".into(),
            created_at_ms: 0,
            config: TopicConfig {
                partitions: 2,
                ..TopicConfig::default()
            },
            parent: None,
            owner: None,
            owner_id: None,
            schemas: Vec::new(),
            owners: vec![owner, 3],
            owner_epochs: vec![epoch, 0],
            moves: target
                .map(|target| {
                    (
                        0,
                        PartitionMove {
                            id: 42,
                            target,
                            since_ms: 0,
                            reason: "admin".into(),
                            thawed: thawed.to_vec(),
                        },
                    )
                })
                .into_iter()
                .collect(),
            rebuilt: Default::default(),
            role: Default::default(),
            carried_children: Vec::new(),
            pinned: Default::default(),
        }
    }

    #[test]
    fn a_move_is_wanted_only_as_the_catalog_names_it() {
        let t = topic(SOURCE, 0, Some(ME), &[]);
        assert_eq!(wanted_from(&t, (7, 0, 42), ME), Some(SOURCE));
        assert_eq!(
            wanted_from(&t, (7, 0, 41), ME),
            None,
            "a cancelled move's id"
        );
        assert_eq!(wanted_from(&t, (8, 0, 42), ME), None, "another incarnation");
        assert_eq!(
            wanted_from(&t, (7, 1, 42), ME),
            None,
            "no move of that partition"
        );
        assert_eq!(
            wanted_from(&t, (7, 0, 42), 3),
            None,
            "sent to another member"
        );
        let gone = topic(SOURCE, 0, None, &[]);
        assert_eq!(wanted_from(&gone, (7, 0, 42), ME), None, "cancelled");
    }

    #[test]
    fn the_catch_up_freezes_once_little_is_left() {
        let mut c = CatchUp::default();
        assert!(!c.freeze_after(100 << 20));
        assert!(!c.freeze_after(30 << 20));
        assert!(c.freeze_after(FREEZE_WHEN_LEFT));
    }

    #[test]
    fn the_catch_up_freezes_after_three_passes_that_did_not_shrink() {
        let mut c = CatchUp::default();
        assert!(!c.freeze_after(64 << 20));
        assert!(!c.freeze_after(64 << 20), "one");
        assert!(!c.freeze_after(32 << 20), "shrank: not counted");
        assert!(!c.freeze_after(40 << 20), "two");
        assert!(c.freeze_after(50 << 20), "three");
    }

    #[test]
    fn the_catch_up_freezes_after_its_last_pass_whatever_it_copied() {
        let mut c = CatchUp::default();
        let mut size = 1u64 << 60;
        for pass in 1..MAX_CATCH_UP_PASSES {
            size /= 2;
            assert!(!c.freeze_after(size), "pass {pass}");
        }
        assert!(c.freeze_after(size / 2));
    }

    #[test]
    fn a_flip_committed_when_this_member_owns_the_partition_one_epoch_on() {
        let after = topic(ME, 4, None, &[]);
        assert!(flipped(Some(&after), 7, 0, ME, 3));
        assert!(
            !flipped(Some(&after), 7, 0, ME, 4),
            "an epoch further: another flip"
        );
        assert!(!flipped(Some(&after), 8, 0, ME, 3), "another incarnation");
        assert!(!flipped(Some(&topic(SOURCE, 4, None, &[])), 7, 0, ME, 3));
        assert!(!flipped(None, 7, 0, ME, 3), "the topic is gone");
    }

    #[test]
    fn a_lost_flip_answer_is_resolved_from_the_catalog() {
        let key = (7, 0, 42);
        let token = 99;
        let judge = |t: Option<&TopicMeta>| resolve(t, key, ME, SOURCE, 3, token);
        assert_eq!(judge(Some(&topic(ME, 4, None, &[]))), Resolution::Committed);
        assert_eq!(
            judge(Some(&topic(SOURCE, 3, Some(ME), &[]))),
            Resolution::ProposeAgain,
            "not committed, the same move, the freeze held"
        );
        assert_eq!(
            judge(Some(&topic(SOURCE, 3, Some(ME), &[token]))),
            Resolution::Lost,
            "the freeze was thawed: a flip naming it is refused"
        );
        assert_eq!(
            judge(Some(&topic(SOURCE, 4, Some(ME), &[]))),
            Resolution::Lost,
            "the source moved on an epoch"
        );
        assert_eq!(
            judge(Some(&topic(SOURCE, 3, None, &[]))),
            Resolution::Lost,
            "cancelled"
        );
        assert_eq!(
            judge(Some(&topic(3, 4, None, &[]))),
            Resolution::Lost,
            "moved elsewhere"
        );
        assert_eq!(judge(None), Resolution::Lost, "the topic is gone");
    }
}
