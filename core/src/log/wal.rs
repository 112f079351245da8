//! The node's write-ahead log: one file and one `fdatasync` for the appends of every
//! partition, written by one dedicated thread.
//!
//! ```text
//!  append() ─► queue ─► WAL thread: drain the queue (a round) ─► per partition: offsets,
//!  (any log)             timestamps, frames encoded once into the round's buffer
//!                        ─► write the round to wal/<seq>.wal ─► ONE fdatasync
//!                        ─► pwrite each partition's frames into its segment (page cache)
//!                        ─► publish, reply
//!  every 2 MiB of segment bytes (more with many files: ~256 KiB a file) ─► checkpoint
//!                             thread: fdatasync the segment files written since
//!                             (writeback: keeps each flush small; removes nothing)
//!  WAL file ≥ rotate_bytes ─► next file; checkpoint thread: fdatasync every segment file the
//!                             old files wrote ─► remove (or recycle) those WAL files
//!  open ─► replay every WAL file into the segments it names (compare, repair) ─► fsync
//!          them ─► remove the WAL files ─► start a new one
//! ```
//!
//! A segment write is never synced on its own: the WAL entry that carries the same frames is
//! what makes an append durable, and the checkpoint syncs the segment files before the WAL
//! files that cover them go. While the node is busy the queue fills during each `fdatasync`,
//! so one sync covers whatever every partition received meanwhile. Segment bytes are written
//! only after their round's sync: every segment byte past the last checkpoint has a durable
//! entry, so replay never cuts a segment (bytes past the last entry it sees were
//! acknowledged, and a WAL cut short must not cost them).
//!
//! File `wal/<seq, 20 digits>.wal`: magic `NRDWAL03`, `u64` seq, `u64` nonce (random, new
//! each time the file is started), then one entry per round: `u32 body_len, u32
//! CRC32C(nonce ‖ body), u64 nonce, body`; zeros after the last entry. A round's body is a
//! run of records `u8 kind, u32 length, ...`: `1` register (`u32 log id`, the partition
//! directory relative to the data directory, UTF-8), `2` append (`u32 log id, u64 segment
//! base, u64 byte position in the segment`, then the record frames exactly as the segment
//! holds them). Log ids are per file: each file registers a log before its first append
//! there. The files are ours but are read as untrusted bytes (their entries hold client
//! payloads): replay stops at the first entry that is short, carries another nonce or fails
//! its CRC (a round that never finished its sync, or old entries of a recycled file). A round
//! is written only after the previous one's sync, so a whole entry of this file after a bad
//! one means synced data was damaged: replay refuses to start. A client cannot forge an
//! entry inside a payload: it would need the file's nonce. Replay refuses paths that leave
//! the data directory or pass through a symbolic link.
//!
//! WAL files are preallocated (written with zeros once, then recycled): an `fdatasync` that
//! overwrites allocated blocks flushes the data alone, where one that grows a file also writes
//! its inode (`scripts/bench-peers` prints both: here ~30% less latency, 15–20% less CPU). A
//! busy node zero-fills one spare file (`wal/spare.<n>`) in the background and, after that,
//! the checkpoint recycles each covered file as the next spare. The nonce makes a recycled file's old entries invalid.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use super::disk::DataFile;
use super::{AppendReply, LogError, Shared, io_err, segment};
use crate::metrics::CoreMetrics;
use crate::record::NewRecord;

const MAGIC: &[u8; 8] = b"NRDWAL03";
/// Magic, the file's sequence number, its nonce.
const FILE_HEADER: u64 = 24;
const SUFFIX: &str = ".wal";
/// Prefix of a preallocated file waiting to become the next WAL file (`spare.<n>`; not a
/// name replay reads).
const SPARE: &str = "spare.";
/// `u32` body length, `u32` CRC32C(nonce ‖ body), `u64` the file's nonce.
const ENTRY_HEADER: usize = 16;
/// Sequence numbers at or above this are not ours (names are ignored): `seq + 1` never
/// overflows.
const MAX_SEQ: u64 = 1 << 62;
/// No WAL file is read whole if larger (a file ends at most one round past `rotate_bytes`).
const MAX_FILE_BYTES: u64 = 2 << 30;
const KIND_REGISTER: u8 = 1;
const KIND_APPEND: u8 = 2;
/// A record inside a round's entry: `u8 kind, u32 length of what follows`.
const SUB_HEADER: usize = 1 + 4;
/// Fixed part of an append record after its header: log id, segment base, position.
const APPEND_FIXED: usize = 4 + 8 + 8;
/// No entry body is larger (a round holds at most `MAX_ROUND_BYTES` plus one request).
const MAX_ENTRY_BODY: u64 = 1 << 30;
/// A round stops taking appends past this many bytes (the rest wait for the next round).
const MAX_ROUND_BYTES: usize = 8 * 1024 * 1024;
/// Yields the writer spends gathering a round (see `Writer::run`).
const GATHER_YIELDS: usize = 2;
/// The writer's name in `narad_task_panics_total` and `/readyz`.
const WRITER_TASK: &str = "log_writer";

#[derive(Debug, Clone)]
pub struct WalConfig {
    /// Start a new WAL file (and checkpoint the old ones) past this size.
    pub rotate_bytes: u64,
    /// Sync the segment files written since the last writeback once this many segment
    /// bytes have gathered (see [`Job::Writeback`]).
    pub writeback_bytes: u64,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            rotate_bytes: 64 * 1024 * 1024,
            writeback_bytes: 2 * 1024 * 1024,
        }
    }
}

/// What replaying the WAL at open did, for the log line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WalReplay {
    pub files: usize,
    pub entries: u64,
    /// Entries whose frames were missing or damaged in their segment and were rewritten.
    pub repaired: u64,
    /// Entries for segments (or partitions) deleted since: skipped.
    pub skipped: u64,
    /// A WAL file ended in a torn entry.
    pub torn: bool,
}

pub(super) enum Cmd {
    Append {
        log: Arc<Shared>,
        records: Vec<NewRecord>,
        reply: AppendReply,
    },
    /// Seal the active segment (`aged`: only if it is still past its age).
    Roll {
        log: Arc<Shared>,
        aged: bool,
        reply: oneshot::Sender<Result<(), LogError>>,
    },
    /// Answered once every command queued before it is done; the log refuses what follows.
    Close {
        log: Arc<Shared>,
        reply: oneshot::Sender<()>,
    },
    /// Starts a new WAL file and answers once every earlier one is checkpointed away (its
    /// segments synced, the file removed): no WAL file then names what was written before.
    /// A partition directory whose content is about to be replaced wholesale (a move) asks
    /// for it, so that no later replay writes old frames into the new content.
    Checkpoint {
        reply: oneshot::Sender<Result<(), LogError>>,
    },
}

