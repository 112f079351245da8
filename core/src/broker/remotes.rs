//! Remotes in the broker: read from the catalog, changed through the metadata store like
//! topics (durable before they are visible; on a cluster member through the replicated log).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::catalog::{Applied, CatalogCommand, RemoteChild, RemoteMeta};
use crate::log::LogError;
use crate::record::Record;

use super::origin::{MAX_HOPS, Route, position_in, route_of};
use super::{Broker, BrokerError, Topic, cursor_file, fanout};

impl Broker {
    /// Every remote, by name.
    pub fn remotes(&self) -> Vec<Arc<RemoteMeta>> {
        self.store.catalog().remotes().cloned().collect()
    }

    pub fn remote(&self, name: &str) -> Result<Arc<RemoteMeta>, BrokerError> {
        self.store
            .catalog()
            .remote(name)
            .cloned()
            .ok_or_else(|| BrokerError::RemoteNotFound(name.to_owned()))
    }

    /// Stores `remote`: a new one (`expect_version: None`) or a change of the one of its
    /// name and id still at `expect_version`. Returns it as stored (with its version).
    pub async fn put_remote(
        self: &Arc<Self>,
        remote: RemoteMeta,
        expect_version: Option<u64>,
    ) -> Result<Arc<RemoteMeta>, BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let name = remote.name.clone();
        let id = remote.id;
        let cmd = CatalogCommand::PutRemote {
            remote,
            expect_version,
        };
        if self.store.replicated() {
            self.propose_replicated(cmd).await?;
            // (this node applied it: the catalog holds it unless a later change removed it)
            return self
                .store
                .catalog()
                .remote(&name)
                .filter(|r| r.id == id)
                .cloned()
                .ok_or(BrokerError::RemoteNotFound(name));
        }
        match self.commit(cmd, |_| {}).await? {
            Applied::Remote(r) => Ok(r),
            other => unreachable!("a remote put applied as {other:?}"),
        }
    }

    /// Removes the remote of id `remote_id`.
    pub async fn delete_remote(self: &Arc<Self>, remote_id: u64) -> Result<(), BrokerError> {
        self.change_remotes(CatalogCommand::DeleteRemote { remote_id })
            .await
    }
}

/// Most records one slab of a remote cursor holds.
const REMOTE_SLAB_RECORDS: usize = 4096;

/// How many slabs a node's remote memory budget of `bytes` holds (at least one).
pub(super) fn slabs_for(bytes: usize) -> usize {
    (bytes / fanout::SLAB_BYTES).max(1)
}

