//! Partition moves on this node: the source side (list and read a partition's files, freeze
//! it for the last bytes, thaw it), the target side (stage a copy, verify it, install it),
//! and what a node does when it follows a catalog in which one of its partitions moved away.
//!
//! ```text
//!  target                                   source (the owner)
//!  copy files ◄── list / read (serving) ─── partition keeps taking appends
//!  freeze ─────────────────────────────────► marker (durable) ─► drain appends, leases,
//!                                            settles ─► close the log ─► persist queue
//!  copy the rest ◄── list / read (frozen) ──
//!  verify, install, CompleteMove ──► Raft ─► both follow: the target serves, the source
//!                                            drops its copy (its leases answer 410)
//! ```
//!
//! Nothing here decides a move: the cluster's mover does (`infra`), and the catalog's
//! compare-and-set makes the flip (see [`crate::catalog::moves`]).

use super::*;
use crate::broker::partition::{self, FREEZE_MARKER, LogEnv, Partition};
use crate::catalog::move_machine::{FreezeRefusal, HeldFreeze, refuse_freeze};
use crate::ids::PartitionId;

/// Directory (under the data directory) where partitions being moved here are staged, and
/// where a node puts a partition it gave away before removing it.
pub const MOVES_DIR: &str = "moves";
/// Directory (under the data directory) where a node that was forgotten keeps the copies of
/// its partitions it finds rebuilt elsewhere when it comes back.
pub const QUARANTINE_DIR: &str = "quarantine";
/// Most bytes one read of a partition file returns.
pub const MAX_FILE_CHUNK: u64 = 1 << 20;

/// One file of a partition, as a move copies it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionFile {
    pub name: String,
    pub size: u64,
}

/// What a frozen partition holds: its end and its files, stable until it thaws.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FrozenPartition {
    pub next_offset: u64,
    pub files: Vec<PartitionFile>,
}

pub use crate::catalog::move_machine::FreezeAsk;

/// A freeze whose deadline passed, for the owner to thaw once the cluster agrees.
#[derive(Debug, Clone)]
pub struct LapsedFreeze {
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub token: u64,
    pub owner_epoch: u64,
}

/// Whether `name` is a file a partition directory holds that a move copies: a plain name
/// (no separator, not hidden), not the freeze marker, not a temporary file.
pub fn is_partition_file(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains('/')
        && !name.contains('\0')
        && name != FREEZE_MARKER
        && !name.ends_with(".tmp")
}