/// The node's WAL: a cheap handle; the last one dropped stops the threads (after
/// [`Wal::shutdown`] they are already stopped and the WAL is checkpointed away).
#[derive(Clone)]
pub struct Wal(Arc<WalOwner>);

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.0.inner.dir)
            .finish()
    }
}

struct WalOwner {
    inner: Arc<WalInner>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Drop for WalOwner {
    fn drop(&mut self) {
        self.inner.stop();
    }
}

pub(super) struct WalInner {
    /// Paths in the WAL are relative to this (the data directory).
    root: PathBuf,
    dir: PathBuf,
    queue: Mutex<Queue>,
    wake: Condvar,
    poisoned: Mutex<Option<String>>,
    pub(super) metrics: Arc<CoreMetrics>,
    next_log_id: AtomicU32,
    /// A preallocated file ready to be the next WAL file, and its path.
    spare: Mutex<Option<(File, PathBuf)>>,
    spares_made: AtomicU32,
    /// A [`Job::Writeback`] is queued or running (at most one at a time).
    writeback_pending: AtomicBool,
    #[cfg(test)]
    pub(super) faults: Option<Arc<super::disk::faults::FaultDisk>>,
    /// Tests: stop as a killed process would (no final checkpoint, no more checkpoints).
    #[cfg(test)]
    abandoned: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Queue {
    cmds: Vec<Cmd>,
    /// The writer waits on `wake` (a push must notify it).
    idle: bool,
    stop: bool,
    /// The writer has exited: nothing pushed now would be answered.
    gone: bool,
}

impl WalInner {
    fn stop(&self) {
        self.queue.lock().stop = true;
        self.wake.notify_one();
    }

    pub(super) fn poisoned(&self) -> Option<String> {
        self.poisoned.lock().clone()
    }

    fn poison(&self, reason: String) {
        tracing::error!(error = %reason, "write-ahead log poisoned: every append fails until a restart");
        self.metrics.log_poisoned.inc();
        self.poisoned.lock().get_or_insert(reason);
    }

    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    fn spare_path(&self) -> PathBuf {
        let n = self.spares_made.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join(format!("{SPARE}{}{n:06}", std::process::id()))
    }

    pub(super) fn next_log_id(&self) -> u32 {
        self.next_log_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues `cmds` for the writer, all in one round if it is idle.
    pub(super) fn push(&self, cmds: impl IntoIterator<Item = Cmd>) -> Result<(), LogError> {
        let mut q = self.queue.lock();
        if q.gone || q.stop {
            return Err(LogError::Closed);
        }
        q.cmds.extend(cmds);
        if q.idle {
            q.idle = false;
            drop(q);
            self.wake.notify_one();
        }
        Ok(())
    }

    /// A data file for the writer (through the fault model in tests).
    pub(super) fn data_file(&self, file: File, path: &Path) -> DataFile {
        #[cfg(test)]
        if let Some(disk) = &self.faults {
            return DataFile::faulty(file, disk.clone(), path.to_owned());
        }
        let _ = path;
        DataFile::new(file)
    }
}

impl Wal {
    /// Opens the WAL in `dir` for the partition directories under `root`: replays what an
    /// earlier run left into the segments, makes that durable, removes the old files and
    /// starts the writer. Blocking. Call before any partition under `root` is opened.
    pub fn open(
        dir: &Path,
        root: &Path,
        cfg: WalConfig,
        metrics: Arc<CoreMetrics>,
    ) -> Result<(Self, WalReplay), LogError> {
        Self::open_inner(
            dir,
            root,
            cfg,
            metrics,
            #[cfg(test)]
            None,
        )
    }

    /// Tests: every WAL and segment write goes through `disk`'s model.
    #[cfg(test)]
    pub(crate) fn open_faulty(
        dir: &Path,
        root: &Path,
        cfg: WalConfig,
        metrics: Arc<CoreMetrics>,
        disk: Arc<super::disk::faults::FaultDisk>,
    ) -> Result<(Self, WalReplay), LogError> {
        Self::open_inner(dir, root, cfg, metrics, Some(disk))
    }

    fn open_inner(
        dir: &Path,
        root: &Path,
        cfg: WalConfig,
        metrics: Arc<CoreMetrics>,
        #[cfg(test)] faults: Option<Arc<super::disk::faults::FaultDisk>>,
    ) -> Result<(Self, WalReplay), LogError> {
        crate::fsutil::create_dir_private(dir).map_err(io_err(dir))?;
        let files = list_files(dir)?;
        let replay = replay(root, &files)?;
        for (_, path) in &files {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(path)(e)),
                _ => {}
            }
        }
        if !files.is_empty() {
            crate::fsutil::sync_dir(dir).map_err(io_err(dir))?;
        }
        let seq = files.last().map_or(1, |(s, _)| s + 1);
        let inner = Arc::new(WalInner {
            root: root.to_owned(),
            dir: dir.to_owned(),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            poisoned: Mutex::new(None),
            metrics,
            next_log_id: AtomicU32::new(1),
            spare: Mutex::new(None),
            spares_made: AtomicU32::new(0),
            writeback_pending: AtomicBool::new(false),
            #[cfg(test)]
            faults,
            #[cfg(test)]
            abandoned: std::sync::atomic::AtomicBool::new(false),
        });
        let _ = std::fs::remove_file(dir.join("spare.tmp"));
        adopt_spare(&inner, cfg.rotate_bytes);
        let (file, pos, nonce, preallocated) = create_file(&inner, seq)?;
        let (ckpt_tx, ckpt_rx) = std::sync::mpsc::channel();
        let writer = Writer {
            inner: inner.clone(),
            nonce,
            salt: crc32c::crc32c(&nonce.to_le_bytes()),
            preallocated,
            spare_requested: false,
            appended: 0,
            cfg,
            file,
            seq,
            pos,
            registered: HashSet::new(),
            dirty: HashMap::new(),
            unflushed: HashMap::new(),
            unflushed_bytes: 0,
            buf: Vec::new(),
            ckpt: ckpt_tx,
            rotate_retry_at: 0,
        };
        let ckpt_inner = inner.clone();
        let checkpointer = std::thread::Builder::new()
            .name("narad-wal-ckpt".into())
            .spawn(move || checkpointer(&ckpt_inner, &ckpt_rx))
            .map_err(io_err(dir))?;
        let writer_inner = inner.clone();
        let writer = std::thread::Builder::new()
            .name("narad-wal".into())
            .spawn(move || writer.run())
            .map_err(|e| {
                writer_inner.stop();
                io_err(dir)(e)
            })?;
        Ok((
            Self(Arc::new(WalOwner {
                inner,
                threads: Mutex::new(vec![writer, checkpointer]),
            })),
            replay,
        ))
    }