/// One slab of the node's remote memory budget, held by a cursor from its read to the end
/// of its ship.
struct HeldSlab {
    _permit: tokio::sync::OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for HeldSlab {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Broker {
    /// Remote `remote_id`'s share of the node's budget for what remote cursors hold: the
    /// budget split evenly between the remotes there are, at least one slab each (a share
    /// resized when remotes come or go; slabs held of the old one are given back to it).
    fn remote_slabs(&self, remote_id: u64) -> Arc<tokio::sync::Semaphore> {
        let catalog = self.store.catalog();
        let remotes = catalog.remotes().count().max(1);
        let share = (self.remote_slab_budget / remotes).max(1);
        let mut shares = self.remote_slabs.lock();
        if shares.len() > remotes {
            shares.retain(|id, _| catalog.remotes().any(|r| r.id == *id));
        }
        match shares.get(&remote_id) {
            Some((n, s)) if *n == share => s.clone(),
            _ => {
                let s = Arc::new(tokio::sync::Semaphore::new(share));
                shares.insert(remote_id, (share, s.clone()));
                s
            }
        }
    }
}

impl HeldSlab {
    fn new(
        permit: tokio::sync::OwnedSemaphorePermit,
        gauge: &prometheus_client::metrics::gauge::Gauge,
    ) -> Self {
        gauge.inc();
        Self {
            _permit: permit,
            gauge: gauge.clone(),
        }
    }
}
/// A paused cursor (or one with no shipper yet) looks again this often.
const PAUSED_POLL: Duration = Duration::from_millis(250);

/// One slab for a [`RemoteShipper`]: records of one parent partition, in offset order.
pub struct ShipBatch {
    pub child: Arc<RemoteChild>,
    /// This cluster's id, which every mirrored record names as its origin.
    pub cluster_id: u64,
    pub parent_partition: u32,
    /// The parent's failover epoch, which the target checks (see `catalog::role`).
    pub epoch: u64,
    /// The parent is no longer a primary (demoted, or a mirror since): these records are its
    /// tail, for the primary that replaced it.
    pub tail: bool,
    pub records: Vec<Arc<Record>>,
    /// The lanes that took their share of this same slab in an earlier attempt: a retry
    /// sends only the others. Empty on a first attempt.
    pub done: Vec<bool>,
    /// This cluster's clock as the slab goes (unix ms): a delayed record is sent with what
    /// is left of its delay, so it becomes due on the target when it would have here.
    pub now_ms: i64,
}

/// What a failback's progress found of one child: read from where (its consumers' offset)
/// to where (the partition's end then), and the lowest positions in the target.
type ChildScan = (u64, u64, Vec<(u32, u64)>);

/// Most records one progress message reads to find where a failback's children stand
/// (beyond, the child is not known and its records from the target go to it again).
const CHILD_SCAN_MAX: u64 = 64 << 10;

/// One parent partition's consumer progress for a [`RemoteShipper`].
pub struct ProgressUpdate {
    pub child: Arc<RemoteChild>,
    pub cluster_id: u64,
    pub parent_partition: u32,
    /// The parent's failover epoch.
    pub epoch: u64,
    /// The parent is no longer a primary (see [`ShipBatch::tail`]).
    pub tail: bool,
    pub progress: super::PartitionProgress,
    /// The partition's end, the cursor's position, its leases, and the parent's partition
    /// count (what the mirror's promote reports, and how it knows a drain is complete).
    pub end: super::SourceEnd,
    /// Records that came from the target itself and were acked here, as ranges
    /// `(target partition, start, end)` of the target's own offsets: a failback's old
    /// primary settles them in its queue.
    pub returned: Vec<(u32, u64, u64)>,
}

/// A parent's settings and schema versions, for its remote child's target (a mirror
/// follows its source's: visibility, delay, retention, message size, key policy; never the
/// partition count, which is the target's own).
pub struct CatalogSync {
    pub child: Arc<RemoteChild>,
    pub cluster_id: u64,
    pub epoch: u64,
    pub config: crate::topic::TopicConfig,
    pub schemas: Vec<crate::catalog::SchemaVersion>,
    /// The parent's fan-out children (a promote of the target attaches them there).
    pub children: Vec<crate::catalog::CarriedChild>,
}

/// Why the target did not take a [`CatalogSync`].
#[derive(Debug, Clone)]
pub struct SyncRefused {
    /// Its schema versions are not the parent's: records the parent took may be refused.
    pub schema: bool,
    /// The target did follow the parent (its role and epoch); only settings were refused.
    pub followed: bool,
    pub message: String,
}

/// Why the target did not take a progress update.
#[derive(Debug, Clone)]
pub struct ProgressRefused {
    /// The target was promoted past the parent's epoch (`409 fenced`): the parent is the
    /// old primary.
    pub fenced: bool,
    pub message: String,
}

/// Why a slab was not shipped whole.
#[derive(Debug, Clone)]
pub struct ShipFailure {
    /// The link state this means (`unavailable`, `throttled`, `auth_failed`, ...).
    pub state: &'static str,
    pub message: String,
    /// When to try again.
    pub retry_in: Duration,
    /// The lanes that took their share (kept for the retry).
    pub done: Vec<bool>,
    /// The offset of the record the target refused (`rejected_record`, `record_too_large`):
    /// an admin may skip it.
    pub blocked: Option<u64>,
}

/// Ships remote children's records to their remotes (set by the server: the sender lives in
/// `narad-xregion`). Resolves `Ok` only once every record of the batch was accepted by the
/// target (each lane answered 202): the cursor moves only then.
pub trait RemoteShipper: Send + Sync {
    fn ship(
        &self,
        batch: ShipBatch,
    ) -> Pin<Box<dyn Future<Output = Result<(), ShipFailure>> + Send>>;

    /// Sends the source's consumer progress on one parent partition to the remote child's
    /// target (see `progress`); `Err` says why it did not arrive (sent again later).
    fn send_progress(
        &self,
        _update: ProgressUpdate,
    ) -> Pin<Box<dyn Future<Output = Result<(), ProgressRefused>> + Send>> {
        Box::pin(async { Ok(()) })
    }

    /// Brings the remote child's target topic's settings and JSON Schema versions to the
    /// parent's (`sync`); `Err` says why not (`schema`: its versions are not the parent's,
    /// so records would be refused: shipping waits).
    fn sync_catalog(
        &self,
        _sync: CatalogSync,
    ) -> Pin<Box<dyn Future<Output = Result<(), SyncRefused>> + Send>> {
        Box::pin(async { Ok(()) })
    }

    /// How long until remote `remote_id` takes a request from this node again, when its
    /// gate is open: cursors read nothing meanwhile.
    fn gate_wait(&self, _remote_id: u64) -> Option<Duration> {
        None
    }
}

/// What a remote child's cursor reports.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkStatus {
    pub state: &'static str,
    pub last_error: Option<String>,
    /// Commit time of the oldest record not shipped yet (0: none waiting).
    pub oldest_unshipped_ms: i64,
    /// The record the target refused, holding this cursor up.
    pub blocked: Option<u64>,
}

pub(crate) struct RemoteCursor {
    epoch: u64,
    /// `u64::MAX` until the task has loaded its position.
    pub(crate) next: AtomicU64,
    status: parking_lot::Mutex<LinkStatus>,
}

impl RemoteCursor {
    fn set(&self, state: &'static str, error: Option<String>) {
        let mut s = self.status.lock();
        if state == "running" {
            s.blocked = None;
        }
        s.state = state;
        if error.is_some() || state == "running" {
            s.last_error = error;
        }
    }
}

/// A remote child as `GET /v1/topics/{parent}/children` shows it, beside the local ones.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RemoteChildInfo {
    pub remote: String,
    pub remote_topic: String,
    /// The incarnation id of the topic it ships to (16 hex digits): another cluster's link
    /// checks by it that this one does not ship to the topic it would mirror here.
    #[serde(default)]
    pub target_topic_id: String,
    pub lanes: u8,
    pub paused: bool,
    /// `running`, `paused`, or what stops it (the worst over the parent's partitions).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// How old the oldest record not shipped yet is.
    pub lag_seconds: f64,
    /// Records the target refused, each holding a parent partition's cursor up: an admin may
    /// skip them (`POST .../skip`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<BlockedRecord>,
}

