//! The partition log: append-only segments, group commit through the node's write-ahead
//! log, recovery, retention.
//!
//! ```text
//!  append() ──► WAL queue ──► WAL thread (one per node, see `wal`) ──► frames into the
//!                 segment (page cache) + one WAL write + ONE fdatasync for every partition
//!                 ──► publish (offsets, tail cache) ──► reply
//!  read() ─────────────────────────────────────────► tail cache, else pread
//! ```
//!
//! The WAL thread assigns offsets and commit timestamps (never decreasing) for every
//! partition, so concurrent appends are serialised in one place. An append is answered only
//! after the `fdatasync` of the WAL that covers it; readers only ever see records that sync
//! covered. Segment files are synced by the WAL's checkpoints (and at close), never per
//! append. A failed segment write poisons its log; a failed WAL write or fsync poisons every
//! log: appends fail until the process restarts and recovery (WAL replay, then the segment
//! scan) decides what really reached the disk.

#[cfg(test)]
mod crash_tests;
pub(crate) mod disk;
pub mod segment;
pub mod wal;

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, oneshot};

use crate::clock::SharedClock;
use crate::metrics::CoreMetrics;
use crate::record::{NewRecord, Record};
use disk::DataFile;
use segment::{ReadError, RecoveryError, Segment, SegmentMeta, SegmentReader};
pub use wal::{Wal, WalConfig, WalReplay};

#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Seal the active segment once it holds this many bytes (a segment may exceed it by at
    /// most one group-commit batch).
    pub segment_max_bytes: u64,
    /// Seal the active segment this long after its first record, so quiet partitions seal too.
    pub segment_max_age_ms: i64,
    /// Newest records kept decoded in memory, so consumers of fresh data never touch the
    /// disk. One budget for the whole node: every log opened with (a clone of) this config
    /// shares it, so many partitions do not multiply it.
    pub tail_cache: TailBudget,
    /// The node's write-ahead log every log opened with this config appends through. `None`:
    /// the log opens a private one in `<dir>/wal` (tools and tests that open one log).
    pub wal: Option<Wal>,
}

/// The node-wide memory budget of the partitions' tail caches.
///
/// Cached records are copies sized to what they hold (never slices of a request buffer,
/// which would keep the whole buffer alive while the budget counted only the payload), and
/// each counts its payload, key, headers and a fixed overhead. A partition that caches more
/// while the node is over the budget evicts its own oldest records down to its fair share
/// (the budget over the open caches), then the oldest records of the caches above their
/// share: a partition gone quiet cannot keep the busy ones from caching.
#[derive(Debug, Clone)]
pub struct TailBudget(Arc<TailBudgetInner>);

#[derive(Debug)]
struct TailBudgetInner {
    limit: usize,
    used: AtomicU64,
    /// Every open log's cache, for eviction across partitions.
    caches: Mutex<Vec<std::sync::Weak<Mutex<TailCache>>>>,
    /// Read cursors kept now, node-wide (at most [`MAX_READ_CURSORS`]).
    cursors: AtomicU64,
}

/// How many partitions may keep a read cursor at once, node-wide: with at most
/// [`READ_CURSOR_BYTES`] each, the cursors hold at most 16 MiB whatever the partition count.
const MAX_READ_CURSORS: u64 = 256;

/// The largest buffer a read cursor keeps (a reader's largest ordinary read).
const READ_CURSOR_BYTES: usize = 64 * 1024;

/// One of the node's [`MAX_READ_CURSORS`], given back when dropped.
#[derive(Debug)]
struct CursorSlot(TailBudget);

impl Drop for CursorSlot {
    fn drop(&mut self) {
        self.0.0.cursors.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a log's last read from disk stopped, with the bytes its reader had read past that
/// point: the next read from exactly there (a queue consuming its backlog one record at a
/// time) decodes from those bytes instead of reading the file again.
#[derive(Debug)]
struct ReadCursor {
    /// The segment the bytes are from (compared by address; the weak reference keeps the
    /// address from being reused while the cursor lives, not the segment's file open).
    segment: std::sync::Weak<Segment>,
    /// The offset the next read must start at to use it.
    next: u64,
    state: segment::ReaderState,
    slot: CursorSlot,
}

impl TailBudget {
    pub fn new(limit_bytes: usize) -> Self {
        Self(Arc::new(TailBudgetInner {
            limit: limit_bytes,
            used: AtomicU64::new(0),
            caches: Mutex::new(Vec::new()),
            cursors: AtomicU64::new(0),
        }))
    }

    /// A read cursor's slot, if fewer than [`MAX_READ_CURSORS`] are kept.
    fn cursor_slot(&self) -> Option<CursorSlot> {
        self.0
            .cursors
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_READ_CURSORS).then_some(n + 1)
            })
            .ok()
            .map(|_| CursorSlot(self.clone()))
    }

    fn register(&self, cache: &Arc<Mutex<TailCache>>) {
        let mut caches = self.0.caches.lock();
        caches.retain(|c| c.strong_count() > 0);
        caches.push(Arc::downgrade(cache));
    }

    /// Evicts the oldest records of the caches above their fair share until the node is
    /// within the budget (or every cache is at its share). Called with no cache locked.
    fn rebalance(&self) {
        let caches: Vec<Arc<Mutex<TailCache>>> = {
            let mut list = self.0.caches.lock();
            list.retain(|c| c.strong_count() > 0);
            list.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        let share = self.0.limit / caches.len().max(1);
        for cache in caches {
            if !self.over() {
                return;
            }
            // a cache busy elsewhere is skipped: its own writer rebalances after its push
            let Some(mut c) = cache.try_lock() else {
                continue;
            };
            while self.over() && c.bytes > share && c.pop_front() {}
        }
    }

    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// Bytes the caches of every open log hold now.
    pub fn used(&self) -> u64 {
        self.0.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.0.limit as u64
    }
}