    pub(super) fn inner(&self) -> &Arc<WalInner> {
        &self.0.inner
    }

    /// Checkpoints every WAL file written so far away (see [`Cmd::Checkpoint`]): once this
    /// returns, no WAL file names a frame written before the call.
    pub(crate) async fn checkpoint(&self) -> Result<(), LogError> {
        let (tx, rx) = oneshot::channel();
        self.0.inner.push([Cmd::Checkpoint { reply: tx }])?;
        rx.await.unwrap_or(Err(LogError::Closed))
    }

    /// Tests: stops the threads as a `kill -9` would leave the files (no checkpoint).
    #[cfg(test)]
    pub(crate) fn abandon(&self) {
        self.0.inner.abandoned.store(true, Ordering::SeqCst);
        self.shutdown();
    }

    /// Stops the writer once it has answered everything queued, syncs every segment it
    /// wrote and removes the WAL files (so the next open replays nothing). Blocking; call
    /// after the logs are closed.
    pub fn shutdown(&self) {
        self.0.inner.stop();
        let threads = std::mem::take(&mut *self.0.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

fn wal_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}{SUFFIX}"))
}

fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&s| s < MAX_SEQ)
}

/// The WAL files in `dir`, oldest first.
fn list_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, LogError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let Some(seq) = parse_name(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        let path = entry.path();
        if !entry.file_type().map_err(io_err(&path))?.is_file() {
            return Err(io_err(&path)(io::Error::new(
                io::ErrorKind::InvalidData,
                "a write-ahead log name that is not a regular file",
            )));
        }
        files.push((seq, path));
    }
    files.sort_unstable();
    Ok(files)
}

/// Starts WAL file `seq` with a fresh nonce: the spare if one is ready (preallocated), else a
/// new, empty file. Returns the file, where entries start, the nonce, and whether it is
/// preallocated.
fn create_file(inner: &WalInner, seq: u64) -> Result<(DataFile, u64, u64, bool), LogError> {
    let path = wal_path(&inner.dir, seq);
    let nonce = random_nonce();
    let mut header = [0u8; FILE_HEADER as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&seq.to_le_bytes());
    header[16..].copy_from_slice(&nonce.to_le_bytes());
    let spare = inner.spare.lock().take();
    let (file, preallocated) = match spare {
        Some((f, spare_path)) => {
            // the header first, then the name: a crash between leaves a file whose header
            // does not match its name, which replay ignores
            f.write_all_at(&header, 0)
                .and_then(|()| f.sync_data())
                .and_then(|()| std::fs::rename(&spare_path, &path))
                .map_err(io_err(&path))?;
            (inner.data_file(f, &path), true)
        }
        None => {
            let f = crate::fsutil::create_new_private(&path).map_err(io_err(&path))?;
            let f = inner.data_file(f, &path);
            f.write_all_at(&header, 0)
                .and_then(|()| f.sync_data())
                .map_err(io_err(&path))?;
            (f, false)
        }
    };
    crate::fsutil::sync_dir(&inner.dir).map_err(io_err(&path))?;
    Ok((file, FILE_HEADER, nonce, preallocated))
}

/// A nonce no one can guess (never 0: zeros are the end of a preallocated file).
fn random_nonce() -> u64 {
    crate::random_u64() | 1
}

/// Zero-fills a spare WAL file of `bytes` (background, once per node) and offers it.
fn prepare_spare(inner: &WalInner, bytes: u64) -> io::Result<()> {
    let path = inner.spare_path();
    let tmp = inner.dir.join("spare.tmp");
    let _ = std::fs::remove_file(&tmp);
    let file = crate::fsutil::create_new_private(&tmp)?;
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < bytes {
        let n = zeros.len().min((bytes - at) as usize);
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    crate::fsutil::sync_dir(&inner.dir)?;
    offer_spare(inner, &path)
}

/// Puts the file at `path` (a `spare.<n>`) in the writer's slot.
fn offer_spare(inner: &WalInner, path: &Path) -> io::Result<()> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    *inner.spare.lock() = Some((file, path.to_owned()));
    Ok(())
}

