//! Consumer progress shipped with mirrored records: a mirror's queue follows its source's.
//!
//! A remote child's cursor sends, per parent partition and at most every
//! `mirror_progress_interval_ms` (default [`PROGRESS_INTERVAL`]), the partition's ack frontier and the acked ranges above it, clamped
//! to what the link has shipped (so every record it covers is already on the mirror). The
//! mirror settles, in its own partitions, every record whose origin
//! (`narad-origin: <cluster>/<topic>/<partition>/<offset>`) that progress covers: once it
//! is promoted its consumers get only what the source's consumers had not acked, give or
//! take one interval (leases are not carried: a record leased at the source is unacked).
//!
//! The mirror keeps, per topic, an index of its records that are not settled yet by origin
//! (origin partition and offset → local partition and offset), so progress that covers
//! records later settles them without reading the log again. Records are indexed as the
//! mirror takes them (their headers are at hand then); what the index missed (records taken
//! before the first progress, or while it was busy) is read back once, at the next
//! progress. The index is memory only (what it settled is in the queue state, persisted as
//! acks are); after a restart it is built again from each partition's ack frontier at the
//! next progress.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::*;
use crate::catalog::role::Source;

/// How often a remote child's cursor sends its partition's progress by default (when it
/// changed, and every [`PROGRESS_RESEND`] anyway): `mirror_progress_interval_ms`.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// Progress is sent again this often even when it did not change (a mirror that restarted
/// right after taking it may not have persisted what it settled).
/// It is also how an idle old primary learns that its mirror was promoted (the answer is
/// `fenced`) without waiting for a produce.
pub const PROGRESS_RESEND: Duration = Duration::from_secs(2);
/// Most acked ranges one partition's progress carries (a queue keeps at most this many).
pub const MAX_PROGRESS_RANGES: usize = 4096;
/// Most origin partitions one mirror keeps progress for.
pub const MAX_ORIGIN_PARTITIONS: u32 = 65_536;
/// [`MAX_ORIGIN_PARTITIONS`], for the API's checks.
pub fn progress_max_origin_partitions() -> u32 {
    MAX_ORIGIN_PARTITIONS
}

/// Most offsets one progress message hands back (see `settle_returned`).
pub const MAX_RETURNED: u64 = 1 << 16;

/// Most records one progress message makes its mirror read back to index (records the
/// index did not take as they came, say the whole backlog after a restart): the rest is
/// read at the next progress (one comes every interval, and every 2 s anyway), so a link's
/// request costs bounded time. A promote reads all that is left.
pub const READ_PER_PROGRESS: u64 = 1 << 16;

/// Indexed records settled per step once progress covers them.
const SETTLE_BATCH: usize = 1024;

/// Most unsettled records one mirror's index holds; records beyond are not indexed (they
/// stay deliverable after a promote: duplicates, never a gap).
pub const MAX_INDEXED: usize = 4 << 20;

/// The source's progress on one of its partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionProgress {
    /// Every origin offset below it was acked at the source.
    pub frontier: u64,
    /// Acked ranges `[start, end)` above the frontier: ascending, disjoint, not empty.
    #[serde(default)]
    pub acked: Vec<(u64, u64)>,
    /// Per fan-out child of the source topic, by name: every record of this partition below
    /// the offset was processed by that child's consumers (children the source does not know
    /// that of are left out). A promote leaves those records out of the child here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<(String, u64)>,
    /// A failback (the mirror is the old primary): per fan-out child, by name, and per
    /// partition of the mirror, the lowest of the mirror's offsets among the records of this
    /// partition that came from the mirror and the child's consumers have not processed
    /// (a partition not listed: no such record). A child left out is not known: every record
    /// of the mirror's own goes to its child there again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children_returned: Vec<(String, Vec<(u32, u64)>)>,
}