fn list_files(dir: &Path) -> std::io::Result<Vec<PartitionFile>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let Ok(md) = e.metadata() else { continue };
        if md.is_file() && is_partition_file(&name) {
            out.push(PartitionFile {
                name,
                size: md.len(),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// `files` without the segments (`<base>.log` and `<base>.idx`) whose records all lie below
/// `cutoff`: a segment ends where the next one begins, so the last is always kept, and so is
/// everything from the first segment that reaches `cutoff` on (what is left is contiguous).
fn skip_below(files: Vec<PartitionFile>, cutoff: u64) -> Vec<PartitionFile> {
    let base = |name: &str| -> Option<u64> {
        let b = name
            .strip_suffix(".log")
            .or_else(|| name.strip_suffix(".idx"))?;
        (b.len() == 20 && b.bytes().all(|c| c.is_ascii_digit()))
            .then(|| b.parse().ok())
            .flatten()
    };
    let mut bases: Vec<u64> = files
        .iter()
        .filter(|f| f.name.ends_with(".log"))
        .filter_map(|f| base(&f.name))
        .collect();
    bases.sort_unstable();
    let skip: std::collections::HashSet<u64> = bases
        .windows(2)
        .filter(|w| w[1] <= cutoff)
        .map(|w| w[0])
        .collect();
    files
        .into_iter()
        .filter(|f| base(&f.name).is_none_or(|b| !skip.contains(&b)))
        .collect()
}

/// Moves `dir` (if it exists) to `aside`, replacing whatever was there. Blocking.
fn set_aside(dir: &Path, aside: &Path) -> Result<(), BrokerError> {
    let _ = std::fs::remove_dir_all(aside);
    match std::fs::rename(dir, aside) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error(dir)(e)),
        _ => Ok(()),
    }
}

/// A placeholder waiting for its rebuild from the archive holds none of the partition's
/// records: nothing is copied from it.
fn refuse_placeholder(topic: &str, part: &Partition) -> Result<(), BrokerError> {
    if part.is_awaiting_rebuild() || part.is_unverified() {
        return Err(BrokerError::PartitionMoving {
            topic: topic.to_owned(),
            partition: part.index,
        });
    }
    Ok(())
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> BrokerError + '_ {
    move |source| {
        BrokerError::Storage(LogError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

impl Broker {
    /// A random number drawn when this process started: a move's copier notices the source
    /// restarted (a restart may cut a torn tail the copy already holds) by its change.
    pub fn incarnation(&self) -> u64 {
        self.handles.epoch()
    }

    /// The broker clock's time, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Topic `topic` of incarnation `topic_id` and its partition `p`.
    fn move_partition_of(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
    ) -> Result<(Arc<Topic>, Arc<Partition>), BrokerError> {
        let t = self.topic(topic)?;
        if t.id() != topic_id {
            return Err(BrokerError::TopicNotFound(topic.to_owned()));
        }
        let part = t.partition(p)?;
        Ok((t, part))
    }

    /// The partition's owner epoch, if this node owns it.
    fn owned_epoch(&self, t: &Topic, p: u32) -> Result<u64, BrokerError> {
        let meta = t.meta.read();
        if !self.is_local(&meta, p) {
            return Err(BrokerError::NotOwner {
                topic: meta.name.clone(),
                partition: p,
                owner: meta.owner_of(p).unwrap_or(0),
            });
        }
        Ok(meta.owner_epoch(p))
    }

    /// The files of partition `p` a move copies (this node must own it). While the
    /// partition serves, the active segment grows and retention may delete old segments:
    /// the copier lists again until the partition is frozen. Segments the new owner does not
    /// need are left out (see [`Broker::copy_cutoff`]).
    pub async fn partition_files(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
    ) -> Result<Vec<PartitionFile>, BrokerError> {
        let (t, part) = self.move_partition_of(topic, topic_id, p)?;
        self.owned_epoch(&t, p)?;
        refuse_placeholder(topic, &part)?;
        let cutoff = self.copy_cutoff(&t, &part);
        let dir = part.dir.clone();
        tokio::task::spawn_blocking(move || {
            list_files(&dir)
                .map(|f| skip_below(f, cutoff))
                .map_err(io_error(&dir))
        })
        .await
        .expect("list task")
    }

    /// Below which offset a moving partition's records need not be copied: records that are
    /// in the archive (the new owner reads them from there for replays), acked (its queue
    /// never delivers them again), and copied by every fan-out and remote child (no cursor
    /// reads them again). 0 when any of that is unknown.
    fn copy_cutoff(&self, t: &Topic, part: &Partition) -> u64 {
        let p = part.index;
        let mut cutoff = part
            .archived_below
            .load(Ordering::Acquire)
            .min(part.queue.lock().frontier());
        let id = t.id();
        let catalog = self.store.catalog();
        let children: Vec<String> = catalog
            .topics()
            .filter(|c| c.parent.as_ref().is_some_and(|l| l.parent_id == id))
            .map(|c| c.name.clone())
            .collect();
        {
            let fanout = self.fanout.lock();
            for c in &children {
                match fanout.get(&(c.clone(), p)) {
                    Some(s) => cutoff = cutoff.min(s.next.load(Ordering::Acquire)),
                    None => return 0,
                }
            }
        }
        let remote = self.remote_cursors.lock();
        for c in catalog.remote_children_of(id) {
            match remote.get(&(c.name.clone(), p)) {
                Some(s) => cutoff = cutoff.min(s.next.load(Ordering::Acquire)),
                None => return 0,
            }
        }
        cutoff
    }

    /// Up to `len` (at most [`MAX_FILE_CHUNK`]) bytes of file `name` of partition `p` from
    /// `pos` (fewer at its end).
    pub async fn read_partition_file(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
        name: &str,
        pos: u64,
        len: u64,
    ) -> Result<Bytes, BrokerError> {
        if !is_partition_file(name) {
            return Err(BrokerError::InvalidField(InvalidField {
                field: "name",
                reason: "not a partition file".into(),
            }));
        }
        let (t, part) = self.move_partition_of(topic, topic_id, p)?;
        self.owned_epoch(&t, p)?;
        refuse_placeholder(topic, &part)?;
        let path = part.dir.join(name);
        let len = len.min(MAX_FILE_CHUNK) as usize;
        tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            let f = match std::fs::File::open(&path) {
                Ok(f) => f,
                // retention, a seal or a thaw changed the directory since the listing
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(BrokerError::ClusterUnavailable(format!(
                        "{} is gone from the partition since it was listed; list again",
                        path.display()
                    )));
                }
                Err(e) => return Err(io_error(&path)(e)),
            };
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                match f.read_at(&mut buf[got..], pos + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_error(&path)(e)),
                }
            }
            buf.truncate(got);
            Ok(Bytes::from(buf))
        })
        .await
        .expect("read task")
    }

    /// Freezes partition `p` (owned here at `expect_epoch`) under `token` for `ttl`: no
    /// appends, leases or settles until it thaws or moves; its log closes and its queue state
    /// is written, so its files hold everything and stay as they are. Asked again with the
    /// same token it renews the freeze; `renew` only renews (refused if no freeze holds under
    /// `token`: it lapsed and thawed). Answers the partition's end and files.
    pub async fn freeze_partition(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
        ask: FreezeAsk,
    ) -> Result<FrozenPartition, BrokerError> {
        let FreezeAsk {
            owner_epoch: expect_epoch,
            move_id,
            token,
            ttl,
            ..
        } = ask;
        let _one = self.moves_lock.lock().await;
        let (t, part) = self.move_partition_of(topic, topic_id, p)?;
        let held = part.freeze.lock().map(|f| HeldFreeze {
            token: f.token,
            move_id: f.move_id,
        });
        let refused = refuse_freeze(held, &t.meta.read(), p, self.store.node_id(), ask);
        if let Some(refused) = refused {
            return Err(match refused {
                FreezeRefusal::HeldByAnother => BrokerError::ClusterUnavailable(format!(
                    "partition {p} of '{topic}' is frozen for another move until it thaws; retry"
                )),
                FreezeRefusal::Lapsed => BrokerError::ClusterUnavailable(format!(
                    "partition {p} of '{topic}' is no longer frozen for this move (its freeze lapsed)"
                )),
                FreezeRefusal::NotOwner { owner } => BrokerError::NotOwner {
                    topic: topic.to_owned(),
                    partition: p,
                    owner,
                },
                FreezeRefusal::Epoch { now } => BrokerError::ClusterUnavailable(format!(
                    "partition {p} of '{topic}' is at owner epoch {now}, not {expect_epoch}"
                )),
                FreezeRefusal::NotInFlight => BrokerError::ClusterUnavailable(format!(
                    "move {move_id} of partition {p} of '{topic}' is not in flight (cancelled or done)"
                )),
            });
        }
        let until = std::time::Instant::now() + ttl;
        let drained = part
            .freeze(token, move_id, until, FREEZE_DRAIN)
            .await
            .map_err(io_error(&part.dir))?;
        if !drained {
            return Err(BrokerError::ClusterUnavailable(format!(
                "partition {p} of '{topic}' could not be frozen: requests on it did not end within {FREEZE_DRAIN:?}"
            )));
        }
        part.close().await;
        let next_offset = part.stats().next_offset;
        let persist = part.clone();
        tokio::task::spawn_blocking(move || {
            persist.persist_queue(true)?;
            persist.write_moved_leases()
        })
        .await
        .expect("persist task")
        .map_err(io_error(&part.dir))?;
        let cutoff = self.copy_cutoff(&t, &part);
        let dir = part.dir.clone();
        let files = tokio::task::spawn_blocking(move || {
            list_files(&dir)
                .map(|f| skip_below(f, cutoff))
                .map_err(io_error(&dir))
        })
        .await
        .expect("list task")?;
        self.metrics.partition_freezes.inc();
        Ok(FrozenPartition { next_offset, files })
    }

    /// Thaws partition `p` if it is frozen under `token` (the cluster agreed it did not
    /// move, see [`crate::catalog::CatalogCommand::ThawPartition`]). `false` if another
    /// freeze, or none, holds it.
    pub async fn thaw_partition(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
        token: u64,
    ) -> Result<bool, BrokerError> {
        let _one = self.moves_lock.lock().await;
        let (_, part) = self.move_partition_of(topic, topic_id, p)?;
        let holds = part.freeze.lock().is_some_and(|f| f.token == token);
        if !holds {
            return Ok(false);
        }
        part.thaw().await.map_err(io_error(&part.dir))?;
        let t = self.topic(topic)?;
        self.dispatch(&t).await;
        Ok(true)
    }

    /// Freezes on partitions this node owns whose deadline passed (`now`), for the caller to
    /// ask the cluster whether each may thaw; with `orphaned`, instead those whose move is no
    /// longer in the catalog this node follows (cancelled: no flip can ever name them, so
    /// they thaw at once, no cluster asked).
    pub fn lapsed_freezes(&self, now: std::time::Instant, orphaned: bool) -> Vec<LapsedFreeze> {
        let mut out = Vec::new();
        for t in self.topics.read().values() {
            let meta = t.meta.read();
            for part in t.partitions().iter() {
                let f = *part.freeze.lock();
                let due = |f: &partition::Freeze| {
                    if orphaned {
                        // its move is no longer in flight: cancelled, or replaced by
                        // another move of the partition (which this freeze would hold up)
                        match (f.move_id, meta.moves.get(&part.index)) {
                            (_, None) => true,
                            (Some(id), Some(m)) => m.id != id,
                            (None, Some(_)) => false,
                        }
                    } else {
                        f.until <= now
                    }
                };
                if let Some(f) = f
                    && due(&f)
                    && self.is_local(&meta, part.index)
                {
                    out.push(LapsedFreeze {
                        topic: meta.name.clone(),
                        topic_id: meta.id,
                        partition: part.index,
                        token: f.token,
                        owner_epoch: meta.owner_epoch(part.index),
                    });
                }
            }
        }
        out
    }

    /// Where move `move_id`'s copy of partition `p` of `meta` is staged on its way here
    /// (one directory per move: a move that ends never touches a later one's copy).
    pub fn staging_dir(&self, meta: &TopicMeta, p: u32, move_id: u64) -> PathBuf {
        self.cfg
            .data_dir
            .join(MOVES_DIR)
            .join(format!("{}.p{p:05}.{move_id:016x}", meta.dir_name()))
    }

    /// Opens a staged copy as a partition (recovering it as a restart would) and answers its
    /// end: what the move checks against the source's before installing it.
    pub async fn verify_staged(&self, dir: &Path) -> Result<u64, BrokerError> {
        let env = self.log_env();
        let dir = dir.to_owned();
        let part = tokio::task::spawn_blocking(move || Partition::open(0, dir, &env))
            .await
            .expect("open task")?;
        let next = part.stats().next_offset;
        part.close().await;
        Ok(next)
    }

    /// Before a move to this node copies partition `p` (not owned here): checkpoints the WAL
    /// so that no WAL file names frames this node once wrote into the partition, which its
    /// install would otherwise have to do inside the source's freeze.
    pub async fn prepare_install(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
    ) -> Result<(), BrokerError> {
        let (t, _) = self.move_partition_of(topic, topic_id, p)?;
        if self.owned_epoch(&t, p).is_ok() {
            return Ok(());
        }
        let epoch = t.meta.read().owner_epoch(p);
        self.checkpoint_wal().await?;
        self.wal_clean
            .lock()
            .insert(PartitionId::new(topic_id, p), epoch);
        Ok(())
    }

    /// Puts the staged copy of partition `p` in place of this node's copy (a node that does
    /// not own a partition holds an empty one), reopened from its files. The partition is
    /// served here only once the catalog names this node its owner.
    pub async fn install_partition(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
        staged: &Path,
    ) -> Result<(), BrokerError> {
        let _one = self.moves_lock.lock().await;
        let (t, old) = self.move_partition_of(topic, topic_id, p)?;
        if self.owned_epoch(&t, p).is_ok() {
            return Err(BrokerError::ClusterUnavailable(format!(
                "partition {p} of '{topic}' is already served here"
            )));
        }
        // (checkpointed already at this owner epoch by `prepare_install`, while the source
        // still served: the partition was not owned here since, so nothing was written)
        let epoch = t.meta.read().owner_epoch(p);
        let clean = self.wal_clean.lock().remove(&PartitionId::new(topic_id, p)) == Some(epoch);
        old.retire().await;
        if !clean {
            self.checkpoint_wal().await?;
        }
        let dir = old.dir.clone();
        let aside = self
            .cfg
            .data_dir
            .join(MOVES_DIR)
            .join(format!("{}.p{p:05}.replaced", t.meta.read().dir_name()));
        let part = self
            .swap_dir(dir, p, Some(staged.to_owned()), aside, false)
            .await?;
        match self.open_logs.try_acquire() {
            Some(slot) => part.adopt_slot(slot),
            None => part.close().await,
        }
        // the leases it holds for the old owner end on their own: the topic's timer wakes
        // for the first, so waiting readers get those messages then, not at their next poll
        let wakeup = part.queue.lock().next_wakeup();
        self.replace_partition(&t, p, part);
        if let Some(at) = wakeup {
            self.arm_timer(&t, at);
        }
        Ok(())
    }

    pub(super) fn replace_partition(&self, t: &Topic, p: u32, part: Arc<Partition>) {
        let mut parts = t.partitions.write();
        let mut all: Vec<Arc<Partition>> = parts.iter().cloned().collect();
        if let Some(slot) = all.get_mut(p as usize) {
            *slot = part;
        }
        *parts = Arc::new(all);
    }

    /// Following a catalog in which partition `p` of `t` moved from this node to another:
    /// its copy here goes (the new owner holds everything it held: the flip came after the
    /// freeze and the copy), replaced by an empty one; its waiting settles wake (and find
    /// their lease gone), its cursors stop.
    pub(super) async fn give_away_partition(
        &self,
        t: &Arc<Topic>,
        p: u32,
    ) -> Result<(), BrokerError> {
        let _one = self.moves_lock.lock().await;
        let (name, forgotten) = {
            let meta = t.meta.read();
            let me = self.store.node_id();
            let lost = meta
                .rebuilt
                .get(&p)
                .filter(|l| l.epoch == meta.owner_epoch(p) && Some(l.lost_node) == me)
                .map(|l| format!("{}.p{p:05}.e{}", meta.dir_name(), l.epoch));
            (meta.name.clone(), lost)
        };
        self.stop_cursors_of(&name, p);
        match forgotten {
            // this node was forgotten as lost, yet here it is: its copy may hold the records
            // the cluster gave up (the unarchived tail), so it is kept aside, not deleted
            Some(keep) => {
                let keep = self.cfg.data_dir.join(QUARANTINE_DIR).join(keep);
                self.replace_with_empty(t, p, Some(keep.clone())).await?;
                tracing::error!(topic = %name, partition = p, kept = %keep.display(), "this node was forgotten and its partition rebuilt elsewhere from the archive; its own copy (which may hold records the cluster reported lost) is kept aside for an operator");
            }
            None => {
                self.replace_with_empty(t, p, None).await?;
                tracing::info!(topic = %name, partition = p, "partition moved to another node; its copy here is gone");
            }
        }
        Ok(())
    }

    /// A copy of partition `p` installed here by a move that did not complete (cancelled,
    /// or its flip refused and the move gone): replaced by an empty partition, unless this
    /// node owns it or a move to this node is in flight for it (its next install replaces
    /// it anyway, and it may be about to flip). Returns whether it discarded anything.
    pub async fn discard_unowned_copy(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
    ) -> Result<bool, BrokerError> {
        let _one = self.moves_lock.lock().await;
        let (t, part) = self.move_partition_of(topic, topic_id, p)?;
        let me = self.store.node_id();
        {
            let meta = t.meta.read();
            if self.is_local(&meta, p) || meta.moves.get(&p).is_some_and(|m| Some(m.target) == me) {
                return Ok(false);
            }
        }
        if part.stats().next_offset == 0 {
            return Ok(false);
        }
        self.replace_with_empty(&t, p, None).await?;
        tracing::info!(
            topic,
            partition = p,
            "discarded the copy of a partition whose move here did not complete"
        );
        Ok(true)
    }

    /// Retires partition `p`'s copy here and puts an empty partition in its place. The
    /// caller holds `moves_lock`.
    async fn replace_with_empty(
        &self,
        t: &Arc<Topic>,
        p: u32,
        keep: Option<PathBuf>,
    ) -> Result<(), BrokerError> {
        let old = t.partition(p)?;
        old.retire().await;
        old.thawed.notify_waiters();
        self.checkpoint_wal().await?;
        let dir = old.dir.clone();
        let aside = keep.clone().unwrap_or_else(|| {
            self.cfg
                .data_dir
                .join(MOVES_DIR)
                .join(format!("{}.p{p:05}.gone", t.meta.read().dir_name()))
        });
        let part = self.swap_dir(dir, p, None, aside, keep.is_some()).await?;
        part.close().await;
        self.replace_partition(t, p, part);
        Ok(())
    }

    /// Replaces partition `p`'s directory `dir`: the copy there is set aside at `aside`
    /// (kept there when `keep`, else removed), `staged` (none: an empty partition) renamed
    /// into its place, and the result opened. The caller retired the old partition,
    /// checkpointed the WAL (no WAL entry may name the old files), and holds `moves_lock`.
    async fn swap_dir(
        &self,
        dir: PathBuf,
        p: u32,
        staged: Option<PathBuf>,
        aside: PathBuf,
        keep: bool,
    ) -> Result<Arc<Partition>, BrokerError> {
        let env = self.log_env();
        let part = tokio::task::spawn_blocking(move || -> Result<Partition, BrokerError> {
            if let Some(parent) = aside.parent() {
                crate::fsutil::create_dir_private(parent).map_err(io_error(parent))?;
            }
            set_aside(&dir, &aside)?;
            if let Some(staged) = &staged {
                std::fs::rename(staged, &dir).map_err(io_error(&dir))?;
            }
            if let Some(parent) = dir.parent() {
                crate::fsutil::sync_dir(parent).map_err(io_error(parent))?;
            }
            if !keep {
                let _ = std::fs::remove_dir_all(&aside);
            }
            let part = Partition::open(p, dir.clone(), &env)?;
            // holds a move brought are in the queue now; a later start must not apply them
            // again over leases of its own
            let _ = std::fs::remove_file(dir.join(partition::MOVED_LEASES));
            Ok(part)
        })
        .await
        .expect("partition swap task")?;
        Ok(Arc::new(part))
    }

    /// Stops the fan-out and remote cursors reading parent partition `p` of `topic` (it
    /// moved away: its new owner runs them from the cursor files that moved with it).
    fn stop_cursors_of(&self, topic: &str, p: u32) {
        let children: Vec<String> = {
            let topics = self.topics.read();
            let Some(parent) = topics.get(topic) else {
                return;
            };
            let id = parent.id();
            topics
                .values()
                .filter(|c| {
                    c.meta
                        .read()
                        .parent
                        .as_ref()
                        .is_some_and(|l| l.parent_id == id)
                })
                .map(|c| c.meta.read().name.clone())
                .collect()
        };
        self.fanout
            .lock()
            .retain(|(c, i), _| !(*i == p && children.contains(c)));
        let remote: Vec<String> = {
            let Ok(t) = self.topic(topic) else { return };
            self.store
                .catalog()
                .remote_children_of(t.id())
                .map(|c| c.name.clone())
                .collect()
        };
        self.remote_cursors
            .lock()
            .retain(|(c, i), _| !(*i == p && remote.contains(c)));
    }

    /// Before a partition directory's content is replaced wholesale: no WAL file may name
    /// frames written into it before (a replay at the next start would write those old
    /// frames into the new content, or refuse to start over the mismatch).
    pub(super) async fn checkpoint_wal(&self) -> Result<(), BrokerError> {
        match &self.env.cfg.wal {
            Some(wal) => wal.checkpoint().await.map_err(BrokerError::from),
            None => Ok(()),
        }
    }

    pub(super) fn log_env(&self) -> LogEnv {
        LogEnv {
            cfg: self.env.cfg.clone(),
            clock: self.env.clock.clone(),
            metrics: self.env.metrics.clone(),
            max_ack_ranges: self.env.max_ack_ranges,
        }
    }
}

