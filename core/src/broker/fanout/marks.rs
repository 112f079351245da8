//! What a fan-out child's consumers processed, in its parent partition's offsets.

/// Most marks one cursor keeps: beyond, every other one goes (the answer only gets
/// coarser, never wrong).
const MAX_MARKS: usize = 256;
/// Most child partition ends one cursor's marks hold (a child of many partitions gets fewer
/// marks, at least 8).
const MAX_MARK_VALUES: usize = 4096;
/// Marks one slab adds at most (inside it; its end is one more), at least this many records
/// apart.
const MARKS_PER_SLAB: usize = 64;
const MIN_MARK_RECORDS: usize = 32;

/// How far a child's consumers got, in its parent partition's offsets (a mirror of the
/// parent carries it, so a promote there leaves out of the child what was processed here).
///
/// The cursor keeps, per child partition, one past the last copy it made there (`own`).
/// After each copied slab, and every few records inside one, it notes the parent offset it
/// reached with `own` then: every copy of a parent record below that offset sits below those
/// ends. Once the child's ack frontier is at or past every one of them, the child's consumers
/// processed every record of the parent below that offset. Copies other cursors made in the
/// same child partitions do not hold a mark back. Memory only: a cursor that starts (or a
/// restarted node) notes where it stands with the child's whole ends as its first mark.
#[derive(Default)]
pub(crate) struct Marks {
    /// `(parent offset reached, ends then)`, oldest first.
    pending: std::collections::VecDeque<(u64, Vec<u64>)>,
    /// Every parent record below it was processed in the child (`None`: nothing noted yet).
    consumed: Option<u64>,
    /// Per child partition, one past the last copy this cursor made there (`None`: not
    /// known yet; the child's ends stand for it until the first mark).
    own: Option<Vec<u64>>,
    /// Some child partition is on another cluster member: not known here.
    unknown: bool,
}

impl Marks {
    /// The first mark of a cursor that stands at `next` while the child's partitions end at
    /// `ends` (`None`: some of them are not on this member). Nothing if it has marks.
    pub(crate) fn start(&mut self, next: u64, ends: Option<Vec<u64>>) {
        if self.own.is_none() || self.unknown {
            self.own = ends.clone();
            self.note(next, ends);
        }
    }

    /// The cursor reached parent offset `reached` with its copies ending at `ends` (`None`:
    /// some child partition is not on this member).
    fn note(&mut self, reached: u64, ends: Option<Vec<u64>>) {
        let Some(ends) = ends else {
            self.unknown = true;
            self.own = None;
            self.pending.clear();
            return;
        };
        self.unknown = false;
        if self.pending.back().is_some_and(|(o, _)| *o >= reached) {
            return;
        }
        let max = (MAX_MARK_VALUES / ends.len().max(1)).clamp(8, MAX_MARKS);
        self.pending.push_back((reached, ends));
        if self.pending.len() > max {
            // thin out evenly, keeping the oldest (the consumers reach it first) and the
            // newest
            let last = self.pending.len() - 1;
            let mut i = 0;
            self.pending.retain(|_| {
                let keep = i % 2 == 0 || i == last;
                i += 1;
                keep
            });
        }
    }

    /// A slab copied: `went` says where each of its records went in order (parent offset,
    /// and child partition or `None` when left out), `bases` where each child partition's
    /// share of it begins (`None` for a partition whose base is not known here: its share
    /// was sent before, or it is on another member). `reached`: one past the slab.
    pub(crate) fn copied(
        &mut self,
        went: &[(u64, Option<u32>)],
        bases: &[Option<u64>],
        reached: u64,
        child_ends: impl FnOnce() -> Option<Vec<u64>>,
    ) {
        if self.unknown {
            return;
        }
        let Some(mut own) = self.own.clone() else {
            // no first mark yet: the child's ends now stand for where earlier copies are
            let ends = child_ends();
            self.own = ends.clone();
            self.note(reached, ends);
            return;
        };
        // (a child grown meanwhile: its new partitions have no copy of this cursor's)
        own.resize(bases.len().max(own.len()), 0);
        let mut counts = vec![0u64; own.len()];
        let step = (went.len() / MARKS_PER_SLAB).max(MIN_MARK_RECORDS);
        for (i, (offset, q)) in went.iter().enumerate() {
            if let Some(q) = *q {
                let q = q as usize;
                let Some(base) = bases.get(q).copied().flatten() else {
                    // where this copy is is not known here
                    self.note(reached, None);
                    return;
                };
                counts[q] += 1;
                own[q] = base + counts[q];
            }
            if (i + 1) % step == 0 && i + 1 < went.len() {
                self.note(offset + 1, Some(own.clone()));
            }
        }
        self.own = Some(own.clone());
        self.note(reached, Some(own));
    }

    /// The cursor moved past records it never copied (gone to retention, or none): where it
    /// stands now.
    pub(crate) fn skipped(&mut self, reached: u64) {
        if let Some(own) = self.own.clone() {
            self.note(reached, Some(own));
        }
    }

    /// Every parent record below the answer was processed in the child, whose partitions'
    /// ack frontiers are `frontiers` now.
    pub(crate) fn consumed(&mut self, frontiers: &[u64]) -> Option<u64> {
        if self.unknown {
            return None;
        }
        while let Some((reached, ends)) = self.pending.front() {
            let done = ends
                .iter()
                .enumerate()
                .all(|(q, e)| frontiers.get(q).is_some_and(|f| f >= e));
            if !done {
                break;
            }
            self.consumed = Some(self.consumed.map_or(*reached, |c| c.max(*reached)));
            self.pending.pop_front();
        }
        // (nothing processed yet: every record below 0 was)
        Some(self.consumed.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_say_what_a_childs_consumers_processed_in_parent_offsets() {
        let mut m = Marks::default();
        // the cursor starts at 10 with the child's two partitions ending at 4 and 6
        m.note(10, Some(vec![4, 6]));
        assert_eq!(m.consumed(&[3, 6]), Some(0), "partition 0 still holds one");
        assert_eq!(m.consumed(&[4, 6]), Some(10));
        // slabs copied parent 10..20 (child ends 9, 6) and 20..30 (child ends 9, 12)
        m.note(20, Some(vec![9, 6]));
        m.note(30, Some(vec![9, 12]));
        assert_eq!(
            m.consumed(&[8, 12]),
            Some(10),
            "one copy of 10..20 unprocessed"
        );
        assert_eq!(m.consumed(&[9, 11]), Some(20));
        assert_eq!(m.consumed(&[9, 12]), Some(30));
        // never back, whatever the frontiers say later
        assert_eq!(m.consumed(&[0, 0]), Some(30));
        // a child partition on another member: not known
        m.note(40, None);
        assert_eq!(m.consumed(&[100, 100]), None);
        m.note(50, Some(vec![20, 20]));
        assert_eq!(m.consumed(&[20, 20]), Some(50));
        // thinned when full: coarser, never past what was processed
        let mut m = Marks::default();
        for i in 1..=(MAX_MARKS as u64 * 3) {
            m.note(i * 10, Some(vec![i]));
        }
        assert!(m.pending.len() <= MAX_MARKS);
        // the oldest marks stay (consumers that lag reach them first)
        assert_eq!(m.consumed(&[1]), Some(10));
        let c = m.consumed(&[100]).unwrap();
        assert!(c <= 1000, "{c}");
        assert!(c >= 1000 - 10 * 64, "{c}");
        assert_eq!(
            m.consumed(&[MAX_MARKS as u64 * 3]),
            Some(MAX_MARKS as u64 * 30)
        );
    }
}