/// At open: keeps one spare that is large enough (offered to the writer), removes the rest.
fn adopt_spare(inner: &WalInner, rotate_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(&inner.dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(SPARE) else {
            continue;
        };
        let path = e.path();
        let usable = rest.bytes().all(|b| b.is_ascii_digit())
            && !rest.is_empty()
            && e.metadata()
                .is_ok_and(|m| m.is_file() && m.len() >= rotate_bytes)
            && inner.spare.lock().is_none();
        if !(usable && offer_spare(inner, &path).is_ok()) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A segment replay wrote into: kept open to be synced at the end.
struct Replayed {
    file: File,
    len: u64,
}

fn replay(root: &Path, files: &[(u64, PathBuf)]) -> Result<WalReplay, LogError> {
    let mut report = WalReplay {
        files: files.len(),
        ..WalReplay::default()
    };
    let mut segments: HashMap<PathBuf, Option<Replayed>> = HashMap::new();
    for (seq, path) in files {
        let size = std::fs::metadata(path).map_err(io_err(path))?.len();
        if size > MAX_FILE_BYTES {
            return Err(bad(
                path,
                "a write-ahead log file far larger than any we write",
            ));
        }
        let data = std::fs::read(path).map_err(io_err(path))?;
        if data.len() < FILE_HEADER as usize || &data[..8] != MAGIC {
            tracing::warn!(path = %path.display(), "write-ahead log file without its magic; ignored");
            continue;
        }
        if data[8..16] != seq.to_le_bytes() {
            // a spare being renamed into place when the node stopped: nothing in it is ours
            tracing::info!(path = %path.display(), "write-ahead log file of another number; ignored");
            continue;
        }
        let nonce = u64::from_le_bytes(data[16..24].try_into().expect("8"));
        let mut at = FILE_HEADER as usize;
        let mut logs: HashMap<u32, PathBuf> = HashMap::new();
        loop {
            let body = match parse_entry(&data, at, nonce) {
                Parsed::Entry(body) => body,
                Parsed::End => break,
                Parsed::Invalid { search_from } => {
                    if let Some(next) = find_entry(&data, search_from, nonce) {
                        return Err(LogError::Recovery(segment::RecoveryError::CorruptMiddle {
                            path: path.clone(),
                            pos: at as u64,
                            reason: format!(
                                "an invalid write-ahead log entry followed by a valid one at byte {next}"
                            ),
                        }));
                    }
                    report.torn = true;
                    tracing::info!(path = %path.display(), at, "write-ahead log replay stops at an invalid entry (a write that was never acknowledged, or an old entry of a recycled file)");
                    break;
                }
            };
            at += ENTRY_HEADER + body.len();
            report.entries += 1;
            replay_round(root, path, body, &mut logs, &mut segments, &mut report)?;
        }
    }
    for (path, seg) in segments {
        if let Some(seg) = seg {
            seg.file.sync_data().map_err(io_err(&path))?;
        }
    }
    Ok(report)
}

/// Applies the records of one round's entry (CRC-valid: anything malformed inside is not
/// a torn write, and is refused).
fn replay_round(
    root: &Path,
    path: &Path,
    mut body: &[u8],
    logs: &mut HashMap<u32, PathBuf>,
    segments: &mut HashMap<PathBuf, Option<Replayed>>,
    report: &mut WalReplay,
) -> Result<(), LogError> {
    while !body.is_empty() {
        if body.len() < SUB_HEADER {
            return Err(bad(path, "a malformed record in a write-ahead log entry"));
        }
        let kind = body[0];
        let len = u32::from_le_bytes(body[1..SUB_HEADER].try_into().expect("4")) as usize;
        let Some(rec) = body.get(SUB_HEADER..SUB_HEADER + len) else {
            return Err(bad(path, "a malformed record in a write-ahead log entry"));
        };
        body = &body[SUB_HEADER + len..];
        match kind {
            KIND_REGISTER if rec.len() >= 4 => {
                let id = u32::from_le_bytes(rec[..4].try_into().expect("4"));
                let rel = std::str::from_utf8(&rec[4..]).ok().and_then(relative);
                let Some(rel) = rel else {
                    return Err(bad(path, "a registered path outside the data directory"));
                };
                logs.insert(id, partition_dir(root, &rel)?);
            }
            KIND_APPEND if rec.len() > APPEND_FIXED => {
                let id = u32::from_le_bytes(rec[..4].try_into().expect("4"));
                let base = u64::from_le_bytes(rec[4..12].try_into().expect("8"));
                let pos = u64::from_le_bytes(rec[12..20].try_into().expect("8"));
                let Some(dir) = logs.get(&id) else {
                    return Err(bad(path, "an append for a log the file never registered"));
                };
                let seg = segment::segment_path(dir, base);
                replay_entry(segments, &seg, pos, &rec[APPEND_FIXED..], report)?;
            }
            _ => {
                return Err(bad(
                    path,
                    "a record of unknown kind in a write-ahead log entry",
                ));
            }
        }
    }
    Ok(())
}

enum Parsed<'a> {
    Entry(&'a [u8]),
    /// Zeros: the end of what was written to a preallocated file (or of the file).
    End,
    /// Not an entry of this file; a later one, if any, starts at `search_from` or after.
    Invalid {
        search_from: usize,
    },
}

/// The entry at `at`, if it is a whole entry of the file with this nonce.
fn parse_entry(data: &[u8], at: usize, nonce: u64) -> Parsed<'_> {
    let Some(header) = data.get(at..at + ENTRY_HEADER) else {
        return if data.len() == at {
            Parsed::End
        } else {
            Parsed::Invalid {
                search_from: at + 1,
            }
        };
    };
    if header.iter().all(|&b| b == 0) {
        return Parsed::End;
    }
    let len = u32::from_le_bytes(header[..4].try_into().expect("4")) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4"));
    let end = at + ENTRY_HEADER + len;
    // the bytes inside an entry's declared extent are its body (client payloads among
    // them), never evidence: a search for a later entry starts past them when it can
    let search_from = if (len as u64) <= MAX_ENTRY_BODY && end <= data.len() {
        end.max(at + 1)
    } else {
        at + 1
    };
    if header[8..] != nonce.to_le_bytes() || len == 0 || end > data.len() {
        return Parsed::Invalid { search_from };
    }
    let body = &data[at + ENTRY_HEADER..end];
    if crc32c::crc32c_append(crc32c::crc32c(&nonce.to_le_bytes()), body) != crc {
        return Parsed::Invalid { search_from };
    }
    Parsed::Entry(body)
}

/// Where the first whole entry of this file starts at or after `from`, if any.
fn find_entry(data: &[u8], from: usize, nonce: u64) -> Option<usize> {
    let needle = nonce.to_le_bytes();
    let mut at = from;
    while at + ENTRY_HEADER <= data.len() {
        let rel = data[at + 8..].windows(8).position(|w| w == needle)?;
        let start = at + rel;
        if matches!(parse_entry(data, start, nonce), Parsed::Entry(_)) {
            return Some(start);
        }
        at = start + 1;
    }
    None
}

/// The partition directory `rel` names under `root`, refusing a path through a symbolic
/// link (replay must never write outside the data directory).
fn partition_dir(root: &Path, rel: &Path) -> Result<PathBuf, LogError> {
    let mut dir = root.to_owned();
    for c in rel.components() {
        dir.push(c);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(bad(
                    &dir,
                    "a partition directory reached through a symbolic link",
                ));
            }
            // missing (a deleted topic: its entries are skipped) or a real directory
            _ => {}
        }
    }
    Ok(dir)
}