/// How long a freeze waits for the appends, leases and settles in progress to end.
const FREEZE_DRAIN: Duration = Duration::from_secs(5);

impl Broker {
    /// Asks for partition `p` of `topic` to move to node `target` (`None`: cancels the move
    /// in flight), at the owner and epoch the catalog shows now; answers the topic as the
    /// change left it. A cluster member only.
    pub async fn set_move_target(
        self: &Arc<Self>,
        topic: &str,
        p: u32,
        target: Option<u64>,
        reason: &str,
    ) -> Result<Arc<TopicMeta>, BrokerError> {
        let meta = self.moves_topic(topic)?;
        if p >= meta.config.partitions {
            return Err(BrokerError::PartitionOutOfRange {
                index: None,
                partition: p,
                partitions: meta.config.partitions,
            });
        }
        let owner = meta.owner_of(p).ok_or_else(|| {
            BrokerError::ClusterUnsupported(format!("topic '{topic}' has no partition owners"))
        })?;
        let cmd = crate::catalog::CatalogCommand::SetMoveTarget {
            topic_id: meta.id,
            partition: p,
            expect_owner: owner,
            expect_epoch: meta.owner_epoch(p),
            target: target.map(|node| crate::catalog::MoveTarget {
                id: crate::random_u64() | 1,
                node,
                since_ms: self.clock.now_ms(),
                reason: reason.to_owned(),
            }),
        };
        self.propose_replicated(cmd).await?;
        self.store
            .catalog()
            .get(topic)
            .cloned()
            .ok_or_else(|| BrokerError::TopicNotFound(topic.to_owned()))
    }

