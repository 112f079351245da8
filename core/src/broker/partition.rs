//! One partition of a topic: its log (opened lazily, closed when idle) and its queue state.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::clock::SharedClock;
use crate::log::{LogConfig, LogError, LogStats, PartitionLog, SealedSegment};
use crate::metrics::CoreMetrics;
use crate::queue::{MAX_PERSISTED_COUNTS, PartitionQueue, QueueSnapshot};

use super::journal::DeliveryJournal;

pub const QUEUE_STATE_FILE: &str = "queue.state";
/// Present while the partition is frozen for a move (see [`Partition::freeze`]): holds the
/// freeze's token, so a restart keeps the partition frozen until the cluster says whether
/// it moved.
pub const FREEZE_MARKER: &str = "move.frozen";
/// The leases a partition's previous owner had handed out when it froze for a move: the
/// new owner holds those messages until the leases would have ended (no reader gets a
/// message another may still be working on). `u64 offset, i64 deadline_ms` each, then a
/// CRC32C of it all; a file that does not check is ignored (the messages are then
/// delivered again at once: a duplicate, never a loss).
pub const MOVED_LEASES: &str = "leases.moved";

/// The node's budget of open partition logs (`max_open_logs`). Every open log holds file
/// descriptors (a read handle per segment and a write handle for the active one), so this is
/// what keeps many topics × partitions from exhausting the process's descriptor limit: past
/// it, the least recently used idle logs are closed (see `Broker::log_of`), and with none
/// idle a use that needs one more log is refused with a retryable error.
#[derive(Debug)]
pub(crate) struct OpenLogs {
    max: usize,
    open: AtomicUsize,
}

impl OpenLogs {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            open: AtomicUsize::new(0),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// A slot for one more open log, if the budget has room.
    pub fn try_acquire(self: &Arc<Self>) -> Option<LogSlot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| LogSlot(self.clone()))
    }
}

/// One open log's place in [`OpenLogs`]; given back when dropped (the log closed).
#[derive(Debug)]
pub(crate) struct LogSlot(Arc<OpenLogs>);

impl Drop for LogSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) struct Partition {
    pub index: u32,
    pub dir: PathBuf,
    log: Mutex<Option<Arc<PartitionLog>>>,
    /// The budget slot the open log holds; `Some` exactly while `log` is (set and cleared
    /// under `opening`).
    slot: Mutex<Option<LogSlot>>,
    /// Serialises opening and closing the log.
    opening: tokio::sync::Mutex<()>,
    /// Closed for good (its topic was deleted): never reopened, or a request still holding
    /// the partition would make its directory again after the delete removed it.
    retired: AtomicBool,
    pub queue: Mutex<PartitionQueue>,
    pub last_used_ms: AtomicI64,
    /// Offsets below this are in the archive (uploaded and verified); with an archive
    /// configured, retention deletes nothing at or above it.
    pub archived_below: AtomicU64,
    last_stats: Mutex<LogStats>,
    /// The sealed segments when the log last closed: a closed log seals nothing, so this
    /// answers the archive's question without reopening (and evicting another log).
    last_sealed: Mutex<Vec<SealedSegment>>,
    persist_lock: Mutex<()>,
    /// Delivery counts as they are handed out, between two snapshots. Lock order: `journal`
    /// before `queue` (see [`Partition::persist_queue`]); never taken while holding `queue`.
    journal: Mutex<DeliveryJournal>,
    /// The journal's last write failed (logged once, until one succeeds).
    journal_failing: AtomicBool,
    /// The last snapshot had no room for every delivery count (logged once per episode).
    counts_truncated: AtomicBool,
    /// Frozen for a move: no appends, no leases, no settles, the log stays closed.
    frozen: AtomicBool,
    /// A placeholder for a partition this node rebuilds from the archive (its lost owner's):
    /// nothing is appended, leased, settled or read here until the rebuilt copy replaces it.
    awaiting_rebuild: AtomicBool,
    /// Opened when a cluster member started: not served until it is checked against what
    /// the cluster saw acknowledged (a member restored from an older copy of its data
    /// directory must not hand out again offsets it acknowledged before).
    unverified: AtomicBool,
    /// The freeze's token and until when it holds (see [`Partition::freeze`]).
    pub(crate) freeze: Mutex<Option<Freeze>>,
    /// Appends, takes and settles in progress (see [`Partition::enter`]).
    busy: AtomicU64,
    /// Woken when `busy` drops to 0.
    idle: tokio::sync::Notify,
    /// Woken when a freeze ends (thawed, or the partition moved away).
    pub(crate) thawed: tokio::sync::Notify,
}

