//! One partition of a topic: its log (opened lazily, closed when idle) and its queue state.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::clock::SharedClock;
use crate::log::{LogConfig, LogError, LogStats, PartitionLog, SealedSegment};
use crate::metrics::CoreMetrics;
use crate::queue::{PartitionQueue, QueueSnapshot};

pub const QUEUE_STATE_FILE: &str = "queue.state";

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
        let snapshot = read_snapshot(&dir);
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
                acked: Vec::new(),
            };
        }
        snapshot.acked.retain(|&(_, e)| e <= stats.next_offset);
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).expect("operating system random source");
        let queue = PartitionQueue::new(
            snapshot,
            stats.oldest_offset,
            stats.next_offset,
            u64::from_le_bytes(seed),
            env.max_ack_ranges,
        );
        Ok(Self {
            index,
            dir,
            log: Mutex::new(Some(Arc::new(log))),
            slot: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            queue: Mutex::new(queue),
            last_used_ms: AtomicI64::new(env.clock.now_ms()),
            archived_below: AtomicU64::new(0),
            last_stats: Mutex::new(stats),
            last_sealed: Mutex::new(Vec::new()),
            persist_lock: Mutex::new(()),
        })
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
                *self.last_stats.lock() = log.stats();
                *self.last_sealed.lock() = log.sealed_segments();
                log.close().await;
                drop(log);
                self.slot.lock().take();
                true
            }
            None => false,
        }
    }

    /// Closes the log, waiting for its queued appends.
    pub async fn close(&self) {
        let _guard = self.opening.lock().await;
        let log = self.log.lock().take();
        if let Some(log) = log {
            *self.last_stats.lock() = log.stats();
            *self.last_sealed.lock() = log.sealed_segments();
            log.close().await;
        }
        self.slot.lock().take();
    }

    /// Writes the queue snapshot if acks changed it. Blocking.
    pub fn persist_queue(&self) -> std::io::Result<bool> {
        let _one_writer = self.persist_lock.lock();
        let snapshot = {
            let mut q = self.queue.lock();
            if !q.is_dirty() {
                return Ok(false);
            }
            q.mark_clean();
            q.snapshot()
        };
        let result = write_snapshot(&self.dir, &snapshot);
        if result.is_err() {
            // Try again on the next pass.
            let mut q = self.queue.lock();
            q.force_dirty();
        }
        result.map(|()| true)
    }
}

fn read_snapshot(dir: &Path) -> Option<QueueSnapshot> {
    let path = dir.join(QUEUE_STATE_FILE);
    let data = std::fs::read(&path).ok()?;
    let snap = QueueSnapshot::decode(&data);
    if snap.is_none() {
        tracing::error!(path = %path.display(), "queue state is corrupt; starting from the beginning of the log (messages will be redelivered)");
    }
    snap
}

fn write_snapshot(dir: &Path, snap: &QueueSnapshot) -> std::io::Result<()> {
    crate::fsutil::write_file_atomic(&dir.join(QUEUE_STATE_FILE), &snap.encode())
}
