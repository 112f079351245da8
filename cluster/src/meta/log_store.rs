//! The Raft log on disk: one append-only file of framed entries, plus a small state file
//! (vote, committed, last purged) replaced atomically.
//!
//! ```text
//! raft/log    "NRDRAFT1" | nonce u64 | frame*
//!             frame = u32 len | u32 CRC32C(nonce ‖ body) | u64 nonce | body (JSON entry)
//! raft/state  JSON {vote, committed, last_purged}        (temp + fsync + rename)
//! ```
//!
//! An append is written and `fdatasync`ed before openraft hears it is flushed (the callback),
//! so an entry a leader counted toward a quorum is on this disk; each entry of an append is
//! synced before the next is written, so a crash tears at most the last frame on disk. At open the file is read
//! frame by frame: an incomplete or damaged frame at the end is an append that never
//! completed (and so was never reported flushed): it is cut. A valid frame *after* a damaged
//! one means the damage is in the middle: the node refuses to start rather than lose
//! entries it acknowledged. The per-file random nonce in every frame makes a payload that
//! happens to contain frame-shaped bytes (entries carry client-chosen names) unable to pass
//! for a frame. Memory holds an index (position of every entry), not the entries; reads go
//! to the file. Purged entries stay in the file until they are most of it; then the rest
//! is copied to a new file that replaces it atomically.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{LogId, OptionalSend, RaftLogId, StorageError, StorageIOError, Vote};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{Entry, NodeId, TypeConfig};

const MAGIC: &[u8; 8] = b"NRDRAFT1";
const HEADER: u64 = 16;
const FRAME_HEADER: usize = 16;
/// Largest entry accepted in the log (longer lengths read back are damage).
pub const MAX_ENTRY_BYTES: usize = 16 << 20;
/// Purged bytes that trigger a rewrite, when they are also over half the file.
const COMPACT_BYTES: u64 = 1 << 20;
const LOG_FILE: &str = "log";
const STATE_FILE: &str = "state";

type SError = StorageError<NodeId>;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HardState {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    log_id: LogId<NodeId>,
    offset: u64,
    len: u32,
}

struct LogFile {
    dir: PathBuf,
    file: File,
    nonce: u64,
    /// End of the last valid frame: where the next one goes.
    end: u64,
    index: BTreeMap<u64, Slot>,
    state: HardState,
}