/// A freeze for a move: its token and its deadline (real time: a move's timing, no broker
/// clock involved).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Freeze {
    pub token: u64,
    pub until: std::time::Instant,
    /// The move it was taken for (`None`: a marker written before moves named themselves).
    pub move_id: Option<u64>,
}

/// One append, take or settle in progress on a partition that is not frozen; a freeze
/// waits for every one to end.
pub(crate) struct Busy(Arc<Partition>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// What [`Partition::persist_queue`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Persisted {
    /// A snapshot was written.
    pub written: bool,
    /// Delivery counts the snapshot had no room for ([`MAX_PERSISTED_COUNTS`]).
    pub counts_left_out: usize,
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("index", &self.index)
            .finish()
    }
}

pub(crate) struct LogEnv {
    pub cfg: LogConfig,
    pub clock: SharedClock,
    pub metrics: Arc<CoreMetrics>,
    pub max_ack_ranges: usize,
}

impl Partition {
    /// Opens the partition's log (recovering it) and restores its queue state. Blocking.
    /// The log is left open without a budget slot: the caller gives it one with
    /// [`Partition::adopt_slot`] or closes it.
    pub fn open(index: u32, dir: PathBuf, env: &LogEnv) -> Result<Self, LogError> {
        let (log, report) = PartitionLog::open(
            &dir,
            env.cfg.clone(),
            env.clock.clone(),
            env.metrics.clone(),
        )?;
        if let Some(bytes) = report.torn_tail_bytes {
            tracing::warn!(dir = %dir.display(), bytes, "recovered partition after truncating a torn tail");
        }
        let stats = log.stats();
        let snapshot = read_snapshot(&dir)?;
        let mut snapshot = snapshot.unwrap_or_default();
        if snapshot.frontier > stats.next_offset {
            tracing::error!(
                dir = %dir.display(),
                frontier = snapshot.frontier,
                next_offset = stats.next_offset,
                "queue frontier is past the end of the log; the log lost data, resetting the frontier"
            );
            snapshot = QueueSnapshot {
                frontier: stats.next_offset,
                ..Default::default()
            };
        }
        snapshot.acked.retain(|&(_, e)| e <= stats.next_offset);
        let mut queue = PartitionQueue::new(
            snapshot,
            stats.oldest_offset,
            stats.next_offset,
            crate::random_u64(),
            env.max_ack_ranges,
        );
        // Counts handed out after the snapshot (the queue ignores settled offsets, and a
        // count already in the snapshot is never lowered).
        let now = env.clock.now_ms();
        for (offset, deadline) in read_moved_leases(&dir)? {
            if deadline > now {
                queue.hold(offset, deadline);
            }
        }
        let freeze = read_freeze_marker(&dir)?;
        let journal = DeliveryJournal::open(&dir, |offset, count| {
            queue.restore_counts([(offset, count)]);
        })
        .map_err(|source| LogError::Io {
            path: dir.clone(),
            source,
        })?;
        if journal.has_files() {
            // the first snapshot takes the journals in and lets them go
            queue.force_dirty();
        }
        Ok(Self {
            index,
            dir,
            log: Mutex::new(Some(Arc::new(log))),
            slot: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            retired: AtomicBool::new(false),
            queue: Mutex::new(queue),
            last_used_ms: AtomicI64::new(env.clock.now_ms()),
            archived_below: AtomicU64::new(0),
            last_stats: Mutex::new(stats),
            last_sealed: Mutex::new(Vec::new()),
            persist_lock: Mutex::new(()),
            journal: Mutex::new(journal),
            journal_failing: AtomicBool::new(false),
            counts_truncated: AtomicBool::new(false),
            frozen: AtomicBool::new(freeze.is_some()),
            awaiting_rebuild: AtomicBool::new(false),
            unverified: AtomicBool::new(false),
            // a freeze found at open holds for a full term from now (the cluster decides)
            freeze: Mutex::new(freeze.map(|(token, move_id)| Freeze {
                move_id,
                token,
                until: std::time::Instant::now() + DEFAULT_FREEZE_TTL,
            })),
            busy: AtomicU64::new(0),
            idle: tokio::sync::Notify::new(),
            thawed: tokio::sync::Notify::new(),
        })
    }