fn replay_entry(
    segments: &mut HashMap<PathBuf, Option<Replayed>>,
    path: &Path,
    pos: u64,
    frames: &[u8],
    report: &mut WalReplay,
) -> Result<(), LogError> {
    if !segments.contains_key(path) {
        let seg = match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(path)(e)),
            Ok(m) if !m.is_file() => {
                return Err(bad(path, "a segment name that is not a regular file"));
            }
            Ok(_) => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(io_err(path))?;
                let len = file.metadata().map_err(io_err(path))?.len();
                Some(Replayed { file, len })
            }
        };
        segments.insert(path.to_owned(), seg);
    }
    // a segment deleted since (retention, a deleted topic) is gone on purpose
    let Some(seg) = segments.get_mut(path).expect("inserted") else {
        report.skipped += 1;
        return Ok(());
    };
    if pos > seg.len {
        // everything before an entry's position was made durable before the WAL file that
        // holds it was started; a hole means the disk lost acknowledged data
        return Err(LogError::Recovery(segment::RecoveryError::CorruptMiddle {
            path: path.to_owned(),
            pos: seg.len,
            reason: format!(
                "the write-ahead log has records at byte {pos} but the segment ends at {}",
                seg.len
            ),
        }));
    }
    let end = pos + frames.len() as u64;
    let have = (seg.len.min(end) - pos) as usize;
    let mut on_disk = vec![0; have];
    seg.file
        .read_exact_at(&mut on_disk, pos)
        .map_err(io_err(path))?;
    if have < frames.len() || on_disk != frames[..have] {
        seg.file.write_all_at(frames, pos).map_err(io_err(path))?;
        seg.len = seg.len.max(end);
        report.repaired += 1;
    }
    Ok(())
}

/// `rel` as a path under the data directory: only plain components (empty is the root).
fn relative(rel: &str) -> Option<PathBuf> {
    let p = Path::new(rel);
    p.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| p.to_owned())
}

fn bad(path: &Path, what: &str) -> LogError {
    io_err(path)(io::Error::new(io::ErrorKind::InvalidData, what.to_owned()))
}

enum Job {
    /// Sync these segment files, then remove the WAL files up to `upto` (one of them kept as
    /// the next spare if none is waiting and it is at least `spare_bytes`).
    Checkpoint {
        files: Vec<Arc<DataFile>>,
        upto: u64,
        spare_bytes: u64,
        /// Told when this checkpoint is done (or could not be).
        done: Option<oneshot::Sender<Result<(), LogError>>>,
    },
    /// Zero-fill a spare of this size.
    Prepare { bytes: u64 },
    /// Sync these segment files, removing nothing: the checkpoint of a busy node would
    /// otherwise flush a whole WAL file's worth of segment bytes (64 MiB) in one go, and every
    /// WAL sync queued behind that flush would wait for it (the latency spike every
    /// rotation). Synced a few MiB at a time, the flushes stay small and the checkpoint
    /// finds little left to do. Durability does not depend on it.
    Writeback { files: Vec<Arc<DataFile>> },
    /// Sync the segment files of a closed log and drop them (see `Writer::release`), then
    /// tell `done`, which the log's close awaits; counted as a writeback, and a failure
    /// poisons the same way.
    Release {
        files: Vec<Arc<DataFile>>,
        done: oneshot::Sender<()>,
    },
}

fn checkpointer(inner: &WalInner, rx: &std::sync::mpsc::Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let (files, upto, spare_bytes, done) = match job {
            Job::Checkpoint {
                files,
                upto,
                spare_bytes,
                done,
            } => (files, upto, spare_bytes, done),
            Job::Prepare { bytes } => {
                if inner.spare.lock().is_none()
                    && let Err(e) = prepare_spare(inner, bytes)
                {
                    tracing::warn!(error = %e, "could not preallocate a WAL file; syncs stay slower");
                }
                continue;
            }
            Job::Writeback { files } => {
                writeback(inner, &files);
                inner.writeback_pending.store(false, Ordering::Release);
                continue;
            }
            Job::Release { files, done } => {
                writeback(inner, &files);
                drop(files);
                let _ = done.send(());
                continue;
            }
        };
        if let Some(reason) = inner.poisoned() {
            if let Some(d) = done {
                let _ = d.send(Err(LogError::Poisoned(reason)));
            }
            continue;
        }
        #[cfg(test)]
        if inner.abandoned.load(Ordering::SeqCst) {
            continue;
        }
        let started = Instant::now();
        let synced = files.iter().try_for_each(|f| f.sync_data());
        if let Err(e) = synced {
            // the segments may not hold what the WAL acknowledged: keep the WAL files (the
            // next start replays them) and stop taking appends
            let reason = format!("checkpoint fsync of a segment failed: {e}");
            inner.poison(reason.clone());
            if let Some(d) = done {
                let _ = d.send(Err(LogError::Poisoned(reason)));
            }
            continue;
        }
        let mut removed = 0;
        if let Ok(list) = list_files(&inner.dir) {
            for (seq, path) in list {
                if seq <= upto {
                    if recycle(inner, &path, spare_bytes) {
                        removed += 1;
                        continue;
                    }
                    match std::fs::remove_file(&path) {
                        Ok(()) => removed += 1,
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, "could not remove a checkpointed WAL file");
                        }
                    }
                }
            }
        }
        if removed > 0
            && let Err(e) = crate::fsutil::sync_dir(&inner.dir)
        {
            tracing::warn!(dir = %inner.dir.display(), error = %e, "could not sync the WAL directory");
        }
        inner.metrics.wal_checkpoints.inc();
        inner
            .metrics
            .wal_checkpoint_seconds
            .observe(started.elapsed().as_secs_f64());
        if let Some(d) = done {
            let _ = d.send(Ok(()));
        }
    }
}

/// Syncs segment files ahead of their checkpoint. A failed sync poisons the WAL as a failed
/// checkpoint does: after an `fdatasync` error the kernel may have dropped the pages it could
/// not write, and a later sync of the same file can succeed without them.
fn writeback(inner: &WalInner, files: &[Arc<DataFile>]) {
    if inner.poisoned().is_some() {
        return;
    }
    #[cfg(test)]
    if inner.abandoned.load(Ordering::SeqCst) {
        return;
    }
    let started = Instant::now();
    if let Err(e) = files.iter().try_for_each(|f| f.sync_data()) {
        inner.poison(format!("writeback fsync of a segment failed: {e}"));
        return;
    }
    inner.metrics.wal_writebacks.inc();
    inner
        .metrics
        .wal_writeback_seconds
        .observe(started.elapsed().as_secs_f64());
}

/// Renames a checkpointed WAL file to be the next spare, if none is waiting and it is fully
/// allocated (at least `spare_bytes`). Its old entries stay, but fail their CRC under the
/// number it gets next.
fn recycle(inner: &WalInner, path: &Path, spare_bytes: u64) -> bool {
    if spare_bytes == 0
        || inner.spare.lock().is_some()
        || !std::fs::metadata(path).is_ok_and(|m| m.len() >= spare_bytes)
    {
        return false;
    }
    let spare = inner.spare_path();
    std::fs::rename(path, &spare).is_ok()
        && crate::fsutil::sync_dir(&inner.dir).is_ok()
        && offer_spare(inner, &spare).is_ok()
}

