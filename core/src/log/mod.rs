//! The partition log: append-only segments, group commit, recovery, retention.
//!
//! ```text
//!  append() ──► mpsc ──► writer task ──► encode frames ──► write + ONE fdatasync ──► reply all
//!                          │ (drains every queued request                 │
//!                          │  into one batch: group commit)               ▼
//!                          └── roll by size / age ◄──────────── segments (RwLock) + tail cache
//!  read() ──────────────────────────────────────────────────────► tail cache, else pread
//! ```
//!
//! One writer task per partition assigns offsets and commit timestamps (never decreasing), so
//! concurrent appends are serialised in one place. An append is answered only after the fsync
//! that covers it; readers only ever see bytes that fsync covered. A failed write or fsync
//! poisons the log: every later append fails until the process restarts and recovery decides
//! what really reached the disk.

pub mod segment;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt as _;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, oneshot};

use crate::clock::SharedClock;
use crate::metrics::CoreMetrics;
use crate::record::{NewRecord, Record};
use segment::{ReadError, RecoveryError, Segment, SegmentMeta, SegmentReader};

/// Group commit drains queued appends into one write until the batch reaches this size.
const MAX_GROUP_BYTES: usize = 8 * 1024 * 1024;
/// Queued append requests per partition before `append` waits (backpressure).
const WRITER_QUEUE: usize = 4096;
/// The writers' name in `narad_task_panics_total` and `/readyz`.
const WRITER_TASK: &str = "log_writer";

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
}