    /// `topic` as the catalog has it, on a cluster member (moves need a cluster).
    fn moves_topic(&self, topic: &str) -> Result<Arc<TopicMeta>, BrokerError> {
        if !self.store.replicated() {
            return Err(BrokerError::ClusterUnsupported(
                "partition moves need a cluster (cluster_members)".into(),
            ));
        }
        self.store
            .catalog()
            .get(topic)
            .cloned()
            .ok_or_else(|| BrokerError::TopicNotFound(topic.to_owned()))
    }

    /// Gives partition `p` of `topic`, which an admin moved by hand, back to the planner.
    /// Whether it was pinned.
    pub async fn unpin(self: &Arc<Self>, topic: &str, p: u32) -> Result<bool, BrokerError> {
        let meta = self.moves_topic(topic)?;
        if !meta.pinned.contains(&p) {
            return Ok(false);
        }
        self.propose_replicated(crate::catalog::CatalogCommand::Unpin {
            topic_id: meta.id,
            partition: p,
        })
        .await?;
        Ok(true)
    }
}

impl Broker {
    /// Marks member `node` as being decommissioned (or not), through the cluster.
    pub async fn set_draining(
        self: &Arc<Self>,
        node: u64,
        draining: bool,
    ) -> Result<(), BrokerError> {
        if !self.store.replicated() {
            return Err(BrokerError::ClusterUnsupported(
                "decommissioning needs a cluster (cluster_members)".into(),
            ));
        }
        self.propose_replicated(crate::catalog::CatalogCommand::SetDraining { node, draining })
            .await
    }
}