/// One partition's share of a round.
struct Group {
    log: Arc<Shared>,
    appends: Vec<(Vec<NewRecord>, AppendReply)>,
    bytes: usize,
}

/// A group encoded into the round's buffer, waiting for the sync.
struct Encoded {
    log: Arc<Shared>,
    file: Arc<DataFile>,
    frames: std::ops::Range<usize>,
    start_pos: u64,
    ts: i64,
    next: u64,
    /// (offset, position, length) of every frame.
    notes: Vec<(u64, u64, u64)>,
    /// (first offset, records, reply) of every append.
    placed: Vec<(u64, Vec<NewRecord>, AppendReply)>,
    failed: Option<String>,
}

struct Writer {
    inner: Arc<WalInner>,
    /// The current file's nonce, and its CRC32C (the start of every entry's CRC).
    nonce: u64,
    salt: u32,
    /// The current file was a spare (writes overwrite allocated blocks).
    preallocated: bool,
    spare_requested: bool,
    /// Bytes written since open (a busy node gets a spare).
    appended: u64,
    cfg: WalConfig,
    file: DataFile,
    seq: u64,
    pos: u64,
    /// Logs registered in the current file.
    registered: HashSet<u32>,
    /// Segment files the current file's entries wrote, to sync at its checkpoint.
    dirty: HashMap<(u32, u64), Arc<DataFile>>,
    /// Segment files written since the last [`Job::Writeback`], and how many bytes.
    unflushed: HashMap<(u32, u64), Arc<DataFile>>,
    unflushed_bytes: u64,
    buf: Vec<u8>,
    ckpt: std::sync::mpsc::Sender<Job>,
    /// After a failed rotation, the next attempt waits until the file reaches this size.
    rotate_retry_at: u64,
}