impl PartitionProgress {
    /// Checks the shape of progress a link sent (it is not trusted to be well formed).
    pub fn validate(&self) -> Result<(), String> {
        if self.acked.len() > MAX_PROGRESS_RANGES {
            return Err(format!(
                "acked: at most {MAX_PROGRESS_RANGES} ranges, got {}",
                self.acked.len()
            ));
        }
        let mut last = self.frontier;
        for (i, &(s, e)) in self.acked.iter().enumerate() {
            if s <= last || e <= s {
                return Err(format!(
                    "acked[{i}]: ranges must be [start, end) with start above the frontier and the previous range's end, and end above start"
                ));
            }
            last = e;
        }
        if self.children.len() > crate::catalog::MAX_CHILDREN {
            return Err(format!(
                "children: at most {}",
                crate::catalog::MAX_CHILDREN
            ));
        }
        for (name, _) in &self.children {
            crate::topic::validate_name(name)
                .map_err(|e| format!("children: '{name}': {}", e.reason))?;
        }
        if self.children_returned.len() > crate::catalog::MAX_CHILDREN {
            return Err(format!(
                "children_returned: at most {}",
                crate::catalog::MAX_CHILDREN
            ));
        }
        for (name, at) in &self.children_returned {
            crate::topic::validate_name(name)
                .map_err(|e| format!("children_returned: '{name}': {}", e.reason))?;
            if at.len() > MAX_ORIGIN_PARTITIONS as usize
                || at.iter().any(|(p, _)| *p >= MAX_ORIGIN_PARTITIONS)
            {
                return Err(format!(
                    "children_returned: '{name}': at most {MAX_ORIGIN_PARTITIONS} partitions, each below it"
                ));
            }
        }
        Ok(())
    }

    /// Whether origin offset `o` was acked at the source.
    pub fn covers(&self, o: u64) -> bool {
        o < self.frontier || {
            let i = self.acked.partition_point(|&(s, _)| s <= o);
            i > 0 && o < self.acked[i - 1].1
        }
    }

    /// This progress as far as `shipped` (records at or above it are not on the mirror).
    pub fn clamped(&self, shipped: u64) -> Self {
        Self {
            frontier: self.frontier.min(shipped),
            acked: self
                .acked
                .iter()
                .filter(|(s, _)| *s < shipped)
                .map(|&(s, e)| (s, e.min(shipped)))
                .collect(),
            children: self.children.clone(),
            children_returned: self.children_returned.clone(),
        }
    }
}

/// What the source said of one of its partitions besides its acks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceEnd {
    /// The partition's end offset there: every record below it was acknowledged.
    pub end: u64,
    /// Where the link's cursor stood: every record below it (from where the link started)
    /// was accepted by this mirror.
    pub shipped: u64,
    /// Records leased there and not settled yet.
    pub leased: u64,
    /// Acked records there not yet looked at for records that came from this mirror (a
    /// failback hands their acks back: see `returned`).
    pub unreturned: u64,
    /// The source's partition count.
    pub partitions: u32,
    /// The source was no longer a primary (demoted): it takes no more records.
    pub demoted: bool,
    /// When the mirror took it (its clock, ms).
    pub at_ms: i64,
}

/// One source partition as a mirror knows it (the promote's report).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OriginReport {
    /// The source's partition.
    pub partition: u32,
    /// One past the highest origin offset this mirror holds from it.
    pub received_to: u64,
    /// The partition's end at the source as last reported (absent: never reported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_end: Option<u64>,
    /// Records the source had acknowledged (below its reported end) that this mirror does
    /// not hold: lost if the source is lost with its disks.
    pub unreceived: u64,
    /// The source's ack frontier as last reported.
    pub acked_frontier: u64,
    /// Records leased at the source as last reported (not carried: delivered again here).
    pub source_leased: u64,
    /// Acked records at the source not yet looked at for this mirror's own records (their
    /// acks are handed back as the scan goes).
    pub source_unreturned: u64,
    /// How old the last progress is (ms; absent: none came).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress_age_ms: Option<i64>,
    /// The last progress came from a demoted source (it takes no more records).
    pub source_demoted: bool,
    /// Per fan-out child of the source: every record of this partition below the offset
    /// was processed by the child's consumers there (as last reported).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<(String, u64)>,
    /// A failback: per fan-out child of the source, the lowest of this topic's own offsets
    /// (per partition) its consumers there have not processed, among the records of this
    /// source partition (see [`PartitionProgress::children_returned`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children_returned: Vec<(String, Vec<(u32, u64)>)>,
}

/// A mirror's view of its source (`POST .../promote` answers it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct MirrorReport {
    pub partitions: Vec<OriginReport>,
    /// Records settled because the source's consumers acked them (this promote's share).
    pub settled: u64,
    /// Every source partition reported, from a demoted source, an end this mirror holds
    /// and its last acks: nothing more is coming (a planned switchover can promote).
    pub drained: bool,
    /// Cluster members owning partitions of the mirror that could not be asked (their
    /// share is missing from these figures, and the records they hold that the source's
    /// consumers acked are delivered again after a promote).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unanswered: Vec<u64>,
}