/// Memory a cached record accounts for besides its bytes (the `Arc<Record>`, its vectors and
/// the allocator's per-allocation overhead).
const CACHED_RECORD_OVERHEAD: usize = 128;

/// What a cached record holds: its share of the group's frames (its whole frame: header,
/// fixed fields, key, headers, payload) and its own copies of the header names and values.
fn cached_size(r: &Record) -> usize {
    CACHED_RECORD_OVERHEAD
        + crate::record::FRAME_HEADER_LEN
        + 32
        + r.payload.len()
        + r.key.as_ref().map_or(0, Bytes::len)
        + r.headers
            .iter()
            .map(|(k, v)| 2 * (k.len() + v.len()) + 38)
            .sum::<usize>()
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_max_bytes: 64 * 1024 * 1024,
            segment_max_age_ms: 10 * 60 * 1000,
            tail_cache: TailBudget::new(64 * 1024 * 1024),
            wal: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(
        "partition log is poisoned by an earlier write or fsync failure ({0}); restart the broker to recover"
    )]
    Poisoned(String),
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    #[error("offset {requested} is older than the oldest retained offset {oldest}")]
    Truncated { requested: u64, oldest: u64 },
    #[error("corrupt record in {path}: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: ReadError,
    },
    #[error("partition log is closed")]
    Closed,
}

/// `EMFILE` (this process) and `ENFILE` (the whole system): out of file descriptors. The
/// values are the same on Linux, the BSDs and macOS.
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// Whether `e` means the process (or the system) has no file descriptor left: a shortage
/// that passes once descriptors are given back, not a fault of the disk or the data.
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(EMFILE | ENFILE))
}

