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

/// What one copy pass does with one of the source's files, from what the staged copy holds.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum FileStep {
    /// Copy from this position on (a log segment only grows: what is staged stays).
    From(u64),
    /// Copy it whole again (a file rewritten in place, once the source is frozen; a segment
    /// that shrank, which a log that only grows cannot do, to be sure).
    Whole,
    /// Not now: a rewritten file is copied only once frozen (before, it would change again).
    Later,
}

/// The step for source file `name` of `size` bytes, of which the staged copy holds `staged`
/// bytes, before (`frozen` false) or during the freeze.
pub(super) fn file_step(name: &str, size: u64, staged: u64, frozen: bool) -> FileStep {
    let segment = name.ends_with(".log");
    if segment && staged <= size {
        FileStep::From(staged)
    } else if !segment && !frozen {
        FileStep::Later
    } else {
        FileStep::Whole
    }
}

/// The size of one read at `max_bytes_per_sec` (0: no limit): 1 MiB, less when the pace is
/// slow, so that pacing stays smooth, never under 16 KiB.
pub(super) fn chunk_for(max_bytes_per_sec: u64, max_chunk: u64) -> u64 {
    match max_bytes_per_sec {
        0 => max_chunk,
        r => (r / 4).clamp(16 << 10, max_chunk),
    }
}

/// The pace of copies: `n` more bytes at `rate` bytes a second may start at the returned
/// instant, and the next after the second (`next`: when the previous ones allowed the next
/// to start; an idle pace saves up no burst).
pub(super) fn pace_slot(
    next: std::time::Instant,
    now: std::time::Instant,
    n: u64,
    rate: u64,
) -> (std::time::Instant, std::time::Instant) {
    let start = next.max(now);
    (
        start,
        start + std::time::Duration::from_secs_f64(n as f64 / rate as f64),
    )
}

/// Whether a read's answer can be a part of the file: something, and no more than asked.
pub(super) fn chunk_fits(got: usize, asked: u64) -> bool {
    got > 0 && got as u64 <= asked
}

/// Where a partition rebuilt from the archive starts: `(next, redeliver_from)`. Its log goes
/// on after the archive's last record (`next_offset`); its queue serves again, from the
/// archived queue frontier (never below the archive's first record), what the archive holds
/// that consumers had not acked, if anything.
pub(super) fn rebuild_start(
    next_offset: u64,
    start_offset: u64,
    queue_frontier: Option<u64>,
) -> (u64, Option<u64>) {
    let from = queue_frontier.unwrap_or(start_offset).max(start_offset);
    (next_offset, (from < next_offset).then_some(from))
}

/// The member that takes the next partition of a lost one: the live member with the fewest
/// partitions now (the lowest id among equals), counted as holding one more after.
pub(super) fn least_loaded(count: &mut std::collections::BTreeMap<u64, usize>) -> Option<u64> {
    let to = count
        .iter()
        .min_by_key(|&(&n, &c)| (c, n))
        .map(|(n, _)| *n)?;
    *count.get_mut(&to).expect("just found") += 1;
    Some(to)
}

/// The records of a partition rebuilt from the archive that are gone: from the archive's
/// end `start` to the end the members saw acknowledged (`seen_end`), as `(to, how many)`.
pub(super) fn lost_span(start: u64, seen_end: u64) -> (u64, u64) {
    let to = seen_end.max(start);
    (to, to - start)
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
    fn a_segment_is_copied_on_from_what_is_staged() {
        assert_eq!(
            file_step("00000000000000000000.log", 900, 0, false),
            FileStep::From(0)
        );
        assert_eq!(
            file_step("00000000000000000000.log", 900, 512, false),
            FileStep::From(512)
        );
        assert_eq!(
            file_step("00000000000000000000.log", 900, 900, true),
            FileStep::From(900)
        );
        // it cannot shrink; if it did, it is copied again whole
        assert_eq!(
            file_step("00000000000000000000.log", 100, 512, true),
            FileStep::Whole
        );
    }

    #[test]
    fn a_rewritten_file_is_copied_whole_and_only_once_frozen() {
        for name in [
            "queue.json",
            "00000000000000000000.idx",
            "cursor-child.json",
        ] {
            assert_eq!(file_step(name, 64, 0, false), FileStep::Later, "{name}");
            assert_eq!(file_step(name, 64, 64, true), FileStep::Whole, "{name}");
            assert_eq!(file_step(name, 64, 0, true), FileStep::Whole, "{name}");
        }
    }

    #[test]
    fn a_slow_pace_reads_smaller_chunks_within_bounds() {
        const MIB: u64 = 1 << 20;
        assert_eq!(chunk_for(0, MIB), MIB, "no limit");
        assert_eq!(chunk_for(100 * MIB, MIB), MIB);
        assert_eq!(chunk_for(MIB, MIB), MIB / 4);
        assert_eq!(chunk_for(1, MIB), 16 << 10, "never under 16 KiB");
    }

    #[test]
    fn the_pace_spaces_copies_and_saves_up_no_burst() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let (start, next) = pace_slot(t0, t0, 1000, 1000);
        assert_eq!((start, next), (t0, t0 + Duration::from_secs(1)));
        // the next asked at once waits for the first to be paid for
        let (start, next) = pace_slot(next, t0, 500, 1000);
        assert_eq!(start, t0 + Duration::from_secs(1));
        assert_eq!(next, t0 + Duration::from_millis(1500));
        // after an idle minute it starts now, not in the past
        let later = t0 + Duration::from_secs(60);
        let (start, _) = pace_slot(next, later, 1, 1000);
        assert_eq!(start, later);
    }

    #[test]
    fn a_read_answer_is_taken_only_if_it_can_be_part_of_the_file() {
        assert!(chunk_fits(1, 1));
        assert!(chunk_fits(100, 1 << 20));
        assert!(!chunk_fits(0, 10), "nothing: the source lost the file");
        assert!(!chunk_fits(11, 10), "more than asked");
    }

    #[test]
    fn a_rebuilt_partition_goes_on_after_the_archive_and_serves_what_was_not_acked() {
        assert_eq!(rebuild_start(100, 0, Some(40)), (100, Some(40)));
        assert_eq!(rebuild_start(100, 0, Some(100)), (100, None), "all acked");
        assert_eq!(
            rebuild_start(100, 0, None),
            (100, Some(0)),
            "no frontier: all of it"
        );
        assert_eq!(
            rebuild_start(100, 60, Some(40)),
            (100, Some(60)),
            "never below the archive's first record"
        );
        assert_eq!(rebuild_start(0, 0, None), (0, None), "an empty archive");
    }

    #[test]
    fn a_lost_members_partitions_go_to_the_least_loaded_in_turn() {
        let mut count: std::collections::BTreeMap<u64, usize> =
            [(1, 5), (2, 3), (3, 3)].into_iter().collect();
        let got: Vec<u64> = (0..5).map(|_| least_loaded(&mut count).unwrap()).collect();
        assert_eq!(
            got,
            [2, 3, 2, 3, 1],
            "fewest first, the lowest id among equals"
        );
        assert_eq!(count.values().copied().collect::<Vec<_>>(), [6, 5, 5]);
        assert_eq!(least_loaded(&mut Default::default()), None, "nobody live");
    }

    #[test]
    fn what_the_archive_did_not_hold_is_counted_lost() {
        assert_eq!(lost_span(100, 130), (130, 30));
        assert_eq!(lost_span(100, 100), (100, 0));
        assert_eq!(
            lost_span(100, 90),
            (100, 0),
            "the archive holds more than was seen"
        );
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
