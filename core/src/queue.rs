//! The queue state of one partition: leases, acks, the frontier. Pure data, no IO, no clock.
//!
//! Every offset of the log is in exactly one of these states:
//!
//! ```text
//!   below frontier ........ acked (settled for good)
//!   in `acked` ranges ..... acked out of order (above the frontier)
//!   in `leases` ........... leased to a consumer until its deadline
//!   in `ready` ............ seen, due, waiting for (re)delivery
//!   in `not_due` .......... seen, delayed until its due time
//!   >= scan_next .......... not looked at yet (fresh appends)
//! ```
//!
//! Delivery hands out the lowest offset that is ready or, failing that, scans forward from
//! `scan_next`, asking a [`DueSource`] for each record's due time. The frontier is the number
//! of the first offset that is not acked: everything below it is settled. It only moves
//! forward. The frontier and the out-of-order acked ranges are what [`QueueSnapshot`] persists;
//! leases are deliberately not persisted: after a crash every unacked message is deliverable at
//! once.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Tells the queue when a record becomes deliverable.
pub trait DueSource {
    /// The due time (unix ms) of the record at `offset`, or `None` if it cannot be read now
    /// (the scan stops there and resumes on the next call).
    fn due_ms(&mut self, offset: u64) -> Option<i64>;
}

impl<F: FnMut(u64) -> Option<i64>> DueSource for F {
    fn due_ms(&mut self, offset: u64) -> Option<i64> {
        self(offset)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub nonce: u64,
    pub deadline_ms: i64,
    pub delivery_count: u32,
}

/// A delivery decided by [`PartitionQueue::take`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    pub offset: u64,
    pub nonce: u64,
    pub deadline_ms: i64,
    pub delivery_count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The lease this handle names is gone: expired, superseded, acked, or never existed.
    #[error(
        "receipt handle is stale: the lease expired, was released, or the message was already acked"
    )]
    Stale,
    /// The out-of-order acked set is at its bound; retry after the frontier catches up.
    #[error("too many out-of-order acks are pending on this partition; retry shortly")]
    AckSetFull,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSnapshot {
    /// Every offset below this is acked.
    pub frontier: u64,
    /// Out-of-order acked ranges `[start, end)`, all above the frontier, disjoint, sorted.
    pub acked: Vec<(u64, u64)>,
}

const SNAPSHOT_MAGIC: &[u8; 8] = b"NRDQST01";