impl LogError {
    /// Whether this failed for want of a file descriptor (see [`is_out_of_descriptors`]).
    pub fn is_out_of_descriptors(&self) -> bool {
        match self {
            Self::Io { source, .. } | Self::Recovery(RecoveryError::Io { source, .. }) => {
                is_out_of_descriptors(source)
            }
            Self::Poisoned(_)
            | Self::Recovery(_)
            | Self::Truncated { .. }
            | Self::Corrupt { .. }
            | Self::Closed => false,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A sealed segment's extent, for the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedSegment {
    pub base: u64,
    /// One past its last offset.
    pub end: u64,
    pub size: u64,
    pub min_ts: i64,
    pub max_ts: i64,
}

/// What an append made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: u64,
    pub count: u32,
    pub timestamp_ms: i64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    pub oldest_offset: u64,
    pub next_offset: u64,
    pub bytes: u64,
    pub segments: usize,
}

/// The answer to an append: what it made durable, and the records handed back to be freed
/// by the task that made them.
type AppendReply = oneshot::Sender<AppendOutcome>;

/// What an append's receiver yields (see [`PartitionLog::submit`]).
pub type AppendOutcome = Result<(Appended, Vec<NewRecord>), LogError>;

struct TailCache {
    records: VecDeque<Arc<Record>>,
    bytes: usize,
    budget: TailBudget,
}

impl TailCache {
    fn pop_front(&mut self) -> bool {
        let Some(r) = self.records.pop_front() else {
            return false;
        };
        let n = cached_size(&r);
        self.bytes -= n;
        self.budget.0.used.fetch_sub(n as u64, Ordering::Relaxed);
        true
    }
}

impl Drop for TailCache {
    /// A closed (idle) log gives its share of the budget back.
    fn drop(&mut self) {
        self.budget
            .0
            .used
            .fetch_sub(self.bytes as u64, Ordering::Relaxed);
    }
}

struct Shared {
    dir: PathBuf,
    cfg: LogConfig,
    clock: SharedClock,
    metrics: Arc<CoreMetrics>,
    segments: RwLock<Vec<Arc<Segment>>>,
    /// One past the last durable offset.
    next_offset: AtomicU64,
    cache: Arc<Mutex<TailCache>>,
    poisoned: Mutex<Option<String>>,
    /// Its id in the WAL (per process) and its directory relative to the WAL's root.
    id: u32,
    relpath: String,
    wal: Arc<wal::WalInner>,
    /// What only the WAL thread changes: the segment appends go to.
    writer: Mutex<WriterState>,
    /// `close` was called: new appends are refused.
    closed: AtomicBool,
    /// The active segment's age deadline may have changed (for the age roller).
    age_changed: Notify,
    /// Where the last read from disk stopped (see [`ReadCursor`]).
    cursor: Mutex<Option<ReadCursor>>,
    /// Tests: the reads that went on from the cursor.
    #[cfg(test)]
    cursor_hits: AtomicU64,
    /// Tests: the writer panics before its next group.
    #[cfg(test)]
    panic_next_group: AtomicBool,
}

struct WriterState {
    file: Arc<DataFile>,
    active: Arc<Segment>,
    last_ts: i64,
    /// The WAL thread has processed the close: anything queued after it is refused.
    closed: bool,
}

/// An open partition log. Dropping it (after [`PartitionLog::close`]) releases its files.
pub struct PartitionLog {
    shared: Arc<Shared>,
    /// Keeps the WAL's threads alive (the private one of a log opened without a node WAL).
    wal: Wal,
    private_wal: bool,
    /// Seals the active segment when it reaches its age.
    roller: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for PartitionLog {
    fn drop(&mut self) {
        if let Some(r) = self.roller.lock().take() {
            r.abort();
        }
        if !self.shared.closed.swap(true, Ordering::AcqRel) {
            let (reply, _) = oneshot::channel();
            let _ = self.shared.wal.push([wal::Cmd::Close {
                log: self.shared.clone(),
                reply,
            }]);
        }
    }
}

impl std::fmt::Debug for PartitionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionLog")
            .field("dir", &self.shared.dir)
            .finish()
    }
}

/// What recovery found, for logging by the caller.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub torn_tail_bytes: Option<u64>,
    pub segments: usize,
    pub scanned_bytes: u64,
}

