//! Partition moves between cluster members: the target's mover, the source's side of the
//! copy (ops 120–123 on the cluster endpoint), and the watchdog that thaws a freeze whose
//! mover went quiet.
//!
//! ```text
//!  admin / planner ── SetMoveTarget ──► Raft ──► target's mover sees a move to itself
//!  mover: catch up  (list + read while the source serves, ≤ 20 passes, until ≤ 4 MiB left)
//!         freeze    (source: marker, drain, close the log, persist the queue) ─► token
//!         finalize  (copy exactly the frozen files; renew the freeze as it goes)
//!         verify    (open the staged copy: its end must be the source's)
//!         fence     (renew once more: the source is still frozen at that end)
//!         install   (rename into place; not served until the flip)
//!         flip      (CompleteMove: owner := target, owner epoch + 1, iff nobody thawed the
//!                    token) ─► committed: done │ refused: again │ unknown: resolve
//!  resolve: read index, then the catalog says: owner is us (done), or not (again); an
//!           installed copy is never deleted on a bare error
//!  source watchdog: a freeze past its deadline ─► ThawPartition through Raft ─► committed:
//!           thaw │ refused (the flip won): stay frozen, the catalog hands it away
//! ```
//!
//! Queue state (frontier, acked ranges, delivery counts), fan-out and remote cursor files
//! move as files of the partition. Leases do not: the new owner delivers again whatever was
//! leased and not acked when the source froze, and the old owner answers `410` to their
//! handles.
//!
//! The sequence above is [`MoveMachine`] (in the catalog, without I/O, also run by the cluster
//! simulation); the mover here performs the calls it asks for and feeds it their answers.
//!
//! Here: the mover (the target's side, above); `source`, the calls it makes answered;
//! `plan`, the leader's planner; `forget`, a member lost for good and the witness that makes
//! forgetting it safe; `metrics`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_cluster::rpc::Op;
use narad_core::broker::Broker;
use narad_core::broker::moves::{MAX_FILE_CHUNK, PartitionFile};
use narad_core::catalog::store::{MetaStore, StoreError};
use narad_core::catalog::{CatalogCommand, CatalogError, TopicMeta};
use narad_core::failpoint;
use narad_core::ids::PartitionId;
use narad_wire::ErrorCode;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use narad_cluster::rpc::ops::{MEMBER_PROBE, MOVE_FREEZE, MOVE_LIST, MOVE_READ};

use crate::cluster::ClusterNode;
use crate::config::MoveSettings;
use crate::http::error::ApiError;

/// How long forget watches a member it is asked to declare lost: it must fail every probe
/// over this window, from this member and from every other live one.
const LOST_FOR: Duration = Duration::from_secs(3);
/// Probes of a member forget makes over [`LOST_FOR`], one [`PROBE_WITHIN`] each.
const LOST_PROBES: u32 = 3;
const PROBE_WITHIN: Duration = Duration::from_secs(1);
/// Moves one node copies at once (as a target); more wait their turn.
pub const MOVES_PER_NODE: usize = 2;
/// Partitions a member rebuilds from the archive at once (a forgotten member's partitions
/// wait their turn: each attempt holds one archived segment in memory).
const REBUILDS_PER_NODE: usize = 2;
/// Deadline of one call to the source.
const CALL: Duration = Duration::from_secs(10);
/// Deadline of a proposal or read index.
const PROPOSE: Duration = Duration::from_secs(10);

/// The injected faults (tests) one move already went through: each fires once per move.
#[derive(Debug, Default)]
struct Injected(u8);

impl Injected {
    const STALL_BEFORE_FREEZE: u8 = 1;
    const STALL_FROZEN: u8 = 2;
    const STALL_FLIP: u8 = 4;
    const LOSE_FLIP_REPLY: u8 = 8;

    /// True the first time a fault is asked for.
    fn once(&mut self, fault: u8) -> bool {
        let first = self.0 & fault == 0;
        self.0 |= fault;
        first
    }
}

#[cfg(test)]
#[test]
fn an_injected_fault_fires_once_per_move() {
    let mut i = Injected::default();
    assert!(i.once(Injected::STALL_FROZEN));
    assert!(!i.once(Injected::STALL_FROZEN), "once");
    assert!(
        i.once(Injected::LOSE_FLIP_REPLY),
        "the others are their own"
    );
    assert!(!i.once(Injected::LOSE_FLIP_REPLY));
    assert!(i.once(Injected::STALL_BEFORE_FREEZE) && i.once(Injected::STALL_FLIP));
}

/// What one attempt of a move learnt from its source so far.
struct Attempt {
    meta: Arc<TopicMeta>,
    partition: u32,
    source: u64,
    /// The files the last list named, and the source process it came from.
    listed: Vec<PartitionFile>,
    listed_from: u64,
    /// What the freeze answered, and when it was asked for.
    frozen: Option<FreezeReply>,
    frozen_at: Option<Instant>,
    /// Whether the flip was proposed once already.
    proposed: bool,
}