impl Writer {
    fn run(mut self) {
        loop {
            {
                let mut q = self.inner.queue.lock();
                while q.cmds.is_empty() && !q.stop {
                    q.idle = true;
                    self.inner.wake.wait(&mut q);
                }
                q.idle = false;
            }
            // Let the producers that are already runnable queue their appends before the round
            // closes, for as long as more keep coming (a few yields at most): on a busy node
            // every round costs a sync whatever it holds, so fewer, larger rounds spend less
            // CPU per message; idle, this costs a few µs.
            let mut seen = self.inner.queue.lock().cmds.len();
            for _ in 0..GATHER_YIELDS {
                std::thread::yield_now();
                let now = self.inner.queue.lock().cmds.len();
                if now == seen {
                    break;
                }
                seen = now;
            }
            let (cmds, stop) = {
                let mut q = self.inner.queue.lock();
                (std::mem::take(&mut q.cmds), q.stop)
            };
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| self.round(cmds)));
            if let Err(payload) = result {
                // a writer that panicked half way through a round may have left any log in
                // any state: nothing is written any more, appends fail as after an fsync error
                self.inner
                    .poison("the write-ahead log writer panicked".to_owned());
                self.inner
                    .metrics
                    .tasks
                    .record(WRITER_TASK, payload.as_ref());
            }
            if stop {
                let mut q = self.inner.queue.lock();
                if q.cmds.is_empty() {
                    q.gone = true;
                    break;
                }
            }
        }
        self.finish();
    }

    /// At shutdown: checkpoint everything, the current file included.
    fn finish(mut self) {
        #[cfg(test)]
        if self.inner.abandoned.load(Ordering::SeqCst) {
            return;
        }
        if self.inner.poisoned().is_none() {
            let files = self.dirty.drain().map(|(_, f)| f).collect();
            let _ = self.ckpt.send(Job::Checkpoint {
                files,
                upto: self.seq,
                // (the current file too: keep one for the next start)
                spare_bytes: self.cfg.rotate_bytes,
                done: None,
            });
        }
    }

    fn round(&mut self, cmds: Vec<Cmd>) {
        let mut groups: Vec<Group> = Vec::new();
        let mut index: HashMap<u32, usize> = HashMap::new();
        let mut bytes = 0;
        for cmd in cmds {
            match cmd {
                Cmd::Append {
                    log,
                    records,
                    reply,
                } => {
                    let n: usize = records.iter().map(NewRecord::encoded_len).sum();
                    if bytes > 0 && bytes + n > MAX_ROUND_BYTES {
                        self.commit(&mut groups);
                        index.clear();
                        bytes = 0;
                    }
                    bytes += n;
                    let i = *index.entry(log.id).or_insert_with(|| {
                        groups.push(Group {
                            log: log.clone(),
                            appends: Vec::new(),
                            bytes: 0,
                        });
                        groups.len() - 1
                    });
                    groups[i].bytes += n;
                    groups[i].appends.push((records, reply));
                }
                Cmd::Roll { log, aged, reply } => {
                    self.commit(&mut groups);
                    index.clear();
                    bytes = 0;
                    let due = !aged || log.age_expired();
                    let r = if due { self.roll(&log) } else { Ok(()) };
                    let _ = reply.send(r);
                }
                Cmd::Close { log, reply } => {
                    self.commit(&mut groups);
                    index.clear();
                    bytes = 0;
                    log.close_writer();
                    log.release_unused_space();
                    self.release(log.id, reply);
                }
                Cmd::Checkpoint { reply } => {
                    self.commit(&mut groups);
                    index.clear();
                    bytes = 0;
                    if let Some(reason) = self.inner.poisoned() {
                        let _ = reply.send(Err(LogError::Poisoned(reason)));
                    } else if let Err(reply) = self.rotate_then(Some(reply)) {
                        let _ = reply.send(Err(LogError::Poisoned(
                            "could not start a new WAL file to checkpoint the old ones".into(),
                        )));
                    }
                }
            }
        }
        self.commit(&mut groups);
    }

    fn roll(&mut self, log: &Arc<Shared>) -> Result<(), LogError> {
        if let Some(reason) = self.inner.poisoned() {
            return Err(LogError::Poisoned(reason));
        }
        log.roll(&self.inner)
    }

    /// Writes the round: segments, then the WAL, one sync; then publishes and replies.
    fn commit(&mut self, groups: &mut Vec<Group>) {
        if groups.is_empty() {
            return;
        }
        if let Some(reason) = self.inner.poisoned() {
            for g in groups.drain(..) {
                for (_, reply) in g.appends {
                    let _ = reply.send(Err(LogError::Poisoned(reason.clone())));
                }
            }
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        // the whole round is one entry (one CRC): of a round that was never synced any part
        // may be lost, so only a whole round is ever replayed
        buf.extend_from_slice(&[0; ENTRY_HEADER]);
        let mut encoded = Vec::with_capacity(groups.len());
        for g in groups.drain(..) {
            match g.log.prepare(&self.inner, g.bytes) {
                Ok((file, base, start_pos, ts, next)) => {
                    if self.registered.insert(g.log.id) {
                        encode_register(&mut buf, g.log.id, &g.log.relpath);
                    }
                    let sub = buf.len();
                    buf.push(KIND_APPEND);
                    buf.extend_from_slice(&[0; 4]);
                    buf.extend_from_slice(&g.log.id.to_le_bytes());
                    buf.extend_from_slice(&base.to_le_bytes());
                    buf.extend_from_slice(&start_pos.to_le_bytes());
                    let frames_start = buf.len();
                    let mut next_off = next;
                    let mut notes = Vec::new();
                    let mut placed = Vec::with_capacity(g.appends.len());
                    for (records, reply) in g.appends {
                        let first = next_off;
                        for r in &records {
                            let at = buf.len();
                            r.encode(next_off, ts, &mut buf);
                            let pos = start_pos + (at - frames_start) as u64;
                            notes.push((next_off, pos, (buf.len() - at) as u64));
                            next_off += 1;
                        }
                        placed.push((first, records, reply));
                    }
                    finish_sub(&mut buf, sub);
                    self.dirty
                        .entry((g.log.id, base))
                        .or_insert_with(|| file.clone());
                    self.unflushed
                        .entry((g.log.id, base))
                        .or_insert_with(|| file.clone());
                    encoded.push(Encoded {
                        log: g.log,
                        file,
                        frames: frames_start..buf.len(),
                        start_pos,
                        ts,
                        next: next_off,
                        notes,
                        placed,
                        failed: None,
                    });
                }
                Err(e) => {
                    for (_, reply) in g.appends {
                        let _ = reply.send(Err(super::again(&e)));
                    }
                }
            }
        }
        #[cfg(test)]
        for e in &encoded {
            if e.log.panic_next_group.swap(false, Ordering::SeqCst) {
                panic!("injected log writer panic");
            }
        }
        if encoded.is_empty() {
            self.buf = buf;
            return;
        }
        finish_entry(&mut buf, 0, self.nonce, self.salt);
        let started = Instant::now();
        let written = self
            .file
            .write_all_at(&buf, self.pos)
            .and_then(|()| self.file.sync_data());
        let m = &self.inner.metrics;
        m.fsyncs.inc();
        m.fsync_seconds.observe(started.elapsed().as_secs_f64());
        if let Err(err) = written {
            let reason = format!(
                "write/fsync of {} failed: {err}",
                wal_path(&self.inner.dir, self.seq).display()
            );
            self.inner.poison(reason.clone());
            for e in encoded {
                for (_, _, reply) in e.placed {
                    let _ = reply.send(Err(LogError::Poisoned(reason.clone())));
                }
            }
            self.buf = buf;
            return;
        }
        // Only now the segments (page cache; the checkpoint syncs them): a segment never holds
        // bytes whose WAL entry is not durable, so replay knows where every segment's durable
        // data ends (the end of its last entry) and cuts anything past it.
        for e in &mut encoded {
            e.file.preallocate(
                e.start_pos + (e.frames.end - e.frames.start) as u64,
                e.log.cfg.segment_max_bytes,
            );
            if let Err(err) = e.file.write_all_at(&buf[e.frames.clone()], e.start_pos) {
                // (the records are in the WAL: they come back at the next start)
                let reason = format!("write to {} failed: {err}", e.log.dir.display());
                e.log.poison(reason.clone());
                e.failed = Some(reason);
            }
        }
        self.unflushed_bytes += encoded
            .iter()
            .map(|e| (e.frames.end - e.frames.start) as u64)
            .sum::<u64>();
        self.pos += buf.len() as u64;
        self.appended += buf.len() as u64;
        m.appended_bytes.inc_by(buf.len() as u64);
        let records: usize = encoded.iter().map(|e| e.notes.len()).sum();
        m.records_per_fsync.observe(records as f64);
        for e in encoded {
            match e.failed {
                Some(reason) => {
                    for (_, _, reply) in e.placed {
                        let _ = reply.send(Err(LogError::Poisoned(reason.clone())));
                    }
                }
                None => e
                    .log
                    .publish(e.ts, e.next, &e.notes, e.placed, &buf[e.frames]),
            }
        }
        self.buf = buf;
        self.writeback();
        if !self.spare_requested && self.appended >= (self.cfg.rotate_bytes / 4).min(1 << 20) {
            // a busy node: preallocate a file in the background, and move to it when ready
            self.spare_requested = true;
            let _ = self.ckpt.send(Job::Prepare {
                bytes: self.cfg.rotate_bytes,
            });
        }
        let spare_ready = !self.preallocated && self.inner.spare.lock().is_some();
        if spare_ready || self.pos >= self.cfg.rotate_bytes.max(self.rotate_retry_at) {
            self.rotate();
        }
    }

    fn rotate(&mut self) {
        let _ = self.rotate_then(None);
    }

    /// Hands the segment files written since the last writeback to the checkpointer once
    /// `writeback_bytes` have gathered and no writeback is pending (else they wait for the
    /// next round: one pending at a time bounds the queue).
    ///
    /// Each file synced costs an `fdatasync` whatever it holds, so with many files written the
    /// writeback waits for about an eighth of `writeback_bytes` a file (up to a quarter of
    /// `rotate_bytes`): spread over 64 partitions, 2 MiB made 64 syncs of 32 KiB, and the
    /// checkpoint thread took 13% of a batch produce's CPU against 2% on one partition.
    fn writeback(&mut self) {
        let per_file = (self.unflushed.len() as u64).saturating_mul(self.cfg.writeback_bytes / 8);
        let due = self
            .cfg
            .writeback_bytes
            .max(per_file.min(self.cfg.rotate_bytes / 4));
        if self.unflushed_bytes < due || self.inner.writeback_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let files = self.unflushed.drain().map(|(_, f)| f).collect();
        self.unflushed_bytes = 0;
        if self.ckpt.send(Job::Writeback { files }).is_err() {
            self.inner.writeback_pending.store(false, Ordering::Release);
        }
    }

    /// Hands the segment files of a closed log to the checkpointer, which syncs them and lets
    /// them go. Until the WAL file that wrote them was checkpointed they were kept open for its
    /// checkpoint to sync: a node that deletes topics or closes idle partitions faster than it
    /// fills a WAL file ran out of descriptors (found by a black-box review: create, produce,
    /// delete, repeated, held every deleted segment open). Jobs run in order, so the sync comes
    /// before the checkpoint that removes the WAL file covering them. `closed` is told once
    /// they are synced and dropped, and the log's close waits for that: a node that closes
    /// logs faster than the checkpointer syncs them (partitions far past `max_open_logs`,
    /// each produce reopening one and evicting another) would otherwise pile up descriptors
    /// in the checkpointer's queue, beyond what `max_open_logs` bounds (found by the next
    /// review: 8,000 descriptors on a node allowed 16 logs).
    fn release(&mut self, log: u32, closed: oneshot::Sender<()>) {
        let mut files: Vec<Arc<DataFile>> = Vec::new();
        for map in [&mut self.dirty, &mut self.unflushed] {
            map.retain(|&(id, _), f| {
                if id == log {
                    if !files.iter().any(|g| Arc::ptr_eq(g, f)) {
                        files.push(f.clone());
                    }
                    false
                } else {
                    true
                }
            });
        }
        if files.is_empty() {
            let _ = closed.send(());
        } else {
            // (if the checkpointer is gone the job is dropped, and `closed` with it)
            let _ = self.ckpt.send(Job::Release {
                files,
                done: closed,
            });
        }
    }

    /// Starts the next WAL file and hands the old ones to the checkpointer, which tells
    /// `done` when they are gone. The reply back if no new file could be started.
    #[allow(clippy::type_complexity)]
    fn rotate_then(
        &mut self,
        done: Option<oneshot::Sender<Result<(), LogError>>>,
    ) -> Result<(), oneshot::Sender<Result<(), LogError>>> {
        let seq = self.seq + 1;
        match create_file(&self.inner, seq) {
            Ok((file, pos, nonce, preallocated)) => {
                let files = self.dirty.drain().map(|(_, f)| f).collect();
                let _ = self.ckpt.send(Job::Checkpoint {
                    files,
                    upto: self.seq,
                    spare_bytes: self.cfg.rotate_bytes,
                    done,
                });
                // (the checkpoint syncs them all)
                self.unflushed.clear();
                self.unflushed_bytes = 0;
                self.file = file;
                self.seq = seq;
                self.nonce = nonce;
                self.salt = crc32c::crc32c(&nonce.to_le_bytes());
                self.preallocated = preallocated;
                self.pos = pos;
                self.registered.clear();
                self.rotate_retry_at = 0;
                Ok(())
            }
            Err(e) => {
                // the current file keeps growing; try again a little later
                tracing::warn!(error = %e, "could not start a new WAL file; retrying later");
                let _ = std::fs::remove_file(wal_path(&self.inner.dir, seq));
                self.rotate_retry_at = self.pos + self.cfg.rotate_bytes / 4 + 1;
                done.map_or(Ok(()), Err)
            }
        }
    }
}

