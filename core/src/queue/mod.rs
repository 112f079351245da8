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
mod tests;