impl PartitionLog {
    /// Opens (or creates) the log in `dir`, recovering it. Blocking: call from a blocking
    /// context. Must run inside a tokio runtime (the writer task is spawned on it).
    pub fn open(
        dir: &Path,
        cfg: LogConfig,
        clock: SharedClock,
        metrics: Arc<CoreMetrics>,
    ) -> Result<(Self, RecoveryReport), LogError> {
        crate::fsutil::create_dir_private(dir).map_err(io_err(dir))?;
        let (wal, private_wal) = match &cfg.wal {
            Some(w) => (w.clone(), false),
            None => {
                let (w, replayed) =
                    Wal::open(&dir.join("wal"), dir, WalConfig::default(), metrics.clone())?;
                if replayed.entries > 0 {
                    tracing::info!(dir = %dir.display(), ?replayed, "replayed the write-ahead log");
                }
                (w, true)
            }
        };
        let relpath = dir
            .strip_prefix(wal.inner().root())
            .ok()
            .and_then(Path::to_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                io_err(dir)(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the partition directory is not under the write-ahead log's data directory",
                ))
            })?;
        let mut bases = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(stem) = name.strip_suffix(".log")
                && let Ok(base) = stem.parse::<u64>()
            {
                // a segment name that is no regular file (a link to a device, a FIFO) would
                // block or never end: refused, with the path, rather than read
                if !entry.file_type().map_err(io_err(dir))?.is_file() {
                    let path = segment::segment_path(dir, base);
                    return Err(io_err(&path)(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "a segment name that is not a regular file",
                    )));
                }
                bases.push(base);
            }
        }
        bases.sort_unstable();
        let gaps = segment::read_gaps(dir).map_err(io_err(&dir.join(segment::GAPS_FILE)))?;
        let mut report = RecoveryReport::default();
        let mut segments: Vec<Arc<Segment>> = Vec::new();
        if bases.is_empty() {
            segments.push(Arc::new(create_segment(dir, 0)?));
        }
        for (i, &base) in bases.iter().enumerate() {
            let path = segment::segment_path(dir, base);
            let is_active = i + 1 == bases.len();
            let file = segment::open_read(&path).map_err(io_err(&path))?;
            let size = file.metadata().map_err(io_err(&path))?.len();
            let meta = match (!is_active)
                .then(|| segment::read_index(dir, base, size))
                .flatten()
            {
                Some(meta) => meta,
                None => {
                    let data = std::fs::read(&path).map_err(io_err(&path))?;
                    report.scanned_bytes += data.len() as u64;
                    let scanned = segment::scan(&path, base, &data)?;
                    let mut meta = scanned.meta;
                    if let Some(pos) = scanned.torn_at {
                        if !is_active {
                            return Err(RecoveryError::CorruptMiddle {
                                path,
                                pos,
                                reason: "a sealed segment ends in an invalid frame".into(),
                            }
                            .into());
                        }
                        let w = OpenOptions::new()
                            .write(true)
                            .open(&path)
                            .map_err(io_err(&path))?;
                        w.set_len(pos).map_err(io_err(&path))?;
                        w.sync_all().map_err(io_err(&path))?;
                        let torn = size - pos;
                        report.torn_tail_bytes = Some(torn);
                        metrics.torn_tails_truncated.inc();
                        tracing::warn!(path = %path.display(), at = pos, bytes = torn, "truncated torn tail");
                    }
                    if !is_active {
                        meta.sealed = true;
                        if let Err(e) = segment::write_index(dir, base, &meta) {
                            tracing::warn!(path = %path.display(), error = %e, "could not rewrite segment index");
                        }
                    }
                    meta
                }
            };
            if let Some(prev) = segments.last() {
                let prev_end = prev.meta.lock().end;
                if prev_end != base && !gaps.contains(&(prev_end, base)) {
                    return Err(RecoveryError::Discontinuity {
                        path: prev.path.clone(),
                        end: prev_end,
                        next_base: base,
                    }
                    .into());
                }
            }
            segments.push(Arc::new(Segment {
                base,
                path,
                file,
                meta: Mutex::new(meta),
            }));
        }
        report.segments = segments.len();
        let active = segments.last().expect("at least one segment").clone();
        let next_offset = active.meta.lock().end;
        // Timestamps never decrease within a partition: the newest one is the floor for the
        // next append (the active segment may be empty right after a roll).
        let last_ts = segments
            .iter()
            .rev()
            .find_map(|s| s.meta.lock().max_ts)
            .unwrap_or(i64::MIN);
        let write_file = OpenOptions::new()
            .write(true)
            .open(&active.path)
            .map_err(io_err(&active.path))?;
        let write_file = wal.inner().data_file(write_file, &active.path);
        metrics.logs_opened.inc();
        let cache = Arc::new(Mutex::new(TailCache {
            records: VecDeque::new(),
            bytes: 0,
            budget: cfg.tail_cache.clone(),
        }));
        cfg.tail_cache.register(&cache);
        let shared = Arc::new(Shared {
            dir: dir.to_owned(),
            cfg,
            clock,
            metrics,
            segments: RwLock::new(segments),
            next_offset: AtomicU64::new(next_offset),
            cache: cache.clone(),
            poisoned: Mutex::new(None),
            id: wal.inner().next_log_id(),
            relpath,
            wal: wal.inner().clone(),
            writer: Mutex::new(WriterState {
                file: Arc::new(write_file),
                active,
                last_ts,
                closed: false,
            }),
            closed: AtomicBool::new(false),
            age_changed: Notify::new(),
            cursor: Mutex::new(None),
            #[cfg(test)]
            cursor_hits: AtomicU64::new(0),
            #[cfg(test)]
            panic_next_group: AtomicBool::new(false),
        });
        let roller = tokio::spawn(age_roller(shared.clone()));
        Ok((
            Self {
                shared,
                wal,
                private_wal,
                roller: Mutex::new(Some(roller)),
            },
            report,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Appends `records` atomically (one write, one fsync) and returns once they are durable.
    pub async fn append(&self, records: Vec<NewRecord>) -> Result<Appended, LogError> {
        let (appended, _records) = self
            .submit(records)?
            .await
            .map_err(|_| LogError::Closed)??;
        Ok(appended)
    }

    /// Queues `records` for the WAL thread; the receiver answers once they are durable (or
    /// failed). Appends submitted one after another without awaiting share one round.
    pub fn submit(
        &self,
        records: Vec<NewRecord>,
    ) -> Result<oneshot::Receiver<AppendOutcome>, LogError> {
        debug_assert!(!records.is_empty());
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(LogError::Closed);
        }
        if let Some(reason) = self.is_poisoned() {
            return Err(LogError::Poisoned(reason));
        }
        let (reply, rx) = oneshot::channel();
        self.shared.wal.push([wal::Cmd::Append {
            log: self.shared.clone(),
            records,
            reply,
        }])?;
        Ok(rx)
    }

    /// Seals the active segment now (if it holds any record).
    pub async fn roll(&self) -> Result<(), LogError> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(LogError::Closed);
        }
        let (reply, rx) = oneshot::channel();
        self.shared.wal.push([wal::Cmd::Roll {
            log: self.shared.clone(),
            aged: false,
            reply,
        }])?;
        rx.await.map_err(|_| LogError::Closed)?
    }

    /// Refuses new appends and returns once every append queued before is answered. (The
    /// segment is synced by the WAL's next checkpoint; a log opened without a node WAL
    /// shuts its private one down, which syncs it now.)
    pub async fn close(&self) {
        if let Some(r) = self.roller.lock().take() {
            r.abort();
        }
        if !self.shared.closed.swap(true, Ordering::AcqRel) {
            let (reply, rx) = oneshot::channel();
            if self
                .shared
                .wal
                .push([wal::Cmd::Close {
                    log: self.shared.clone(),
                    reply,
                }])
                .is_ok()
            {
                let _ = rx.await;
            }
        }
        if self.private_wal {
            let wal = self.wal.clone();
            let _ = tokio::task::spawn_blocking(move || wal.shutdown()).await;
        }
    }

    pub fn next_offset(&self) -> u64 {
        self.shared.next_offset.load(Ordering::Acquire)
    }

    /// Why appends fail, if they do: this log's segment write failed, or the WAL's.
    pub fn is_poisoned(&self) -> Option<String> {
        self.shared
            .poisoned
            .lock()
            .clone()
            .or_else(|| self.shared.wal.poisoned())
    }

    pub fn oldest_offset(&self) -> u64 {
        self.shared.segments.read()[0].base
    }

    pub fn stats(&self) -> LogStats {
        let segs = self.shared.segments.read();
        LogStats {
            oldest_offset: segs[0].base,
            next_offset: self.next_offset(),
            bytes: segs.iter().map(|s| s.meta.lock().size).sum(),
            segments: segs.len(),
        }
    }

    /// The sealed, non-empty segments, oldest first: what the archive may take.
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        self.shared
            .segments
            .read()
            .iter()
            .filter_map(|seg| {
                let m = seg.meta.lock();
                match (m.sealed, m.min_ts, m.max_ts) {
                    (true, Some(min_ts), Some(max_ts)) => Some(SealedSegment {
                        base: seg.base,
                        end: m.end,
                        size: m.size,
                        min_ts,
                        max_ts,
                    }),
                    _ => None,
                }
            })
            .collect()
    }

    /// Every record of the sealed segment starting at `base`. Blocking (positional reads).
    pub fn read_segment(&self, base: u64) -> Result<Vec<Record>, LogError> {
        let seg = self
            .shared
            .segments
            .read()
            .iter()
            .find(|s| s.base == base)
            .cloned();
        let Some(seg) = seg else {
            return Err(LogError::Truncated {
                requested: base,
                oldest: self.oldest_offset(),
            });
        };
        let (size, count) = {
            let m = seg.meta.lock();
            (m.size, m.end.saturating_sub(base))
        };
        let mut reader = SegmentReader::new(&seg.file, 0, size);
        let mut out = Vec::with_capacity(count as usize);
        while let Some((rec, _)) = reader.next_record().map_err(|source| LogError::Corrupt {
            path: seg.path.clone(),
            source,
        })? {
            out.push(rec);
        }
        Ok(out)
    }

    /// Keeps where `reader` (over `seg`) stopped as the log's cursor, for a read that starts
    /// at `next`; with `slot`, or a new one while the node has one to give.
    fn keep_cursor(
        &self,
        reader: SegmentReader<'_>,
        seg: &Arc<Segment>,
        next: u64,
        slot: Option<CursorSlot>,
    ) {
        let Some(state) = reader.into_state(READ_CURSOR_BYTES) else {
            return;
        };
        let Some(slot) = slot.or_else(|| self.shared.cfg.tail_cache.cursor_slot()) else {
            return;
        };
        *self.shared.cursor.lock() = Some(ReadCursor {
            segment: Arc::downgrade(seg),
            next,
            state,
            slot,
        });
    }

    /// Reads up to `max_records` records (and roughly `max_bytes` of payload, at least one
    /// record) starting at `from`. Blocking on a cache miss (positional reads); a read from
    /// where the last one from disk stopped goes on from its cursor ([`ReadCursor`]).
    pub fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Record>>, LogError> {
        let end = self.next_offset();
        let mut out = Vec::new();
        if from >= end || max_records == 0 {
            return Ok(out);
        }
        let oldest = self.oldest_offset();
        if from < oldest {
            return Err(LogError::Truncated {
                requested: from,
                oldest,
            });
        }
        {
            let cache = self.shared.cache.lock();
            if let Some(first) = cache.records.front()
                && from >= first.offset
            {
                let mut bytes = 0;
                for r in cache.records.iter().skip((from - first.offset) as usize) {
                    if out.len() >= max_records || (bytes >= max_bytes && !out.is_empty()) {
                        break;
                    }
                    bytes += r.reply_weight();
                    out.push(r.clone());
                }
                return Ok(out);
            }
        }
        let segments = self.shared.segments.read().clone();
        let oldest = segments[0].base;
        if from < oldest {
            return Err(LogError::Truncated {
                requested: from,
                oldest,
            });
        }
        let first = segments.partition_point(|s| s.base <= from) - 1;
        let mut bytes = 0;
        let mut next = from;
        // the last read's cursor: used if this read starts where it stopped; its slot is
        // kept for this read's own cursor either way
        let (mut resume, mut slot) = match self.shared.cursor.lock().take() {
            Some(c) => (Some((c.segment, c.next, c.state)), Some(c.slot)),
            None => (None, None),
        };
        for seg in &segments[first..] {
            let mut reader = {
                let m = seg.meta.lock();
                let resumed = resume
                    .take_if(|(s, at, _)| *at == next && std::ptr::eq(s.as_ptr(), Arc::as_ptr(seg)))
                    .and_then(|(_, _, state)| SegmentReader::resume(&seg.file, state, m.size));
                #[cfg(test)]
                if resumed.is_some() {
                    self.shared.cursor_hits.fetch_add(1, Ordering::Relaxed);
                }
                // (the index is looked at only when there is no cursor to go on from)
                resumed.unwrap_or_else(|| {
                    let i = m.index.partition_point(|e| e.offset <= next);
                    let pos = if i == 0 { 0 } else { m.index[i - 1].pos };
                    SegmentReader::new(&seg.file, pos, m.size)
                })
            };
            loop {
                if out.len() >= max_records || (bytes >= max_bytes && !out.is_empty()) {
                    self.keep_cursor(reader, seg, next, slot.take());
                    return Ok(out);
                }
                let rec = match reader.next_record_from(next) {
                    Ok(rec) => rec,
                    // the records before a damaged frame are served; a read from the damaged
                    // offset reports it
                    Err(_) if !out.is_empty() => return Ok(out),
                    Err(source) => {
                        return Err(LogError::Corrupt {
                            path: seg.path.clone(),
                            source,
                        });
                    }
                };
                let Some((rec, _)) = rec else { break };
                if rec.offset < next {
                    continue;
                }
                next = rec.offset + 1;
                bytes += rec.reply_weight();
                out.push(Arc::new(rec));
            }
        }
        Ok(out)
    }

    /// The first offset whose commit timestamp is at or after `ts_ms` (the next offset when no
    /// such record exists yet).
    pub fn offset_for_time(&self, ts_ms: i64) -> Result<u64, LogError> {
        let segments = self.shared.segments.read().clone();
        for seg in &segments {
            let (max_ts, size, start_pos) = {
                let m = seg.meta.lock();
                let i = m.index.partition_point(|e| e.timestamp_ms < ts_ms);
                let pos = if i == 0 { 0 } else { m.index[i - 1].pos };
                (m.max_ts, m.size, pos)
            };
            match max_ts {
                Some(t) if t >= ts_ms => {}
                _ => continue,
            }
            let mut reader = SegmentReader::new(&seg.file, start_pos, size);
            while let Some((rec, _)) = reader.next_record().map_err(|source| LogError::Corrupt {
                path: seg.path.clone(),
                source,
            })? {
                if rec.timestamp_ms >= ts_ms {
                    return Ok(rec.offset);
                }
            }
        }
        Ok(self.next_offset())
    }

    /// Deletes whole sealed segments older than `retention_ms` (by their newest record's commit
    /// time; 0 = keep forever) or beyond `retention_bytes` (0 = no size limit), oldest first.
    /// Returns the number of segments deleted and whether the active segment is itself past
    /// the age limit (the caller then rolls it so the next pass can delete it).
    ///
    /// With `archived_below`, a segment is deleted only if every record of it is below that
    /// offset (uploaded to the archive and verified): nothing unarchived is ever deleted.
    pub fn apply_retention(
        &self,
        retention_ms: i64,
        retention_bytes: u64,
        archived_below: Option<u64>,
    ) -> (usize, bool) {
        let now = self.shared.clock.now_ms();
        let cutoff = (retention_ms > 0).then(|| now.saturating_sub(retention_ms));
        let mut segs = self.shared.segments.write();
        let mut total: u64 = segs.iter().map(|s| s.meta.lock().size).sum();
        let mut deleted = 0;
        while segs.len() > 1 {
            let (sealed, max_ts, size, end) = {
                let m = segs[0].meta.lock();
                (m.sealed, m.max_ts, m.size, m.end)
            };
            let too_old = matches!((cutoff, max_ts), (Some(c), Some(t)) if t < c);
            let too_big = retention_bytes > 0 && total > retention_bytes;
            let archived = archived_below.is_none_or(|a| end <= a || size == 0);
            if !sealed || !(too_old || too_big || size == 0) || !archived {
                break;
            }
            let seg = segs.remove(0);
            if let Err(e) = std::fs::remove_file(&seg.path) {
                tracing::warn!(path = %seg.path.display(), error = %e, "could not delete segment");
            }
            let _ = std::fs::remove_file(segment::index_path(&self.shared.dir, seg.base));
            total -= size;
            deleted += 1;
            self.shared.metrics.segments_deleted.inc();
        }
        let active_expired = {
            let m = segs.last().expect("active").meta.lock();
            matches!((cutoff, m.max_ts), (Some(c), Some(t)) if t < c)
        };
        (deleted, active_expired)
    }
}