fn encode_register(buf: &mut Vec<u8>, id: u32, rel: &str) {
    let sub = buf.len();
    buf.push(KIND_REGISTER);
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&id.to_le_bytes());
    buf.extend_from_slice(rel.as_bytes());
    finish_sub(buf, sub);
}

/// Fills in the length of the record (inside a round's entry) that starts at `sub`.
fn finish_sub(buf: &mut [u8], sub: usize) {
    let len = (buf.len() - sub - SUB_HEADER) as u32;
    buf[sub + 1..sub + SUB_HEADER].copy_from_slice(&len.to_le_bytes());
}

/// Fills in the length, CRC and nonce of the entry whose header starts at `header` (`salt`:
/// the CRC of the nonce).
fn finish_entry(buf: &mut [u8], header: usize, nonce: u64, salt: u32) {
    let body = &buf[header + ENTRY_HEADER..];
    let len = body.len() as u32;
    let crc = crc32c::crc32c_append(salt, body);
    buf[header..header + 4].copy_from_slice(&len.to_le_bytes());
    buf[header + 4..header + 8].copy_from_slice(&crc.to_le_bytes());
    buf[header + 8..header + 16].copy_from_slice(&nonce.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_strictly() {
        assert_eq!(parse_name("00000000000000000007.wal"), Some(7));
        assert_eq!(parse_name("7.wal"), None);
        assert_eq!(parse_name("0000000000000000000a.wal"), None);
        assert_eq!(parse_name("00000000000000000007.log"), None);
    }

    /// An entry is one of its file's only under that start's nonce: the old entries a
    /// recycled file still holds are not, whatever its number (the nonce is new each time).
    #[test]
    fn an_entry_belongs_to_the_nonce_it_was_written_under() {
        let (a, b) = (random_nonce(), random_nonce());
        assert_ne!(a, b);
        let mut buf = vec![0; ENTRY_HEADER];
        encode_register(&mut buf, 1, "topics/t.1/p00000");
        finish_entry(&mut buf, 0, a, crc32c::crc32c(&a.to_le_bytes()));
        buf.extend_from_slice(&[0; 32]);
        assert!(matches!(parse_entry(&buf, 0, a), Parsed::Entry(_)));
        assert!(matches!(parse_entry(&buf, 0, b), Parsed::Invalid { .. }));
        // the zeros after it are the end, not damage
        let end = ENTRY_HEADER + SUB_HEADER + 4 + "topics/t.1/p00000".len();
        assert!(matches!(parse_entry(&buf, end, a), Parsed::End));
        // a valid entry after a bad one is found (damage), and only under its own nonce
        let mut two = buf[..end].to_vec();
        two[ENTRY_HEADER + 2] ^= 1;
        two.extend_from_slice(&buf[..end]);
        assert!(matches!(parse_entry(&two, 0, a), Parsed::Invalid { .. }));
        assert_eq!(find_entry(&two, 1, a), Some(end));
        assert_eq!(find_entry(&two, 1, b), None);
    }

    #[test]
    fn registered_paths_stay_under_the_root() {
        assert_eq!(relative(""), Some(PathBuf::new()));
        assert_eq!(
            relative("topics/t.1/p00000"),
            Some(PathBuf::from("topics/t.1/p00000"))
        );
        assert_eq!(relative("../x"), None);
        assert_eq!(relative("/etc"), None);
        assert_eq!(relative("a/../../b"), None);
    }
}