/// Undoes what a move running here holds, when its task ends however it ends.
struct MoveDone<'a> {
    mover: &'a Mover,
    key: MoveKey,
}

impl Drop for MoveDone<'_> {
    fn drop(&mut self) {
        let m = self.mover;
        m.metrics.in_flight.dec();
        m.progress.lock().remove(&self.key);
        m.staged_from.lock().remove(&self.key);
        m.running.lock().remove(&self.key);
    }
}

/// How often the leader's planner looks at the placement (and at once when the
/// membership changes).
const PLAN_EVERY: Duration = Duration::from_secs(10);

mod forget;
mod metrics;
mod plan;
mod source;
mod steps;

pub use forget::Forgotten;
pub use metrics::MoveMetrics;
use narad_core::catalog::move_machine::{self, Action, Event, FlipAnswer, MoveKey, MoveMachine};
pub use plan::{PlannedMove, plan_moves};
use source::*;
pub use source::{Progress, serve};

// ── the mover ──

/// A rebuild from the archive: a partition under one owner epoch (a later forget of the
/// same partition is another rebuild).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct RebuildKey {
    partition: PartitionId,
    epoch: u64,
}

/// Runs the moves targeted at this member, thaws this member's lapsed freezes, and on the
/// leader plans moves (rebalance, decommission) and cancels those whose target is gone.
pub struct Mover {
    node: Arc<ClusterNode>,
    broker: Arc<Broker>,
    store: Arc<dyn MetaStore>,
    pub metrics: Arc<MoveMetrics>,
    settings: MoveSettings,
    running: Mutex<HashSet<MoveKey>>,
    /// Rebuilds from the archive running here.
    rebuilding: Mutex<HashSet<RebuildKey>>,
    /// Rebuild attempts that may fetch at once (each holds one archived segment in memory).
    rebuild_slots: Arc<Semaphore>,
    progress: Mutex<BTreeMap<MoveKey, Progress>>,
    slots: Arc<Semaphore>,
    /// Copy pacing (`move_max_bytes_per_sec`): when the next byte may be read.
    pace: Mutex<Instant>,
    /// Members the planner could not reach, since when.
    down_since: Mutex<HashMap<u64, Instant>>,
    /// Per partition being moved here: the source and source process its staged copy came
    /// from (a later attempt from the same process goes on from it).
    staged_from: Mutex<HashMap<MoveKey, (u64, u64)>>,
    /// One planning pass at a time.
    planning: tokio::sync::Mutex<()>,
    /// This member's ingress (what it saw acknowledged, for `forget`).
    ingress: std::sync::Weak<crate::forward::Ingress>,
    /// Where partitions of a lost member are rebuilt from (`None`: no archive).
    archive: Option<Arc<narad_replay::ArchiveReader>>,
    /// Why partitions opened at this member's start are not served yet (`None`: checked).
    unverified: Mutex<Option<String>>,
    /// Where each move's and each rebuild's task runs: a panic there is counted and logged,
    /// and the node reports not ready (instead of a move left `running` here unseen).
    tasks: Arc<narad_core::supervisor::Supervisor>,
}

/// The supervised task groups of the moves and rebuilds copying to this member.
const MOVE_TASK: &str = "partition_move";
const REBUILD_TASK: &str = "partition_rebuild";
/// Both, for the server's shutdown.
pub const COPY_TASKS: [&str; 2] = [MOVE_TASK, REBUILD_TASK];