impl Broker {
    /// Partitions of `t` this node owns that were rebuilt from the archive at their current
    /// owner epoch (`meta.rebuilt`): a log that ends below the rebuilt start (the archive's
    /// end; offsets below it are the archive's) is replaced by an empty one that begins
    /// there, so no offset the lost owner acknowledged is handed out again. Idempotent; run
    /// before the partition is served (at open, and following the catalog before the new
    /// metadata is published).
    pub(super) async fn ensure_rebuilt(
        &self,
        t: &Arc<Topic>,
        meta: &TopicMeta,
    ) -> Result<(), BrokerError> {
        for p in 0..meta.config.partitions {
            let Some(start) = meta.rebuilt_start(p) else {
                continue;
            };
            if !self.is_local(meta, p) {
                continue;
            }
            let Ok(old) = t.partition(p) else { continue };
            if old.stats().next_offset >= start || old.is_awaiting_rebuild() {
                continue;
            }
            if self.cfg.archive_gate {
                // the cluster's mover brings the archived records back, then installs
                old.await_rebuild();
                tracing::warn!(topic = %meta.name, partition = p, start, "partition to be rebuilt here from the archive: it serves nothing until its archived records are back");
                continue;
            }
            // no archive: nothing to bring back, the log starts at `start`
            let _one = self.moves_lock.lock().await;
            let staging = self.begin_rebuild(meta, p).await?;
            self.rebuild_in_place(t, meta, p, staging, start).await?;
        }
        Ok(())
    }