impl MirrorReport {
    /// The report of a mirror whose partitions several cluster members own, from each
    /// member's own (each knows the records of its partitions, and the source's progress it
    /// was sent).
    pub fn merge(reports: impl IntoIterator<Item = MirrorReport>) -> MirrorReport {
        let mut by_partition: BTreeMap<u32, Vec<OriginReport>> = BTreeMap::new();
        let mut out = MirrorReport::default();
        for r in reports {
            out.settled += r.settled;
            out.unanswered.extend(r.unanswered);
            for p in r.partitions {
                by_partition.entry(p.partition).or_default().push(p);
            }
        }
        for (partition, all) in by_partition {
            let received_to = all.iter().map(|p| p.received_to).max().unwrap_or(0);
            // the source's figures as most recently reported to any member
            let latest = all
                .iter()
                .filter(|p| p.progress_age_ms.is_some())
                .min_by_key(|p| p.progress_age_ms)
                .or_else(|| all.first())
                .expect("a partition has a report")
                .clone();
            // what none of the members holds (each counts against its own records)
            let unreceived = all
                .iter()
                .filter(|p| p.source_end.is_some())
                .map(|p| p.unreceived)
                .min()
                .unwrap_or(0);
            out.partitions.push(OriginReport {
                partition,
                received_to,
                unreceived,
                acked_frontier: all.iter().map(|p| p.acked_frontier).max().unwrap_or(0),
                ..latest
            });
        }
        out.drained = drained(&out.partitions);
        out
    }
}

/// Every source partition reported from a demoted source (no new records, no new leases),
/// every record it had is here, and nothing is leased there any more (its consumers' last
/// acks are in the progress).
fn drained(partitions: &[OriginReport]) -> bool {
    !partitions.is_empty()
        && partitions.iter().all(|r| {
            r.source_demoted
                && r.source_end.is_some()
                && r.unreceived == 0
                && r.source_leased == 0
                && r.source_unreturned == 0
        })
}

/// A mirror's index of its unsettled records and the progress it has taken.
#[derive(Debug)]
pub(crate) struct MirrorIndex {
    source: Source,
    /// Per source partition: one past the highest origin offset read here.
    received: BTreeMap<u32, u64>,
    /// Per source partition: its end and state as last reported.
    ends: BTreeMap<u32, SourceEnd>,
    /// Per local partition: what was looked at.
    scanned: Vec<Looked>,
    /// Records not settled, by origin: (origin partition, origin offset, local partition,
    /// local offset); a record the link shipped twice (a chunk sent again) has a local copy
    /// for each time.
    pending: std::collections::BTreeSet<(u32, u64, u32, u64)>,
    progress: BTreeMap<u32, PartitionProgress>,
    /// The index is full: logged once.
    full_logged: bool,
    /// Records read back from the log to index them (the ones not indexed as they came).
    read_back: u64,
}

pub(crate) use origin::origin_of;

/// Most batches one local partition's index holds above its contiguous part (taken out of
/// order: concurrent requests finish in any order); beyond, batches are left to be read.
const MAX_AHEAD: usize = 1024;

/// Most records whose origins wait beside a busy index (per topic), to be indexed by its
/// next holder; beyond, they are read back.
const MAX_DEFERRED: usize = 256 << 10;

/// A batch a mirror took while its index was busy: where it went and its records' origins.
#[derive(Debug)]
pub(crate) struct Deferred {
    source: Source,
    partition: u32,
    base: u64,
    origins: Vec<Option<origin::Hop>>,
}

/// What a mirror's index looked at of one of its local partitions.
#[derive(Debug, Default)]
struct Looked {
    /// Every offset below it was looked at (or is settled).
    below: u64,
    /// Batches looked at above `below`, as they were taken: start → end.
    ahead: BTreeMap<u64, u64>,
}

impl Looked {
    /// Moves `below` to at least `floor` (everything below it was looked at or is settled)
    /// and over the batches that follow it now. Returns the new `below`.
    fn advance(&mut self, floor: u64) -> u64 {
        self.below = self.below.max(floor);
        while let Some((&start, &end)) = self.ahead.first_key_value() {
            if start > self.below {
                break;
            }
            self.below = self.below.max(end);
            self.ahead.pop_first();
        }
        self.below
    }
}