fn create_segment(dir: &Path, base: u64) -> Result<Segment, LogError> {
    let path = segment::segment_path(dir, base);
    crate::fsutil::open_or_create_private(&path).map_err(io_err(&path))?;
    segment::sync_dir(dir).map_err(io_err(dir))?;
    let file = segment::open_read(&path).map_err(io_err(&path))?;
    Ok(Segment {
        base,
        path,
        file,
        meta: Mutex::new(SegmentMeta::new_empty(base)),
    })
}

/// Seals the active segment once it is `segment_max_age_ms` old (so quiet partitions seal
/// too): sleeps on the clock until the deadline, then asks the WAL thread to roll.
async fn age_roller(shared: Arc<Shared>) {
    loop {
        let changed = shared.age_changed.notified();
        let Some(deadline) = shared.age_deadline() else {
            changed.await;
            continue;
        };
        tokio::select! {
            () = shared.clock.sleep_until(deadline) => {}
            () = changed => continue,
        }
        if shared.clock.now_ms() < deadline {
            continue;
        }
        let (reply, rx) = oneshot::channel();
        let cmd = wal::Cmd::Roll {
            log: shared.clone(),
            aged: true,
            reply,
        };
        if shared.wal.push([cmd]).is_err() {
            return;
        }
        match rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(dir = %shared.dir.display(), error = %e, "segment roll failed; retrying in 1s");
                // the age deadline stays in the past: back off instead of spinning
                shared.clock.sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(_) => return,
        }
    }
}