    /// The partitions waiting here to be rebuilt from the archive (see
    /// [`Broker::install_rebuilt`]), with their topic's metadata.
    pub fn awaited_rebuilds(&self) -> Vec<(TopicMeta, u32)> {
        let mut out = Vec::new();
        for t in self.topics.read().values() {
            let meta = t.meta.read();
            for part in t.partitions().iter() {
                if part.is_awaiting_rebuild() && self.is_local(&meta, part.index) {
                    out.push((meta.clone(), part.index));
                }
            }
        }
        out
    }

    /// Starts staging partition `p`'s rebuild here from the archive: an empty directory of
    /// its own under [`MOVES_DIR`] (a previous attempt's is removed).
    pub async fn begin_rebuild(
        &self,
        meta: &TopicMeta,
        p: u32,
    ) -> Result<RebuildStaging, BrokerError> {
        let epoch = meta.owner_epoch(p);
        let moves = self.cfg.data_dir.join(MOVES_DIR);
        let dir = moves.join(format!("{}.p{p:05}.rebuild.e{epoch}", meta.dir_name()));
        let made = dir.clone();
        tokio::task::spawn_blocking(move || {
            crate::fsutil::create_dir_private(&moves)?;
            match std::fs::remove_dir_all(&made) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            crate::fsutil::create_dir_private(&made)
        })
        .await
        .expect("staging task")
        .map_err(io_error(&dir))?;
        Ok(RebuildStaging {
            dir,
            topic_id: meta.id,
            partition: p,
            epoch,
            segments: Vec::new(),
        })
    }