    /// Starts an append, take or settle: `None` while the partition is frozen. A freeze
    /// waits until every [`Busy`] handed out before it is dropped.
    pub fn enter(self: &Arc<Self>) -> Option<Busy> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        if self.is_frozen() || self.is_awaiting_rebuild() || self.is_unverified() {
            self.leave();
            return None;
        }
        Some(Busy(self.clone()))
    }

    fn leave(&self) {
        if self.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// This is a placeholder until the partition is rebuilt here from the archive.
    pub fn is_awaiting_rebuild(&self) -> bool {
        self.awaiting_rebuild.load(Ordering::SeqCst)
    }

    pub(crate) fn await_rebuild(&self) {
        self.awaiting_rebuild.store(true, Ordering::SeqCst);
    }

    /// Not served until checked against what the cluster saw acknowledged (see
    /// [`super::Broker::unverified`]).
    pub fn is_unverified(&self) -> bool {
        self.unverified.load(Ordering::SeqCst)
    }

    pub(crate) fn hold_unverified(&self) {
        self.unverified.store(true, Ordering::SeqCst);
    }

    pub(crate) fn set_verified(&self) {
        if self.unverified.swap(false, Ordering::SeqCst) {
            self.thawed.notify_waiters();
        }
    }

    /// Freezes the partition under `token` (for move `move_id`) until `until`: the marker is durable first (a
    /// restart stays frozen), then no new append, take or settle starts, and this returns
    /// once those in progress ended (at most `drain`; else the freeze is undone and `false`
    /// returned). The caller then closes the log. Blocking parts run on the caller's thread:
    /// call it from a blocking-friendly context (the marker write is one small file).
    pub async fn freeze(
        &self,
        token: u64,
        move_id: u64,
        until: std::time::Instant,
        drain: std::time::Duration,
    ) -> std::io::Result<bool> {
        let earlier = {
            let mut f = self.freeze.lock();
            if let Some(f) = f.as_mut()
                && f.token == token
            {
                f.until = f.until.max(until);
                return Ok(true);
            }
            if f.is_some_and(|f| f.move_id != Some(move_id)) {
                return Err(std::io::Error::other(
                    "the partition is frozen for another move",
                ));
            }
            *f
        };
        {
            if let Some(held) = earlier {
                // the same move's earlier freeze (another attempt's token): still frozen and
                // drained since, so the new attempt's token takes it over, durably first
                let dir = self.dir.clone();
                tokio::task::spawn_blocking(move || write_freeze_marker(&dir, token, move_id))
                    .await
                    .map_err(std::io::Error::other)??;
                let mut f = self.freeze.lock();
                if f.is_some_and(|now| now.token == held.token) {
                    *f = Some(Freeze {
                        token,
                        until: held.until.max(until),
                        move_id: Some(move_id),
                    });
                    tracing::info!(dir = %self.dir.display(), move_id, "a move's new attempt took over the freeze its earlier attempt held");
                    return Ok(true);
                }
                return Err(std::io::Error::other(
                    "the partition's freeze changed while it was taken over",
                ));
            }
        }
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || write_freeze_marker(&dir, token, move_id))
            .await
            .map_err(std::io::Error::other)??;
        *self.freeze.lock() = Some(Freeze {
            token,
            until,
            move_id: Some(move_id),
        });
        self.frozen.store(true, Ordering::SeqCst);
        let drained = tokio::time::timeout(drain, async {
            loop {
                let idle = self.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                if self.busy.load(Ordering::SeqCst) == 0 {
                    return;
                }
                idle.await;
            }
        })
        .await
        .is_ok();
        if !drained {
            self.thaw().await?;
        }
        Ok(drained)
    }

    /// Writes the leases held now to [`MOVED_LEASES`] (frozen for a move: the copy takes
    /// them to the new owner). Blocking.
    pub fn write_moved_leases(&self) -> std::io::Result<()> {
        let held = self.queue.lock().held_leases();
        let mut out = Vec::with_capacity(held.len() * 16 + 4);
        for (o, d) in held {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&d.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        crate::fsutil::write_file_atomic(&self.dir.join(MOVED_LEASES), &out)
    }

    /// Ends the freeze (its marker removed first, so a restart does not freeze again).
    pub async fn thaw(&self) -> std::io::Result<()> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || remove_freeze_marker(&dir))
            .await
            .map_err(std::io::Error::other)??;
        *self.freeze.lock() = None;
        self.frozen.store(false, Ordering::SeqCst);
        self.thawed.notify_waiters();
        Ok(())
    }

    /// Journals the delivery counts of a consume reply before it is returned: one write into
    /// the page cache, so a process crash (kill -9, panic, OOM) cannot lose them. If the write
    /// fails the reply still goes (consumers can drain a full disk) and the next maintenance
    /// pass writes a snapshot, which holds every count; until then a crash may lose these.
    pub fn journal_deliveries(&self, entries: &[(u64, u32)]) {
        if entries.is_empty() {
            return;
        }
        let result = self.journal.lock().append(entries);
        match result {
            Ok(()) => {
                if self.journal_failing.swap(false, Ordering::AcqRel) {
                    tracing::info!(dir = %self.dir.display(), "deliveries journal writable again");
                }
            }
            Err(e) => {
                if !self.journal_failing.swap(true, Ordering::AcqRel) {
                    tracing::error!(dir = %self.dir.display(), error = %e, "could not journal delivery counts; a snapshot will hold them, until then a crash may lose them");
                }
                self.queue.lock().force_dirty();
            }
        }
    }

    /// Whether the maintenance pass has something to write: acks or a big journal for a
    /// snapshot, or journal bytes to `fdatasync`.
    pub fn persist_due(&self) -> bool {
        // one lock at a time: `queue` is never held while `journal` is taken
        let dirty = self.queue.lock().is_dirty();
        dirty || self.journal.lock().needs_work()
    }

    pub fn touch(&self, now_ms: i64) {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
    }

    pub fn is_open(&self) -> bool {
        self.log.lock().is_some()
    }

    /// Gives the log opened by [`Partition::open`] its budget slot.
    pub fn adopt_slot(&self, slot: LogSlot) {
        *self.slot.lock() = Some(slot);
    }

    /// The open log, reopening it if it was closed for idleness; a reopened log takes `slot`
    /// (dropped, so given back, when the log was open already).
    pub async fn log(&self, env: &LogEnv, slot: LogSlot) -> Result<Arc<PartitionLog>, LogError> {
        if let Some(log) = self.log.lock().clone() {
            return Ok(log);
        }
        let _guard = self.opening.lock().await;
        if let Some(log) = self.log.lock().clone() {
            return Ok(log);
        }
        if self.retired.load(Ordering::Acquire) {
            return Err(LogError::Closed);
        }
        let dir = self.dir.clone();
        let (cfg, clock, metrics) = (env.cfg.clone(), env.clock.clone(), env.metrics.clone());
        let (log, _) =
            tokio::task::spawn_blocking(move || PartitionLog::open(&dir, cfg, clock, metrics))
                .await
                .map_err(|e| LogError::Poisoned(format!("log open task failed: {e}")))??;
        let log = Arc::new(log);
        *self.log.lock() = Some(log.clone());
        *self.slot.lock() = Some(slot);
        Ok(log)
    }

    /// The log if it is open, without reopening it.
    pub fn open_log(&self) -> Option<Arc<PartitionLog>> {
        self.log.lock().clone()
    }

    /// The sealed segments: the open log's, or those it had when it closed.
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        match self.open_log() {
            Some(log) => log.sealed_segments(),
            None => self.last_sealed.lock().clone(),
        }
    }

    pub fn stats(&self) -> LogStats {
        match self.open_log() {
            Some(log) => {
                let s = log.stats();
                *self.last_stats.lock() = s;
                s
            }
            None => *self.last_stats.lock(),
        }
    }

    /// Closes the log if nobody is using it. Returns whether it closed.
    pub async fn close_if_unused(&self) -> bool {
        let _guard = self.opening.lock().await;
        let log = {
            let mut slot = self.log.lock();
            match &*slot {
                // A poisoned log stays open: reopening would re-run recovery and could serve
                // bytes that never reached the disk. It recovers at the next restart.
                Some(l) if Arc::strong_count(l) == 1 && l.is_poisoned().is_none() => slot.take(),
                _ => None,
            }
        };
        match log {
            Some(log) => {
                // the figures once the close has written the appends still queued (a
                // producer's append in flight holds no reference to the log: taken before,
                // they stayed behind until it reopened, in /metrics too)
                log.close().await;
                *self.last_stats.lock() = log.stats();
                *self.last_sealed.lock() = log.sealed_segments();
                drop(log);
                self.slot.lock().take();
                self.release_journal_file();
                true
            }
            None => false,
        }
    }

    /// Closes the log for good (its topic was deleted): [`Partition::log`] no longer reopens
    /// it.
    pub async fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        self.close().await;
    }

    /// Closes the log, waiting for its queued appends.
    pub async fn close(&self) {
        let _guard = self.opening.lock().await;
        let log = self.log.lock().take();
        if let Some(log) = log {
            log.close().await;
            *self.last_stats.lock() = log.stats();
            *self.last_sealed.lock() = log.sealed_segments();
        }
        self.slot.lock().take();
    }

    /// Writes the queue snapshot if acks changed it or the deliveries journal grew past
    /// [`super::journal::JOURNAL_SNAPSHOT_BYTES`] (with `compact`, at shutdown: if any journal
    /// is on disk), then deletes the journals it covers. Blocking.
    ///
    /// The capture and the journal's rotation happen under the journal's lock: a delivery
    /// counted after the capture is journaled after it too, so into a newer generation than
    /// the ones this snapshot lets go. A crash after the snapshot is durable but before the
    /// old journals are deleted replays them over it, which changes nothing (max).
    pub fn persist_queue(&self, compact: bool) -> std::io::Result<Persisted> {
        let _one_writer = self.persist_lock.lock();
        let (snapshot, counts_left_out, covered) = {
            let mut journal = self.journal.lock();
            let mut q = self.queue.lock();
            if !(q.is_dirty() || journal.wants_snapshot() || (compact && journal.has_files())) {
                return Ok(Persisted::default());
            }
            q.mark_clean();
            let snapshot = q.snapshot();
            let left_out = q.counts_left_out();
            drop(q);
            (snapshot, left_out, journal.rotate())
        };
        if let Err(e) = write_snapshot(&self.dir, &snapshot) {
            // Try again on the next pass; the journals stay until a snapshot is durable.
            self.queue.lock().force_dirty();
            return Err(e);
        }
        if let Some(covered) = covered {
            self.journal.lock().remove_through(covered);
        }
        self.note_counts_left_out(counts_left_out);
        Ok(Persisted {
            written: true,
            counts_left_out,
        })
    }

    fn note_counts_left_out(&self, left_out: usize) {
        let was = self.counts_truncated.swap(left_out > 0, Ordering::AcqRel);
        if left_out > 0 && !was {
            tracing::warn!(dir = %self.dir.display(), left_out, bound = MAX_PERSISTED_COUNTS, "more leased, unacked messages than a queue snapshot keeps delivery counts for: the counts of the highest offsets are not persisted and restart from 0 after a restart");
        } else if left_out == 0 && was {
            tracing::info!(dir = %self.dir.display(), "every delivery count fits in the queue snapshot again");
        }
    }

    /// Makes the deliveries journal durable (`fdatasync`) if it grew since the last call, so
    /// that a power loss costs at most the counts of one maintenance interval. On failure the
    /// next pass writes a snapshot instead. Blocking.
    pub fn sync_journal(&self) -> std::io::Result<()> {
        let pending = self.journal.lock().pending_sync();
        let result = pending.and_then(|p| p.map_or(Ok(()), |p| p.run()));
        if result.is_err() {
            self.queue.lock().force_dirty();
        }
        result
    }

    /// After the log closed: the journal's file should not hold a descriptor for an idle
    /// partition, so the next pass writes a snapshot, which closes it.
    fn release_journal_file(&self) {
        let open = self.journal.lock().has_open_file();
        if open {
            self.queue.lock().force_dirty();
        }
    }
}

