//! Where a produce's messages go, and which members a consume asks in which order, decided
//! without I/O: from the catalog's owners, this member's id and what it knows of members
//! that are down. The calls are made by the cluster's ingress (`narad-infra`'s forward
//! module) and by the cluster simulation; every choice they act on is made here, so each can
//! be tested alone.
//!
//! - A message pinned to a partition, or keyed under the `strict` key policy, is *sticky*:
//!   it goes to its partition or fails (`owner_down` at once when the owner is known down).
//! - A keyed message under `prefer` goes to its key's partition unless that partition's owner
//!   is known down; then to the next partition whose owner is not.
//! - A keyless message goes where the topic's keyless spread puts it, passed on the same way.
//! - A message that may move, whose owner could not be reached, is placed once more: on a
//!   partition this member owns if there is one (it is surely up), else the next partition
//!   whose owner neither failed in this request nor is known down; never on the owner that
//!   just failed.

/// The placement decisions over one topic's partitions.
pub struct Placement<'a, D> {
    partitions: u32,
    owners: &'a [u64],
    me: u64,
    /// Whether a member is known to be down (never true of this member).
    down: D,
}

impl<'a, D: Fn(u64) -> bool> Placement<'a, D> {
    /// Over a topic of `partitions` partitions owned by `owners` (the catalog's: one per
    /// partition, or none), seen from member `me`.
    pub fn new(partitions: u32, owners: &'a [u64], me: u64, down: D) -> Self {
        Self {
            partitions,
            owners,
            me,
            down,
        }
    }

    /// The member that owns partition `p`. A topic with no owners was made on a single
    /// node: every partition is this member's (as the broker's `is_local` says).
    pub fn owner(&self, p: u32) -> u64 {
        owner_of(self.owners, p, self.me)
    }

    /// The first partition from `p` on (wrapping) whose owner neither failed in this request
    /// nor is known down; `p` itself when every owner is one or the other.
    pub fn live_partition(&self, p: u32, failed: &[u64]) -> u32 {
        self.find_live(p, failed)
            .unwrap_or(p % self.partitions.max(1))
    }

    fn find_live(&self, p: u32, failed: &[u64]) -> Option<u32> {
        let n = self.partitions.max(1);
        (0..n).map(|i| (p % n + i) % n).find(|&q| {
            let o = self.owner(q);
            !failed.contains(&o) && !(self.down)(o)
        })
    }

    /// The partition of a message that names none: its key's (passed on from a down owner
    /// unless `strict`), or the keyless spread's (`spread`, asked only for a keyless one).
    pub fn first(&self, key: Option<&[u8]>, strict: bool, spread: impl FnOnce() -> u32) -> u32 {
        match key {
            Some(k) if strict => crate::topic::partition_for_key(k, self.partitions),
            Some(k) => {
                self.live_partition(crate::topic::partition_for_key(k, self.partitions), &[])
            }
            None => self.live_partition(spread(), &[]),
        }
    }

    /// The owner of partition `p` when it is known down: a sticky message for it is
    /// answered at once.
    pub fn known_down(&self, p: u32) -> Option<u64> {
        let o = self.owner(p);
        (self.down)(o).then_some(o)
    }

    /// Where a message that may move goes after `node`, the owner of its partition `p`,
    /// could not be reached (`failed`: every owner that failed in this request, `node`
    /// included). `None`: nowhere but `node`, or only owners that failed or are known down
    /// (the message fails with `node`'s error at once, not after a call to a down member).
    pub fn again(&self, p: u32, node: u64, failed: &[u64]) -> Option<u32> {
        let n = self.partitions.max(1);
        let q = (1..=n)
            .map(|d| (p % n + d) % n)
            .find(|&q| self.owner(q) == self.me)
            .or_else(|| self.find_live(p + 1, failed))?;
        (self.owner(q) != node).then_some(q)
    }
}

/// The members a consume of a whole topic asks, in the order it asks them: every owner of
/// the topic and this member (`me`: it may hold a partition the catalog does not list yet),
/// each once, starting at the `cursor`-th (the topic's consume cursor, one more at each
/// consume) so that no member is always asked first.
pub fn asked_in_turn(owners: &[u64], me: u64, cursor: u64) -> Vec<u64> {
    let mut members: Vec<u64> = owners.iter().copied().chain([me]).collect();
    members.sort_unstable();
    members.dedup();
    let start = (cursor % members.len() as u64) as usize;
    members.rotate_left(start);
    members
}