/// The same failure again, for another waiter of the same group.
fn again(e: &LogError) -> LogError {
    match e {
        LogError::Closed => LogError::Closed,
        LogError::Poisoned(r) => LogError::Poisoned(r.clone()),
        other => LogError::Poisoned(other.to_string()),
    }
}

/// Where a group of appends goes: its segment file, the segment's base, the byte position,
/// the commit timestamp and the first offset.
type Prepared = (Arc<DataFile>, u64, u64, i64, u64);

/// What the WAL thread does to a log (always on that thread, under `writer`).
impl Shared {
    fn age_deadline(&self) -> Option<i64> {
        let w = self.writer.lock();
        let min_ts = w.active.meta.lock().min_ts;
        min_ts.map(|t| t.saturating_add(self.cfg.segment_max_age_ms))
    }

    fn age_expired(&self) -> bool {
        self.age_deadline()
            .is_some_and(|d| self.clock.now_ms() >= d)
    }

    fn poison(&self, reason: String) {
        tracing::error!(dir = %self.dir.display(), error = %reason, "partition log poisoned");
        self.metrics.log_poisoned.inc();
        self.poisoned.lock().get_or_insert(reason);
    }

    /// Readies the log for a group of `bytes` (rolling a full segment first).
    fn prepare(&self, wal: &wal::WalInner, bytes: usize) -> Result<Prepared, LogError> {
        if self.writer.lock().closed {
            return Err(LogError::Closed);
        }
        if let Some(reason) = self.poisoned.lock().clone() {
            return Err(LogError::Poisoned(reason));
        }
        let (size, has_records) = {
            let w = self.writer.lock();
            let m = w.active.meta.lock();
            (m.size, m.min_ts.is_some())
        };
        if has_records && size + bytes as u64 > self.cfg.segment_max_bytes {
            self.roll(wal)?;
        }
        let w = self.writer.lock();
        let ts = self.clock.now_ms().max(w.last_ts);
        let start_pos = w.active.meta.lock().size;
        Ok((
            w.file.clone(),
            w.active.base,
            start_pos,
            ts,
            self.next_offset.load(Ordering::Acquire),
        ))
    }