/// What became of one record a mirror's index looked at.
enum Indexed {
    /// Not from this index's source (or no origin this version reads).
    Skipped,
    /// Settled now (the progress covers it); `false`: it already was.
    Settled(bool),
    /// Kept in the index until the progress covers it.
    Kept,
    /// The index is full: not kept.
    Full,
}

impl MirrorIndex {
    /// Looks at the record at `local` (partition and offset here) with `headers`.
    fn look(
        &mut self,
        q: &mut crate::queue::PartitionQueue,
        local: (u32, u64),
        headers: &[(String, bytes::Bytes)],
    ) -> Indexed {
        self.look_origin(q, local, origin_of(headers))
    }

    /// [`MirrorIndex::look`] with the record's origin read already.
    fn look_origin(
        &mut self,
        q: &mut crate::queue::PartitionQueue,
        local: (u32, u64),
        origin: Option<origin::Hop>,
    ) -> Indexed {
        let Some((src, op, oo)) = origin else {
            return Indexed::Skipped;
        };
        if src != self.source {
            return Indexed::Skipped;
        }
        if self.progress.get(&op).is_some_and(|p| p.covers(oo)) {
            self.note_received(op, oo);
            return Indexed::Settled(q.settle_processed(local.1));
        }
        if self.pending.len() >= MAX_INDEXED {
            return Indexed::Full;
        }
        self.note_received(op, oo);
        self.pending.insert((op, oo, local.0, local.1));
        Indexed::Kept
    }

    fn note_received(&mut self, op: u32, oo: u64) {
        let got = self.received.entry(op).or_insert(0);
        *got = (*got).max(oo.saturating_add(1));
    }
}

