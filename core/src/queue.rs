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
//! forward. The frontier, the out-of-order acked ranges and the delivery counts of leased,
//! unacked offsets are what [`QueueSnapshot`] persists; leases are deliberately not persisted:
//! after a crash every unacked message is deliverable at once, its delivery count kept (so that
//! a message that keeps crashing its consumer, or the broker, does not look new forever).
//!
//! Delivery counts live in a sparse map `offset -> deliveries` holding exactly the offsets
//! leased at least once and not acked; an ack, the frontier passing, or retention removes
//! them. A snapshot carries at most [`MAX_PERSISTED_COUNTS`] of them, the lowest offsets.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Most delivery counts a partition's snapshot carries (the lowest offsets win): as many as the
/// largest `max_in_flight_per_partition`, so every lease of a partition fits. Beyond it the
/// counts of higher offsets are kept in memory only, and restart from 0 after a restart.
/// 12 bytes each in `queue.state`, so at most ~12 MB per snapshot.
pub const MAX_PERSISTED_COUNTS: usize = 1_000_000;

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
    /// Delivery counts `(offset, count)` of offsets leased at least once and not acked:
    /// offsets ascending, at or above the frontier, outside the acked ranges, counts >= 1.
    /// Empty when read from a version 1 file.
    pub counts: Vec<(u64, u32)>,
}

const SNAPSHOT_MAGIC_V1: &[u8; 8] = b"NRDQST01";
const SNAPSHOT_MAGIC_V2: &[u8; 8] = b"NRDQST02";

/// Bounds-checked little-endian reads over untrusted bytes.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let end = self.at.checked_add(N)?;
        let bytes = self.data.get(self.at..end)?.try_into().ok()?;
        self.at = end;
        Some(bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.at)
    }
}