impl QueueSnapshot {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(28 + self.acked.len() * 16);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&self.frontier.to_le_bytes());
        out.extend_from_slice(&(self.acked.len() as u64).to_le_bytes());
        for (s, e) in &self.acked {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(data: &[u8]) -> Option<Self> {
        if data.len() < 28 {
            return None;
        }
        let (body, crc) = data.split_at(data.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?)
            || &body[..8] != SNAPSHOT_MAGIC
        {
            return None;
        }
        let u = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let frontier = u(8);
        let n = u(16);
        if (body.len() as u64 - 24) != n.checked_mul(16)? {
            return None;
        }
        let acked: Vec<(u64, u64)> = (0..n as usize)
            .map(|i| (u(24 + i * 16), u(32 + i * 16)))
            .collect();
        let mut prev = frontier;
        for &(s, e) in &acked {
            if s <= prev || e <= s {
                return None;
            }
            prev = e;
        }
        Some(Self { frontier, acked })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub frontier: u64,
    pub in_flight: usize,
    pub acked_ahead: u64,
    pub ack_ranges: usize,
    pub ready: usize,
    pub delayed: usize,
    /// Messages not yet acked: `hwm - frontier - acked_ahead`.
    pub unacked: u64,
}

#[derive(Debug)]
pub struct PartitionQueue {
    frontier: u64,
    acked: BTreeMap<u64, u64>,
    acked_count: u64,
    hwm: u64,
    scan_next: u64,
    ready: BTreeSet<u64>,
    not_due: BTreeSet<(i64, u64)>,
    not_due_offsets: HashMap<u64, i64>,
    leases: HashMap<u64, Lease>,
    expiries: BTreeSet<(i64, u64)>,
    deliveries: HashMap<u64, u32>,
    next_nonce: u64,
    max_ack_ranges: usize,
    dirty: bool,
}

/// When a lease taken at `now_ms` ends. Clock readings are truncated to the millisecond, so
/// the lease may really have started up to 1 ms after `now_ms`; one extra millisecond keeps
/// every lease at least `visibility_ms` long in real time (the soak's lifecycle checker found
/// leases 0.1 ms short without it).
fn lease_deadline(now_ms: i64, visibility_ms: i64) -> i64 {
    now_ms.saturating_add(visibility_ms).saturating_add(1)
}

impl PartitionQueue {
    /// Restores a queue from its last snapshot over a log that ends at `hwm` and begins at
    /// `oldest` (retention may have removed offsets the snapshot still counts as unacked).
    pub fn new(
        snapshot: QueueSnapshot,
        oldest: u64,
        hwm: u64,
        nonce_seed: u64,
        max_ack_ranges: usize,
    ) -> Self {
        let acked_count = snapshot.acked.iter().map(|(s, e)| e - s).sum();
        let mut q = Self {
            frontier: snapshot.frontier,
            acked: snapshot.acked.into_iter().collect(),
            acked_count,
            hwm,
            scan_next: snapshot.frontier,
            ready: BTreeSet::new(),
            not_due: BTreeSet::new(),
            not_due_offsets: HashMap::new(),
            leases: HashMap::new(),
            expiries: BTreeSet::new(),
            deliveries: HashMap::new(),
            next_nonce: nonce_seed | 1,
            max_ack_ranges,
            dirty: false,
        };
        q.truncate_below(oldest);
        q
    }

    pub fn snapshot(&self) -> QueueSnapshot {
        QueueSnapshot {
            frontier: self.frontier,
            acked: self.acked.iter().map(|(&s, &e)| (s, e)).collect(),
        }
    }

    /// Whether acks changed the persisted state since the last [`Self::mark_clean`].
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    pub fn mark_clean(&mut self) {
        self.dirty = false;
    }

    /// Marks the state as needing a write (after a failed one).
    pub fn force_dirty(&mut self) {
        self.dirty = true;
    }

    pub fn frontier(&self) -> u64 {
        self.frontier
    }

    pub fn hwm(&self) -> u64 {
        self.hwm
    }

    pub fn in_flight(&self) -> usize {
        self.leases.len()
    }

    pub fn stats(&self) -> QueueStats {
        QueueStats {
            frontier: self.frontier,
            in_flight: self.leases.len(),
            acked_ahead: self.acked_count,
            ack_ranges: self.acked.len(),
            ready: self.ready.len(),
            delayed: self.not_due.len(),
            unacked: self.hwm.saturating_sub(self.frontier + self.acked_count),
        }
    }

    /// The log grew: offsets below `hwm` exist and are durable.
    pub fn on_append(&mut self, hwm: u64) {
        self.hwm = self.hwm.max(hwm);
    }

    /// Retention removed every offset below `oldest`. Returns how many of them were never
    /// acked (data loss for this queue, to be counted and logged by the caller).
    pub fn truncate_below(&mut self, oldest: u64) -> u64 {
        if oldest <= self.frontier {
            return 0;
        }
        let oldest = oldest.min(self.hwm.max(self.frontier));
        let mut acked_below = 0;
        while let Some((&s, &e)) = self.acked.iter().next() {
            if s >= oldest {
                break;
            }
            self.acked.remove(&s);
            if e > oldest {
                acked_below += oldest - s;
                self.acked.insert(oldest, e);
                self.acked_count -= oldest - s;
            } else {
                acked_below += e - s;
                self.acked_count -= e - s;
            }
        }
        let dropped = (oldest - self.frontier) - acked_below;
        self.ready = self.ready.split_off(&oldest);
        let gone: Vec<u64> = self
            .leases
            .keys()
            .copied()
            .filter(|&o| o < oldest)
            .collect();
        for o in gone {
            if let Some(l) = self.leases.remove(&o) {
                self.expiries.remove(&(l.deadline_ms, o));
            }
        }
        let gone: Vec<(u64, i64)> = self
            .not_due_offsets
            .iter()
            .filter(|&(&o, _)| o < oldest)
            .map(|(&o, &d)| (o, d))
            .collect();
        for (o, d) in gone {
            self.not_due_offsets.remove(&o);
            self.not_due.remove(&(d, o));
        }
        self.deliveries.retain(|&o, _| o >= oldest);
        self.frontier = oldest;
        self.absorb_ranges();
        self.scan_next = self.scan_next.max(self.frontier);
        self.dirty = true;
        dropped
    }

    /// Releases every lease whose deadline has passed; returns the released offsets.
    pub fn expire(&mut self, now_ms: i64) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(&(deadline, offset)) = self.expiries.first() {
            if deadline > now_ms {
                break;
            }
            self.expiries.pop_first();
            self.leases.remove(&offset);
            self.ready.insert(offset);
            out.push(offset);
        }
        out
    }

    /// Moves delayed records whose time has come to the ready set; returns how many.
    pub fn promote_due(&mut self, now_ms: i64) -> usize {
        let mut n = 0;
        while let Some(&(due, offset)) = self.not_due.first() {
            if due > now_ms {
                break;
            }
            self.not_due.pop_first();
            self.not_due_offsets.remove(&offset);
            self.ready.insert(offset);
            n += 1;
        }
        n
    }

    /// The next time something changes on its own: a lease expires or a delay ends.
    pub fn next_wakeup(&self) -> Option<i64> {
        let a = self.expiries.first().map(|&(d, _)| d);
        let b = self.not_due.first().map(|&(d, _)| d);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a [`Self::take`] right now could deliver something (ignoring delays not yet
    /// scanned).
    pub fn may_deliver(&self, max_in_flight: usize) -> bool {
        self.leases.len() < max_in_flight && (!self.ready.is_empty() || self.scan_next < self.hwm)
    }

    /// Leases up to `max` messages, lowest offset first, respecting `max_in_flight`.
    pub fn take(
        &mut self,
        now_ms: i64,
        max: usize,
        max_in_flight: usize,
        visibility_ms: i64,
        source: &mut impl DueSource,
    ) -> Vec<Leased> {
        self.promote_due(now_ms);
        let mut out = Vec::new();
        while out.len() < max && self.leases.len() < max_in_flight {
            let offset = if let Some(o) = self.ready.pop_first() {
                o
            } else {
                self.scan_next = self.scan_next.max(self.frontier);
                if let Some((_, &end)) = self.acked.range(..=self.scan_next).next_back()
                    && self.scan_next < end
                {
                    self.scan_next = end;
                    continue;
                }
                if self.scan_next >= self.hwm {
                    break;
                }
                let o = self.scan_next;
                let Some(due) = source.due_ms(o) else { break };
                self.scan_next += 1;
                if due > now_ms {
                    self.not_due.insert((due, o));
                    self.not_due_offsets.insert(o, due);
                    continue;
                }
                o
            };
            out.push(self.lease(offset, now_ms, visibility_ms));
        }
        out
    }

    fn lease(&mut self, offset: u64, now_ms: i64, visibility_ms: i64) -> Leased {
        let nonce = self.next_nonce;
        self.next_nonce = self.next_nonce.wrapping_add(1).max(1);
        let count = self.deliveries.entry(offset).or_insert(0);
        *count += 1;
        let deadline_ms = lease_deadline(now_ms, visibility_ms);
        let lease = Lease {
            nonce,
            deadline_ms,
            delivery_count: *count,
        };
        self.leases.insert(offset, lease);
        self.expiries.insert((deadline_ms, offset));
        Leased {
            offset,
            nonce,
            deadline_ms,
            delivery_count: *count,
        }
    }

    fn live_lease(&self, offset: u64, nonce: u64, now_ms: i64) -> Result<Lease, LeaseError> {
        match self.leases.get(&offset) {
            Some(l) if l.nonce == nonce && l.deadline_ms > now_ms => Ok(*l),
            _ => Err(LeaseError::Stale),
        }
    }

    fn drop_lease(&mut self, offset: u64, lease: Lease) {
        self.leases.remove(&offset);
        self.expiries.remove(&(lease.deadline_ms, offset));
    }

    /// Settles a delivery.
    pub fn ack(&mut self, offset: u64, nonce: u64, now_ms: i64) -> Result<(), LeaseError> {
        let lease = self.live_lease(offset, nonce, now_ms)?;
        if offset != self.frontier && self.acked.len() >= self.max_ack_ranges {
            let joins_left = self
                .acked
                .range(..offset)
                .next_back()
                .is_some_and(|(_, &e)| e == offset);
            let joins_right = self.acked.contains_key(&(offset + 1));
            if !joins_left && !joins_right {
                return Err(LeaseError::AckSetFull);
            }
        }
        self.drop_lease(offset, lease);
        self.deliveries.remove(&offset);
        self.mark_acked(offset);
        self.dirty = true;
        Ok(())
    }

    /// Resets the lease to a full visibility timeout from now; returns the new deadline.
    pub fn extend(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: i64,
        visibility_ms: i64,
    ) -> Result<i64, LeaseError> {
        let lease = self.live_lease(offset, nonce, now_ms)?;
        self.expiries.remove(&(lease.deadline_ms, offset));
        let deadline_ms = lease_deadline(now_ms, visibility_ms);
        self.expiries.insert((deadline_ms, offset));
        self.leases.insert(
            offset,
            Lease {
                deadline_ms,
                ..lease
            },
        );
        Ok(deadline_ms)
    }

    /// Releases the lease now: the message is deliverable again at once.
    pub fn nack(&mut self, offset: u64, nonce: u64, now_ms: i64) -> Result<(), LeaseError> {
        let lease = self.live_lease(offset, nonce, now_ms)?;
        self.drop_lease(offset, lease);
        self.ready.insert(offset);
        Ok(())
    }

    /// Takes back a lease whose message never reached a consumer (the reader left, or the
    /// record could not be read): deliverable again at once, and not counted as a delivery.
    pub fn unlease(&mut self, offset: u64, nonce: u64, now_ms: i64) -> Result<(), LeaseError> {
        self.nack(offset, nonce, now_ms)?;
        if let Some(c) = self.deliveries.get_mut(&offset) {
            *c = c.saturating_sub(1);
        }
        Ok(())
    }

    fn mark_acked(&mut self, offset: u64) {
        if offset == self.frontier {
            self.frontier += 1;
            self.absorb_ranges();
            return;
        }
        let left = self
            .acked
            .range(..offset)
            .next_back()
            .filter(|&(_, &e)| e == offset)
            .map(|(&s, _)| s);
        let right = self.acked.remove(&(offset + 1));
        let start = left.unwrap_or(offset);
        let end = right.unwrap_or(offset + 1);
        self.acked.insert(start, end);
        self.acked_count += 1;
    }

    fn absorb_ranges(&mut self) {
        while let Some(end) = self.acked.remove(&self.frontier) {
            self.acked_count -= end - self.frontier;
            self.frontier = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VIS: i64 = 1000;

    fn q(hwm: u64) -> PartitionQueue {
        PartitionQueue::new(QueueSnapshot::default(), 0, hwm, 7, 1024)
    }

    fn now_due(_: u64) -> Option<i64> {
        Some(0)
    }

    #[test]
    fn delivers_lowest_first_and_acks_move_the_frontier() {
        let mut q = q(3);
        let l = q.take(10, 3, 100, VIS, &mut now_due);
        assert_eq!(
            l.iter().map(|l| l.offset).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert!(q.take(10, 1, 100, VIS, &mut now_due).is_empty());
        q.ack(1, l[1].nonce, 11).unwrap();
        q.ack(2, l[2].nonce, 11).unwrap();
        assert_eq!(q.frontier(), 0);
        assert_eq!(q.stats().acked_ahead, 2);
        q.ack(0, l[0].nonce, 11).unwrap();
        assert_eq!(q.frontier(), 3);
        assert_eq!(q.stats().acked_ahead, 0);
        assert_eq!(q.stats().unacked, 0);
    }

    #[test]
    fn stale_handles() {
        let mut q = q(1);
        let l = q.take(0, 1, 100, VIS, &mut now_due)[0];
        assert_eq!(q.ack(0, l.nonce + 1, 1), Err(LeaseError::Stale));
        q.ack(0, l.nonce, 1).unwrap();
        assert_eq!(q.ack(0, l.nonce, 1), Err(LeaseError::Stale), "double ack");
        assert_eq!(q.extend(0, l.nonce, 1, VIS), Err(LeaseError::Stale));
        assert_eq!(q.nack(0, l.nonce, 1), Err(LeaseError::Stale));
    }

    #[test]
    fn expiry_redelivers_with_a_new_nonce_and_count() {
        let mut q = q(1);
        let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
        // a lease lasts at least VIS in real time: clock readings are whole milliseconds
        assert_eq!(q.next_wakeup(), Some(VIS + 1));
        assert!(q.expire(VIS).is_empty());
        assert_eq!(q.expire(VIS + 1), vec![0]);
        let b = q.take(VIS + 1, 1, 100, VIS, &mut now_due)[0];
        assert_eq!(b.offset, 0);
        assert_ne!(a.nonce, b.nonce);
        assert_eq!(b.delivery_count, 2);
        assert_eq!(q.ack(0, a.nonce, VIS + 2), Err(LeaseError::Stale));
        q.ack(0, b.nonce, VIS + 2).unwrap();
    }

    #[test]
    fn an_unreaped_expired_lease_is_stale() {
        let mut q = q(1);
        let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
        assert_eq!(q.ack(0, a.nonce, VIS + 1), Err(LeaseError::Stale));
    }

    #[test]
    fn extend_resets_to_a_full_timeout() {
        let mut q = q(1);
        let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
        assert_eq!(q.extend(0, a.nonce, 900, VIS), Ok(1901));
        assert!(q.expire(1500).is_empty());
        q.ack(0, a.nonce, 1800).unwrap();
    }

    #[test]
    fn nack_releases_at_once() {
        let mut q = q(2);
        let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
        q.nack(0, a.nonce, 1).unwrap();
        let b = q.take(1, 1, 100, VIS, &mut now_due)[0];
        assert_eq!(b.offset, 0);
        assert_eq!(b.delivery_count, 2);
    }

    #[test]
    fn unlease_does_not_count_a_delivery() {
        let mut q = q(1);
        let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
        q.unlease(0, a.nonce, 1).unwrap();
        assert_eq!(q.take(1, 1, 100, VIS, &mut now_due)[0].delivery_count, 1);
    }

    #[test]
    fn in_flight_cap() {
        let mut q = q(5);
        assert_eq!(q.take(0, 10, 2, VIS, &mut now_due).len(), 2);
        assert!(q.take(0, 10, 2, VIS, &mut now_due).is_empty());
        assert!(!q.may_deliver(2));
    }

    #[test]
    fn delayed_records_never_early_and_do_not_block_later_ones() {
        let mut q = q(3);
        let mut due = |o: u64| Some(if o == 0 { 5000 } else { 0 });
        let l = q.take(100, 10, 100, VIS, &mut due);
        assert_eq!(l.iter().map(|l| l.offset).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(q.next_wakeup(), Some(1101));
        assert!(q.take(4999, 10, 100, VIS, &mut due).is_empty());
        let l = q.take(5000, 10, 100, VIS, &mut due);
        assert_eq!(l[0].offset, 0);
    }

    #[test]
    fn unreadable_record_stops_the_scan_without_losing_it() {
        let mut q = q(2);
        let mut broken = |_| None;
        assert!(q.take(0, 1, 100, VIS, &mut broken).is_empty());
        assert_eq!(q.take(0, 1, 100, VIS, &mut now_due)[0].offset, 0);
    }

    #[test]
    fn ack_set_bound() {
        let mut q = PartitionQueue::new(QueueSnapshot::default(), 0, 10, 1, 2);
        let l = q.take(0, 10, 100, VIS, &mut now_due);
        q.ack(2, l[2].nonce, 1).unwrap();
        q.ack(4, l[4].nonce, 1).unwrap();
        assert_eq!(q.ack(6, l[6].nonce, 1), Err(LeaseError::AckSetFull));
        q.ack(3, l[3].nonce, 1).unwrap(); // joins ranges
        q.ack(6, l[6].nonce, 1).unwrap();
        q.ack(0, l[0].nonce, 1).unwrap();
        q.ack(1, l[1].nonce, 1).unwrap();
        assert_eq!(q.frontier(), 5);
    }

    #[test]
    fn snapshot_restores_acked_state_and_drops_leases() {
        let mut q = q(5);
        let l = q.take(0, 5, 100, VIS, &mut now_due);
        q.ack(0, l[0].nonce, 1).unwrap();
        q.ack(2, l[2].nonce, 1).unwrap();
        q.ack(3, l[3].nonce, 1).unwrap();
        let snap = QueueSnapshot::decode(&q.snapshot().encode()).unwrap();
        assert_eq!(snap.frontier, 1);
        assert_eq!(snap.acked, vec![(2, 4)]);
        let mut r = PartitionQueue::new(snap, 0, 5, 99, 1024);
        let l = r.take(0, 10, 100, VIS, &mut now_due);
        assert_eq!(l.iter().map(|l| l.offset).collect::<Vec<_>>(), vec![1, 4]);
    }

    #[test]
    fn snapshot_decode_rejects_garbage() {
        let mut bytes = QueueSnapshot {
            frontier: 3,
            acked: vec![(5, 6)],
        }
        .encode();
        assert!(QueueSnapshot::decode(&bytes[..bytes.len() - 1]).is_none());
        bytes[9] ^= 1;
        assert!(QueueSnapshot::decode(&bytes).is_none());
        assert!(QueueSnapshot::decode(b"short").is_none());
    }

    #[test]
    fn truncation_counts_unacked_losses() {
        let mut q = q(10);
        let l = q.take(0, 4, 100, VIS, &mut now_due);
        q.ack(1, l[1].nonce, 1).unwrap();
        // offsets 0,2,3 leased, 4..9 never delivered; retention removes 0..6
        assert_eq!(q.truncate_below(6), 5);
        assert_eq!(q.frontier(), 6);
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.take(2, 10, 100, VIS, &mut now_due)[0].offset, 6);
    }

    proptest! {
        /// Random operation sequences keep the invariants: no offset is leased twice at once,
        /// the frontier never moves back, acked offsets are never delivered again, and once
        /// everything is acked the frontier reaches the end.
        #[test]
        fn random_operations_keep_invariants(ops in proptest::collection::vec((0u8..6, 0u64..40, 0i64..400), 1..300), seed in any::<u64>()) {
            let mut q = PartitionQueue::new(QueueSnapshot::default(), 0, 0, seed, 8);
            let mut now = 0i64;
            let mut hwm = 0u64;
            let mut live: HashMap<u64, Leased> = HashMap::new();
            let mut acked: BTreeSet<u64> = BTreeSet::new();
            let mut delays: HashMap<u64, i64> = HashMap::new();
            let mut last_frontier = 0;
            for (op, arg, dt) in ops {
                now += dt;
                // leases past their deadline are gone from the model's point of view
                live.retain(|_, l| l.deadline_ms > now);
                match op {
                    0 => { for _ in 0..=arg % 4 { delays.insert(hwm, now + (arg as i64 % 3) * 100); hwm += 1; } q.on_append(hwm); }
                    1 => {
                        q.expire(now);
                        let mut src = |o: u64| delays.get(&o).copied();
                        for l in q.take(now, (arg % 5 + 1) as usize, 6, VIS, &mut src) {
                            prop_assert!(!live.contains_key(&l.offset), "double lease of {}", l.offset);
                            prop_assert!(!acked.contains(&l.offset), "acked {} delivered again", l.offset);
                            prop_assert!(delays[&l.offset] <= now, "delivered early");
                            live.insert(l.offset, l);
                        }
                    }
                    2 | 3 => {
                        if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                            let l = live[&o];
                            match q.ack(o, l.nonce, now) {
                                Ok(()) => { live.remove(&o); acked.insert(o); }
                                Err(LeaseError::AckSetFull) => {}
                                Err(e) => prop_assert!(false, "live lease rejected: {e}"),
                            }
                        }
                    }
                    4 => {
                        if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                            let l = live.remove(&o).unwrap();
                            q.nack(o, l.nonce, now).unwrap();
                        }
                    }
                    _ => {
                        if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                            let d = q.extend(o, live[&o].nonce, now, VIS).unwrap();
                            live.get_mut(&o).unwrap().deadline_ms = d;
                        }
                    }
                }
                prop_assert!(q.frontier() >= last_frontier);
                last_frontier = q.frontier();
                for o in 0..q.frontier() { prop_assert!(acked.contains(&o)); }
            }
            // drain: everything eventually delivered and acked
            for _ in 0..10_000 {
                now += 500;
                q.expire(now);
                let mut src = |o: u64| delays.get(&o).copied();
                let got = q.take(now, 5, 6, VIS, &mut src);
                for l in got {
                    match q.ack(l.offset, l.nonce, now) {
                        Ok(()) => { acked.insert(l.offset); }
                        Err(LeaseError::AckSetFull) => { q.nack(l.offset, l.nonce, now).unwrap(); }
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                }
                if q.frontier() == hwm { break; }
            }
            prop_assert_eq!(q.frontier(), hwm);
        }
    }
}