/// The member that owns partition `p` of a topic with `owners` (this member, `me`, when the
/// topic has none: it was made on a single node).
pub fn owner_of(owners: &[u64], p: u32, me: u64) -> u64 {
    // (the catalog keeps one owner per partition; a partition past them is refused by its
    // caller as out of range, and this member's broker says so)
    owners.get(p as usize).copied().unwrap_or(me)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// Four partitions (or as many as `owners`) with these owners.
    fn over(
        owners: &[u64],
        me: u64,
        down: impl Fn(u64) -> bool,
    ) -> Placement<'_, impl Fn(u64) -> bool> {
        Placement::new(owners.len().max(4) as u32, owners, me, down)
    }

    fn key_on(p: u32, n: u32) -> Vec<u8> {
        (0u32..)
            .map(|i| format!("k{i}").into_bytes())
            .find(|k| crate::topic::partition_for_key(k, n) == p)
            .unwrap()
    }

    #[test]
    fn a_topic_without_owners_is_this_members() {
        let owners = &[];
        let place = over(owners, 7, |_| false);
        assert_eq!(place.owner(0), 7);
        assert_eq!(place.owner(3), 7);
        assert_eq!(place.known_down(2), None);
    }

    #[test]
    fn the_live_partition_passes_over_down_and_failed_owners_and_wraps() {
        // partitions 0..4 on members 1, 2, 3, 1
        let owners = &[1, 2, 3, 1];
        let place = over(owners, 1, |o| o == 2);
        assert_eq!(place.live_partition(0, &[]), 0);
        assert_eq!(place.live_partition(1, &[]), 2, "2 is down");
        assert_eq!(place.live_partition(1, &[3]), 3, "3 failed in this request");
        assert_eq!(
            place.live_partition(2, &[3, 1]),
            2,
            "every owner out: its own"
        );
        assert_eq!(place.live_partition(5, &[]), 2, "wraps past the last");
    }

    #[test]
    fn a_key_under_prefer_is_passed_on_from_a_down_owner_and_under_strict_is_not() {
        let owners = &[1, 2, 3, 1];
        let place = over(owners, 1, |o| o == 2);
        let k1 = key_on(1, 4);
        assert_eq!(place.first(Some(&k1), false, || unreachable!()), 2);
        assert_eq!(place.first(Some(&k1), true, || unreachable!()), 1);
        let k0 = key_on(0, 4);
        assert_eq!(place.first(Some(&k0), false, || unreachable!()), 0);
    }

    #[test]
    fn a_keyless_message_takes_the_spread_passed_on_from_a_down_owner() {
        let owners = &[1, 2, 3, 1];
        let place = over(owners, 1, |o| o == 3);
        let asked = RefCell::new(0);
        let spread = || {
            *asked.borrow_mut() += 1;
            2
        };
        assert_eq!(place.first(None, false, spread), 3);
        assert_eq!(*asked.borrow(), 1);
        assert_eq!(
            place.first(None, true, || 1),
            1,
            "strict is about keys only"
        );
    }

    #[test]
    fn a_sticky_message_learns_its_owner_is_down_at_once() {
        let owners = &[1, 2, 3, 1];
        let place = over(owners, 1, |o| o == 2);
        assert_eq!(place.known_down(1), Some(2));
        assert_eq!(place.known_down(0), None);
    }

    #[test]
    fn placed_again_on_a_partition_of_this_member_first() {
        // member 3 failed for partition 2; this member (1) owns 0 and 3
        let owners = &[1, 2, 3, 1];
        let place = over(owners, 1, |_| false);
        assert_eq!(
            place.again(2, 3, &[3]),
            Some(3),
            "the next of this member's"
        );
        assert_eq!(
            place.again(0, 1, &[1]),
            None,
            "this member's own partitions failed"
        );
    }

    #[test]
    fn placed_again_without_a_partition_here_on_the_next_live_owner() {
        // this member (9) owns nothing: 1 failed for partition 0, 2 is known down
        let owners = &[1, 2, 3, 1];
        let place = over(owners, 9, |o| o == 2);
        assert_eq!(place.again(0, 1, &[1]), Some(2));
        // every other owner out too: nowhere else to go
        assert_eq!(place.again(0, 1, &[1, 3]), None);
    }

    #[test]
    fn a_consume_asks_every_member_once_and_each_goes_first_in_turn() {
        assert_eq!(asked_in_turn(&[3, 1, 3, 2], 1, 0), vec![1, 2, 3]);
        assert_eq!(asked_in_turn(&[3, 1, 3, 2], 1, 1), vec![2, 3, 1]);
        assert_eq!(asked_in_turn(&[3, 1, 3, 2], 1, 5), vec![3, 1, 2]);
        // this member is asked even where the catalog lists none of its partitions
        assert_eq!(asked_in_turn(&[3, 3], 9, 0), vec![3, 9]);
        assert_eq!(
            asked_in_turn(&[], 9, 7),
            vec![9],
            "a topic made on a single node"
        );
        let firsts: std::collections::BTreeSet<u64> =
            (0..3).map(|c| asked_in_turn(&[1, 2, 3], 2, c)[0]).collect();
        assert_eq!(firsts.len(), 3, "each member first once in three consumes");
        assert_eq!(asked_in_turn(&[1, 2], 1, u64::MAX).len(), 2);
    }

    #[test]
    fn never_placed_again_on_the_owner_that_failed() {
        // one member owns every partition: another try there is the same failure
        let owners = &[5, 5, 5, 5];
        let place = over(owners, 9, |_| false);
        for p in 0..4 {
            assert_eq!(place.again(p, 5, &[5]), None);
        }
    }
}