/// Reads one of the partition's own files at open: `Ok(None)` when it is not there. A
/// shortage of file descriptors fails the open, to be tried again: it says nothing of the
/// file, and taken as a missing or unreadable one it would reset the queue, drop leases or
/// freeze the partition. Any other error is the caller's to judge (`Ok(Some(Err(_)))`).
fn read_own(path: &Path) -> Result<Option<std::io::Result<Vec<u8>>>, LogError> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(Ok(b))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) if crate::log::is_out_of_descriptors(&source) => Err(LogError::Io {
            path: path.to_owned(),
            source,
        }),
        Err(e) => Ok(Some(Err(e))),
    }
}

/// The leases a previous owner handed over ([`MOVED_LEASES`]); none if the file is
/// missing, unreadable, damaged or implausibly large.
fn read_moved_leases(dir: &Path) -> Result<Vec<(u64, i64)>, LogError> {
    let Some(Ok(data)) = read_own(&dir.join(MOVED_LEASES))? else {
        return Ok(Vec::new());
    };
    if data.len() < 4 || (data.len() - 4) % 16 != 0 || data.len() > 64 << 20 {
        return Ok(Vec::new());
    }
    let (body, crc) = data.split_at(data.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        tracing::warn!(dir = %dir.display(), "moved leases file does not check; its messages are delivered again at once");
        return Ok(Vec::new());
    }
    Ok(body
        .chunks_exact(16)
        .map(|c| {
            (
                u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                i64::from_le_bytes(c[8..].try_into().expect("8 bytes")),
            )
        })
        .collect())
}