/// Why the log could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the raft log {path} is damaged at byte {at}, with valid entries after it: refusing to start rather than drop acknowledged entries"
    )]
    CorruptMiddle { path: PathBuf, at: u64 },
    #[error("{path} is not a raft log or state file: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// The Raft log store. Clones share the same log (the reader openraft asks for is a clone).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogFile>>,
    /// Why this member stopped taking part (see `committed_conflict`), once it did.
    halted: Arc<Mutex<Option<String>>>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, cutting an incomplete last append.
    pub fn open(dir: &Path) -> Result<Self, OpenError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| OpenError::Io { path, source }
        };
        narad_core::fsutil::create_dir_private(dir).map_err(io(dir))?;
        let state_path = dir.join(STATE_FILE);
        let (state, state_found) = match std::fs::read(&state_path) {
            Ok(b) => (
                serde_json::from_slice(&b).map_err(|e| OpenError::Invalid {
                    path: state_path.clone(),
                    reason: e.to_string(),
                })?,
                true,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (HardState::default(), false),
            Err(e) => return Err(io(&state_path)(e)),
        };
        let path = dir.join(LOG_FILE);
        let _ = std::fs::remove_file(dir.join(format!("{LOG_FILE}.tmp")));
        let (file, nonce, end, index) = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(mut f) => {
                let mut bytes = Vec::new();
                f.read_to_end(&mut bytes).map_err(io(&path))?;
                let (nonce, end, index) = scan(&path, &bytes)?;
                if end < bytes.len() as u64 {
                    tracing::warn!(path = %path.display(), cut = bytes.len() as u64 - end, "raft log: an incomplete last append was cut");
                    f.set_len(end).map_err(io(&path))?;
                    f.sync_data().map_err(io(&path))?;
                }
                (f, nonce, end, index)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (f, nonce) = create(dir, &path).map_err(io(&path))?;
                (f, nonce, HEADER, BTreeMap::new())
            }
            Err(e) => return Err(io(&path)(e)),
        };
        // openraft saves a vote before any entry reaches the log: entries without the state
        // file mean it was lost, and with it the vote (this node could vote twice in a term)
        if !state_found && !index.is_empty() {
            return Err(OpenError::Invalid {
                path: state_path,
                reason: "missing while the raft log holds entries (the node's vote is lost, so it could vote twice in one term): restore the file, or remove this node's raft directory and join again under a new node_id".into(),
            });
        }
        let mut index = index;
        // entries at or below the purge point are gone, even if still in the file
        if let Some(p) = state.last_purged {
            index = index.split_off(&(p.index + 1));
        }
        Ok(Self {
            inner: Arc::new(Mutex::new(LogFile {
                dir: dir.to_owned(),
                file,
                nonce,
                end,
                index,
                state,
            })),
            halted: Arc::default(),
        })
    }

    /// Why entries a leader sends conflict with what this member committed, if they do:
    /// `prev` and `entries` (ascending) name, at an index this member committed, another
    /// entry than its own. Raft never changes a committed entry, so a leader that does holds
    /// a history made without this member's last entries: another member lost acknowledged
    /// metadata (restored from an older copy of its data directory, or a lost disk) while
    /// this one was away. (openraft takes every entry at or below the commit point as the
    /// same without looking: the leader's would be skipped and this member's state would
    /// part from the others' without a word.)
    pub fn committed_conflict(
        &self,
        prev: Option<LogId<NodeId>>,
        entries: impl Iterator<Item = LogId<NodeId>>,
    ) -> Option<String> {
        let f = self.inner.lock();
        let committed = f.state.committed?;
        for id in prev.into_iter().chain(entries) {
            if id.index > committed.index {
                break;
            }
            if let Some(mine) = f.index.get(&id.index).map(|s| s.log_id)
                && mine != id
            {
                return Some(format!(
                    "the leader's log conflicts with metadata this member committed (at index {}: the leader's entry is {id}, this member committed {mine}; committed up to {committed}): another member lost acknowledged metadata (restored from an older copy of its data directory, or a lost disk) while this one was away; this member stops taking part rather than undo it (see docs/operations.md, restoring a member)",
                    id.index
                ));
            }
        }
        None
    }

    /// Why a snapshot whose history holds `theirs(index)` at an index conflicts with what
    /// this member committed, if it does (and the snapshot's history reaches that far back).
    pub fn snapshot_conflict(
        &self,
        theirs: impl Fn(u64) -> Option<LogId<NodeId>>,
    ) -> Option<String> {
        let committed = self.inner.lock().state.committed?;
        let other = theirs(committed.index)?;
        (other != committed).then(|| format!(
            "the leader's snapshot conflicts with metadata this member committed (at index {}: the snapshot's history holds {other}, this member committed {committed}): another member lost acknowledged metadata (restored from an older copy of its data directory, or a lost disk) while this one was away; this member stops taking part rather than undo it (see docs/operations.md, restoring a member)",
            committed.index
        ))
    }

    /// Stops this member taking part in the metastore, for `why` (see
    /// [`Self::committed_conflict`]); once is enough, and it holds until the process ends.
    pub fn halt(&self, why: String) {
        let mut h = self.halted.lock();
        if h.is_none() {
            tracing::error!("{why}");
            *h = Some(why);
        }
    }

    /// Why this member stopped taking part, if it did.
    pub fn halted(&self) -> Option<String> {
        self.halted.lock().clone()
    }

    /// Runs `f` on the log off the async threads; its error becomes openraft's as `kind` says.
    /// The last entry purged from the log (covered by a snapshot), if any.
    pub fn last_purged(&self) -> Option<LogId<NodeId>> {
        self.inner.lock().state.last_purged
    }

    async fn blocking<T: Send + 'static>(
        &self,
        kind: fn(&std::io::Error) -> SError,
        f: impl FnOnce(&mut LogFile) -> std::io::Result<T> + Send + 'static,
    ) -> Result<T, SError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&mut inner.lock()))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r)
            .map_err(|e| kind(&e))
    }
}

fn write_logs(e: &std::io::Error) -> SError {
    StorageIOError::write_logs(e).into()
}

fn read_logs(e: &std::io::Error) -> SError {
    StorageIOError::read_logs(e).into()
}

fn write_vote(e: &std::io::Error) -> SError {
    StorageIOError::write_vote(e).into()
}

/// Creates a new log file (header with a fresh nonce) and makes its name durable.
fn create(dir: &Path, path: &Path) -> std::io::Result<(File, u64)> {
    let nonce = u64::from_le_bytes(super::random_bytes());
    let mut f = narad_core::fsutil::create_new_private(path)?;
    f.write_all(MAGIC)?;
    f.write_all(&nonce.to_le_bytes())?;
    f.sync_all()?;
    narad_core::fsutil::sync_dir(dir)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    Ok((f, nonce))
}