impl Broker {
    /// Up to `max` records of `part` from `next` (off the runtime's threads), or, when
    /// retention removed `next` already, `Err(oldest)`: where the partition begins now.
    pub(super) async fn read_slab(
        &self,
        part: &Partition,
        next: u64,
        max: usize,
    ) -> Result<Result<Vec<Arc<Record>>, u64>, BrokerError> {
        let log = self.log_of(part).await?;
        let read = tokio::task::spawn_blocking(move || log.read(next, max, fanout::SLAB_BYTES))
            .await
            .expect("slab read task");
        match read {
            Ok(r) => Ok(Ok(r)),
            Err(LogError::Truncated { oldest, .. }) => Ok(Err(oldest)),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes the source's progress on its partition `partition` for mirror `topic` (the
    /// caller checked that the link is this mirror's source at its epoch) and settles every
    /// record of `topic` it covers. Returns how many were settled now.
    pub async fn take_mirror_progress(
        self: &Arc<Self>,
        topic: &str,
        source: Source,
        partition: u32,
        progress: PartitionProgress,
        end: Option<SourceEnd>,
    ) -> Result<u64, BrokerError> {
        progress.validate().map_err(|reason| {
            BrokerError::InvalidField(crate::topic::InvalidField {
                field: "progress",
                reason,
            })
        })?;
        if partition >= MAX_ORIGIN_PARTITIONS {
            return Err(BrokerError::InvalidField(crate::topic::InvalidField {
                field: "partition",
                reason: format!("must be below {MAX_ORIGIN_PARTITIONS}"),
            }));
        }
        let t = self.topic(topic)?;
        let index = self.mirror_index(&t, source);
        let mut index = index.lock().await;
        // what came so far first: progress counts only for records this mirror holds (a
        // link that claims more is not believed beyond them), and replaces the last (one
        // cursor sends one at a time). While the index has not looked at all it holds (a
        // backlog read a share per message), what it holds is not known yet: the link's own
        // claim of what it shipped bounds the progress then.
        let mut budget = READ_PER_PROGRESS;
        self.settle_covered(&t, &mut index, &mut budget).await?;
        let held = index.received.get(&partition).copied().unwrap_or(0);
        let limit = if budget > 0 {
            held
        } else {
            end.map_or(u64::MAX, |e| e.shipped).max(held)
        };
        index.progress.insert(partition, progress.clamped(limit));
        if let Some(end) = end {
            index.ends.insert(
                partition,
                SourceEnd {
                    at_ms: self.clock.now_ms(),
                    ..end
                },
            );
        }
        let n = self.settle_covered(&t, &mut index, &mut budget).await;
        drop(index);
        self.metrics
            .mirror_progress_at
            .get_or_create(&TopicLabel {
                topic: topic.to_owned(),
            })
            .set(self.clock.now_ms() / 1000);
        self.mirror_progress_taken.notify_waiters();
        n
    }

    /// Settles, in mirror `topic`'s own partitions, the records the source's consumers
    /// processed after they came from here (`returned`: ranges `(partition, start, end)` of
    /// this topic's offsets). Returns how many were settled.
    pub async fn settle_returned(
        &self,
        topic: &str,
        source: Source,
        returned: &[(u32, u64, u64)],
    ) -> Result<u64, BrokerError> {
        let total: u64 = returned.iter().map(|(_, s, e)| e.saturating_sub(*s)).sum();
        if returned.len() > MAX_PROGRESS_RANGES
            || total > MAX_RETURNED
            || returned.iter().any(|(_, s, e)| e <= s)
        {
            return Err(BrokerError::InvalidField(crate::topic::InvalidField {
                field: "returned",
                reason: format!(
                    "at most {MAX_PROGRESS_RANGES} ranges [start, end) with end above start, {MAX_RETURNED} offsets in all"
                ),
            }));
        }
        let t = self.topic(topic)?;
        let meta = t.meta.read().clone();
        let parts = t.partitions();
        let mut settled = 0u64;
        for &(p, s, e) in returned {
            let Some(part) = parts.get(p as usize) else {
                continue;
            };
            if !self.is_local(&meta, p) {
                continue;
            }
            // only records that can have gone from here to the source: this topic's own, or
            // ones it got from a third topic and forwarded; never one that came from the
            // source (it holds that one itself)
            let mut next = s;
            while next < e {
                let max = ((e - next) as usize).min(4096);
                let records = match self.read_slab(part, next, max).await? {
                    Ok(r) => r,
                    Err(oldest) => {
                        next = oldest.max(next + 1);
                        continue;
                    }
                };
                let Some(last) = records.last().map(|r| r.offset) else {
                    break;
                };
                let mut q = part.queue.lock();
                for r in records.iter().filter(|r| r.offset < e) {
                    if !origin::came_through(r, source.topic) {
                        settled += u64::from(q.settle_processed(r.offset));
                    }
                }
                next = last + 1;
            }
        }
        if settled > 0 {
            self.metrics
                .mirror_settled
                .get_or_create(&TopicLabel { topic: meta.name })
                .inc_by(settled);
        }
        Ok(settled)
    }

    /// What mirror `topic` holds of its source, per source partition, after settling what the
    /// progress taken so far covers (`None`: no progress came since this node started).
    pub async fn mirror_report(
        self: &Arc<Self>,
        topic: &str,
    ) -> Result<Option<MirrorReport>, BrokerError> {
        let t = self.topic(topic)?;
        let found = self.mirror_indexes.lock().get(&t.id()).cloned();
        let Some(index) = found else { return Ok(None) };
        let mut index = index.lock().await;
        let mut all = u64::MAX;
        let settled = self.settle_covered(&t, &mut index, &mut all).await?;
        let now = self.clock.now_ms();
        let count = index
            .ends
            .values()
            .map(|e| e.partitions)
            .max()
            .unwrap_or(0)
            .max(index.progress.keys().map(|p| p + 1).max().unwrap_or(0));
        let partitions: Vec<OriginReport> = (0..count)
            .map(|p| {
                let received_to = index.received.get(&p).copied().unwrap_or(0);
                let end = index.ends.get(&p);
                let progress = index.progress.get(&p);
                OriginReport {
                    partition: p,
                    received_to,
                    source_end: end.map(|e| e.end),
                    unreceived: end.map_or(0, |e| e.end.saturating_sub(e.shipped.max(received_to))),
                    acked_frontier: progress.map_or(0, |p| p.frontier),
                    source_leased: end.map_or(0, |e| e.leased),
                    source_unreturned: end.map_or(0, |e| e.unreturned),
                    progress_age_ms: end.map(|e| now.saturating_sub(e.at_ms)),
                    source_demoted: end.is_some_and(|e| e.demoted),
                    children: progress.map(|p| p.children.clone()).unwrap_or_default(),
                    children_returned: progress
                        .map(|p| p.children_returned.clone())
                        .unwrap_or_default(),
                }
            })
            .collect();
        let drained = drained(&partitions);
        Ok(Some(MirrorReport {
            partitions,
            settled,
            drained,
            unanswered: Vec::new(),
        }))
    }

    /// Waits until progress comes for a mirror (any), at most `within`.
    pub async fn mirror_progress_wait(&self, within: Duration) {
        let _ = tokio::time::timeout(within, self.mirror_progress_taken.notified()).await;
    }

    /// Settles every record of mirror `topic` that the progress taken so far covers (a
    /// promote does this last), makes the queue state of its partitions here durable (a
    /// promote answered is followed by no more progress: what the source's consumers acked
    /// must survive a crash of the new primary right after it), and drops the index.
    /// Returns how many were settled.
    pub async fn settle_mirror_progress(self: &Arc<Self>, topic: &str) -> Result<u64, BrokerError> {
        let t = self.topic(topic)?;
        let found = self.mirror_indexes.lock().get(&t.id()).cloned();
        let Some(index) = found else { return Ok(0) };
        let mut index = index.lock().await;
        let mut all = u64::MAX;
        let n = self.settle_covered(&t, &mut index, &mut all).await?;
        let parts = t.partitions();
        let persisted = tokio::task::spawn_blocking(move || {
            parts.iter().try_for_each(|p| {
                p.persist_queue(false)
                    .map(drop)
                    .map_err(|source| LogError::Io {
                        path: p.dir.clone(),
                        source,
                    })
            })
        })
        .await
        .expect("queue persist task");
        if let Err(e) = persisted {
            tracing::error!(topic = %topic, error = %e, "could not make what the mirror settled durable before its promote (nothing was changed)");
            return Err(e.into());
        }
        self.mirror_indexes.lock().remove(&t.id());
        self.mirror_deferred.lock().remove(&t.id());
        // (no longer a mirror: no progress is expected)
        self.metrics.mirror_progress_at.remove(&TopicLabel {
            topic: topic.to_owned(),
        });
        Ok(n)
    }

    /// Indexes records mirror `t` just took from its source's link into `partition` (durable,
    /// from offset `base`), so the progress that covers them settles them without reading
    /// them back. Never waits: while the index is busy (a progress message holds it, maybe
    /// reading), the batch's origins wait beside it (at most [`MAX_DEFERRED`] records) and
    /// the next holder indexes them first; records none of this takes (no index yet, too
    /// many waiting, or they do not follow what it looked at last) are read back at the next
    /// progress instead.
    pub(super) fn index_taken(
        &self,
        t: &Topic,
        source: Source,
        partition: u32,
        base: u64,
        records: &[NewRecord],
    ) {
        let Some(index) = self.mirror_indexes.lock().get(&t.id()).cloned() else {
            return;
        };
        let Ok(mut index) = index.try_lock() else {
            let mut deferred = self.mirror_deferred.lock();
            let (waiting, held) = deferred.entry(t.id()).or_default();
            if *held + records.len() <= MAX_DEFERRED {
                *held += records.len();
                waiting.push(Deferred {
                    source,
                    partition,
                    base,
                    origins: records.iter().map(|r| origin_of(&r.headers)).collect(),
                });
            }
            return;
        };
        self.index_deferred(t, &mut index);
        let origin = |i: usize| origin_of(&records[i].headers);
        self.index_batch(
            t,
            &mut index,
            source,
            partition,
            base,
            records.len(),
            origin,
        );
    }

    /// Indexes the batches that waited while `index` was busy (its holder calls this first).
    fn index_deferred(&self, t: &Topic, index: &mut MirrorIndex) {
        let waiting = self.mirror_deferred.lock().remove(&t.id());
        for d in waiting.into_iter().flat_map(|(w, _)| w) {
            let origin = |i: usize| d.origins[i];
            self.index_batch(
                t,
                index,
                d.source,
                d.partition,
                d.base,
                d.origins.len(),
                origin,
            );
        }
    }

    /// Indexes one batch of `len` records of `t`'s partition `partition` from `base`, the
    /// `i`th with origin `origin(i)` (the caller holds the index).
    #[allow(clippy::too_many_arguments)]
    fn index_batch(
        &self,
        t: &Topic,
        index: &mut MirrorIndex,
        source: Source,
        partition: u32,
        base: u64,
        len: usize,
        origin: impl Fn(usize) -> Option<origin::Hop>,
    ) {
        if index.source != source {
            return;
        }
        let Some(part) = t.partitions().get(partition as usize).cloned() else {
            return;
        };
        let p = partition as usize;
        if index.scanned.len() <= p {
            index.scanned.resize_with(p + 1, Looked::default);
        }
        let end = base + len as u64;
        let mut q = part.queue.lock();
        // everything below `start` was looked at (or is settled)
        let start = index.scanned[p].advance(q.frontier());
        let from = start.max(base);
        // (a batch above a gap is kept aside, so long as there are not too many)
        if from >= end || (from > start && index.scanned[p].ahead.len() >= MAX_AHEAD) {
            return;
        }
        let mut settled = 0u64;
        let mut upto = end;
        for offset in from..end {
            let hop = origin((offset - base) as usize);
            match index.look_origin(&mut q, (partition, offset), hop) {
                Indexed::Settled(now) => settled += u64::from(now),
                Indexed::Skipped | Indexed::Kept => {}
                // the rest is left for the read at the next progress, which logs it
                Indexed::Full => {
                    upto = offset;
                    break;
                }
            }
        }
        drop(q);
        let looked = &mut index.scanned[p];
        if from == start {
            looked.advance(upto);
        } else if upto > from {
            looked.ahead.insert(from, upto);
        }
        self.count_settled(t, settled);
    }

    /// Records mirror `topic`'s index read back from the log so far (tests).
    #[cfg(test)]
    pub(super) async fn mirror_read_back(&self, topic: &str) -> u64 {
        let t = self.topic(topic).unwrap();
        let index = self.mirror_indexes.lock().get(&t.id()).cloned();
        match index {
            Some(i) => i.lock().await.read_back,
            None => 0,
        }
    }

    fn count_settled(&self, t: &Topic, settled: u64) {
        if settled > 0 {
            self.metrics
                .mirror_settled
                .get_or_create(&TopicLabel {
                    topic: t.meta.read().name.clone(),
                })
                .inc_by(settled);
        }
    }

    fn mirror_index(&self, t: &Arc<Topic>, source: Source) -> Arc<tokio::sync::Mutex<MirrorIndex>> {
        let mut all = self.mirror_indexes.lock();
        let fresh = || {
            Arc::new(tokio::sync::Mutex::new(MirrorIndex {
                source,
                scanned: Vec::new(),
                pending: Default::default(),
                progress: BTreeMap::new(),
                received: BTreeMap::new(),
                ends: BTreeMap::new(),
                full_logged: false,
                read_back: 0,
            }))
        };
        let entry = all.entry(t.id()).or_insert_with(fresh);
        // (another source: the topic was promoted and became another one's mirror since)
        if entry.try_lock().is_ok_and(|i| i.source != source) {
            *entry = fresh();
        }
        entry.clone()
    }

    /// Reads what `index` has not looked at yet of `t`'s local partitions, then settles every
    /// indexed record the progress covers.
    async fn settle_covered(
        self: &Arc<Self>,
        t: &Arc<Topic>,
        index: &mut MirrorIndex,
        budget: &mut u64,
    ) -> Result<u64, BrokerError> {
        // what came while the index was busy first: it need not be read back
        self.index_deferred(t, index);
        let meta = t.meta.read().clone();
        let parts = t.partitions();
        if index.scanned.len() < parts.len() {
            index.scanned.resize_with(parts.len(), Looked::default);
        }
        let mut settled = 0u64;
        for (i, part) in parts.iter().enumerate() {
            if !self.is_local(&meta, i as u32) {
                continue;
            }
            let (frontier, hwm) = {
                let q = part.queue.lock();
                (q.frontier(), q.hwm())
            };
            // what was not looked at yet: up to the next batch indexed as it came
            // (what was looked at stays in the index across each read: a caller dropped
            // mid-read, say a client gone, leaves it as it was)
            let mut next = index.scanned[i].advance(frontier);
            let mut full = false;
            while next < hwm && !full && *budget > 0 {
                let stop = index.scanned[i]
                    .ahead
                    .keys()
                    .next()
                    .map_or(hwm, |&s| s.min(hwm));
                let max = (stop.saturating_sub(next).min(*budget) as usize).clamp(1, 4096);
                let records = match self.read_slab(part, next, max).await? {
                    Ok(r) => r,
                    Err(oldest) => {
                        next = index.scanned[i].advance(oldest);
                        continue;
                    }
                };
                let Some(last) = records.last().map(|r| r.offset) else {
                    break;
                };
                index.read_back += records.len() as u64;
                *budget = budget.saturating_sub(records.len() as u64);
                let mut q = part.queue.lock();
                let mut upto = last + 1;
                for r in &records {
                    match index.look(&mut q, (i as u32, r.offset), &r.headers) {
                        Indexed::Settled(now) => settled += u64::from(now),
                        Indexed::Skipped | Indexed::Kept => {}
                        Indexed::Full => {
                            upto = r.offset;
                            full = true;
                            break;
                        }
                    }
                }
                drop(q);
                next = index.scanned[i].advance(upto);
            }
            if index.pending.len() >= MAX_INDEXED && !index.full_logged {
                index.full_logged = true;
                tracing::warn!(topic = %meta.name, indexed = index.pending.len(), "a mirror's index of unsettled records is full: records beyond it are not settled by the source's progress (processed again after a promote)");
            }
        }
        // indexed records the progress covers now, a bounded batch at a time (a second's
        // worth of records collected at once took fresh pages every time)
        let MirrorIndex {
            progress, pending, ..
        } = index;
        let mut batch = Vec::with_capacity(SETTLE_BATCH);
        for (&op, p) in progress.iter() {
            let ranges = std::iter::once((0, p.frontier)).chain(p.acked.iter().copied());
            for (s, e) in ranges {
                loop {
                    batch.clear();
                    batch.extend(
                        pending
                            .range((op, s, 0, 0)..(op, e, 0, 0))
                            .take(SETTLE_BATCH)
                            .copied(),
                    );
                    if batch.is_empty() {
                        break;
                    }
                    for &k in &batch {
                        pending.remove(&k);
                        let (_, _, lp, lo) = k;
                        if let Some(part) = parts.get(lp as usize) {
                            settled += u64::from(part.queue.lock().settle_processed(lo));
                        }
                    }
                }
            }
        }
        self.count_settled(t, settled);
        Ok(settled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_reports_merge_into_the_mirrors() {
        let part =
            |received_to, end: Option<u64>, unreceived, age: Option<i64>, leased| OriginReport {
                partition: 0,
                received_to,
                source_end: end,
                unreceived,
                acked_frontier: received_to / 2,
                source_leased: leased,
                source_unreturned: 0,
                progress_age_ms: age,
                source_demoted: true,
                children: vec![],
                children_returned: vec![],
            };
        let a = MirrorReport {
            partitions: vec![part(40, Some(50), 10, Some(900), 3)],
            settled: 5,
            drained: false,
            unanswered: vec![],
        };
        let b = MirrorReport {
            partitions: vec![part(50, Some(50), 0, Some(100), 0)],
            settled: 7,
            drained: false,
            unanswered: vec![9],
        };
        // a member that never got progress knows only what it holds
        let c = MirrorReport {
            partitions: vec![part(30, None, 0, None, 0)],
            settled: 0,
            drained: false,
            unanswered: vec![],
        };
        let m = MirrorReport::merge([a, b, c]);
        assert_eq!(m.settled, 12);
        assert_eq!(m.unanswered, vec![9]);
        let p = &m.partitions[0];
        assert_eq!(
            (
                p.received_to,
                p.unreceived,
                p.acked_frontier,
                p.source_leased
            ),
            (50, 0, 25, 0)
        );
        assert_eq!(p.progress_age_ms, Some(100));
        assert!(m.drained, "{m:?}");
        assert!(!MirrorReport::merge([]).drained);
    }

    #[test]
    fn progress_covers_its_frontier_and_ranges_and_is_checked() {
        let p = PartitionProgress {
            frontier: 5,
            acked: vec![(7, 9), (12, 13)],
            children: vec![],
            children_returned: vec![],
        };
        p.validate().unwrap();
        let covered: Vec<u64> = (0..15).filter(|&o| p.covers(o)).collect();
        assert_eq!(covered, vec![0, 1, 2, 3, 4, 7, 8, 12]);
        assert_eq!(
            p.clamped(8),
            PartitionProgress {
                frontier: 5,
                acked: vec![(7, 8)],
                children: vec![],
                children_returned: vec![],
            }
        );
        assert_eq!(p.clamped(3).frontier, 3);
        for bad in [
            vec![(5, 6)],
            vec![(7, 7)],
            vec![(9, 10), (8, 12)],
            vec![(7, 9), (9, 10)],
        ] {
            let p = PartitionProgress {
                frontier: 5,
                acked: bad,
                children: vec![],
                children_returned: vec![],
            };
            assert!(p.validate().is_err(), "{p:?}");
        }
    }
}