/// How long a freeze holds without its mover renewing it, and how long one found at open
/// holds before the owner asks the cluster whether it may thaw.
pub const DEFAULT_FREEZE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// The freeze marker's token and move id, if there is one (an 8-byte marker predates move
/// ids). A marker that cannot be read keeps the partition frozen under token 0, which no flip
/// names: better unavailable than written past a flip ([`read_own`]: not for want of a
/// descriptor, which would hold until a restart on a single node, where nothing thaws it).
fn read_freeze_marker(dir: &Path) -> Result<Option<(u64, Option<u64>)>, LogError> {
    let word = |b: &[u8], at: usize| {
        b.get(at..at + 8)
            .map(|t| u64::from_le_bytes(t.try_into().expect("8 bytes")))
    };
    Ok(match read_own(&dir.join(FREEZE_MARKER))? {
        None => None,
        Some(Ok(b)) => Some((word(&b, 0).unwrap_or(0), word(&b, 8))),
        Some(Err(e)) => {
            tracing::error!(dir = %dir.display(), error = %e, "cannot read the partition's freeze marker: it stays frozen");
            Some((0, None))
        }
    })
}

fn write_freeze_marker(dir: &Path, token: u64, move_id: u64) -> std::io::Result<()> {
    let mut b = token.to_le_bytes().to_vec();
    b.extend_from_slice(&move_id.to_le_bytes());
    crate::fsutil::write_file_atomic(&dir.join(FREEZE_MARKER), &b)
}