/// A record a remote refused.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct BlockedRecord {
    pub partition: u32,
    pub offset: u64,
}

/// How bad a state is, to report the worst of several cursors.
pub fn state_rank(state: &str) -> u8 {
    match state {
        "running" => 0,
        "paused" | "standby" => 1,
        "throttled" | "unavailable" => 2,
        _ => 3,
    }
}

impl Broker {
    /// Sets how remote children's records reach their remotes (once).
    pub fn set_remote_shipper(&self, shipper: Arc<dyn RemoteShipper>) {
        let _ = self.shipper.set(shipper);
    }

    /// This cluster's id, named now if it has none yet (durably, through the catalog).
    pub async fn ensure_cluster_id(self: &Arc<Self>) -> Result<u64, BrokerError> {
        if let Some(id) = self.store.catalog().cluster_id() {
            return Ok(id);
        }
        let cmd = CatalogCommand::InitCluster {
            cluster_id: crate::random_u64() | 1,
        };
        if self.store.replicated() {
            self.propose_replicated(cmd).await?;
        } else {
            let _guard = self.meta_lock.lock().await;
            self.commit(cmd, |_| {}).await?;
        }
        self.store
            .catalog()
            .cluster_id()
            .ok_or_else(|| BrokerError::ClusterUnavailable("the cluster has no id yet".into()))
    }

    /// The cluster's id, if it has one.
    pub fn cluster_id(&self) -> Option<u64> {
        self.store.catalog().cluster_id()
    }

    /// Every remote child of `parent`, by name.
    pub fn remote_children(&self, parent: &str) -> Vec<Arc<RemoteChild>> {
        let catalog = self.store.catalog();
        let Some(p) = catalog.get(parent) else {
            return Vec::new();
        };
        catalog.remote_children_of(p.id).cloned().collect()
    }

    /// Makes `child` a remote child (its cursors start where `child.starts` says).
    /// Whether an attach of `child` would be taken here now, taking nothing. An attach runs
    /// it before its checks reach the remote, whose last step makes the target topic the
    /// parent's mirror: an attach refused here only afterwards left that topic read-only
    /// for nothing. (The target's id is not known yet, so the loop rule against it is left
    /// to the attach itself; the checks refuse a target that ships back to the parent.)
    pub fn precheck_attach_remote(&self, child: &RemoteChild) -> Result<(), BrokerError> {
        let cmd = CatalogCommand::AttachRemote {
            child: RemoteChild {
                target_id: 0,
                ..child.clone()
            },
        };
        crate::catalog::apply(&self.store.catalog(), &cmd)
            .map(drop)
            .map_err(Into::into)
    }