fn frame(nonce: u64, body: &[u8]) -> Vec<u8> {
    let mut crc = crc32c::crc32c(&nonce.to_le_bytes());
    crc = crc32c::crc32c_append(crc, body);
    let mut b = Vec::with_capacity(FRAME_HEADER + body.len());
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(&nonce.to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// The frame at `at`, if a valid one starts there: its body's range.
fn frame_at(bytes: &[u8], at: usize, nonce: u64) -> Option<std::ops::Range<usize>> {
    let head = bytes.get(at..at + FRAME_HEADER)?;
    let len = u32::from_le_bytes(head[0..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..8].try_into().ok()?);
    if head[8..16] != nonce.to_le_bytes() || len > MAX_ENTRY_BYTES {
        return None;
    }
    let body = bytes.get(at + FRAME_HEADER..at + FRAME_HEADER + len)?;
    let sum = crc32c::crc32c_append(crc32c::crc32c(&nonce.to_le_bytes()), body);
    (sum == crc).then_some(at + FRAME_HEADER..at + FRAME_HEADER + len)
}

type Scanned = (u64, u64, BTreeMap<u64, Slot>);

/// Reads the whole file: its nonce, where valid frames end, and the index.
fn scan(path: &Path, bytes: &[u8]) -> Result<Scanned, OpenError> {
    let invalid = |reason: &str| OpenError::Invalid {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if bytes.len() < HEADER as usize || &bytes[..8] != MAGIC {
        return Err(invalid("no raft log header"));
    }
    let nonce = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let mut at = HEADER as usize;
    let mut index = BTreeMap::new();
    let mut last: Option<u64> = None;
    while let Some(body) = frame_at(bytes, at, nonce) {
        let entry: Entry = serde_json::from_slice(&bytes[body.clone()])
            .map_err(|e| invalid(&format!("entry at byte {at}: {e}")))?;
        let log_id = *entry.get_log_id();
        // a truncate cuts the file, so indexes only ascend (with a gap where a snapshot
        // replaced entries that were purged)
        if last.is_some_and(|l| log_id.index <= l) {
            return Err(invalid(&format!(
                "entry {} follows {}",
                log_id.index,
                last.unwrap_or(0)
            )));
        }
        last = Some(log_id.index);
        index.insert(
            log_id.index,
            Slot {
                log_id,
                offset: at as u64,
                len: (body.end - at) as u32,
            },
        );
        at = body.end;
    }
    // damage: only an incomplete last append may be cut; a valid frame later means the
    // damage is in the middle (the nonce marks where frames may start)
    let needle = nonce.to_le_bytes();
    let mut probe = at + 1;
    while probe + FRAME_HEADER <= bytes.len() {
        match bytes[probe + 8..]
            .windows(8)
            .position(|w| w == needle)
            .map(|i| probe + i)
        {
            Some(start) => {
                if frame_at(bytes, start, nonce).is_some() {
                    return Err(OpenError::CorruptMiddle {
                        path: path.to_owned(),
                        at: at as u64,
                    });
                }
                probe = start + 1;
            }
            None => break,
        }
    }
    Ok((nonce, at as u64, index))
}

impl LogFile {
    fn save_state(&self) -> std::io::Result<()> {
        let body = serde_json::to_vec(&self.state).expect("raft state serialises");
        narad_core::fsutil::write_file_atomic(&self.dir.join(STATE_FILE), &body)
    }

    fn read(&self, slot: &Slot) -> std::io::Result<Entry> {
        let mut buf = vec![0; slot.len as usize];
        self.file.read_exact_at(&mut buf, slot.offset)?;
        let body = buf.get(FRAME_HEADER..).unwrap_or_default();
        serde_json::from_slice(body)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// Appends `entries`, each frame written and synced before the next is written: a crash
    /// can then tear only the last frame on disk (never leave a damaged frame with intact
    /// frames after it, which the open must take for damage in the middle). Entries are
    /// metadata and few, so a sync per entry costs little; a single entry (the usual case)
    /// costs the one sync it always did.
    fn append(&mut self, entries: Vec<Entry>) -> std::io::Result<()> {
        for e in &entries {
            let body = serde_json::to_vec(e).expect("raft entries serialise");
            if body.len() > MAX_ENTRY_BYTES {
                return Err(std::io::Error::other(format!(
                    "a raft entry of {} bytes is over the {MAX_ENTRY_BYTES}-byte limit",
                    body.len()
                )));
            }
            let f = frame(self.nonce, &body);
            self.file.write_all_at(&f, self.end)?;
            self.file.sync_data()?;
            let slot = Slot {
                log_id: *e.get_log_id(),
                offset: self.end,
                len: f.len() as u32,
            };
            self.end += f.len() as u64;
            self.index.insert(slot.log_id.index, slot);
        }
        Ok(())
    }

    fn truncate(&mut self, from: u64) -> std::io::Result<()> {
        let Some(first) = self.index.range(from..).next().map(|(_, s)| *s) else {
            return Ok(());
        };
        self.file.set_len(first.offset)?;
        self.file.sync_data()?;
        self.end = first.offset;
        self.index.split_off(&from);
        Ok(())
    }

    fn purge(&mut self, upto: LogId<NodeId>) -> std::io::Result<()> {
        if self
            .state
            .last_purged
            .is_some_and(|p| p.index >= upto.index)
        {
            return Ok(());
        }
        self.state.last_purged = Some(upto);
        self.save_state()?;
        self.index = self.index.split_off(&(upto.index + 1));
        let live = self.index.values().map(|s| s.len as u64).sum::<u64>();
        let dead = self.end - HEADER - live;
        if dead > COMPACT_BYTES && dead > live {
            self.compact()?;
        }
        Ok(())
    }

    /// Copies the live frames to a new file that replaces the log.
    fn compact(&mut self) -> std::io::Result<()> {
        let path = self.dir.join(LOG_FILE);
        let tmp = self.dir.join(format!("{LOG_FILE}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let nonce = u64::from_le_bytes(super::random_bytes());
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce.to_le_bytes());
        let mut index = BTreeMap::new();
        for (i, s) in &self.index {
            let mut buf = vec![0; s.len as usize];
            self.file.read_exact_at(&mut buf, s.offset)?;
            let f = frame(nonce, &buf[FRAME_HEADER..]);
            index.insert(
                *i,
                Slot {
                    log_id: s.log_id,
                    offset: out.len() as u64,
                    len: f.len() as u32,
                },
            );
            out.extend_from_slice(&f);
        }
        let mut f = narad_core::fsutil::create_new_private(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        narad_core::fsutil::sync_dir(&self.dir)?;
        self.file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        self.nonce = nonce;
        self.end = out.len() as u64;
        self.index = index;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, SError> {
        let (start, end) = (range.start_bound().cloned(), range.end_bound().cloned());
        self.blocking(read_logs, move |f| {
            f.index
                .range((start, end))
                .map(|(_, s)| f.read(s))
                .collect()
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SError> {
        let f = self.inner.lock();
        let last_purged = f.state.last_purged;
        let last = f
            .index
            .values()
            .next_back()
            .map(|s| s.log_id)
            .or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SError> {
        let vote = *vote;
        self.blocking(write_vote, move |f| {
            f.state.vote = Some(vote);
            f.save_state()
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SError> {
        // (read at start only) a vote a quorum had granted is not taken as still granted: a
        // member that led before it stopped would otherwise lead again at once in the same
        // term, and one restored from an older copy of its data directory would hand out
        // log ids the cluster had already given to other entries. It stands again instead,
        // through the pre-vote, which a member with a shorter log does not win.
        Ok(self.inner.lock().state.vote.map(|v| Vote {
            committed: false,
            ..v
        }))
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SError> {
        self.blocking(write_vote, move |f| {
            if f.state.committed == committed {
                return Ok(());
            }
            f.state.committed = committed;
            f.save_state()
        })
        .await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SError> {
        Ok(self.inner.lock().state.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), SError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let r = self.blocking(write_logs, move |f| f.append(entries)).await;
        // flushed means on disk: reported only after the fdatasync
        match &r {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        r
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SError> {
        self.blocking(write_logs, move |f| f.truncate(log_id.index))
            .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SError> {
        self.blocking(write_logs, move |f| f.purge(log_id)).await
    }
}

#[cfg(test)]
pub(super) fn damage(dir: &Path, at_from_end: u64, byte: u8) {
    let path = dir.join(LOG_FILE);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let len = f.metadata().unwrap().len();
    f.write_all_at(&[byte], len - at_from_end).unwrap();
}

#[cfg(test)]
pub(super) fn log_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(LOG_FILE)).unwrap().len()
}