impl Mover {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: Arc<ClusterNode>,
        broker: Arc<Broker>,
        store: Arc<dyn MetaStore>,
        metrics: Arc<MoveMetrics>,
        settings: MoveSettings,
        ingress: std::sync::Weak<crate::forward::Ingress>,
        archive: Option<Arc<narad_replay::ArchiveReader>>,
        tasks: Arc<narad_core::supervisor::Supervisor>,
    ) -> Arc<Self> {
        Arc::new(Self {
            node,
            broker,
            store,
            metrics,
            settings,
            running: Mutex::new(HashSet::new()),
            rebuilding: Mutex::new(HashSet::new()),
            rebuild_slots: Arc::new(Semaphore::new(REBUILDS_PER_NODE)),
            progress: Mutex::new(BTreeMap::new()),
            slots: Arc::new(Semaphore::new(MOVES_PER_NODE)),
            pace: Mutex::new(Instant::now()),
            down_since: Mutex::new(HashMap::new()),
            staged_from: Mutex::new(HashMap::new()),
            planning: tokio::sync::Mutex::new(()),
            ingress,
            archive,
            unverified: Mutex::new(Some(
                "checking this member's partitions against what the cluster acknowledged".into(),
            )),
            tasks,
        })
    }

    /// Why this member is not ready for its partitions yet: at its start they are held
    /// until checked against what the other members saw acknowledged (see
    /// [`Mover::witness`]). `None` once checked.
    pub fn unverified(&self) -> Option<String> {
        // (the start's check ends only once nothing is held: no scan per probe after it)
        if !self.broker.verifying() {
            return None;
        }
        self.unverified.lock().clone()
    }

    /// Waits until `n` more bytes may be copied (`move_max_bytes_per_sec`).
    async fn pace(&self, n: u64) {
        let rate = self.settings.max_bytes_per_sec;
        if rate == 0 {
            return;
        }
        let at = {
            let mut next = self.pace.lock();
            let (start, after) = steps::pace_slot(*next, Instant::now(), n, rate);
            *next = after;
            start
        };
        let wait = at.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            sleep(wait).await;
        }
    }

    /// The size of one read: 1 MiB, less when the pace is slow (so pacing stays smooth).
    fn chunk(&self) -> u64 {
        steps::chunk_for(self.settings.max_bytes_per_sec, MAX_FILE_CHUNK)
    }

    /// The moves this member is copying in now.
    pub fn progress(&self) -> Vec<Progress> {
        self.progress.lock().values().cloned().collect()
    }

    fn set_phase(&self, key: MoveKey, phase: &str) {
        if let Some(p) = self.progress.lock().get_mut(&key) {
            phase.clone_into(&mut p.phase);
        }
    }

    fn add_bytes(&self, key: MoveKey, n: u64) {
        self.metrics.bytes_copied.inc_by(n);
        if let Some(p) = self.progress.lock().get_mut(&key) {
            p.bytes_copied += n;
        }
    }

    /// Until `stop`: starts a task for every move the catalog targets at this member, and
    /// once a second thaws the freezes here that ran out.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut view = self.node.meta.subscribe();
        let me = self.node.node_id();
        let mut planned_at: Option<Instant> = None;
        let mut seen: (Vec<u64>, std::collections::BTreeSet<u64>, usize) = Default::default();
        loop {
            let (catalog, voters) = {
                let v = view.borrow_and_update();
                let mut voters: Vec<u64> = v.membership.membership().voter_ids().collect();
                voters.sort_unstable();
                (v.catalog.clone(), voters)
            };
            for t in catalog.topics() {
                for (&p, m) in &t.moves {
                    if m.target != me {
                        continue;
                    }
                    let key = MoveKey::new(t.id, p, m.id);
                    if !self.running.lock().insert(key) {
                        continue;
                    }
                    let this = self.clone();
                    let name = t.name.clone();
                    // (stopped with the mover: the group's token is cancelled at shutdown)
                    let started = self.tasks.spawn(MOVE_TASK, move |stop| async move {
                        this.run_move(name, key, stop).await;
                        this.running.lock().remove(&key);
                    });
                    if !started {
                        self.running.lock().remove(&key);
                    }
                }
            }
            for (meta, p) in self.broker.awaited_rebuilds() {
                let key = RebuildKey {
                    partition: PartitionId::new(meta.id, p),
                    epoch: meta.owner_epoch(p),
                };
                if !self.rebuilding.lock().insert(key) {
                    continue;
                }
                let this = self.clone();
                let started = self.tasks.spawn(REBUILD_TASK, move |stop| async move {
                    this.run_rebuild(key, stop).await;
                    this.rebuilding.lock().remove(&key);
                });
                if !started {
                    self.rebuilding.lock().remove(&key);
                }
            }
            self.thaw_lapsed().await;
            // at once when the membership or the draining set changes, or a move ended (the
            // budget has room again; a drained member may be retired)
            let shape = (
                voters,
                catalog.draining().clone(),
                catalog.topics().map(|t| t.moves.len()).sum::<usize>(),
            );
            let changed = shape.0 != seen.0 || shape.1 != seen.1 || shape.2 < seen.2;
            let due = planned_at.is_none_or(|t| t.elapsed() >= PLAN_EVERY) || changed;
            seen = shape;
            if due && !self.node.meta.handing_off() && self.node.meta.is_leader() {
                planned_at = Some(Instant::now());
                if let Err(e) = self.plan_pass(false).await {
                    tracing::debug!(error = %e.message, "partition planner pass skipped");
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                r = view.changed() => if r.is_err() { return },
                () = sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Freezes here past their deadline: thawed once the cluster recorded the thaw (so no
    /// flip naming the token can commit after), left frozen if the flip came first.
    async fn thaw_lapsed(&self) {
        // a freeze whose move was cancelled (this node applied the cancel: no flip naming it
        // can commit after it) thaws at once
        for f in self.broker.lapsed_freezes(Instant::now(), true) {
            if let Ok(true) = self
                .broker
                .thaw_partition(&f.topic, f.topic_id, f.partition, f.token)
                .await
            {
                tracing::info!(topic = %f.topic, partition = f.partition, "the move of a frozen partition was cancelled: it is served here again");
            }
        }
        for f in self.broker.lapsed_freezes(Instant::now(), false) {
            let cmd = CatalogCommand::ThawPartition {
                topic_id: f.topic_id,
                partition: f.partition,
                owner: self.node.node_id(),
                expect_epoch: f.owner_epoch,
                token: f.token,
            };
            match self.store.replicate(cmd).await {
                Ok(()) => {
                    match self
                        .broker
                        .thaw_partition(&f.topic, f.topic_id, f.partition, f.token)
                        .await
                    {
                        Ok(true) => {
                            self.metrics.thaws.inc();
                            tracing::warn!(topic = %f.topic, partition = f.partition, "a move's freeze ran out before its flip: the partition is served here again");
                        }
                        Ok(false) => {}
                        Err(e) => {
                            tracing::error!(topic = %f.topic, partition = f.partition, error = %e, "could not thaw a partition; retrying");
                        }
                    }
                }
                Err(StoreError::Refused(_)) => {
                    // the flip committed first: the catalog hands the partition away
                }
                Err(e) => {
                    tracing::warn!(topic = %f.topic, partition = f.partition, error = %e, "a lapsed freeze cannot be thawed until the cluster records it; the partition stays frozen");
                }
            }
        }
    }

    /// The move `key` = (topic id, partition, move id): attempts until it completes or the
    /// catalog no longer asks for it.
    async fn run_move(self: &Arc<Self>, topic: String, key: MoveKey, stop: CancellationToken) {
        let MoveKey {
            topic_id,
            partition: p,
            move_id,
        } = key;
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        // (keyed by the move: a cancelled move of the partition may still be winding down
        // beside the one that replaced it)
        let pkey = key;
        self.progress.lock().insert(
            pkey,
            Progress {
                topic: topic.clone(),
                partition: p,
                move_id,
                phase: "catch_up".into(),
                bytes_copied: 0,
                attempts: 0,
                started_ms: self.broker.now_ms(),
                last_error: None,
            },
        );
        self.metrics.in_flight.inc();
        // what the end of the move undoes, however it ends (a panic too: the move stays
        // this member's to run again, and its figures do not stay up)
        let _done = MoveDone { mover: self, key };
        let started = Instant::now();
        let mut completed = false;
        let staging = self
            .broker
            .catalog()
            .get(&topic)
            .filter(|m| m.id == topic_id)
            .map(|m| self.broker.staging_dir(m, p, move_id));
        let mut machine = MoveMachine::new();
        let mut injected = Injected::default();
        loop {
            if stop.is_cancelled() {
                break;
            }
            let Some((meta, source)) = self.wanted(&topic, key) else {
                break;
            };
            if let Some(pr) = self.progress.lock().get_mut(&pkey) {
                pr.attempts += 1;
            }
            let token = loop {
                let t = narad_core::random_u64();
                if t != 0 {
                    break t;
                }
            };
            let mut at = Attempt {
                meta,
                partition: p,
                source,
                listed: Vec::new(),
                listed_from: 0,
                frozen: None,
                frozen_at: None,
                proposed: false,
            };
            let mut action = machine.step(Event::Start { token });
            let ended = loop {
                if action != Action::Done {
                    self.set_phase(pkey, machine.phase());
                }
                match action {
                    Action::Done => {
                        break Ok(at.frozen_at.map(|t| t.elapsed()).unwrap_or_default());
                    }
                    Action::Retry {
                        after,
                        error,
                        staged_stale,
                    } => break Err((after, error, staged_stale)),
                    a => {
                        let answer = self.perform(&mut at, move_id, a, &mut injected).await;
                        action = machine.step(answer);
                    }
                }
            };
            match ended {
                Ok(frozen_for) => {
                    self.metrics.completed.inc();
                    self.metrics
                        .seconds
                        .observe(started.elapsed().as_secs_f64());
                    self.metrics
                        .freeze_seconds
                        .observe(frozen_for.as_secs_f64());
                    tracing::info!(topic = %topic, partition = p, from = source, to = self.node.node_id(), seconds = started.elapsed().as_secs_f64(), frozen_ms = frozen_for.as_millis() as u64, "partition moved here");
                    completed = true;
                    break;
                }
                Err((after, e, staged_stale)) => {
                    if staged_stale {
                        self.staged_from.lock().remove(&pkey);
                    }
                    self.metrics.aborted.inc();
                    tracing::warn!(topic = %topic, partition = p, from = source, error = %e, retry_in = ?after, "partition move attempt failed; trying again");
                    if let Some(pr) = self.progress.lock().get_mut(&pkey) {
                        pr.last_error = Some(e);
                        pr.phase = "retrying".into();
                    }
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = sleep(after) => {}
                    }
                }
            }
        }
        // the staged copy goes whatever ended the move (the topic may be gone from the
        // catalog: its staging directory is found by its incarnation and move id)
        if let Some(staging) = staging {
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(staging)).await;
        }
        if let Some(meta) = self
            .broker
            .catalog()
            .get(&topic)
            .filter(|m| m.id == topic_id)
        {
            // a copy installed by an attempt whose flip never came is not kept
            if !completed {
                let _ = self
                    .broker
                    .discard_unowned_copy(&meta.name, meta.id, p)
                    .await;
            }
        }
    }

    /// Rebuilds partition `key.1` of topic `key.0`, reassigned here at owner epoch `key.2`
    /// after its owner was forgotten, from the archive; tried again (backing off up to 30 s)
    /// until it is installed or no longer wanted here. The partition serves nothing
    /// meanwhile: its producers and consumers are told it is moving.
    async fn run_rebuild(&self, key: RebuildKey, stop: CancellationToken) {
        let (topic_id, p, epoch) = (key.partition.topic.0, key.partition.partition, key.epoch);
        let mut backoff = Duration::from_secs(1);
        let started = Instant::now();
        loop {
            if stop.is_cancelled() {
                return;
            }
            let Some(meta) = self
                .broker
                .awaited_rebuilds()
                .into_iter()
                .find(|(m, q)| m.id == topic_id && *q == p && m.owner_epoch(p) == epoch)
                .map(|(m, _)| m)
            else {
                return;
            };
            let Ok(slot) = self.rebuild_slots.clone().acquire_owned().await else {
                return;
            };
            let attempt = self.rebuild(&meta, p).await;
            drop(slot);
            match attempt {
                Ok((restored, redelivered)) => {
                    self.metrics.rebuilt_records.inc_by(restored);
                    tracing::info!(topic = %meta.name, partition = p, restored, redelivered, seconds = started.elapsed().as_secs_f64(), "partition rebuilt here from the archive");
                    return;
                }
                Err(e) => {
                    self.metrics.rebuild_failures.inc();
                    tracing::warn!(topic = %meta.name, partition = p, error = %e, retry_in = ?backoff, "rebuilding a forgotten member's partition from the archive failed; trying again (it serves nothing until then)");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// One rebuild attempt: the archived segments the lost owner's consumers had not
    /// finished with (from the queue frontier the archive recorded, within local retention)
    /// are fetched one at a time, written to a staged copy, and installed. Returns the
    /// records put back and how many of them the queue delivers again.
    async fn rebuild(&self, meta: &TopicMeta, p: u32) -> Result<(u64, u64), String> {
        let archive = self
            .archive
            .as_ref()
            .ok_or("this member has no archive to rebuild from")?;
        let start = meta
            .rebuilt_start(p)
            .ok_or("the partition is not rebuilt from the archive")?;
        let manifest = archive
            .archive()
            .load_manifest(&meta.name, p)
            .await
            .map_err(|e| format!("the archive's manifest could not be read: {e}"))?
            .filter(|m| m.topic_id == meta.id);
        let mut staging = self
            .broker
            .begin_rebuild(meta, p)
            .await
            .map_err(|e| e.to_string())?;
        let (mut frontier, mut restored) = (start, 0u64);
        if let Some(m) = manifest {
            frontier = m
                .queue_frontier
                .unwrap_or(m.start_offset)
                .max(m.start_offset);
            // what the lost owner's own retention would have deleted by now is not brought
            // back (its queue would have dropped it too)
            let keep_ms = self.broker.local_retention_ms(&meta.config);
            let now = self.broker.now_ms();
            for seg in &m.segments {
                if seg.last_offset < frontier
                    || seg.last_offset >= start
                    || (keep_ms > 0 && seg.max_ts < now.saturating_sub(keep_ms))
                {
                    continue;
                }
                let records = archive
                    .segment_records(&meta.name, p, seg)
                    .await
                    .map_err(|e| e.to_string())?;
                restored += records.len() as u64;
                self.broker
                    .stage_rebuilt_segment(&mut staging, records)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        let redelivered = self
            .broker
            .install_rebuilt(&meta.name, staging, frontier)
            .await
            .map_err(|e| e.to_string())?;
        Ok((restored, redelivered))
    }

    /// Whether member `id` answers a ping within `within` (over the cached connection; a
    /// failed dial is remembered for its backoff).
    async fn answers(&self, id: u64, within: Duration) -> bool {
        match self.node.meta.addr_of(id) {
            Some(addr) => self
                .node
                .meta
                .rpc()
                .call(id, &addr, Op::PING, Bytes::new(), within)
                .await
                .is_ok(),
            None => false,
        }
    }

    /// Whether member `id` answers a ping within `within`, dialled afresh if need be (a
    /// remembered failed dial is not trusted: see [`narad_cluster::rpc::Rpc::probe`]). This
    /// member answers for itself.
    async fn answers_fresh(&self, id: u64, within: Duration) -> bool {
        if id == self.node.node_id() {
            return true;
        }
        match self.node.meta.addr_of(id) {
            Some(addr) => self.node.meta.rpc().probe(id, &addr, within).await.is_ok(),
            None => false,
        }
    }

    /// Whether member `id` is lost as far as the cluster can tell: it fails every one of
    /// [`LOST_PROBES`] fresh probes from this member over [`LOST_FOR`], and no other member
    /// in `others` that answers says it reaches `id` (a member cut off from this one only,
    /// or restarting, is not lost). `Err` names who still reaches it.
    async fn lost(&self, id: u64, others: &[u64]) -> Result<(), String> {
        if self.node.meta.addr_of(id).is_none() {
            // not a member: nothing to reach
            return Ok(());
        }
        let me = self.node.node_id();
        for i in 0..LOST_PROBES {
            if i > 0 {
                // (real time: a peer's liveness over a window, no broker clock involved)
                #[allow(clippy::disallowed_methods)]
                tokio::time::sleep(LOST_FOR / LOST_PROBES).await;
            }
            if self.answers_fresh(id, PROBE_WITHIN).await {
                return Err(format!("node {id} answers this member"));
            }
        }
        let body = serde_json::to_vec(&id).expect("serialises");
        let asks = others.iter().filter(|&&n| n != me && n != id).map(|&n| {
            let body = body.clone();
            async move { (n, self.call::<bool>(n, MEMBER_PROBE, body).await) }
        });
        for (n, r) in futures_util::future::join_all(asks).await {
            if let Ok(true) = r {
                return Err(format!("node {n} reaches node {id}"));
            }
        }
        Ok(())
    }

    /// The topic and the partition's owner, if the catalog still moves it here under `key`.
    fn wanted(&self, topic: &str, key: MoveKey) -> Option<(Arc<TopicMeta>, u64)> {
        let catalog = self.broker.catalog();
        let meta = catalog.get(topic)?.clone();
        let source = move_machine::wanted_from(&meta, key, self.node.node_id())?;
        Some((meta, source))
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        node: u64,
        op: Op,
        body: Vec<u8>,
    ) -> Result<T, String> {
        let bytes = self.call_raw(node, op, body).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("node {node} answered {op:?} with a malformed reply: {e}"))
    }

    async fn call_raw(&self, node: u64, op: Op, body: Vec<u8>) -> Result<Bytes, String> {
        let addr = self
            .node
            .meta
            .addr_of(node)
            .ok_or_else(|| format!("node {node} is not a member"))?;
        self.node
            .meta
            .rpc()
            .call(node, &addr, op, Bytes::from(body), CALL)
            .await
            .map_err(|e| format!("node {node}: {e}"))
    }

    /// Performs one of the move machine's actions for attempt `at` of move `move_id`, and
    /// answers what it came to. The injected faults (failpoints) fire here, once a move.
    async fn perform(
        self: &Arc<Self>,
        at: &mut Attempt,
        move_id: u64,
        action: Action,
        injected: &mut Injected,
    ) -> Event {
        let meta = at.meta.clone();
        let (p, source) = (at.partition, at.source);
        let pkey = MoveKey::new(meta.id, p, move_id);
        let epoch = meta.owner_epoch(p);
        let staging = self.broker.staging_dir(&meta, p, move_id);
        let freeze_req = |token, renew| {
            serde_json::to_vec(&FreezeRequest {
                topic: meta.name.clone(),
                topic_id: meta.id,
                partition: p,
                catalog: self.broker.followed(),
                owner_epoch: epoch,
                move_id,
                token,
                ttl_ms: self.settings.freeze_ttl.as_millis() as u64,
                renew,
            })
            .expect("serialises")
        };
        let failed = |r: Result<Event, String>| r.unwrap_or_else(Event::Failed);
        match action {
            Action::Prepare => failed(
                self.broker
                    .prepare_install(&meta.name, meta.id, p)
                    .await
                    .map(|()| Event::Prepared)
                    .map_err(|e| format!("checkpointing the write-ahead log: {e}")),
            ),
            Action::List => {
                let body = serde_json::to_vec(&ListRequest {
                    topic: meta.name.clone(),
                    topic_id: meta.id,
                    partition: p,
                    catalog: self.broker.followed(),
                })
                .expect("serialises");
                failed(
                    self.call::<ListReply>(source, MOVE_LIST, body)
                        .await
                        .map(|listed| {
                            at.listed = listed.files;
                            at.listed_from = listed.incarnation;
                            Event::Listed {
                                incarnation: listed.incarnation,
                            }
                        }),
                )
            }
            Action::CatchUp { first } => {
                if first {
                    // what an earlier attempt staged from the same source process is kept
                    // (its segments only grew since); anything else starts over
                    let from = (source, at.listed_from);
                    let keep = self.staged_from.lock().get(&pkey) == Some(&from);
                    let staging = staging.clone();
                    let made = tokio::task::spawn_blocking(move || {
                        if !keep {
                            let _ = std::fs::remove_dir_all(&staging);
                        }
                        narad_core::fsutil::create_dir_private(&staging)
                    })
                    .await;
                    match made {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Event::Failed(format!("staging directory: {e}")),
                        Err(e) => return Event::Failed(e.to_string()),
                    }
                    self.staged_from.lock().insert(pkey, from);
                }
                // (producers that outpace the copy make the freeze longer: moves are paced
                // below produce rates only by `move_max_bytes_per_sec`)
                let files = std::mem::take(&mut at.listed);
                failed(
                    self.sync(&meta, p, move_id, source, &staging, &files, None)
                        .await
                        .map(|bytes| Event::Copied { bytes }),
                )
            }
            Action::Freeze { token } => {
                let stall = failpoint::millis("move.stall_before_freeze");
                if !stall.is_zero() && injected.once(Injected::STALL_BEFORE_FREEZE) {
                    tracing::warn!(
                        ?stall,
                        "failpoint move.stall_before_freeze: stalling before the freeze"
                    );
                    sleep(stall).await;
                }
                at.frozen_at = Some(Instant::now());
                let frozen: FreezeReply = match self
                    .call(source, MOVE_FREEZE, freeze_req(token, false))
                    .await
                {
                    Ok(f) => f,
                    Err(e) => return Event::Failed(e),
                };
                let stall = failpoint::millis("move.stall_frozen");
                // (not on an attempt the machine fails at once: the source restarted)
                if !stall.is_zero()
                    && frozen.incarnation == at.listed_from
                    && injected.once(Injected::STALL_FROZEN)
                {
                    tracing::warn!(
                        ?stall,
                        "failpoint move.stall_frozen: stalling a frozen move"
                    );
                    sleep(stall).await;
                }
                let answer = Event::Frozen {
                    incarnation: frozen.incarnation,
                    end: frozen.frozen.next_offset,
                };
                at.frozen = Some(frozen);
                answer
            }
            Action::Finalize { token } => {
                let Some(frozen) = at.frozen.as_ref() else {
                    return Event::Failed("finalize before a freeze".into());
                };
                failed(
                    self.sync(
                        &meta,
                        p,
                        move_id,
                        source,
                        &staging,
                        &frozen.frozen.files,
                        Some(&freeze_req(token, true)),
                    )
                    .await
                    .map(|_| Event::Finalized),
                )
            }
            Action::Verify => failed(
                self.broker
                    .verify_staged(&staging)
                    .await
                    .map(|end| Event::Verified { end })
                    .map_err(|e| format!("the staged copy does not open: {e}")),
            ),
            Action::Fence { token } => {
                // still frozen under our token, at the same end, and still wanted
                failed(
                    self.call::<FreezeReply>(source, MOVE_FREEZE, freeze_req(token, true))
                        .await
                        .map(|fenced| Event::Fenced {
                            incarnation: fenced.incarnation,
                            end: fenced.frozen.next_offset,
                            wanted: self.wanted(&meta.name, pkey).is_some(),
                        }),
                )
            }
            Action::Install => {
                self.staged_from.lock().remove(&pkey);
                if let Err(e) = self
                    .broker
                    .install_partition(&meta.name, meta.id, p, &staging)
                    .await
                {
                    return Event::Failed(format!("install: {e}"));
                }
                let stall = failpoint::millis("move.stall_flip");
                if !stall.is_zero() && injected.once(Injected::STALL_FLIP) {
                    self.set_phase(pkey, "stalled");
                    tracing::warn!(
                        ?stall,
                        "failpoint move.stall_flip: stalling a move before its flip"
                    );
                    sleep(stall).await;
                }
                Event::Installed
            }
            Action::ProposeFlip { token } => {
                let flip = CatalogCommand::CompleteMove {
                    topic_id: meta.id,
                    partition: p,
                    move_id,
                    source,
                    target: self.node.node_id(),
                    expect_epoch: epoch,
                    token,
                };
                let first = !std::mem::replace(&mut at.proposed, true);
                Event::Flip(match self.store.replicate(flip).await {
                    // (the attempt's first proposal only, not the resolve loop's)
                    Ok(())
                        if first
                            && failpoint::on("move.lose_flip_reply")
                            && injected.once(Injected::LOSE_FLIP_REPLY) =>
                    {
                        tracing::warn!(topic = %meta.name, partition = p, "failpoint move.lose_flip_reply: the flip's answer is treated as lost; asking the cluster");
                        FlipAnswer::Unknown
                    }
                    Ok(()) => FlipAnswer::Committed,
                    Err(StoreError::Refused(e)) => FlipAnswer::Refused {
                        // ours may have committed on an earlier try of the same proposal
                        owns: self.owns(&meta, p, epoch),
                        why: match e {
                            CatalogError::MoveConflict(m) => m,
                            e => e.to_string(),
                        },
                    },
                    Err(e) => {
                        tracing::warn!(topic = %meta.name, partition = p, error = %e, "the flip's outcome is unknown; asking the cluster");
                        FlipAnswer::Unknown
                    }
                })
            }
            Action::ReadIndex { token } => {
                if self.node.meta.read_index(PROPOSE).await.is_err() {
                    return Event::Read(None);
                }
                let catalog = self.node.meta.view().catalog.clone();
                let now = catalog.get(&meta.name).map(|t| &**t);
                Event::Read(Some(move_machine::resolve(
                    now,
                    pkey,
                    self.node.node_id(),
                    source,
                    epoch,
                    token,
                )))
            }
            Action::Wait(d) => {
                sleep(d).await;
                Event::Waited
            }
            Action::Done | Action::Retry { .. } => {
                Event::Failed("the runner performs no end of a move".into())
            }
        }
    }

    /// Whether the catalog this member applied names it the partition's owner, one epoch on.
    fn owns(&self, meta: &TopicMeta, p: u32, epoch: u64) -> bool {
        let catalog = self.broker.catalog();
        move_machine::flipped(
            catalog.get(&meta.name).map(|t| &**t),
            meta.id,
            p,
            self.node.node_id(),
            epoch,
        )
    }

    /// Makes `staging` hold the source's `files`: log segments grow in place (their bytes
    /// never change once written), every other file is copied whole once frozen (they are
    /// rewritten in place: queue state, cursors); files the source no longer has go. Frozen,
    /// `renew` is the freeze request, sent again every few seconds so the freeze holds while
    /// the copy goes on. Answers how many bytes it copied.
    #[allow(clippy::too_many_arguments)]
    async fn sync(
        &self,
        meta: &TopicMeta,
        p: u32,
        move_id: u64,
        source: u64,
        staging: &Path,
        files: &[PartitionFile],
        renew: Option<&Vec<u8>>,
    ) -> Result<u64, String> {
        let key = MoveKey::new(meta.id, p, move_id);
        let frozen = renew.is_some();
        let names: HashSet<&str> = files.iter().map(|f| f.name.as_str()).collect();
        {
            let staging = staging.to_owned();
            let keep: HashSet<String> = names.iter().map(|s| (*s).to_owned()).collect();
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                for e in std::fs::read_dir(&staging)? {
                    let e = e?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if !keep.contains(&name) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
                Ok(())
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("staging directory: {e}"))?;
        }
        let mut copied = 0u64;
        let mut renewed = Instant::now();
        for f in files {
            if !narad_core::broker::moves::is_partition_file(&f.name) {
                return Err(format!("the source listed a file named {:?}", f.name));
            }
            let path = staging.join(&f.name);
            let have = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let from = match steps::file_step(&f.name, f.size, have, frozen) {
                steps::FileStep::From(at) => at,
                steps::FileStep::Later => continue,
                steps::FileStep::Whole => {
                    let _ = std::fs::remove_file(&path);
                    0
                }
            };
            let mut pos = from;
            while pos < f.size {
                let len = (f.size - pos).min(self.chunk());
                if renew.is_none() {
                    // (paced while the source serves; once frozen its producers wait on
                    // this copy, so it goes at full speed)
                    self.pace(len).await;
                }
                // a move cancelled (or replaced) meanwhile copies no more: its slot, the
                // source's reads and the link go to the moves the catalog still wants
                if self.wanted(&meta.name, key).is_none() {
                    return Err("the move was cancelled".into());
                }
                let body = serde_json::to_vec(&ReadRequest {
                    topic: meta.name.clone(),
                    topic_id: meta.id,
                    partition: p,
                    name: f.name.clone(),
                    pos,
                    len,
                })
                .expect("serialises");
                let chunk = self.call_raw(source, MOVE_READ, body).await?;
                if !steps::chunk_fits(chunk.len(), len) {
                    return Err(format!(
                        "the source answered {} bytes of {} at {pos} (asked {len})",
                        chunk.len(),
                        f.name
                    ));
                }
                let n = chunk.len() as u64;
                let path = path.clone();
                tokio::task::spawn_blocking(move || write_at(&path, pos, &chunk))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("writing the staged copy: {e}"))?;
                pos += n;
                copied += n;
                self.add_bytes(key, n);
                if let Some(req) = renew
                    && renewed.elapsed() >= self.settings.freeze_ttl / 4
                {
                    let _: FreezeReply = self.call(source, MOVE_FREEZE, req.clone()).await?;
                    renewed = Instant::now();
                }
            }
            if pos == 0 && f.size == 0 && !path.exists() {
                write_at(&path, 0, &[]).map_err(|e| format!("writing the staged copy: {e}"))?;
            }
        }
        if frozen {
            // the copy holds exactly the frozen files, at their sizes, and reaches the disk
            // before the flip can name it
            let staging = staging.to_owned();
            let want: BTreeMap<String, u64> =
                files.iter().map(|f| (f.name.clone(), f.size)).collect();
            tokio::task::spawn_blocking(move || {
                let mut have = BTreeMap::new();
                for e in std::fs::read_dir(&staging)? {
                    let e = e?;
                    have.insert(
                        e.file_name().to_string_lossy().into_owned(),
                        e.metadata()?.len(),
                    );
                }
                if have != want {
                    return Err(std::io::Error::other(format!(
                        "the staged files {have:?} are not the source's {want:?}"
                    )));
                }
                sync_tree(&staging)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("syncing the staged copy: {e}"))?;
        }
        Ok(copied)
    }
}

fn write_at(path: &Path, pos: u64, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    f.write_all_at(bytes, pos)
}

fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_file() {
            std::fs::File::open(e.path())?.sync_all()?;
        }
    }
    narad_core::fsutil::sync_dir(dir)
}

/// Real time: a move's pacing, no broker clock involved.
#[allow(clippy::disallowed_methods)]
async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Answers an error the mover's callers see as a 4xx/5xx.
pub fn unavailable(m: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::ClusterUnavailable, m.into())
}