    /// Makes a durable group visible: segment metadata, tail cache, next offset; replies.
    fn publish(
        &self,
        ts: i64,
        next: u64,
        notes: &[(u64, u64, u64)],
        placed: Vec<(u64, Vec<NewRecord>, AppendReply)>,
        frames: &[u8],
    ) {
        let first_record = {
            let mut w = self.writer.lock();
            w.last_ts = ts;
            let mut meta = w.active.meta.lock();
            let first = meta.min_ts.is_none();
            for &(offset, pos, len) in notes {
                meta.note_record(offset, pos, len, ts);
            }
            first
        };
        if first_record {
            self.age_changed.notify_one();
        }
        let caching = self.cfg.tail_cache.limit() > 0;
        let mut fresh = Vec::with_capacity(if caching { notes.len() } else { 0 });
        // One copy of the group's frames, exactly as large as what it holds, shared by its
        // cached records: not slices of the producer's request buffers (which a cached slice
        // would keep alive) and not one allocation per key and payload.
        let chunk = if caching {
            Bytes::copy_from_slice(frames)
        } else {
            Bytes::new()
        };
        let start_pos = notes.first().map_or(0, |n| n.1);
        let mut notes_iter = notes.iter();
        let mut replies = Vec::with_capacity(placed.len());
        for (base, records, reply) in placed {
            let count = records.len() as u32;
            if caching {
                for (i, r) in records.iter().enumerate() {
                    let at = notes_iter.next().map_or(0, |n| (n.1 - start_pos) as usize);
                    fresh.push(Arc::new(r.committed_in(&chunk, at, base + i as u64, ts)));
                }
            }
            replies.push((
                reply,
                Appended {
                    base_offset: base,
                    count,
                    timestamp_ms: ts,
                },
                records,
            ));
        }
        self.push_cache(fresh);
        self.next_offset.store(next, Ordering::Release);
        for (reply, appended, records) in replies {
            // the records go back to the producer's task, which frees them where their
            // request buffer was allocated (not here, across threads)
            let _ = reply.send(Ok((appended, records)));
        }
    }