fn remove_freeze_marker(dir: &Path) -> std::io::Result<()> {
    // (the leases it wrote for the copy are its own again)
    let _ = std::fs::remove_file(dir.join(MOVED_LEASES));
    match std::fs::remove_file(dir.join(FREEZE_MARKER)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    crate::log::segment::sync_dir(dir)
}

pub(super) fn read_snapshot(dir: &Path) -> Result<Option<QueueSnapshot>, LogError> {
    let path = dir.join(QUEUE_STATE_FILE);
    let snap = match read_own(&path)? {
        None => return Ok(None),
        Some(Ok(data)) => QueueSnapshot::decode(&data),
        Some(Err(e)) => {
            tracing::error!(path = %path.display(), error = %e, "cannot read the queue state");
            None
        }
    };
    if snap.is_none() {
        tracing::error!(path = %path.display(), "queue state is corrupt or unreadable; starting from the beginning of the log (messages will be redelivered)");
    }
    Ok(snap)
}

pub(super) fn write_snapshot(dir: &Path, snap: &QueueSnapshot) -> std::io::Result<()> {
    crate::fsutil::write_file_atomic(&dir.join(QUEUE_STATE_FILE), &snap.encode())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log closed (idle or evicted) keeps the figures it has once the appends still queued
    /// for it are written: a producer's append in flight holds no reference to the log, so
    /// figures taken before the close stayed one record behind until the log reopened, in
    /// the topic's stats and /metrics alike (found by a black-box review).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_logs_figures_count_the_appends_it_wrote_while_closing() {
        use crate::log::disk::faults::FaultDisk;
        use crate::log::wal::{Wal, WalConfig};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let disk = FaultDisk::new();
        let metrics = Arc::new(CoreMetrics::default());
        let (wal, _) = Wal::open_faulty(
            &root.join("wal"),
            root,
            WalConfig::default(),
            metrics.clone(),
            disk.clone(),
        )
        .unwrap();
        let env = LogEnv {
            cfg: LogConfig {
                wal: Some(wal.clone()),
                ..LogConfig::default()
            },
            clock: crate::clock::ManualClock::new(1_000),
            metrics,
            max_ack_ranges: 1024,
        };
        let part = Partition::open(0, root.join("p0"), &env).unwrap();
        let record = || crate::record::NewRecord {
            key: None,
            headers: Vec::new(),
            payload: bytes::Bytes::from_static(b"m"),
            delay_ms: 0,
        };
        let log = part.open_log().unwrap();
        log.submit(vec![record()]).unwrap().await.unwrap().unwrap();
        // the next append waits in the WAL's sync; its producer holds no reference
        disk.hold_syncs_of(".wal");
        let appended = log.submit(vec![record()]).unwrap();
        drop(log);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while disk.held() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the sync was not held"
            );
            tokio::task::yield_now().await;
        }
        let (closed, ()) = tokio::join!(part.close_if_unused(), async {
            tokio::task::yield_now().await;
            disk.release_held();
        });
        assert!(closed);
        appended.await.unwrap().unwrap();
        assert!(part.open_log().is_none());
        let stats = part.stats();
        assert_eq!(stats.next_offset, 2, "{stats:?}");
        assert_eq!(
            stats.bytes,
            std::fs::metadata(root.join("p0").join("00000000000000000000.log"))
                .unwrap()
                .len(),
            "{stats:?}"
        );
        wal.shutdown();
    }

    /// A move's new attempt (a new token: its source or its target restarted, or froze,
    /// while the move held its freeze) takes over the freeze the same move's earlier attempt
    /// held, at once and durably (a restart keeps it under the new token); another move's
    /// freeze is still refused (before, the same move was refused too, "frozen for another
    /// move", until the freeze's 30 s term lapsed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_same_moves_new_attempt_takes_its_freeze_over() {
        use crate::log::wal::{Wal, WalConfig};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let metrics = Arc::new(CoreMetrics::default());
        let (wal, _) = Wal::open(
            &root.join("wal"),
            root,
            WalConfig::default(),
            metrics.clone(),
        )
        .unwrap();
        let env = LogEnv {
            cfg: LogConfig {
                wal: Some(wal.clone()),
                ..LogConfig::default()
            },
            clock: crate::clock::ManualClock::new(1_000),
            metrics,
            max_ack_ranges: 1024,
        };
        let part = Partition::open(0, root.join("p0"), &env).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let drain = std::time::Duration::from_secs(1);
        assert!(part.freeze(11, 7, until, drain).await.unwrap());
        part.close().await;
        // restarted: the marker holds the first attempt's freeze
        let part = Partition::open(0, root.join("p0"), &env).unwrap();
        assert_eq!(part.freeze.lock().map(|f| f.token), Some(11));
        assert!(part.freeze(22, 7, until, drain).await.unwrap());
        assert_eq!(
            part.freeze.lock().map(|f| (f.token, f.move_id)),
            Some((22, Some(7)))
        );
        assert!(part.is_frozen());
        let e = part.freeze(33, 8, until, drain).await.unwrap_err();
        assert!(e.to_string().contains("another move"), "{e}");
        part.close().await;
        let part = Partition::open(0, root.join("p0"), &env).unwrap();
        assert_eq!(part.freeze.lock().map(|f| f.token), Some(22), "durable");
        part.close().await;
        wal.shutdown();
    }

    /// With no file descriptor left, the freeze marker and the deliveries journals cannot be
    /// read: that fails the partition's open (to be tried again), where before it froze the
    /// partition until a restart. The test lowers its own process's RLIMIT_NOFILE, so it
    /// runs only under cargo nextest (a process per test); plain `cargo test` skips it.
    #[test]
    fn reads_that_find_no_descriptor_fail_the_open_and_freeze_nothing() {
        if std::env::var_os("NEXTEST").is_none() {
            eprintln!("skipped: needs a process of its own (cargo nextest)");
            return;
        }
        let prlimit = |nofile: &str| {
            std::process::Command::new("prlimit")
                .arg(format!("--pid={}", std::process::id()))
                .arg(format!("--nofile={nofile}"))
                .status()
        };
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let (soft, hard) = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w[3].to_owned(), w[4].to_owned())
            })
            .expect("the open-files limits");
        let held = std::fs::read_dir("/proc/self/fd").unwrap().count();
        if !prlimit(&format!("{}:{hard}", held + 8)).is_ok_and(|s| s.success()) {
            eprintln!("skipped: prlimit (util-linux) is not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // a queue state and handed-over leases that the reads below must not take as absent
        write_snapshot(dir.path(), &QueueSnapshot::default()).unwrap();
        std::fs::write(
            dir.path().join(MOVED_LEASES),
            crc32c::crc32c(&[]).to_le_bytes(),
        )
        .unwrap();
        // every descriptor left is taken, then given back before the limit is restored
        let mut fillers = Vec::new();
        let err = loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => fillers.push(f),
                Err(e) => break e,
            }
        };
        let marker = read_freeze_marker(dir.path());
        let journal = DeliveryJournal::open(dir.path(), |_, _| {});
        let snapshot = read_snapshot(dir.path());
        let leases = read_moved_leases(dir.path());
        drop(fillers);
        assert!(prlimit(&format!("{soft}:{hard}")).unwrap().success());
        assert!(crate::log::is_out_of_descriptors(&err), "{err}");
        assert!(
            matches!(&marker, Err(e) if e.is_out_of_descriptors()),
            "{marker:?}"
        );
        assert!(
            journal
                .as_ref()
                .is_err_and(crate::log::is_out_of_descriptors),
            "the journal opened without seeing the directory"
        );
        assert!(
            matches!(&snapshot, Err(e) if e.is_out_of_descriptors()),
            "the queue state taken as absent"
        );
        assert!(
            matches!(&leases, Err(e) if e.is_out_of_descriptors()),
            "{leases:?}"
        );
        // descriptors back: the state is read, no marker, no freeze
        assert!(read_snapshot(dir.path()).unwrap().is_some());
        assert_eq!(read_freeze_marker(dir.path()).unwrap(), None);
        assert!(DeliveryJournal::open(dir.path(), |_, _| {}).is_ok());
    }
}