impl QueueSnapshot {
    /// The version 2 encoding (`NRDQST02`, see docs/storage-format.md).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(36 + self.acked.len() * 16 + self.counts.len() * 12);
        out.extend_from_slice(SNAPSHOT_MAGIC_V2);
        out.extend_from_slice(&self.frontier.to_le_bytes());
        out.extend_from_slice(&(self.acked.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.counts.len() as u64).to_le_bytes());
        for (s, e) in &self.acked {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
        for (o, c) in &self.counts {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&c.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads a version 1 or 2 snapshot. The bytes are untrusted: a bad checksum, a length
    /// that does not match the declared counts (checked before anything is allocated), or
    /// ranges and counts out of order, overlapping or inconsistent with each other make it
    /// `None`, never a panic.
    pub fn decode(data: &[u8]) -> Option<Self> {
        let body = data.get(..data.len().checked_sub(4)?)?;
        let crc = u32::from_le_bytes(data.get(body.len()..)?.try_into().ok()?);
        if crc32c::crc32c(body) != crc {
            return None;
        }
        let mut r = Reader { data: body, at: 0 };
        let v2 = match &r.take::<8>()? {
            m if m == SNAPSHOT_MAGIC_V1 => false,
            m if m == SNAPSHOT_MAGIC_V2 => true,
            _ => return None,
        };
        let frontier = r.u64()?;
        let n = r.u64()?;
        let m = if v2 { r.u64()? } else { 0 };
        let declared = n.checked_mul(16)?.checked_add(m.checked_mul(12)?)?;
        if r.remaining() as u64 != declared {
            return None;
        }
        let mut acked = Vec::with_capacity(n as usize);
        let mut prev = frontier;
        for _ in 0..n {
            let (s, e) = (r.u64()?, r.u64()?);
            if s <= prev || e <= s {
                return None;
            }
            acked.push((s, e));
            prev = e;
        }
        let mut counts = Vec::with_capacity(m as usize);
        let mut ranges = acked.iter().peekable();
        let mut prev: Option<u64> = None;
        for _ in 0..m {
            let (o, c) = (r.u64()?, r.u32()?);
            if o < frontier || prev.is_some_and(|p| o <= p) || c == 0 {
                return None;
            }
            while ranges.next_if(|&&(_, e)| e <= o).is_some() {}
            if ranges.peek().is_some_and(|&&(s, _)| s <= o) {
                return None; // an acked offset has no count
            }
            counts.push((o, c));
            prev = Some(o);
        }
        Some(Self {
            frontier,
            acked,
            counts,
        })
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

/// A map keyed by offset. Offsets are chosen by the broker (a client names one only through a
/// receipt handle, which is authenticated), so they need no defence against chosen keys: one
/// multiplication hashes them, not SipHash (which showed in the consume profile).
type OffsetMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<OffsetHasher>>;

#[derive(Debug, Default, Clone, Copy)]
struct OffsetHasher(u64);

impl std::hash::Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: consecutive offsets spread over the whole table
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
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
    not_due_offsets: OffsetMap<i64>,
    leases: OffsetMap<Lease>,
    expiries: BTreeSet<(i64, u64)>,
    /// Delivery counts of offsets leased at least once and not acked (never 0).
    deliveries: BTreeMap<u64, u32>,
    next_nonce: u64,
    max_ack_ranges: usize,
    /// Most counts a snapshot carries ([`MAX_PERSISTED_COUNTS`] outside tests).
    max_counts: usize,
    dirty: bool,
    /// One past the highest offset held for a previous owner's lease ([`Self::hold`]):
    /// the scan skips offsets below it that are leased or ready.
    held_until: u64,
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
        Self::with_max_counts(
            snapshot,
            oldest,
            hwm,
            nonce_seed,
            max_ack_ranges,
            MAX_PERSISTED_COUNTS,
        )
    }

    /// [`Self::new`] with another bound on persisted delivery counts (tests).
    pub fn with_max_counts(
        snapshot: QueueSnapshot,
        oldest: u64,
        hwm: u64,
        nonce_seed: u64,
        max_ack_ranges: usize,
        max_counts: usize,
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
            not_due_offsets: OffsetMap::default(),
            leases: OffsetMap::default(),
            expiries: BTreeSet::new(),
            deliveries: BTreeMap::new(),
            next_nonce: nonce_seed | 1,
            max_ack_ranges,
            max_counts,
            dirty: false,
            held_until: 0,
        };
        q.truncate_below(oldest);
        q.restore_counts(snapshot.counts);
        q
    }

    /// Raises delivery counts to persisted ones (the snapshot's, then the deliveries
    /// journal's, merged with max: a count never goes down, whatever order they come in).
    /// Counts of offsets that are acked, gone or past the end of the log are ignored, and at
    /// most `max_counts` are kept, the lowest offsets (as a snapshot would keep them).
    pub fn restore_counts(&mut self, counts: impl IntoIterator<Item = (u64, u32)>) {
        for (offset, count) in counts {
            if count == 0 || offset >= self.hwm || self.is_acked(offset) {
                continue;
            }
            let c = self.deliveries.entry(offset).or_insert(0);
            *c = (*c).max(count);
            if self.deliveries.len() > self.max_counts {
                self.deliveries.pop_last();
            }
        }
    }

    /// The delivery count of `offset` so far (0: never delivered, or acked).
    pub fn delivery_count(&self, offset: u64) -> u32 {
        self.deliveries.get(&offset).copied().unwrap_or(0)
    }

    fn is_acked(&self, offset: u64) -> bool {
        offset < self.frontier
            || self
                .acked
                .range(..=offset)
                .next_back()
                .is_some_and(|(_, &e)| offset < e)
    }

    /// The persisted state: frontier, acked ranges and the delivery counts of the lowest
    /// `max_counts` leased, unacked offsets (see [`Self::counts_left_out`]).
    pub fn snapshot(&self) -> QueueSnapshot {
        QueueSnapshot {
            frontier: self.frontier,
            acked: self.acked.iter().map(|(&s, &e)| (s, e)).collect(),
            counts: self
                .deliveries
                .iter()
                .take(self.max_counts)
                .map(|(&o, &c)| (o, c))
                .collect(),
        }
    }

    /// Changes the bound on persisted delivery counts (tests of what happens past it).
    #[cfg(test)]
    pub(crate) fn set_max_counts(&mut self, max_counts: usize) {
        self.max_counts = max_counts;
    }

    /// How many delivery counts [`Self::snapshot`] leaves out for want of room.
    pub fn counts_left_out(&self) -> usize {
        self.deliveries.len().saturating_sub(self.max_counts)
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
        self.deliveries = self.deliveries.split_off(&oldest);
        self.frontier = oldest;
        self.absorb_ranges();
        self.scan_next = self.scan_next.max(self.frontier);
        self.dirty = true;
        self.debug_check();
        dropped
    }

    /// The leases held now, as (offset, deadline): what a partition moving to another node
    /// hands its new owner ([`Self::hold`]).
    pub fn held_leases(&self) -> Vec<(u64, i64)> {
        self.expiries.iter().map(|&(d, o)| (o, d)).collect()
    }

    /// Keeps `offset` out of delivery until `deadline_ms`, under no handle: a lease the
    /// partition's previous owner handed out (its reader may still be working on it; its
    /// handle is answered `410` there, and the message comes again once the lease would have
    /// ended). Ignored for offsets acked, outside the log, or leased already.
    pub fn hold(&mut self, offset: u64, deadline_ms: i64) {
        if offset < self.frontier
            || offset >= self.hwm
            || self.is_acked(offset)
            || self.leases.contains_key(&offset)
        {
            return;
        }
        self.ready.remove(&offset);
        let lease = Lease {
            // (no handle carries nonce 0: see `lease`)
            nonce: 0,
            deadline_ms,
            delivery_count: self.delivery_count(offset),
        };
        self.leases.insert(offset, lease);
        self.expiries.insert((deadline_ms, offset));
        self.held_until = self.held_until.max(offset + 1);
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
        self.debug_check();
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
                debug_assert!(
                    !self.leases.contains_key(&o),
                    "offset {o} ready while leased"
                );
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
                if o < self.held_until && (self.leases.contains_key(&o) || self.ready.contains(&o))
                {
                    // held for a previous owner's lease (or released since): not scanned
                    self.scan_next += 1;
                    continue;
                }
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
        self.debug_check();
        out
    }

    /// What every change leaves true (checked in debug builds: tests run them): each lease
    /// has its one expiry, and each delayed record its one due time.
    fn debug_check(&self) {
        debug_assert_eq!(
            self.leases.len(),
            self.expiries.len(),
            "a lease without its expiry"
        );
        debug_assert_eq!(
            self.not_due.len(),
            self.not_due_offsets.len(),
            "a delayed record without its due time"
        );
    }

    fn lease(&mut self, offset: u64, now_ms: i64, visibility_ms: i64) -> Leased {
        let nonce = self.next_nonce;
        self.next_nonce = self.next_nonce.wrapping_add(1).max(1);
        let count = self.deliveries.entry(offset).or_insert(0);
        // saturating: a count restored from disk may be anything
        *count = count.saturating_add(1);
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
        if self.ack_set_full_for(offset) {
            return Err(LeaseError::AckSetFull);
        }
        self.drop_lease(offset, lease);
        self.deliveries.remove(&offset);
        self.mark_acked(offset);
        self.dirty = true;
        self.debug_check();
        Ok(())
    }

    /// Whether acking `offset` would need a new range while the ack set holds the most it
    /// keeps (an ack at the frontier, or one joining a range, never does).
    fn ack_set_full_for(&self, offset: u64) -> bool {
        let joins_left = self
            .acked
            .range(..offset)
            .next_back()
            .is_some_and(|(_, &e)| e == offset);
        let joins_right = self.acked.contains_key(&(offset + 1));
        offset != self.frontier
            && self.acked.len() >= self.max_ack_ranges
            && !joins_left
            && !joins_right
    }

    /// Settles `offset` without a lease: it was processed elsewhere (a mirror's source
    /// reported it acked). Whatever holds it (a lease, the ready set, a delay) lets go.
    /// False when it was settled already, or when the ack set is full and it joins no range
    /// (then it stays deliverable: a duplicate, never a gap).
    pub fn settle_processed(&mut self, offset: u64) -> bool {
        if offset < self.frontier
            || offset >= self.hwm
            || self
                .acked
                .range(..=offset)
                .next_back()
                .is_some_and(|(_, &e)| offset < e)
        {
            return false;
        }
        if self.ack_set_full_for(offset) {
            return false;
        }
        if let Some(lease) = self.leases.remove(&offset) {
            self.expiries.remove(&(lease.deadline_ms, offset));
        }
        self.ready.remove(&offset);
        if let Some(due) = self.not_due_offsets.remove(&offset) {
            self.not_due.remove(&(due, offset));
        }
        self.deliveries.remove(&offset);
        self.mark_acked(offset);
        self.dirty = true;
        self.debug_check();
        true
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
        self.debug_check();
        Ok(())
    }

    /// Takes back a lease whose message never reached a consumer (the reader left, or the
    /// record could not be read): deliverable again at once, and not counted as a delivery.
    pub fn unlease(&mut self, offset: u64, nonce: u64, now_ms: i64) -> Result<(), LeaseError> {
        self.nack(offset, nonce, now_ms)?;
        if let Some(c) = self.deliveries.get_mut(&offset) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.deliveries.remove(&offset);
            }
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
    fn records_processed_elsewhere_are_settled_and_never_delivered() {
        let mut q = q(6);
        let l = q.take(0, 1, 100, VIS, &mut now_due)[0];
        assert_eq!(l.offset, 0);
        // a leased one, one ahead, one at the end; twice is a no-op; past the end is not
        assert!(q.settle_processed(0));
        assert!(q.settle_processed(3));
        assert!(q.settle_processed(5));
        assert!(!q.settle_processed(3));
        assert!(!q.settle_processed(6));
        assert_eq!(q.frontier(), 1);
        assert_eq!(
            q.ack(0, l.nonce, 1),
            Err(LeaseError::Stale),
            "its lease is gone"
        );
        let got: Vec<u64> = q
            .take(1, 10, 100, VIS, &mut now_due)
            .iter()
            .map(|l| l.offset)
            .collect();
        assert_eq!(got, vec![1, 2, 4]);
        assert_eq!(q.stats().unacked, 3);
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
            counts: vec![(4, 2)],
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

    /// Leases every ready offset of `q` `times` times (nacking in between); the last leases.
    fn deliver_times(q: &mut PartitionQueue, times: u32, now: i64) -> Vec<Leased> {
        let mut last = Vec::new();
        for _ in 0..times {
            last = q.take(now, 100, 100, VIS, &mut now_due);
            for l in &last {
                q.nack(l.offset, l.nonce, now).unwrap();
            }
        }
        last
    }

    #[test]
    fn snapshot_v2_round_trips_delivery_counts() {
        let mut q = q(6);
        deliver_times(&mut q, 2, 0);
        let l = q.take(0, 6, 100, VIS, &mut now_due);
        assert!(l.iter().all(|l| l.delivery_count == 3));
        q.ack(0, l[0].nonce, 1).unwrap();
        q.ack(2, l[2].nonce, 1).unwrap();
        q.nack(4, l[4].nonce, 1).unwrap();
        let snap = q.snapshot();
        assert_eq!(snap.frontier, 1);
        assert_eq!(snap.acked, vec![(2, 3)]);
        assert_eq!(snap.counts, vec![(1, 3), (3, 3), (4, 3), (5, 3)]);
        let bytes = snap.encode();
        assert_eq!(&bytes[..8], b"NRDQST02");
        let back = QueueSnapshot::decode(&bytes).unwrap();
        assert_eq!(back, snap);
        // after a restart the next delivery is the persisted count + 1
        let mut r = PartitionQueue::new(back, 0, 6, 99, 1024);
        let l = r.take(0, 10, 100, VIS, &mut now_due);
        let got: Vec<(u64, u32)> = l.iter().map(|l| (l.offset, l.delivery_count)).collect();
        assert_eq!(got, vec![(1, 4), (3, 4), (4, 4), (5, 4)]);
    }

    #[test]
    fn snapshot_v1_is_still_read_without_counts() {
        let mut v1 = b"NRDQST01".to_vec();
        for x in [3u64, 1, 5, 7] {
            v1.extend_from_slice(&x.to_le_bytes());
        }
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        let snap = QueueSnapshot::decode(&v1).unwrap();
        assert_eq!(
            snap,
            QueueSnapshot {
                frontier: 3,
                acked: vec![(5, 7)],
                counts: vec![],
            }
        );
        let mut q = PartitionQueue::new(snap, 0, 8, 1, 1024);
        let l = q.take(0, 10, 100, VIS, &mut now_due);
        let got: Vec<(u64, u32)> = l.iter().map(|l| (l.offset, l.delivery_count)).collect();
        assert_eq!(got, vec![(3, 1), (4, 1), (7, 1)]);
    }

    /// `NRDQST02` with the given header fields and payload, checksummed.
    fn v2(frontier: u64, n: u64, m: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = b"NRDQST02".to_vec();
        for x in [frontier, n, m] {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.extend_from_slice(payload);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    fn ranges_and_counts(ranges: &[(u64, u64)], counts: &[(u64, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (s, e) in ranges {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
        for (o, c) in counts {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&c.to_le_bytes());
        }
        out
    }

    #[test]
    fn snapshot_v2_refuses_inconsistent_counts() {
        let ok = v2(3, 1, 2, &ranges_and_counts(&[(5, 7)], &[(3, 1), (7, 2)]));
        assert!(QueueSnapshot::decode(&ok).is_some());
        let bad = [
            ("below the frontier", &[(2, 1), (7, 2)][..]),
            ("inside an acked range", &[(3, 1), (6, 2)]),
            ("at a range's start", &[(3, 1), (5, 2)]),
            ("out of order", &[(7, 1), (3, 2)]),
            ("duplicate", &[(3, 1), (3, 2)]),
            ("zero count", &[(3, 0), (7, 2)]),
        ];
        for (why, counts) in bad {
            let bytes = v2(3, 1, 2, &ranges_and_counts(&[(5, 7)], counts));
            assert!(QueueSnapshot::decode(&bytes).is_none(), "{why}");
        }
        // declared lengths that do not match the bytes, however large, allocate nothing
        let payload = ranges_and_counts(&[(5, 7)], &[(3, 1), (7, 2)]);
        for (n, m) in [
            (1, 1),
            (1, 3),
            (2, 2),
            (u64::MAX, 2),
            (1, u64::MAX),
            (u64::MAX / 16, u64::MAX / 12),
        ] {
            assert!(
                QueueSnapshot::decode(&v2(3, n, m, &payload)).is_none(),
                "n={n} m={m}"
            );
        }
        // a v1 file carries no count section
        let mut v1 = ok.clone();
        v1[..8].copy_from_slice(b"NRDQST01");
        let crc = crc32c::crc32c(&v1[..v1.len() - 4]);
        let at = v1.len() - 4;
        v1[at..].copy_from_slice(&crc.to_le_bytes());
        assert!(QueueSnapshot::decode(&v1).is_none());
    }

    #[test]
    fn snapshot_keeps_the_lowest_counts_within_its_bound() {
        let mut q = PartitionQueue::with_max_counts(QueueSnapshot::default(), 0, 5, 1, 1024, 2);
        deliver_times(&mut q, 1, 0);
        assert_eq!(q.counts_left_out(), 3);
        let snap = q.snapshot();
        assert_eq!(snap.counts, vec![(0, 1), (1, 1)]);
        // in memory every count is kept
        assert_eq!(q.delivery_count(4), 1);
        // a restart keeps the persisted ones; the others start again
        let mut r = PartitionQueue::with_max_counts(snap, 0, 5, 2, 1024, 2);
        let l = r.take(0, 10, 100, VIS, &mut now_due);
        let got: Vec<u32> = l.iter().map(|l| l.delivery_count).collect();
        assert_eq!(got, vec![2, 2, 1, 1, 1]);
    }

    #[test]
    fn restored_counts_never_go_down_and_skip_settled_offsets() {
        let snap = QueueSnapshot {
            frontier: 2,
            acked: vec![(4, 5)],
            counts: vec![(2, 5), (3, 1)],
        };
        let mut q = PartitionQueue::new(snap, 0, 8, 1, 1024);
        // an older journal (lower count), a newer one, acked / settled / future offsets
        q.restore_counts([(2, 3), (3, 4), (1, 9), (4, 9), (8, 9), (6, 0)]);
        assert_eq!(q.delivery_count(2), 5, "max, never lowered");
        assert_eq!(q.delivery_count(3), 4);
        for o in [1, 4, 6, 8] {
            assert_eq!(q.delivery_count(o), 0, "offset {o}");
        }
        // retention removed offsets the snapshot counted
        let q = PartitionQueue::new(q.snapshot(), 3, 8, 1, 1024);
        assert_eq!(q.snapshot().counts, vec![(3, 4)]);
    }

    #[test]
    fn counts_end_with_the_ack_and_an_undelivered_lease() {
        let mut q = q(2);
        let l = q.take(0, 2, 100, VIS, &mut now_due);
        q.unlease(1, l[1].nonce, 1).unwrap();
        assert_eq!(q.snapshot().counts, vec![(0, 1)], "no zero count kept");
        q.ack(0, l[0].nonce, 1).unwrap();
        assert!(q.snapshot().counts.is_empty());
        let l = q.take(1, 1, 100, VIS, &mut now_due);
        q.nack(1, l[0].nonce, 2).unwrap();
        assert_eq!(q.truncate_below(2), 1);
        assert!(q.snapshot().counts.is_empty(), "retention drops counts");
    }

    #[test]
    fn a_huge_restored_count_saturates() {
        let snap = QueueSnapshot {
            counts: vec![(0, u32::MAX)],
            ..Default::default()
        };
        let mut q = PartitionQueue::new(snap, 0, 1, 1, 1024);
        assert_eq!(
            q.take(0, 1, 100, VIS, &mut now_due)[0].delivery_count,
            u32::MAX
        );
    }

    /// Checks what a decoded snapshot promises.
    fn consistent(s: &QueueSnapshot) -> Result<(), TestCaseError> {
        let mut prev = s.frontier;
        for &(a, b) in &s.acked {
            prop_assert!(a > prev && b > a, "ranges {:?}", s.acked);
            prev = b;
        }
        let mut last: Option<u64> = None;
        for &(o, c) in &s.counts {
            prop_assert!(c >= 1 && o >= s.frontier && last.is_none_or(|l| o > l));
            prop_assert!(
                !s.acked.iter().any(|&(a, b)| a <= o && o < b),
                "acked {o} counted"
            );
            last = Some(o);
        }
        Ok(())
    }

    fn arb_snapshot() -> impl Strategy<Value = QueueSnapshot> {
        (
            0u64..1000,
            proptest::collection::vec((1u64..5, 1u64..5, any::<bool>(), 1u32..), 0..30),
        )
            .prop_map(|(frontier, steps)| {
                // walk upwards: each step is a gap of `g` offsets, then a run of `r`, either
                // acked (a range) or counted (one count per offset)
                let mut s = QueueSnapshot {
                    frontier,
                    ..Default::default()
                };
                let mut at = frontier;
                for (g, r, is_range, c) in steps {
                    at += g;
                    if is_range {
                        s.acked.push((at, at + r));
                    } else {
                        s.counts.extend((at..at + r).map(|o| (o, c)));
                    }
                    at += r;
                }
                s
            })
    }
    proptest! {
        #[test]
        fn snapshots_round_trip(s in arb_snapshot()) {
            consistent(&s)?;
            prop_assert_eq!(QueueSnapshot::decode(&s.encode()), Some(s));
        }

        /// Untrusted bytes never panic the decoder, and whatever it accepts is consistent
        /// (and encodes back to the same bytes). The CRC is recomputed, so damage reaches the
        /// structural checks instead of stopping at the checksum.
        #[test]
        fn decode_of_any_bytes_never_panics_or_yields_inconsistent_state(
            base in arb_snapshot(),
            v1 in any::<bool>(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            cut in proptest::option::of(any::<prop::sample::Index>()),
            raw in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let mut body = base.encode();
            body.truncate(body.len() - 4);
            if v1 {
                body[..8].copy_from_slice(b"NRDQST01");
            }
            for (at, x) in edits {
                let at = at.index(body.len());
                body[at] = x;
            }
            if let Some(cut) = cut {
                body.truncate(cut.index(body.len() + 1));
            }
            let crc = crc32c::crc32c(&body);
            body.extend_from_slice(&crc.to_le_bytes());
            if let Some(s) = QueueSnapshot::decode(&body) {
                consistent(&s)?;
                if &body[..8] == b"NRDQST02" {
                    prop_assert_eq!(s.encode(), body);
                }
            }
            let mut raw = raw;
            let crc = crc32c::crc32c(&raw);
            raw.extend_from_slice(&crc.to_le_bytes());
            if let Some(s) = QueueSnapshot::decode(&raw) {
                consistent(&s)?;
            }
        }

        /// Random operation sequences keep the invariants: no offset is leased twice at once,
        /// the frontier never moves back, acked offsets are never delivered again, and once
        /// everything is acked the frontier reaches the end.
        #[test]
        fn random_operations_keep_invariants(ops in proptest::collection::vec((0u8..8, 0u64..40, 0i64..400), 1..300), seed in any::<u64>()) {
            let mut q = PartitionQueue::new(QueueSnapshot::default(), 0, 0, seed, 8);
            let mut now = 0i64;
            let mut hwm = 0u64;
            let mut live: HashMap<u64, Leased> = HashMap::new();
            let mut acked: BTreeSet<u64> = BTreeSet::new();
            let mut delays: HashMap<u64, i64> = HashMap::new();
            let mut counts: HashMap<u64, u32> = HashMap::new();
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
                            let count = counts.entry(l.offset).or_insert(0);
                            *count += 1;
                            prop_assert_eq!(l.delivery_count, *count, "count of {}", l.offset);
                            live.insert(l.offset, l);
                        }
                    }
                    2 | 3 => {
                        if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                            let l = live[&o];
                            match q.ack(o, l.nonce, now) {
                                Ok(()) => { live.remove(&o); acked.insert(o); counts.remove(&o); }
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
                    5 => {
                        if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                            let d = q.extend(o, live[&o].nonce, now, VIS).unwrap();
                            live.get_mut(&o).unwrap().deadline_ms = d;
                        }
                    }
                    6 => {
                        // a delivery that never reached its reader does not count
                        if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                            let l = live.remove(&o).unwrap();
                            q.unlease(o, l.nonce, now).unwrap();
                            let c = counts.get_mut(&o).unwrap();
                            *c -= 1;
                            if *c == 0 { counts.remove(&o); }
                        }
                    }
                    _ => {
                        // restart from the snapshot: leases go, counts stay
                        let snap = QueueSnapshot::decode(&q.snapshot().encode());
                        prop_assert!(snap.is_some(), "own snapshot refused");
                        q = PartitionQueue::new(snap.unwrap(), 0, hwm, seed ^ now as u64, 8);
                        live.clear();
                    }
                }
                let snap = q.snapshot();
                prop_assert_eq!(snap.counts.len(), counts.len());
                for &(o, c) in &snap.counts { prop_assert_eq!(counts.get(&o), Some(&c)); }
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

    /// What a partition's queue must do, written as plainly as it can be: every offset is
    /// acked, leased (nonce, deadline) or waiting (its due time), and nothing else. The real
    /// queue is checked against it operation by operation.
    #[derive(Default)]
    struct Model {
        hwm: u64,
        due: Vec<i64>,
        acked: BTreeSet<u64>,
        leases: BTreeMap<u64, (u64, i64)>,
        counts: BTreeMap<u64, u32>,
    }

    impl Model {
        fn live(&self, o: u64, nonce: u64, now: i64) -> bool {
            self.leases
                .get(&o)
                .is_some_and(|&(n, d)| n == nonce && d > now)
        }

        /// Leases whose deadline passed are gone.
        fn expire(&mut self, now: i64) {
            self.leases.retain(|_, &mut (_, d)| d > now);
        }

        /// What a take must lease: the lowest offsets neither acked, leased nor early.
        fn takes(&self, now: i64, max: usize, max_in_flight: usize) -> Vec<u64> {
            let room = max.min(max_in_flight.saturating_sub(self.leases.len()));
            (0..self.hwm)
                .filter(|o| !self.acked.contains(o) && !self.leases.contains_key(o))
                .filter(|&o| self.due[o as usize] <= now)
                .take(room)
                .collect()
        }

        fn frontier(&self) -> u64 {
            (0..self.hwm)
                .find(|o| !self.acked.contains(o))
                .unwrap_or(self.hwm)
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Append {
            n: u64,
            delay: i64,
        },
        Take {
            max: usize,
        },
        Ack {
            pick: usize,
        },
        Nack {
            pick: usize,
        },
        Extend {
            pick: usize,
        },
        Unlease {
            pick: usize,
        },
        /// A handle handed out earlier (maybe superseded, expired or acked since).
        StaleAck {
            pick: usize,
        },
        SettleProcessed {
            offset: u64,
        },
        Restart,
        Wait {
            ms: i64,
        },
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u64..5, prop_oneof![Just(0i64), 1i64..3000]).prop_map(|(n, delay)| Op::Append { n, delay }),
            4 => (1usize..6).prop_map(|max| Op::Take { max }),
            3 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
            1 => any::<usize>().prop_map(|pick| Op::Nack { pick }),
            1 => any::<usize>().prop_map(|pick| Op::Extend { pick }),
            1 => any::<usize>().prop_map(|pick| Op::Unlease { pick }),
            1 => any::<usize>().prop_map(|pick| Op::StaleAck { pick }),
            1 => (0u64..40).prop_map(|offset| Op::SettleProcessed { offset }),
            1 => Just(Op::Restart),
            3 => (1i64..1500).prop_map(|ms| Op::Wait { ms }),
        ]
    }

    proptest! {
        /// Any sequence of appends (some delayed), takes, acks, nacks, extends, unleases,
        /// stale handles, settles, restarts from the snapshot and waits: the queue leases
        /// exactly what the model says, answers every handle as the model does, and agrees
        /// on the frontier, the leases in flight and every delivery count.
        #[test]
        fn a_queue_does_what_its_model_says(ops in proptest::collection::vec(arb_op(), 1..200), seed in any::<u64>()) {
            const IN_FLIGHT: usize = 6;
            let mut q = PartitionQueue::new(QueueSnapshot::default(), 0, 0, seed, 1 << 20);
            let mut m = Model::default();
            let mut now = 0i64;
            let mut handed: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Append { n, delay } => {
                        for _ in 0..n {
                            m.due.push(now + delay);
                            m.hwm += 1;
                        }
                        q.on_append(m.hwm);
                    }
                    Op::Take { max } => {
                        q.expire(now);
                        m.expire(now);
                        let want = m.takes(now, max, IN_FLIGHT);
                        let due = m.due.clone();
                        let got = q.take(now, max, IN_FLIGHT, VIS, &mut |o: u64| due.get(o as usize).copied());
                        let offsets: Vec<u64> = got.iter().map(|l| l.offset).collect();
                        prop_assert_eq!(&offsets, &want, "leased at {}", now);
                        for l in got {
                            let c = m.counts.entry(l.offset).or_insert(0);
                            *c += 1;
                            prop_assert_eq!(l.delivery_count, *c, "count of {}", l.offset);
                            prop_assert_eq!(l.deadline_ms, now + VIS + 1);
                            m.leases.insert(l.offset, (l.nonce, l.deadline_ms));
                            handed.push((l.offset, l.nonce));
                        }
                    }
                    Op::Ack { pick } | Op::Nack { pick } | Op::Extend { pick } | Op::Unlease { pick } | Op::StaleAck { pick } => {
                        let (o, nonce) = if let Op::StaleAck { .. } = op {
                            let Some(&h) = handed.get(pick % handed.len().max(1)) else { continue };
                            h
                        } else {
                            let live: Vec<(u64, u64)> = m.leases.iter().map(|(&o, &(n, _))| (o, n)).collect();
                            let Some(&h) = live.get(pick % live.len().max(1)) else { continue };
                            h
                        };
                        let ok = m.live(o, nonce, now);
                        let got = match op {
                            Op::Ack { .. } | Op::StaleAck { .. } => q.ack(o, nonce, now),
                            Op::Nack { .. } => q.nack(o, nonce, now),
                            Op::Extend { .. } => q.extend(o, nonce, now, VIS).map(|d| {
                                assert_eq!(d, now + VIS + 1);
                            }),
                            _ => q.unlease(o, nonce, now),
                        };
                        prop_assert_eq!(got.is_ok(), ok, "{:?} of {} at {}: {:?}", op, o, now, got);
                        if let Err(e) = got {
                            prop_assert_eq!(e, LeaseError::Stale);
                        }
                        if ok {
                            match op {
                                Op::Ack { .. } | Op::StaleAck { .. } => {
                                    m.leases.remove(&o);
                                    m.acked.insert(o);
                                    m.counts.remove(&o);
                                }
                                Op::Nack { .. } => {
                                    m.leases.remove(&o);
                                }
                                Op::Extend { .. } => {
                                    m.leases.insert(o, (nonce, now + VIS + 1));
                                }
                                _ => {
                                    m.leases.remove(&o);
                                    let c = m.counts.get_mut(&o).unwrap();
                                    *c -= 1;
                                    if *c == 0 {
                                        m.counts.remove(&o);
                                    }
                                }
                            }
                        }
                    }
                    Op::SettleProcessed { offset } => {
                        let want = offset < m.hwm && !m.acked.contains(&offset);
                        prop_assert_eq!(q.settle_processed(offset), want, "settle {}", offset);
                        if want {
                            m.leases.remove(&offset);
                            m.acked.insert(offset);
                            m.counts.remove(&offset);
                        }
                    }
                    Op::Restart => {
                        // leases go (their messages are deliverable again), acks and counts stay
                        let snap = QueueSnapshot::decode(&q.snapshot().encode());
                        prop_assert!(snap.is_some(), "own snapshot refused");
                        q = PartitionQueue::new(snap.unwrap(), 0, m.hwm, seed ^ now as u64, 1 << 20);
                        m.leases.clear();
                    }
                    Op::Wait { ms } => now += ms,
                }
                prop_assert_eq!(q.frontier(), m.frontier());
                q.expire(now);
                m.expire(now);
                prop_assert_eq!(q.in_flight(), m.leases.len());
                let counts: BTreeMap<u64, u32> = q.snapshot().counts.into_iter().collect();
                prop_assert_eq!(&counts, &m.counts);
            }
        }
    }

    /// Leases a partition's previous owner handed out are held (under no handle) until
    /// their deadline: the scan passes them by, nothing delivers them before, and they come
    /// back once their time is up; acked or out-of-range offsets are not held.
    #[test]
    fn held_leases_of_a_previous_owner_wait_for_their_deadline() {
        let mut q = q(6);
        // offset 4 was acked on the previous owner: not held
        let l = q.take(0, 5, 100, VIS, &mut now_due);
        q.ack(4, l[4].nonce, 1).unwrap();
        let mut q = PartitionQueue::new(q.snapshot(), 0, 6, 9, 1024);
        q.hold(1, 500);
        q.hold(4, 500);
        q.hold(9, 500);
        assert_eq!(q.held_leases(), vec![(1, 500)]);
        let got: Vec<u64> = q
            .take(10, 10, 100, VIS, &mut now_due)
            .iter()
            .map(|l| l.offset)
            .collect();
        assert_eq!(got, vec![0, 2, 3, 5], "held and acked offsets are skipped");
        assert!(q.take(499, 10, 100, VIS, &mut now_due).is_empty());
        assert_eq!(q.expire(500), vec![1]);
        let again = q.take(500, 10, 100, VIS, &mut now_due);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].offset, 1);
        assert_ne!(again[0].nonce, 0, "no handle carries the hold's nonce");
        assert_eq!(q.ack(1, 0, 501), Err(LeaseError::Stale));
    }
}