impl TailBudget {
    pub fn new(limit_bytes: usize) -> Self {
        Self(Arc::new(TailBudgetInner {
            limit: limit_bytes,
            used: AtomicU64::new(0),
            caches: Mutex::new(Vec::new()),
        }))
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

fn cached_size(r: &Record) -> usize {
    CACHED_RECORD_OVERHEAD
        + r.payload.len()
        + r.key.as_ref().map_or(0, Bytes::len)
        + r.headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 32)
            .sum::<usize>()
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_max_bytes: 64 * 1024 * 1024,
            segment_max_age_ms: 10 * 60 * 1000,
            tail_cache: TailBudget::new(64 * 1024 * 1024),
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

type AppendReply = oneshot::Sender<Result<Appended, LogError>>;

enum Cmd {
    Append {
        records: Vec<NewRecord>,
        reply: AppendReply,
    },
    Roll {
        reply: oneshot::Sender<Result<(), LogError>>,
    },
}

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
    /// Tests: the writer panics before its next group.
    #[cfg(test)]
    panic_next_group: std::sync::atomic::AtomicBool,
}

/// An open partition log. Dropping it (after [`PartitionLog::close`]) releases its files.
pub struct PartitionLog {
    shared: Arc<Shared>,
    /// `None` once closed; appends clone the sender (an atomic increment).
    tx: Mutex<Option<mpsc::Sender<Cmd>>>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
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
                if prev_end != base {
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
            #[cfg(test)]
            panic_next_group: std::sync::atomic::AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel(WRITER_QUEUE);
        let writer = Writer {
            shared: shared.clone(),
            file: Arc::new(write_file),
            active,
            last_ts,
            buf: Vec::new(),
        };
        // A writer that panics poisons its log (appends fail with `storage_unavailable`, as
        // after a failed fsync, instead of `Closed`) and marks the node not ready, naming it.
        let health = shared.metrics.tasks.clone();
        let handle = tokio::spawn(async move {
            if let Err(payload) = AssertUnwindSafe(writer.run(rx)).catch_unwind().await {
                health.record(WRITER_TASK, payload.as_ref());
            }
        });
        Ok((
            Self {
                shared,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
            },
            report,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Appends `records` atomically (one write, one fsync) and returns once they are durable.
    pub async fn append(&self, records: Vec<NewRecord>) -> Result<Appended, LogError> {
        debug_assert!(!records.is_empty());
        if let Some(reason) = self.shared.poisoned.lock().clone() {
            return Err(LogError::Poisoned(reason));
        }
        let (reply, rx) = oneshot::channel();
        self.sender()?
            .send(Cmd::Append { records, reply })
            .await
            .map_err(|_| LogError::Closed)?;
        rx.await.map_err(|_| LogError::Closed)?
    }

    /// Seals the active segment now (if it holds any record).
    pub async fn roll(&self) -> Result<(), LogError> {
        let (reply, rx) = oneshot::channel();
        self.sender()?
            .send(Cmd::Roll { reply })
            .await
            .map_err(|_| LogError::Closed)?;
        rx.await.map_err(|_| LogError::Closed)?
    }

    /// Stops the writer after it has answered every queued append.
    pub async fn close(&self) {
        // Dropping the last sender ends the writer loop once the queue is drained.
        self.tx.lock().take();
        let handle = self.writer.lock().take();
        if let Some(h) = handle {
            let _ = h.await;
        }
    }

    fn sender(&self) -> Result<mpsc::Sender<Cmd>, LogError> {
        self.tx.lock().clone().ok_or(LogError::Closed)
    }

    pub fn next_offset(&self) -> u64 {
        self.shared.next_offset.load(Ordering::Acquire)
    }

    pub fn is_poisoned(&self) -> Option<String> {
        self.shared.poisoned.lock().clone()
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

    /// Reads up to `max_records` records (and roughly `max_bytes` of payload, at least one
    /// record) starting at `from`. Blocking on a cache miss (positional reads).
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
        for seg in &segments[first..] {
            let (size, start_pos) = {
                let m = seg.meta.lock();
                let i = m.index.partition_point(|e| e.offset <= next);
                let pos = if i == 0 { 0 } else { m.index[i - 1].pos };
                (m.size, pos)
            };
            let mut reader = SegmentReader::new(&seg.file, start_pos, size);
            loop {
                if out.len() >= max_records || (bytes >= max_bytes && !out.is_empty()) {
                    return Ok(out);
                }
                let rec = reader.next_record().map_err(|source| LogError::Corrupt {
                    path: seg.path.clone(),
                    source,
                })?;
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

/// Yield rounds the writer spends gathering a group commit (see `Writer::run`).
const GATHER_ROUNDS: usize = 2;

struct Writer {
    shared: Arc<Shared>,
    file: Arc<File>,
    active: Arc<Segment>,
    last_ts: i64,
    buf: Vec<u8>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let mut batch: Vec<Cmd> = Vec::new();
        // (declared after `batch`, so dropped before it: the log is poisoned before a
        // panic drops the replies of the group in hand, and no append slips in between)
        let _poison_on_panic = PoisonOnPanic(self.shared.clone());
        loop {
            let deadline = self.age_deadline();
            let first = match deadline {
                Some(ms) => {
                    let clock = self.shared.clock.clone();
                    tokio::select! {
                        cmd = rx.recv() => cmd,
                        () = clock.sleep_until(ms) => {
                            if self.shared.clock.now_ms() >= ms {
                                self.roll_logged().await;
                            }
                            continue;
                        }
                    }
                }
                None => rx.recv().await,
            };
            let Some(first) = first else { break };
            batch.push(first);
            // Let the tasks that are already runnable (HTTP handlers on this worker) enqueue
            // their appends before the group closes, for as long as more keep arriving (a few
            // rounds at most): under load this makes fewer, larger fsyncs, and fsyncs are what
            // bounds throughput on a small machine; idle, it costs a few µs.
            let mut bytes = cmd_bytes(&batch[0]);
            for _ in 0..GATHER_ROUNDS {
                tokio::task::yield_now().await;
                let before = batch.len();
                while bytes < MAX_GROUP_BYTES {
                    match rx.try_recv() {
                        Ok(cmd) => {
                            bytes += cmd_bytes(&cmd);
                            batch.push(cmd);
                        }
                        Err(_) => break,
                    }
                }
                if batch.len() == before || bytes >= MAX_GROUP_BYTES {
                    break;
                }
            }
            #[cfg(test)]
            if self.shared.panic_next_group.swap(false, Ordering::SeqCst) {
                panic!("injected log writer panic");
            }
            self.process(&mut batch).await;
        }
    }

    fn age_deadline(&self) -> Option<i64> {
        let m = self.active.meta.lock();
        m.min_ts
            .map(|t| t.saturating_add(self.shared.cfg.segment_max_age_ms))
    }

    async fn roll_logged(&mut self) {
        if let Err(e) = self.roll().await {
            tracing::error!(dir = %self.shared.dir.display(), error = %e, "segment roll failed; retrying in 1s");
            // The age deadline stays in the past: back off instead of spinning.
            let backoff = std::time::Duration::from_secs(1);
            self.shared.clock.sleep(backoff).await;
        }
    }

    async fn process(&mut self, batch: &mut Vec<Cmd>) {
        let mut appends = Vec::new();
        for cmd in batch.drain(..) {
            match cmd {
                Cmd::Append { records, reply } => appends.push((records, reply)),
                Cmd::Roll { reply } => {
                    self.append_group(std::mem::take(&mut appends)).await;
                    let _ = reply.send(self.roll().await);
                }
            }
        }
        self.append_group(appends).await;
    }

    async fn append_group(&mut self, group: Vec<(Vec<NewRecord>, AppendReply)>) {
        if group.is_empty() {
            return;
        }
        if let Some(reason) = self.shared.poisoned.lock().clone() {
            for (_, reply) in group {
                let _ = reply.send(Err(LogError::Poisoned(reason.clone())));
            }
            return;
        }
        let total: u64 = group
            .iter()
            .flat_map(|(rs, _)| rs.iter())
            .map(|r| r.encoded_len() as u64)
            .sum();
        let (size, has_records) = {
            let m = self.active.meta.lock();
            (m.size, m.min_ts.is_some())
        };
        if has_records
            && size + total > self.shared.cfg.segment_max_bytes
            && let Err(e) = self.roll().await
        {
            for (_, reply) in group {
                let _ = reply.send(Err(LogError::Poisoned(e.to_string())));
            }
            return;
        }
        let ts = self.shared.clock.now_ms().max(self.last_ts);
        let start_pos = self.active.meta.lock().size;
        let mut next = self.shared.next_offset.load(Ordering::Acquire);
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let mut placed = Vec::with_capacity(group.len());
        let mut notes = Vec::new();
        for (records, reply) in group {
            let base = next;
            for r in &records {
                let pos = start_pos + buf.len() as u64;
                r.encode(next, ts, &mut buf);
                notes.push((next, pos, start_pos + buf.len() as u64 - pos));
                next += 1;
            }
            placed.push((base, records, reply));
        }
        let file = self.file.clone();
        let started = Instant::now();
        let (buf, result) = tokio::task::spawn_blocking(move || {
            let r = file
                .write_all_at(&buf, start_pos)
                .and_then(|()| file.sync_data());
            (buf, r)
        })
        .await
        .unwrap_or_else(|e| (Vec::new(), Err(io::Error::other(e.to_string()))));
        let m = &self.shared.metrics;
        m.fsyncs.inc();
        m.fsync_seconds.observe(started.elapsed().as_secs_f64());
        m.records_per_fsync.observe(notes.len() as f64);
        if let Err(e) = result {
            let reason = format!("write/fsync of {} failed: {e}", self.active.path.display());
            tracing::error!(error = %reason, "partition log poisoned");
            m.log_poisoned.inc();
            *self.shared.poisoned.lock() = Some(reason.clone());
            for (_, _, reply) in placed {
                let _ = reply.send(Err(LogError::Poisoned(reason.clone())));
            }
            return;
        }
        m.appended_bytes.inc_by(buf.len() as u64);
        self.buf = buf;
        self.last_ts = ts;
        {
            let mut meta = self.active.meta.lock();
            for &(offset, pos, len) in &notes {
                meta.note_record(offset, pos, len, ts);
            }
        }
        let caching = self.shared.cfg.tail_cache.limit() > 0;
        let mut fresh = Vec::with_capacity(if caching { notes.len() } else { 0 });
        let mut replies = Vec::with_capacity(placed.len());
        for (base, records, reply) in placed {
            let count = records.len() as u32;
            // copies: the producer's bytes are usually slices of a much larger request
            // buffer, which a cached slice would keep alive
            let cached = if caching { records.as_slice() } else { &[] };
            for (i, r) in cached.iter().enumerate() {
                fresh.push(Arc::new(Record {
                    offset: base + i as u64,
                    timestamp_ms: ts,
                    delay_ms: r.delay_ms,
                    key: r.key.as_deref().map(Bytes::copy_from_slice),
                    headers: r
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), Bytes::copy_from_slice(v)))
                        .collect(),
                    payload: Bytes::copy_from_slice(&r.payload),
                }));
            }
            replies.push((
                reply,
                Appended {
                    base_offset: base,
                    count,
                    timestamp_ms: ts,
                },
            ));
        }
        self.push_cache(fresh);
        self.shared.next_offset.store(next, Ordering::Release);
        for (reply, appended) in replies {
            let _ = reply.send(Ok(appended));
        }
    }

    fn push_cache(&self, fresh: Vec<Arc<Record>>) {
        if fresh.is_empty() {
            return;
        }
        let budget = &self.shared.cfg.tail_cache;
        {
            let mut cache = self.shared.cache.lock();
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

    /// Seals the active segment (if it has records) and starts a new one.
    async fn roll(&mut self) -> Result<(), LogError> {
        if self.active.meta.lock().min_ts.is_none() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let active = self.active.clone();
        let base = shared.next_offset.load(Ordering::Acquire);
        // The segment is flagged sealed (which lets the archive take it and retention delete
        // it) only once its successor exists: a failed roll leaves it the active, unsealed
        // segment that keeps taking appends.
        let (seg, file) = tokio::task::spawn_blocking(move || -> Result<_, LogError> {
            let made = create_segment(&shared.dir, base).and_then(|seg| {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&seg.path)
                    .map_err(io_err(&seg.path))?;
                Ok((seg, file))
            });
            let (seg, file) = match made {
                Ok(made) => made,
                Err(e) => {
                    // Appends go on into the current segment, so a successor file left
                    // behind would later start inside it: remove it, or stop appending.
                    let path = segment::segment_path(&shared.dir, base);
                    let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
                    match if ours { std::fs::remove_file(&path) } else { Ok(()) } {
                        Ok(()) => {}
                        Err(r) if r.kind() == io::ErrorKind::NotFound => {}
                        Err(r) => {
                            let reason = format!(
                                "segment roll failed ({e}) and its new file {} could not be removed: {r}",
                                path.display()
                            );
                            *shared.poisoned.lock() = Some(reason.clone());
                            shared.metrics.log_poisoned.inc();
                            return Err(LogError::Poisoned(reason));
                        }
                    }
                    return Err(e);
                }
            };
            let mut meta = active.meta.lock().clone();
            meta.sealed = true;
            if let Err(e) = segment::write_index(&shared.dir, active.base, &meta) {
                tracing::warn!(error = %e, "could not write segment index; it will be rebuilt on open");
            }
            Ok((seg, file))
        })
        .await
        .map_err(|e| LogError::Poisoned(e.to_string()))??;
        let seg = Arc::new(seg);
        {
            // one critical section: readers never see the new segment beside an unsealed one
            let mut segments = self.shared.segments.write();
            self.active.meta.lock().sealed = true;
            segments.push(seg.clone());
        }
        self.active = seg;
        self.file = Arc::new(file);
        self.shared.metrics.segments_rolled.inc();
        Ok(())
    }
}

fn cmd_bytes(cmd: &Cmd) -> usize {
    match cmd {
        Cmd::Append { records, .. } => records.iter().map(NewRecord::encoded_len).sum(),
        Cmd::Roll { .. } => 0,
    }
}

#[cfg(test)]
mod tests;

/// Poisons its log when dropped by a panic unwinding through the writer.
struct PoisonOnPanic(Arc<Shared>);

impl Drop for PoisonOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            *self.0.poisoned.lock() = Some("the partition's log writer panicked".into());
        }
    }
}