    pub async fn attach_remote(self: &Arc<Self>, child: RemoteChild) -> Result<(), BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let cmd = CatalogCommand::AttachRemote { child };
        if self.store.replicated() {
            return self.propose_replicated(cmd).await;
        }
        self.commit(cmd, |_| {}).await?;
        self.start_remote_cursors();
        Ok(())
    }

    /// Applies a remote or remote child command: through the replicated log in a cluster, else
    /// durably here (cursors read the catalog, so there is nothing else to publish).
    async fn change_remotes(self: &Arc<Self>, cmd: CatalogCommand) -> Result<(), BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        if self.store.replicated() {
            return self.propose_replicated(cmd).await;
        }
        self.commit(cmd, |_| {}).await.map(|_| ())
    }

    /// Pauses or resumes remote child `name` of attachment `epoch`.
    pub async fn pause_remote(
        self: &Arc<Self>,
        name: &str,
        epoch: u64,
        paused: bool,
    ) -> Result<(), BrokerError> {
        self.change_remotes(CatalogCommand::PauseRemote {
            name: name.to_owned(),
            epoch,
            paused,
        })
        .await
    }

    /// Skips record `offset` of parent partition `partition` for remote child `name` of
    /// attachment `epoch`: its cursor sends on without it (durable in the catalog first).
    pub async fn skip_remote(
        self: &Arc<Self>,
        name: &str,
        epoch: u64,
        partition: u32,
        offset: u64,
    ) -> Result<(), BrokerError> {
        self.change_remotes(CatalogCommand::SkipRemote {
            name: name.to_owned(),
            epoch,
            partition,
            offset,
        })
        .await
    }

    /// Removes remote child `name` of attachment `epoch`; its cursors stop and their files go.
    pub async fn detach_remote(
        self: &Arc<Self>,
        name: &str,
        epoch: u64,
    ) -> Result<(), BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let parent = self
            .store
            .catalog()
            .remote_children()
            .find(|c| c.name == name && c.epoch == epoch)
            .map(|c| c.parent.clone());
        let cmd = CatalogCommand::DetachRemote {
            name: name.to_owned(),
            epoch,
        };
        if self.store.replicated() {
            self.propose_replicated(cmd).await?;
        } else {
            self.commit(cmd, |_| {}).await?;
        }
        // this node's cursors stop at their next step; their files go now
        self.remote_cursors
            .lock()
            .retain(|(c, _), s| c != name || s.epoch != epoch);
        if let Some(p) = parent.and_then(|p| self.topic(&p).ok()) {
            for part in p.partitions().iter() {
                let _ = std::fs::remove_file(cursor_file::cursor_path(
                    &part.dir,
                    &format!("@{name}"),
                    epoch,
                ));
            }
        }
        Ok(())
    }

    /// Records of `parent` not yet shipped to `child`'s remote from this node's partitions.
    pub fn remote_lag(&self, parent: &str, child: &str) -> u64 {
        let Ok(p) = self.topic(parent) else { return 0 };
        let cursors = self.remote_cursors.lock();
        p.partitions()
            .iter()
            .filter_map(|part| {
                let s = cursors.get(&(child.to_owned(), part.index))?;
                let next = s.next.load(Ordering::Acquire);
                (next != u64::MAX).then(|| part.stats().next_offset.saturating_sub(next))
            })
            .sum()
    }

    /// `parent`'s remote children with what this node's cursors report.
    pub(crate) fn remote_child_infos(&self, parent: &str) -> Vec<super::ChildInfo> {
        let now = self.clock.now_ms();
        let mut out = Vec::new();
        for c in self.remote_children(parent) {
            let (mut state, mut last_error, mut oldest) = ("running", None, 0i64);
            let mut blocked = Vec::new();
            if c.paused {
                state = "paused";
            }
            for ((name, partition), s) in self.remote_cursors.lock().iter() {
                if *name != c.name || s.epoch != c.epoch {
                    continue;
                }
                let st = s.status.lock().clone();
                if let Some(offset) = st.blocked
                    && !c.skips.contains(&(*partition, offset))
                {
                    blocked.push(BlockedRecord {
                        partition: *partition,
                        offset,
                    });
                }
                if state_rank(st.state) > state_rank(state) {
                    state = st.state;
                }
                if last_error.is_none() {
                    last_error = st.last_error;
                }
                if st.oldest_unshipped_ms > 0 && (oldest == 0 || st.oldest_unshipped_ms < oldest) {
                    oldest = st.oldest_unshipped_ms;
                }
            }
            out.push(super::ChildInfo {
                name: c.name.clone(),
                delay_ms: 0,
                lag_messages: self.remote_lag(parent, &c.name),
                due_lag_seconds: 0.0,
                remote: Some(RemoteChildInfo {
                    remote: c.remote.clone(),
                    remote_topic: c.remote_topic.clone(),
                    target_topic_id: format!("{:016x}", c.target_id),
                    lanes: c.lanes,
                    paused: c.paused,
                    state: state.to_owned(),
                    last_error,
                    lag_seconds: if oldest > 0 {
                        (now - oldest).max(0) as f64 / 1000.0
                    } else {
                        0.0
                    },
                    blocked,
                }),
            });
        }
        out
    }

    /// Starts every remote cursor this node should run and does not: one per remote child
    /// and parent partition this node serves.
    pub(crate) fn start_remote_cursors(self: &Arc<Self>) {
        let catalog = self.store.catalog();
        for c in catalog.remote_children() {
            let Ok(p) = self.topic(&c.parent) else {
                continue;
            };
            if p.id() != c.parent_id {
                continue;
            }
            let pmeta = p.meta.read().clone();
            for i in 0..p.partitions().len() as u32 {
                let running = self
                    .remote_cursors
                    .lock()
                    .get(&(c.name.clone(), i))
                    .is_some_and(|s| s.epoch == c.epoch);
                if running || !self.is_local(&pmeta, i) {
                    continue;
                }
                let key = format!("@{}", c.name);
                if let Some(part) = p.partitions().get(i as usize) {
                    cursor_file::remove_cursor_files_but(&part.dir, &key, Some(c.epoch));
                }
                let state = Arc::new(RemoteCursor {
                    epoch: c.epoch,
                    next: AtomicU64::new(u64::MAX),
                    status: parking_lot::Mutex::new(LinkStatus {
                        state: "running",
                        last_error: None,
                        oldest_unshipped_ms: 0,
                        blocked: None,
                    }),
                });
                self.remote_cursors
                    .lock()
                    .insert((c.name.clone(), i), state.clone());
                let weak = Arc::downgrade(self);
                let (parent, child) = (p.clone(), c.clone());
                self.tasks
                    .spawn(super::maintenance::FANOUT_TASK, move |stop| {
                        run_remote_cursor(weak, parent, i, child, state, stop)
                    });
            }
        }
    }
}

/// Most records one progress round reads looking for records that came from the target.
const RETURN_SCAN_MAX: u64 = 16_384;

/// The records of `part` in `[from, to)` (acked: below its ack frontier) whose origin, or an
/// earlier hop, is topic `target` (the link's target: they came from it, and it is the old
/// primary), as
/// ranges of the target's own offsets; and where the scan stopped (at most `budget`
/// records: [`RETURN_SCAN_MAX`] a round in all).
async fn scan_returned(
    b: &Arc<Broker>,
    part: &Arc<super::Partition>,
    from: u64,
    to: u64,
    target: u64,
    budget: u64,
) -> Result<(Vec<(u32, u64, u64)>, u64), BrokerError> {
    let limit = to.min(from.saturating_add(budget));
    let mut next = from;
    let mut found: std::collections::BTreeMap<u32, Vec<u64>> = Default::default();
    while next < limit {
        let max = (limit - next).min(4096) as usize;
        let records = match b.read_slab(part, next, max).await? {
            Ok(r) => r,
            Err(oldest) => {
                next = oldest;
                continue;
            }
        };
        let Some(last) = records.last().map(|r| r.offset) else {
            break;
        };
        // (its origin, or an earlier hop: a record forwarded on its way back, say after
        // failovers across three clusters)
        for r in records.iter().filter(|r| r.offset < limit) {
            if let Some((p, o)) = position_in(r, target) {
                found.entry(p).or_default().push(o);
            }
        }
        next = (last + 1).min(limit);
    }
    let mut ranges = Vec::new();
    for (p, mut offsets) in found {
        offsets.sort_unstable();
        offsets.dedup();
        for o in offsets {
            match ranges.last_mut() {
                Some((lp, _, e)) if *lp == p && *e == o => *e = o + 1,
                _ => ranges.push((p, o, o + 1)),
            }
        }
    }
    Ok((ranges, next.max(from)))
}

