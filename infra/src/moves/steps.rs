//! The copy's and the rebuild's decisions, without I/O: what a copy pass does with each of
//! the source's files, the read size and the pace, whether a read's answer fits, and where a
//! rebuilt partition starts. The move's sequence itself is
//! [`narad_core::catalog::move_machine`]; the mover (`super`) makes the calls.

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
    use super::*;

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
}