    /// Writes one archived segment's records (offsets following each other, above every
    /// segment staged before) into the staged rebuild, synced.
    pub async fn stage_rebuilt_segment(
        &self,
        staging: &mut RebuildStaging,
        records: Vec<Record>,
    ) -> Result<(), BrokerError> {
        let Some(base) = records.first().map(|r| r.offset) else {
            return Ok(());
        };
        if staging.segments.last().is_some_and(|&(_, end)| base < end) {
            return Err(BrokerError::Storage(LogError::Io {
                path: staging.dir.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("an archived segment at {base} overlaps one staged before it"),
                ),
            }));
        }
        let dir = staging.dir.clone();
        let end = tokio::task::spawn_blocking(move || {
            crate::log::segment::write_sealed(&dir, base, &records)
        })
        .await
        .expect("staging task")
        .map_err(io_error(&staging.dir))?;
        staging.segments.push((base, end));
        Ok(())
    }

    /// Puts the staged rebuild of partition `p` of `topic` in place of its placeholder, once
    /// the catalog still says it is rebuilt here at the epoch it was staged for: the archived
    /// segments, an empty segment where the new log starts (the catalog's `seen_end`), the
    /// gaps between them recorded as such, and a queue whose frontier is `frontier` (what the
    /// lost owner's consumers had acked when the archive last heard of it; the offsets of the
    /// gaps count as acked). Returns how many archived records the queue will deliver again.
    pub async fn install_rebuilt(
        &self,
        topic: &str,
        staging: RebuildStaging,
        frontier: u64,
    ) -> Result<u64, BrokerError> {
        let _one = self.moves_lock.lock().await;
        let (t, part) = self.move_partition_of(topic, staging.topic_id, staging.partition)?;
        let p = staging.partition;
        let meta = t.meta.read().clone();
        if !self.is_local(&meta, p)
            || meta.owner_epoch(p) != staging.epoch
            || meta.rebuilt_start(p).is_none()
            || !part.is_awaiting_rebuild()
        {
            let dir = staging.dir.clone();
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
            return Err(BrokerError::ClusterUnavailable(format!(
                "partition {p} of '{topic}' is no longer rebuilt here at owner epoch {}",
                staging.epoch
            )));
        }
        let start = meta.rebuilt_start(p).expect("checked");
        self.rebuild_in_place(&t, &meta, p, staging, frontier.min(start))
            .await
    }

    /// Completes `staging` (an empty segment at the rebuilt log's start, the gaps, the queue
    /// state) and swaps it in for partition `p`. The caller holds `moves_lock`.
    async fn rebuild_in_place(
        &self,
        t: &Arc<Topic>,
        meta: &TopicMeta,
        p: u32,
        staging: RebuildStaging,
        frontier: u64,
    ) -> Result<u64, BrokerError> {
        let start = meta.rebuilt_start(p).unwrap_or(0);
        if staging.staged_end().is_some_and(|e| e > start) {
            return Err(BrokerError::Storage(LogError::Io {
                path: staging.dir.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("archived records staged past the rebuilt log's start {start}"),
                ),
            }));
        }
        let mut gaps = Vec::new();
        let mut prev_end: Option<u64> = None;
        for &(base, end) in &staging.segments {
            if let Some(e) = prev_end
                && e < base
            {
                gaps.push((e, base));
            }
            prev_end = Some(end);
        }
        if let Some(e) = prev_end
            && e < start
        {
            gaps.push((e, start));
        }
        let first = staging.segments.first().map_or(start, |&(b, _)| b);
        let snapshot = rebuilt_queue(frontier.clamp(first, start), &gaps);
        let redelivered = staging
            .segments
            .iter()
            .map(|&(b, e)| e.saturating_sub(b.max(snapshot.frontier)))
            .sum();
        let dir = staging.dir.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            crate::fsutil::open_or_create_private(&crate::log::segment::segment_path(&dir, start))?
                .sync_all()?;
            if !gaps.is_empty() {
                crate::log::segment::write_gaps(&dir, &gaps)?;
            }
            partition::write_snapshot(&dir, &snapshot)?;
            crate::fsutil::sync_dir(&dir)
        })
        .await
        .expect("staging task")
        .map_err(io_error(&staging.dir))?;
        // opened as a restart would before anything is replaced: a copy that does not open
        // (a damaged archive object) never takes the placeholder's place
        let end = self.verify_staged(&staging.dir).await?;
        if end != start {
            return Err(BrokerError::Storage(LogError::Io {
                path: staging.dir.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("the rebuilt copy ends at {end}, not at its start {start}"),
                ),
            }));
        }
        let old = t.partition(p)?;
        old.retire().await;
        old.thawed.notify_waiters();
        self.checkpoint_wal().await?;
        let aside = self
            .cfg
            .data_dir
            .join(MOVES_DIR)
            .join(format!("{}.p{p:05}.rebuilt", meta.dir_name()));
        let part = self
            .swap_dir(old.dir.clone(), p, Some(staging.dir), aside, false)
            .await?;
        part.close().await;
        self.replace_partition(t, p, part);
        tracing::warn!(topic = %meta.name, partition = p, start, redelivered, "partition rebuilt here from the archive: its archived records are served again, those its consumers had not acked are delivered again, the lost owner's unarchived records are gone");
        Ok(redelivered)
    }
}