    fn push_cache(&self, fresh: Vec<Arc<Record>>) {
        if fresh.is_empty() {
            return;
        }
        let budget = &self.cfg.tail_cache;
        {
            let mut cache = self.cache.lock();
            let added: usize = fresh.iter().map(|r| cached_size(r)).sum();
            cache.bytes += added;
            budget.0.used.fetch_add(added as u64, Ordering::Relaxed);
            cache.records.extend(fresh);
            // this partition pays first for what it added, down to its fair share
            let share = budget.limit() / budget.0.caches.lock().len().max(1);
            while budget.over() && cache.bytes > share && cache.pop_front() {}
        }
        if budget.over() {
            budget.rebalance();
        }
    }

    /// A closing log gives back what its active segment had allocated ahead.
    fn release_unused_space(&self) {
        let file = self.writer.lock().file.clone();
        file.release_unused();
    }

    /// The WAL thread has answered everything queued before the close.
    fn close_writer(&self) {
        self.writer.lock().closed = true;
    }

    /// Seals the active segment (if it has records) and starts a new one. The sealed file
    /// is synced by the WAL checkpoint that covers its last records, not here.
    fn roll(&self, wal: &wal::WalInner) -> Result<(), LogError> {
        let active = self.writer.lock().active.clone();
        if active.meta.lock().min_ts.is_none() {
            return Ok(());
        }
        let base = self.next_offset.load(Ordering::Acquire);
        // The segment is flagged sealed (which lets the archive take it and retention delete
        // it) only once its successor exists: a failed roll leaves it the active, unsealed
        // segment that keeps taking appends.
        let made = create_segment(&self.dir, base).and_then(|seg| {
            let file = OpenOptions::new()
                .write(true)
                .open(&seg.path)
                .map_err(io_err(&seg.path))?;
            let file = wal.data_file(file, &seg.path);
            Ok((seg, file))
        });
        let (seg, file) = match made {
            Ok(made) => made,
            Err(e) => {
                // Appends go on into the current segment, so a successor file left behind
                // would later start inside it: remove it, or stop appending.
                let path = segment::segment_path(&self.dir, base);
                let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
                match if ours {
                    std::fs::remove_file(&path)
                } else {
                    Ok(())
                } {
                    Ok(()) => {}
                    Err(r) if r.kind() == io::ErrorKind::NotFound => {}
                    Err(r) => {
                        let reason = format!(
                            "segment roll failed ({e}) and its new file {} could not be removed: {r}",
                            path.display()
                        );
                        self.poison(reason.clone());
                        return Err(LogError::Poisoned(reason));
                    }
                }
                return Err(e);
            }
        };
        let mut meta = active.meta.lock().clone();
        meta.sealed = true;
        if let Err(e) = segment::write_index(&self.dir, active.base, &meta) {
            tracing::warn!(error = %e, "could not write segment index; it will be rebuilt on open");
        }
        let seg = Arc::new(seg);
        {
            // one critical section: readers never see the new segment beside an unsealed one
            let mut segments = self.segments.write();
            active.meta.lock().sealed = true;
            segments.push(seg.clone());
        }
        let sealed = {
            let mut w = self.writer.lock();
            w.active = seg;
            std::mem::replace(&mut w.file, Arc::new(file))
        };
        sealed.release_unused();
        self.age_changed.notify_one();
        self.metrics.segments_rolled.inc();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