/// A mirror of `child`'s parent was promoted past it (the target answered `fenced`): the
/// parent takes no more produces or leases, and what its links did not ship yet goes on as
/// the new primary's late records. False if the role could not be changed (it changed
/// meanwhile, or no quorum: looked at again next round).
async fn demote_fenced(
    b: &Arc<Broker>,
    child: &RemoteChild,
    role: crate::catalog::TopicRole,
    cursor: &RemoteCursor,
    message: String,
) -> bool {
    let demoted = crate::catalog::TopicRole::Demoted {
        epoch: role.epoch(),
    };
    match b.set_role(&child.parent, role, demoted).await {
        Ok(_) => {
            tracing::error!(topic = %child.parent, child = %child.name, epoch = role.epoch(), "a mirror of this topic was promoted: the topic is demoted (no produces, no leases); its links ship what they had not shipped to the new primary");
            cursor.set("fenced", Some(message));
            true
        }
        Err(e) => {
            cursor.set(
                "fenced",
                Some(format!("{message}; demoting the topic: {e}")),
            );
            false
        }
    }
}

/// One remote cursor: ships parent partition `pidx` to `child`'s remote until the link ends
/// or `stop`. The cursor file moves only after a whole slab was accepted by the target, so a
/// crash means duplicates on the target, never a gap.
async fn run_remote_cursor(
    weak: std::sync::Weak<Broker>,
    parent: Arc<Topic>,
    pidx: u32,
    child: Arc<RemoteChild>,
    cursor: Arc<RemoteCursor>,
    stop: crate::supervisor::CancellationToken,
) {
    let part = parent.partitions()[pidx as usize].clone();
    let key = format!("@{}", child.name);
    let path = cursor_file::cursor_path(&part.dir, &key, child.epoch);
    let mut next = match cursor_file::read_cursor(&path, child.epoch) {
        Some(n) => n,
        None => {
            let stats = part.stats();
            child
                .starts
                .get(pidx as usize)
                .map_or(stats.oldest_offset, |&s| {
                    s.clamp(stats.oldest_offset, stats.next_offset)
                })
        }
    };
    cursor.next.store(next, Ordering::Release);
    // the lanes that took their share of the slab ending at `.0` already
    let mut done: Option<(u64, Vec<bool>)> = None;
    // the progress the target took last, and when it was sent
    let mut progress_sent: Option<((super::PartitionProgress, super::SourceEnd), i64)> = None;
    // the next offset to look at for records that came from the target (see `scan_returned`)
    let mut returned_scan = 0u64;
    // acked ranges above the frontier whose records were looked at (and handed back)
    let mut returned_ranges: std::collections::BTreeSet<(u64, u64)> = Default::default();
    // the parent's settings, schema count and epoch the target was last brought to (a
    // target follows the parent to each epoch it is promoted to, whatever the parent was
    // when this cursor started)
    let mut synced: Option<(
        crate::topic::TopicConfig,
        usize,
        u64,
        Vec<crate::catalog::CarriedChild>,
    )> = None;
    // a failback's children: what was found from where (see `children_returned`)
    let mut children_scanned: std::collections::HashMap<String, ChildScan> = Default::default();
    // slabs refused since the target was last asked to follow a new epoch
    let mut follow_tries = 0u32;
    // a record past the hop limit was logged
    let mut too_far_logged = false;
    loop {
        let Some(b) = weak.upgrade() else { return };
        if stop.is_cancelled() || b.shutting_down.load(Ordering::Acquire) {
            return;
        }
        if !b.is_local(&parent.meta.read(), pidx) {
            // the partition moved away: its new owner ships it from the cursor file that
            // moved with it
            b.remote_cursors
                .lock()
                .retain(|_, s| !Arc::ptr_eq(s, &cursor));
            return;
        }
        let current = b
            .store
            .catalog()
            .remote_children()
            .find(|c| c.name == child.name && c.epoch == child.epoch)
            .cloned();
        let Some(current) = current.filter(|_| !parent.deleted.load(Ordering::Acquire)) else {
            // the link ended: this cursor and its file go
            b.remote_cursors
                .lock()
                .retain(|(c, _), s| *c != child.name || s.epoch != child.epoch);
            let _ = std::fs::remove_file(&path);
            return;
        };
        let clock = b.clock.clone();
        let shipper = b.shipper.get().cloned();
        let (paused, shipper) = match shipper {
            _ if current.paused => (Some(("paused", None)), None),
            None => (
                Some((
                    "unavailable",
                    Some("this node cannot reach remotes (no sender)".to_owned()),
                )),
                None,
            ),
            Some(s) => (None, Some(s)),
        };
        if let Some((state, error)) = paused {
            cursor.set(state, error);
            // its lag in time goes on growing: the age of the oldest record not shipped (read
            // once: `next` does not move while paused)
            let known = cursor.status.lock().oldest_unshipped_ms > 0;
            let oldest = if known {
                None
            } else if next < part.stats().next_offset {
                match b.read_slab(&part, next, 1).await {
                    Ok(Ok(r)) => r.first().map(|r| r.timestamp_ms),
                    _ => None,
                }
            } else {
                Some(0)
            };
            if let Some(oldest) = oldest {
                cursor.status.lock().oldest_unshipped_ms = oldest;
            }
            drop(b);
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = clock.sleep(PAUSED_POLL) => {}
            }
            continue;
        }
        let shipper = shipper.expect("set above");
        if let Some(wait) = shipper.gate_wait(current.remote_id) {
            // the remote's gate is open: no reading until a probe may go
            drop(b);
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = clock.sleep(wait.min(Duration::from_secs(1))) => {}
            }
            continue;
        }
        // the parent's consumer progress, at most every interval, once what it covers was
        // shipped (a primary's, and a demoted one's: acks of its last leases still count;
        // a mirror's queue serves nobody)
        let role = parent.meta.read().role;
        let now_ms = clock.now_ms();
        let interval = b.cfg.mirror_progress_interval_ms as i64;
        let due = interval > 0
            && progress_sent
                .as_ref()
                .is_none_or(|(_, at)| now_ms.saturating_sub(*at) >= interval);
        let acks_here = !matches!(role, crate::catalog::TopicRole::Mirror { .. });
        if acks_here && due && cursor.status.lock().state == "running" {
            let (mut snap, leased) = {
                let q = part.queue.lock();
                (q.snapshot(), q.in_flight() as u64)
            };
            // and its fan-out children's (a planned switchover waits for them too)
            let leased =
                leased + b.children_leased(&child.parent, pidx, parent.partitions().len() as u32);
            let end = super::SourceEnd {
                end: part.stats().next_offset,
                shipped: next,
                leased,
                unreturned: 0,
                partitions: parent.partitions().len() as u32,
                demoted: !role.is_primary(),
                at_ms: 0,
            };
            // records of this partition that came from the target itself and were acked
            // here (a failback: the target is the old primary, whose queue still holds them)
            let returns = !matches!(
                role,
                crate::catalog::TopicRole::Primary {
                    promoted_from: None,
                    ..
                }
            );
            let mut newly_returned = Vec::new();
            let (returned, returned_to, unreturned) = if returns {
                let from = returned_scan.max(part.stats().oldest_offset);
                let mut budget = RETURN_SCAN_MAX;
                let below =
                    scan_returned(&b, &part, from, snap.frontier, current.target_id, budget).await;
                match below {
                    Ok((mut ranges, to)) => {
                        budget = budget.saturating_sub(to - from);
                        // and the ranges acked above the frontier (out of order), each once
                        let mut unreturned = snap.frontier.saturating_sub(to);
                        for &(s, e) in &snap.acked {
                            if returned_ranges.contains(&(s, e)) {
                                continue;
                            }
                            if budget < e - s {
                                unreturned += e - s;
                                continue;
                            }
                            match scan_returned(&b, &part, s, e, current.target_id, budget).await {
                                Ok((found, _)) => {
                                    budget -= e - s;
                                    ranges.extend(found);
                                    newly_returned.push((s, e));
                                }
                                Err(_) => unreturned += e - s,
                            }
                        }
                        (ranges, to, unreturned)
                    }
                    Err(e) => {
                        tracing::debug!(parent = %child.parent, partition = pidx, error = %e, "reading acked records to hand back to the old primary; tried again");
                        (Vec::new(), returned_scan, 1)
                    }
                }
            } else {
                (Vec::new(), snap.frontier, 0)
            };
            let end = super::SourceEnd { unreturned, ..end };
            snap.acked.truncate(super::progress::MAX_PROGRESS_RANGES);
            let children = b.children_consumed(&child.parent, pidx);
            // a failback: where the records from the target that the children's consumers
            // here have not processed begin (read again only when that changes)
            let mut children_returned = Vec::new();
            if returns {
                let end = part.stats().next_offset;
                let mut budget = CHILD_SCAN_MAX;
                let mut ask = Vec::new();
                for (name, from) in &children {
                    match children_scanned.get(name) {
                        Some((f, e, found)) if f == from && *e == end => {
                            children_returned.push((name.clone(), found.clone()));
                        }
                        _ => ask.push((name.clone(), *from)),
                    }
                }
                for (name, found) in b
                    .children_returned(
                        &child.parent,
                        &part,
                        pidx,
                        &ask,
                        current.target_id,
                        &mut budget,
                    )
                    .await
                {
                    let from = ask.iter().find(|(n, _)| *n == name).map_or(0, |(_, f)| *f);
                    children_scanned.insert(name.clone(), (from, end, found.clone()));
                    children_returned.push((name, found));
                }
                children_returned.sort();
            }
            let progress = super::PartitionProgress {
                frontier: snap.frontier,
                acked: snap.acked,
                children,
                children_returned,
            }
            .clamped(next);
            let resend = !returned.is_empty()
                || progress_sent.as_ref().is_none_or(|(p, at)| {
                    *p != (progress.clone(), end)
                        || now_ms.saturating_sub(*at)
                            >= (super::PROGRESS_RESEND.as_millis() as i64).max(interval)
                });
            let cluster_id = b.cluster_id();
            if resend && let Some(cluster_id) = cluster_id {
                let sent = shipper
                    .send_progress(ProgressUpdate {
                        child: current.clone(),
                        cluster_id,
                        parent_partition: pidx,
                        epoch: role.epoch(),
                        tail: !role.is_primary(),
                        progress: progress.clone(),
                        end,
                        returned,
                    })
                    .await;
                match sent {
                    Ok(()) => {
                        progress_sent = Some(((progress, end), now_ms));
                        returned_scan = returned_to;
                        returned_ranges.retain(|&(_, e)| e > returned_to);
                        returned_ranges.extend(newly_returned);
                    }
                    Err(e) if e.fenced && role.is_primary() => {
                        // (an idle old primary learns it was replaced from its progress: no
                        // produce has to come first)
                        demote_fenced(&b, &child, role, &cursor, e.message).await;
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!(parent = %child.parent, child = %child.name, partition = pidx, error = %e.message, "consumer progress not taken by the remote; sent again later");
                        progress_sent = progress_sent.map(|(p, _)| (p, now_ms));
                    }
                }
            } else if !resend {
                progress_sent = Some(((progress, end), progress_sent.map_or(now_ms, |(_, at)| at)));
                returned_scan = returned_to;
                returned_ranges.retain(|&(_, e)| e > returned_to);
                returned_ranges.extend(newly_returned);
            }
        }
        // a slab of the node's budget for what remote cursors hold (its remote's share),
        // kept until the ship ends (a cursor waits its turn: many links cannot hold a slab
        // each at once, and a remote that hangs holds only its own share)
        let slabs = b.remote_slabs(current.remote_id);
        let (b, slab) = match slabs.clone().try_acquire_owned() {
            Ok(p) => {
                let held = HeldSlab::new(p, &b.metrics.remote_slabs_held);
                (b, held)
            }
            Err(_) => {
                b.metrics.remote_slab_waits.inc();
                drop(b);
                let permit = tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    p = slabs.acquire_owned() => p.expect("the remote budget is never closed"),
                };
                let Some(b) = weak.upgrade() else { return };
                let held = HeldSlab::new(permit, &b.metrics.remote_slabs_held);
                (b, held)
            }
        };
        let appended = parent.appended.notified();
        tokio::pin!(appended);
        appended.as_mut().enable();
        let read = match b.log_of(&part).await {
            Ok(log) => {
                let max = match &done {
                    Some((end, _)) if *end > next => {
                        ((end - next) as usize).min(REMOTE_SLAB_RECORDS)
                    }
                    _ => REMOTE_SLAB_RECORDS,
                };
                tokio::task::spawn_blocking(move || log.read(next, max, fanout::SLAB_BYTES))
                    .await
                    .expect("remote cursor read task")
            }
            Err(e) => Err(LogError::Io {
                path: part.dir.clone(),
                source: std::io::Error::other(e.to_string()),
            }),
        };
        let records = match read {
            Ok(r) => r,
            Err(LogError::Truncated { oldest, .. }) => {
                let dropped = oldest - next;
                tracing::error!(parent = %child.parent, child = %child.name, partition = pidx, dropped, "a remote child fell behind the parent's retention; records were never shipped");
                b.metrics
                    .fanout_dropped
                    .get_or_create(&crate::metrics::TopicLabel {
                        topic: child.name.clone(),
                    })
                    .inc_by(dropped);
                done = None;
                match cursor_file::persist(&path, child.epoch, oldest).await {
                    Ok(()) => {
                        next = oldest;
                        cursor.next.store(next, Ordering::Release);
                    }
                    Err(e) => {
                        cursor.set("unavailable", Some(format!("writing the cursor: {e}")));
                        drop(b);
                        drop(slab);
                        tokio::select! {
                            biased;
                            () = stop.cancelled() => return,
                            () = clock.sleep(Duration::from_secs(1)) => {}
                        }
                    }
                }
                continue;
            }
            Err(e) => {
                cursor.set("unavailable", Some(format!("reading the parent: {e}")));
                drop(b);
                drop(slab);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = clock.sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
        };
        let Some(last) = records.last().map(|r| r.offset) else {
            cursor.status.lock().oldest_unshipped_ms = 0;
            if cursor.status.lock().state != "running" {
                cursor.set("running", None);
            }
            drop(b);
            // (a cursor wakes every progress interval to send its consumers' acks)
            let idle = if acks_here && interval > 0 {
                Duration::from_millis(interval as u64)
            } else {
                fanout::IDLE_WAIT
            };
            drop(slab);
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = &mut appended => {}
                () = clock.sleep(idle) => {}
            }
            continue;
        };
        cursor.status.lock().oldest_unshipped_ms = records[0].timestamp_ms;
        // what goes: the parent's own records, and (re-protection) the ones it got from
        // elsewhere, unless they came from the target's topic or passed through it (it holds
        // them) or went through every hop a record may; never one an admin skipped. A
        // mirror's records from its source wait here until it is promoted (its lag counts
        // them): a mirror does not ship on what it mirrors
        let forwards = acks_here;
        let mut held_at = None;
        let mut kept = Vec::with_capacity(records.len());
        for r in records {
            if current.skips.contains(&(pidx, r.offset)) {
                continue;
            }
            match route_of(&r) {
                Route::Own => kept.push(r),
                Route::Unreadable => {}
                Route::Through(hops)
                    if hops.iter().any(|(s, _, _)| s.topic == current.target_id) => {}
                Route::Through(_) if !forwards => {
                    held_at = Some(r.offset);
                    break;
                }
                Route::Through(hops) if hops.len() >= MAX_HOPS => {
                    if !too_far_logged {
                        too_far_logged = true;
                        tracing::warn!(parent = %child.parent, child = %child.name, partition = pidx, offset = r.offset, "a record that went through {MAX_HOPS} links already is not forwarded again (logged once per cursor)");
                    }
                }
                Route::Through(_) => kept.push(r),
            }
        }
        let records = kept;
        let last = match held_at {
            Some(o) if o == next => {
                cursor.set(
                    "standby",
                    Some("the parent is a mirror: the records it got from its source go on once it is promoted".into()),
                );
                drop(b);
                drop(slab);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = clock.sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            Some(o) => o - 1,
            None => last,
        };
        let cluster_id = match b.ensure_cluster_id().await {
            Ok(id) => id,
            Err(e) => {
                cursor.set("unavailable", Some(format!("naming this cluster: {e}")));
                drop(b);
                drop(slab);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = clock.sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
        };
        // the target follows the parent's settings and schemas before it gets records that
        // may need them (a new schema version here never blocks the link there)
        if role.is_primary() && !records.is_empty() {
            let (config, schemas) = {
                let m = parent.meta.read();
                (m.config.clone(), m.schemas.clone())
            };
            let children = b.carried_children_of(&child.parent);
            let want = (
                config.clone(),
                schemas.len(),
                role.epoch(),
                children.clone(),
            );
            if synced.as_ref() != Some(&want) {
                let sent = shipper
                    .sync_catalog(CatalogSync {
                        child: current.clone(),
                        cluster_id,
                        epoch: role.epoch(),
                        config,
                        schemas,
                        children,
                    })
                    .await;
                match sent {
                    Ok(()) => {
                        synced = Some(want);
                        follow_tries = 0;
                    }
                    Err(e) if e.schema => {
                        cursor.set("rejected_record", Some(e.message));
                        drop(b);
                        drop(slab);
                        tokio::select! {
                            biased;
                            () = stop.cancelled() => return,
                            () = clock.sleep(Duration::from_secs(5)) => {}
                        }
                        continue;
                    }
                    Err(e) => {
                        // (settings the target refuses do not stop the records: tried again
                        // when they change; but a target not brought to a new epoch takes
                        // none of them, so that is tried again with the next slab)
                        tracing::warn!(parent = %child.parent, child = %child.name, error = %e.message, "the remote child's target did not take the parent's settings");
                        if e.followed || synced.as_ref().is_some_and(|s| s.2 == want.2) {
                            synced = Some(want);
                        }
                    }
                }
            }
        }
        let lanes_done = match done.take() {
            Some((end, d)) if end == last + 1 => d,
            _ => Vec::new(),
        };
        drop(b);
        let outcome = if records.is_empty() {
            Ok(())
        } else {
            shipper
                .ship(ShipBatch {
                    child: current.clone(),
                    cluster_id,
                    parent_partition: pidx,
                    epoch: role.epoch(),
                    tail: !role.is_primary(),
                    records,
                    done: lanes_done,
                    now_ms: clock.now_ms(),
                })
                .await
        };
        drop(slab);
        match outcome {
            Ok(()) => {
                if let Err(e) = cursor_file::persist(&path, child.epoch, last + 1).await {
                    cursor.set("unavailable", Some(format!("writing the cursor: {e}")));
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        () = clock.sleep(Duration::from_secs(1)) => {}
                    }
                    continue;
                }
                next = last + 1;
                cursor.next.store(next, Ordering::Release);
                cursor.set("running", None);
            }
            Err(f) if f.state == "fenced" && role.is_primary() => {
                // (same slab next, now marked as a tail)
                done = Some((last + 1, f.done));
                let Some(b) = weak.upgrade() else { return };
                if !demote_fenced(&b, &child, role, &cursor, f.message).await {
                    drop(b);
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        () = clock.sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
            Err(f) => {
                cursor.set(f.state, Some(f.message));
                cursor.status.lock().blocked = f.blocked;
                done = Some((last + 1, f.done));
                // a long wait (a link stopped until someone acts) ends early when the link
                // changes: a skip, a pause, a detach; and a target refusing a parent it has
                // not followed to its epoch yet is asked to follow again soon
                let following = f.state == "not_a_mirror"
                    && role.is_primary()
                    && synced.as_ref().is_none_or(|s| s.2 != role.epoch());
                let mut left = if following {
                    // (1 s doubling: a target that keeps refusing costs what any stopped
                    // link does)
                    follow_tries = follow_tries.saturating_add(1);
                    let soon = Duration::from_secs(1 << follow_tries.min(5).saturating_sub(1));
                    f.retry_in.min(soon)
                } else {
                    f.retry_in
                };
                while !left.is_zero() {
                    let step = left.min(Duration::from_secs(1));
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        () = clock.sleep(step) => {}
                    }
                    left -= step;
                    let changed = weak.upgrade().is_none_or(|b| {
                        b.store
                            .catalog()
                            .remote_children()
                            .find(|c| c.name == child.name && c.epoch == child.epoch)
                            .is_none_or(|c| **c != *current)
                    });
                    if changed {
                        break;
                    }
                }
            }
        }
    }
}