/// The queue state of a partition rebuilt from the archive: acked below `frontier` and
/// across every gap (no record will ever be there).
fn rebuilt_queue(frontier: u64, gaps: &[(u64, u64)]) -> crate::queue::QueueSnapshot {
    let mut snap = crate::queue::QueueSnapshot {
        frontier,
        ..Default::default()
    };
    for &(s, e) in gaps {
        let s = s.max(snap.frontier);
        if e <= s {
            continue;
        }
        if s == snap.frontier {
            snap.frontier = e;
        } else {
            snap.acked.push((s, e));
        }
    }
    snap
}

/// A rebuild from the archive being staged (see [`Broker::begin_rebuild`]).
#[derive(Debug)]
pub struct RebuildStaging {
    dir: PathBuf,
    topic_id: u64,
    partition: u32,
    /// The owner epoch the partition is rebuilt for.
    epoch: u64,
    /// The archived segments staged, `(base, end)`, ascending.
    segments: Vec<(u64, u64)>,
}

impl RebuildStaging {
    /// One past the last staged offset, if any segment is staged.
    pub fn staged_end(&self) -> Option<u64> {
        self.segments.last().map(|&(_, e)| e)
    }
}

impl Broker {
    /// Gives partition `p` of topic `topic_id`, owned by the lost node `from` at `epoch`, to
    /// node `to`, which rebuilds it from the archive (see
    /// [`crate::catalog::CatalogCommand::ReassignLost`]).
    pub async fn reassign_lost(
        self: &Arc<Self>,
        topic_id: u64,
        p: u32,
        from: u64,
        to: u64,
        epoch: u64,
        tail: crate::catalog::moves::LostTail,
    ) -> Result<(), BrokerError> {
        self.propose_replicated(crate::catalog::CatalogCommand::ReassignLost {
            topic_id,
            partition: p,
            from,
            to,
            expect_epoch: epoch,
            tail: Box::new(tail),
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rebuilt partition's queue: acked below the recorded frontier and across every gap,
    /// in a state a restart reads back (a frontier inside a gap jumps to its end).
    #[test]
    fn a_rebuilt_queue_acks_the_gaps_and_nothing_the_archive_holds_above_the_frontier() {
        type Ranges = &'static [(u64, u64)];
        let cases: [(u64, Ranges, u64, Ranges); 4] = [
            (3, &[(10, 15)], 3, &[(10, 15)]),
            (12, &[(10, 15), (20, 25)], 15, &[(20, 25)]),
            (25, &[(20, 25)], 25, &[]),
            (0, &[], 0, &[]),
        ];
        for (frontier, gaps, want_frontier, want_acked) in cases {
            let snap = rebuilt_queue(frontier, gaps);
            assert_eq!(
                (snap.frontier, &snap.acked[..]),
                (want_frontier, want_acked)
            );
            assert_eq!(
                crate::queue::QueueSnapshot::decode(&snap.encode()),
                Some(snap.clone())
            );
        }
    }

    fn files(names: &[&str]) -> Vec<PartitionFile> {
        names
            .iter()
            .map(|n| PartitionFile {
                name: (*n).to_owned(),
                size: 1,
            })
            .collect()
    }

    /// Only whole segments below the cutoff are left out (with their index), never the last
    /// one, never anything else (queue state, cursors), and what is left is contiguous.
    #[test]
    fn a_move_leaves_out_only_segments_wholly_below_the_cutoff() {
        let all = files(&[
            "00000000000000000000.idx",
            "00000000000000000000.log",
            "00000000000000000100.idx",
            "00000000000000000100.log",
            "00000000000000000200.log",
            "fanout-c.1.offset",
            "queue.state",
        ]);
        let names = |f: Vec<PartitionFile>| f.into_iter().map(|f| f.name).collect::<Vec<_>>();
        assert_eq!(names(skip_below(all.clone(), 0)).len(), 7);
        assert_eq!(
            names(skip_below(all.clone(), 99)).len(),
            7,
            "segment 0 ends at 100"
        );
        assert_eq!(
            names(skip_below(all.clone(), 150)),
            vec![
                "00000000000000000100.idx",
                "00000000000000000100.log",
                "00000000000000000200.log",
                "fanout-c.1.offset",
                "queue.state"
            ]
        );
        // the last segment stays whatever the cutoff
        assert_eq!(
            names(skip_below(all, u64::MAX)),
            vec![
                "00000000000000000200.log",
                "fanout-c.1.offset",
                "queue.state"
            ]
        );
    }
}
