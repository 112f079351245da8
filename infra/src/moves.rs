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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_cluster::rpc::{Fault, Op};
use narad_core::broker::moves::{FrozenPartition, MAX_FILE_CHUNK, PartitionFile};
use narad_core::broker::{Broker, BrokerError};
use narad_core::catalog::store::{MetaStore, StoreError};
use narad_core::catalog::{CatalogCommand, CatalogError, TopicMeta};
use narad_wire::ErrorCode;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use narad_cluster::rpc::ops::{
    MEMBER_PROBE, MOVE_FREEZE, MOVE_LIST, MOVE_PROGRESS, MOVE_READ, MOVE_REBALANCE, SEEN_ENDS,
    WITNESS,
};

use crate::cluster::ClusterNode;
use crate::config::MoveSettings;
use crate::http::error::ApiError;

/// How long forget watches a member it is asked to declare lost: it must fail every probe
/// over this window, from this member and from every other live one.
const LOST_FOR: Duration = Duration::from_secs(3);
/// Probes of a member forget makes over [`LOST_FOR`], one [`PROBE_WITHIN`] each.
const LOST_PROBES: u32 = 3;
const PROBE_WITHIN: Duration = Duration::from_secs(1);
/// How often an owner reports the ends that changed; every [`FULL_WITNESS_EVERY`]th report
/// carries them all (for members that restarted and forgot them).
const WITNESS_EVERY: Duration = Duration::from_millis(500);
/// How often what owners told this member is written to its disk (when it changed).
const PERSIST_ENDS_EVERY: Duration = Duration::from_millis(100);

/// Aborts the task when dropped (the witness loop's persister ends with it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
const FULL_WITNESS_EVERY: u64 = 20;
/// Most partitions one [`SEEN_ENDS`] call asks about.
const MAX_SEEN_ASK: usize = 65_536;

/// Moves one node copies at once (as a target); more wait their turn.
pub const MOVES_PER_NODE: usize = 2;
/// Partitions a member rebuilds from the archive at once (a forgotten member's partitions
/// wait their turn: each attempt holds one archived segment in memory).
const REBUILDS_PER_NODE: usize = 2;
/// Catch-up passes before the freeze, at most.
const MAX_CATCH_UP_PASSES: usize = 20;
/// A catch-up pass that leaves at most this much to copy ends the catch-up.
const FREEZE_WHEN_LEFT: u64 = 4 << 20;
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

/// How often the leader's planner looks at the placement (and at once when the
/// membership changes).
const PLAN_EVERY: Duration = Duration::from_secs(10);

// ── wire ──

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListRequest {
    topic: String,
    topic_id: u64,
    partition: u32,
    catalog: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListReply {
    incarnation: u64,
    files: Vec<PartitionFile>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadRequest {
    topic: String,
    topic_id: u64,
    partition: u32,
    name: String,
    pos: u64,
    len: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FreezeRequest {
    topic: String,
    topic_id: u64,
    partition: u32,
    catalog: u64,
    owner_epoch: u64,
    /// The move the freeze is for (the source refuses it unless the move is in flight).
    move_id: u64,
    token: u64,
    ttl_ms: u64,
    /// Only renew a freeze held under `token` (refused if there is none: it lapsed).
    #[serde(default)]
    renew: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FreezeReply {
    incarnation: u64,
    #[serde(flatten)]
    frozen: FrozenPartition,
}

/// One move in flight on its target, as `GET /v1/cluster/moves` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    pub topic: String,
    pub partition: u32,
    pub move_id: u64,
    pub phase: String,
    pub bytes_copied: u64,
    pub attempts: u32,
    pub started_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

fn malformed(what: &str) -> Fault {
    Fault::new(
        400,
        "malformed_request",
        format!("a malformed {what} request"),
    )
}

fn fault(e: BrokerError) -> Fault {
    let e: ApiError = e.into();
    Fault::new(e.code.http_status(), e.code.as_str(), e.message)
}

/// The source's side: answers the move ops (`None` for any other op).
pub async fn serve(
    broker: &Arc<Broker>,
    mover: Option<&Arc<Mover>>,
    op: Op,
    body: &Bytes,
) -> Option<Result<Bytes, Fault>> {
    let r = match op {
        MOVE_LIST => list(broker, body).await,
        MOVE_READ => read(broker, body).await,
        MOVE_FREEZE => freeze(broker, body).await,
        MOVE_PROGRESS => Ok(Bytes::from(
            serde_json::to_vec(&mover.map(|m| m.progress()).unwrap_or_default())
                .expect("progress serialises"),
        )),
        SEEN_ENDS => {
            let ask: Vec<(u64, u32)> = match serde_json::from_slice(body) {
                Ok(a) => a,
                Err(_) => return Some(Err(malformed("seen ends"))),
            };
            if ask.len() > MAX_SEEN_ASK {
                return Some(Err(malformed("seen ends")));
            }
            let ingress = mover.and_then(|m| m.ingress.upgrade());
            let ends: Vec<u64> = ask
                .iter()
                .map(|&(t, p)| ingress.as_ref().map_or(0, |i| i.seen_end(t, p)))
                .collect();
            Ok(Bytes::from(serde_json::to_vec(&ends).expect("serialises")))
        }
        MEMBER_PROBE => {
            let id: u64 = match serde_json::from_slice(body) {
                Ok(id) => id,
                Err(_) => return Some(Err(malformed("member probe"))),
            };
            let answers = match mover {
                Some(m) => m.answers_fresh(id, PROBE_WITHIN).await,
                None => false,
            };
            Ok(Bytes::from(
                serde_json::to_vec(&answers).expect("serialises"),
            ))
        }
        WITNESS => {
            let ends: Vec<(u64, u32, u64)> = match serde_json::from_slice(body) {
                Ok(a) => a,
                Err(_) => return Some(Err(malformed("witness"))),
            };
            if ends.len() > MAX_SEEN_ASK {
                return Some(Err(malformed("witness")));
            }
            if let Some(i) = mover.and_then(|m| m.ingress.upgrade()) {
                i.witness(&ends);
            }
            Ok(Bytes::new())
        }
        MOVE_REBALANCE => match mover {
            Some(m) => m
                .rebalance_here()
                .await
                .map(|planned| Bytes::from(serde_json::to_vec(&planned).expect("serialises")))
                .map_err(|e| Fault::new(e.code.http_status(), e.code.as_str(), e.message)),
            None => Err(Fault::new(
                503,
                "cluster_unavailable",
                "no mover on this member yet",
            )),
        },
        _ => return None,
    };
    Some(r)
}

async fn list(broker: &Arc<Broker>, body: &Bytes) -> Result<Bytes, Fault> {
    let req: ListRequest = serde_json::from_slice(body).map_err(|_| malformed("move list"))?;
    let _ = broker.catch_up(req.catalog, Duration::from_secs(2)).await;
    let files = broker
        .partition_files(&req.topic, req.topic_id, req.partition)
        .await
        .map_err(fault)?;
    let reply = ListReply {
        incarnation: broker.incarnation(),
        files,
    };
    Ok(Bytes::from(serde_json::to_vec(&reply).expect("serialises")))
}

async fn read(broker: &Arc<Broker>, body: &Bytes) -> Result<Bytes, Fault> {
    let req: ReadRequest = serde_json::from_slice(body).map_err(|_| malformed("move read"))?;
    broker
        .read_partition_file(
            &req.topic,
            req.topic_id,
            req.partition,
            &req.name,
            req.pos,
            req.len,
        )
        .await
        .map_err(fault)
}

async fn freeze(broker: &Arc<Broker>, body: &Bytes) -> Result<Bytes, Fault> {
    let req: FreezeRequest = serde_json::from_slice(body).map_err(|_| malformed("move freeze"))?;
    if req.token == 0 || req.ttl_ms == 0 || req.ttl_ms > 120_000 {
        return Err(malformed("move freeze"));
    }
    if !broker.catch_up(req.catalog, Duration::from_secs(2)).await {
        return Err(fault(BrokerError::ClusterUnavailable(
            "the source has not caught up with the cluster's catalog yet; retry".into(),
        )));
    }
    let frozen = broker
        .freeze_partition(
            &req.topic,
            req.topic_id,
            req.partition,
            narad_core::broker::moves::FreezeAsk {
                owner_epoch: req.owner_epoch,
                move_id: req.move_id,
                token: req.token,
                ttl: Duration::from_millis(req.ttl_ms),
                renew: req.renew,
            },
        )
        .await
        .map_err(fault)?;
    let reply = FreezeReply {
        incarnation: broker.incarnation(),
        frozen,
    };
    Ok(Bytes::from(serde_json::to_vec(&reply).expect("serialises")))
}

// ── metrics ──

#[derive(Debug)]
pub struct MoveMetrics {
    pub in_flight: Gauge,
    pub bytes_copied: Counter,
    pub completed: Counter,
    pub aborted: Counter,
    pub seconds: Histogram,
    pub freeze_seconds: Histogram,
    pub thaws: Counter,
    /// Records a forgotten member held that the archive did not (at least this many).
    pub lost_records: Counter,
    /// Archived records put back on local disk by rebuilds of a forgotten member's partitions.
    pub rebuilt_records: Counter,
    /// Rebuild attempts that failed (the archive unreadable, say) and were started again.
    pub rebuild_failures: Counter,
}

impl Default for MoveMetrics {
    fn default() -> Self {
        let buckets = || {
            Histogram::new([
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
            ])
        };
        Self {
            in_flight: Gauge::default(),
            bytes_copied: Counter::default(),
            completed: Counter::default(),
            aborted: Counter::default(),
            seconds: buckets(),
            freeze_seconds: buckets(),
            thaws: Counter::default(),
            lost_records: Counter::default(),
            rebuilt_records: Counter::default(),
            rebuild_failures: Counter::default(),
        }
    }
}

impl MoveMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "narad_moves_in_flight",
            "partition moves this node is copying in (as their target)",
            self.in_flight.clone(),
        );
        r.register(
            "narad_move_bytes_copied",
            "bytes of partition files copied in by moves",
            self.bytes_copied.clone(),
        );
        r.register(
            "narad_moves_completed",
            "partition moves this node completed (as their target)",
            self.completed.clone(),
        );
        r.register(
            "narad_move_attempts_aborted",
            "move attempts that failed and were started again (or given up: the move was cancelled)",
            self.aborted.clone(),
        );
        r.register(
            "narad_move_seconds",
            "how long a completed move took, from its first copy to its flip",
            self.seconds.clone(),
        );
        r.register(
            "narad_move_freeze_seconds",
            "how long the source was frozen for a completed move (freeze to flip, seen by the target)",
            self.freeze_seconds.clone(),
        );
        r.register(
            "narad_partition_records_lost",
            "acknowledged records lost: of partitions rebuilt from the archive after their owner was forgotten that the archive did not hold, and of partitions whose log here ended below what the cluster saw acknowledged (a data directory restored from an older copy); at least: what live members saw acknowledged",
            self.lost_records.clone(),
        );
        r.register(
            "narad_partition_records_rebuilt",
            "archived records a rebuild of a forgotten member's partition put back on this node's disk (those its consumers had not acked, to be delivered again)",
            self.rebuilt_records.clone(),
        );
        r.register(
            "narad_partition_rebuild_failures",
            "attempts to rebuild a forgotten member's partition from the archive that failed and are tried again (the partition serves nothing meanwhile)",
            self.rebuild_failures.clone(),
        );
        r.register(
            "narad_move_thaws",
            "freezes a source thawed because its mover did not flip in time",
            self.thaws.clone(),
        );
    }
}

// ── the mover ──

/// Runs the moves targeted at this member, thaws this member's lapsed freezes, and on the
/// leader plans moves (rebalance, decommission) and cancels those whose target is gone.
pub struct Mover {
    node: Arc<ClusterNode>,
    broker: Arc<Broker>,
    store: Arc<dyn MetaStore>,
    pub metrics: Arc<MoveMetrics>,
    settings: MoveSettings,
    running: Mutex<HashSet<MoveKey>>,
    /// Rebuilds from the archive running here: (topic id, partition, owner epoch).
    rebuilding: Mutex<HashSet<(u64, u32, u64)>>,
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

/// A move: (topic id, partition, move id).
type MoveKey = (u64, u32, u64);

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
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + Duration::from_secs_f64(n as f64 / rate as f64);
            start
        };
        let wait = at.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            sleep(wait).await;
        }
    }

    /// The size of one read: 1 MiB, less when the pace is slow (so pacing stays smooth).
    fn chunk(&self) -> u64 {
        match self.settings.max_bytes_per_sec {
            0 => MAX_FILE_CHUNK,
            r => (r / 4).clamp(16 << 10, MAX_FILE_CHUNK),
        }
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
                    let key = (t.id, p, m.id);
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
                let key = (meta.id, p, meta.owner_epoch(p));
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
        let (topic_id, p, move_id) = key;
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
        let started = Instant::now();
        let mut completed = false;
        let staging = self
            .broker
            .catalog()
            .get(&topic)
            .filter(|m| m.id == topic_id)
            .map(|m| self.broker.staging_dir(m, p, move_id));
        let mut backoff = Duration::from_millis(200);
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
            match self.attempt(&meta, p, move_id, source, &mut injected).await {
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
                Err(e) => {
                    self.metrics.aborted.inc();
                    tracing::warn!(topic = %topic, partition = p, from = source, error = %e, retry_in = ?backoff, "partition move attempt failed; trying again");
                    if let Some(pr) = self.progress.lock().get_mut(&pkey) {
                        pr.last_error = Some(e);
                        pr.phase = "retrying".into();
                    }
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        self.metrics.in_flight.dec();
        self.progress.lock().remove(&pkey);
        self.staged_from.lock().remove(&pkey);
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
    async fn run_rebuild(&self, key: (u64, u32, u64), stop: CancellationToken) {
        let (topic_id, p, epoch) = key;
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
        let m = meta.moves.get(&key.1)?;
        (meta.id == key.0 && m.id == key.2 && m.target == self.node.node_id())
            .then(|| meta.owner_of(key.1).map(|o| (meta.clone(), o)))
            .flatten()
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

    /// One attempt: copy, freeze, copy the rest, verify, install, flip. `Ok` with how long
    /// the source was frozen once this member owns the partition.
    async fn attempt(
        self: &Arc<Self>,
        meta: &TopicMeta,
        p: u32,
        move_id: u64,
        source: u64,
        injected: &mut Injected,
    ) -> Result<Duration, String> {
        let pkey = (meta.id, p, move_id);
        let epoch = meta.owner_epoch(p);
        let staging = self.broker.staging_dir(meta, p, move_id);
        let list_req = |catalog| {
            serde_json::to_vec(&ListRequest {
                topic: meta.name.clone(),
                topic_id: meta.id,
                partition: p,
                catalog,
            })
            .expect("serialises")
        };
        self.set_phase(pkey, "catch_up");
        self.broker
            .prepare_install(&meta.name, meta.id, p)
            .await
            .map_err(|e| format!("checkpointing the write-ahead log: {e}"))?;
        let mut incarnation = None;
        let (mut last, mut growing) = (None, 0);
        for _ in 0..MAX_CATCH_UP_PASSES {
            let listed: ListReply = self
                .call(source, MOVE_LIST, list_req(self.broker.followed()))
                .await?;
            if incarnation.is_none() {
                // what an earlier attempt staged from the same source process is kept (its
                // segments only grew since); anything else starts over
                let from = (source, listed.incarnation);
                let keep = self.staged_from.lock().get(&pkey) == Some(&from);
                let staging = staging.clone();
                tokio::task::spawn_blocking(move || {
                    if !keep {
                        let _ = std::fs::remove_dir_all(&staging);
                    }
                    narad_core::fsutil::create_dir_private(&staging)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("staging directory: {e}"))?;
                self.staged_from.lock().insert(pkey, from);
            }
            if *incarnation.get_or_insert(listed.incarnation) != listed.incarnation {
                self.staged_from.lock().remove(&pkey);
                return Err("the source restarted during the copy".into());
            }
            let copied = self
                .sync(meta, p, move_id, source, &staging, &listed.files, None)
                .await?;
            if copied <= FREEZE_WHEN_LEFT {
                break;
            }
            // producers outpace the copy: freeze anyway after three passes that did not
            // shrink (the freeze then lasts longer; moves are paced below produce rates
            // only by `move_max_bytes_per_sec`)
            if last.is_some_and(|l| copied >= l) {
                growing += 1;
                if growing >= 3 {
                    break;
                }
            }
            last = Some(copied);
        }
        // freeze, copy exactly what the frozen partition holds
        self.set_phase(pkey, "freeze");
        if !self.settings.stall_before_freeze.is_zero()
            && injected.once(Injected::STALL_BEFORE_FREEZE)
        {
            tracing::warn!(stall = ?self.settings.stall_before_freeze, "move_test_stall_before_freeze_ms: stalling before the freeze");
            sleep(self.settings.stall_before_freeze).await;
        }
        let token = loop {
            let t = narad_core::random_u64();
            if t != 0 {
                break t;
            }
        };
        let freeze_req = |renew| {
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
        let frozen_at = Instant::now();
        let frozen: FreezeReply = self.call(source, MOVE_FREEZE, freeze_req(false)).await?;
        if incarnation.is_some_and(|i| i != frozen.incarnation) {
            return Err("the source restarted during the copy".into());
        }
        if !self.settings.stall_frozen.is_zero() && injected.once(Injected::STALL_FROZEN) {
            tracing::warn!(stall = ?self.settings.stall_frozen, "move_test_stall_frozen_ms: stalling a frozen move");
            sleep(self.settings.stall_frozen).await;
        }
        self.set_phase(pkey, "finalize");
        self.sync(
            meta,
            p,
            move_id,
            source,
            &staging,
            &frozen.frozen.files,
            Some(&freeze_req(true)),
        )
        .await?;
        self.set_phase(pkey, "verify");
        let end = self
            .broker
            .verify_staged(&staging)
            .await
            .map_err(|e| format!("the staged copy does not open: {e}"))?;
        if end != frozen.frozen.next_offset {
            return Err(format!(
                "the staged copy ends at offset {end}, the source at {}",
                frozen.frozen.next_offset
            ));
        }
        // fence: still frozen under our token, at the same end
        let fenced: FreezeReply = self.call(source, MOVE_FREEZE, freeze_req(true)).await?;
        if fenced.incarnation != frozen.incarnation
            || fenced.frozen.next_offset != frozen.frozen.next_offset
        {
            return Err("the source's partition changed since the freeze".into());
        }
        if self.wanted(&meta.name, (meta.id, p, move_id)).is_none() {
            return Err("the move was cancelled".into());
        }
        self.set_phase(pkey, "install");
        self.staged_from.lock().remove(&pkey);
        self.broker
            .install_partition(&meta.name, meta.id, p, &staging)
            .await
            .map_err(|e| format!("install: {e}"))?;
        if !self.settings.stall_flip.is_zero() && injected.once(Injected::STALL_FLIP) {
            self.set_phase(pkey, "stalled");
            tracing::warn!(stall = ?self.settings.stall_flip, "move_test_stall_flip_ms: stalling a move before its flip");
            sleep(self.settings.stall_flip).await;
        }
        self.set_phase(pkey, "flip");
        let flip = CatalogCommand::CompleteMove {
            topic_id: meta.id,
            partition: p,
            move_id,
            source,
            target: self.node.node_id(),
            expect_epoch: epoch,
            token,
        };
        match self.store.replicate(flip.clone()).await {
            Ok(()) if self.settings.lose_flip_reply && injected.once(Injected::LOSE_FLIP_REPLY) => {
                tracing::warn!(topic = %meta.name, partition = p, "move_test_lose_flip_reply: the flip's answer is treated as lost; asking the cluster");
            }
            Ok(()) => return Ok(frozen_at.elapsed()),
            Err(StoreError::Refused(CatalogError::MoveConflict(m))) => {
                // ours may have committed on an earlier try of the same proposal
                if self.owns(meta, p, epoch) {
                    return Ok(frozen_at.elapsed());
                }
                return Err(format!("the flip was refused: {m}"));
            }
            Err(StoreError::Refused(e)) => return Err(format!("the flip was refused: {e}")),
            Err(e) => {
                tracing::warn!(topic = %meta.name, partition = p, error = %e, "the flip's outcome is unknown; asking the cluster");
            }
        }
        // resolve: never delete the installed copy on a bare error
        self.set_phase(pkey, "resolve");
        let mut backoff = Duration::from_millis(250);
        loop {
            if self.node.meta.read_index(PROPOSE).await.is_ok() {
                let catalog = self.node.meta.view().catalog.clone();
                let now = catalog.get(&meta.name).filter(|t| t.id == meta.id);
                match now {
                    Some(t)
                        if t.owner_of(p) == Some(self.node.node_id())
                            && t.owner_epoch(p) == epoch + 1 =>
                    {
                        return Ok(frozen_at.elapsed());
                    }
                    Some(t)
                        if t.owner_of(p) == Some(source)
                            && t.owner_epoch(p) == epoch
                            && t.moves
                                .get(&p)
                                .is_some_and(|m| m.id == move_id && !m.thawed.contains(&token)) =>
                    {
                        // not committed, and still possible: propose again (applied once)
                        match self.store.replicate(flip.clone()).await {
                            Ok(()) => return Ok(frozen_at.elapsed()),
                            Err(StoreError::Refused(_)) if self.owns(meta, p, epoch) => {
                                return Ok(frozen_at.elapsed());
                            }
                            Err(StoreError::Refused(e)) => {
                                return Err(format!("the flip was refused: {e}"));
                            }
                            Err(_) => {}
                        }
                    }
                    _ => return Err("the flip did not commit (the move changed meanwhile)".into()),
                }
            }
            sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// Whether the catalog this member applied names it the partition's owner, one epoch on.
    fn owns(&self, meta: &TopicMeta, p: u32, epoch: u64) -> bool {
        self.broker.catalog().get(&meta.name).is_some_and(|t| {
            t.id == meta.id
                && t.owner_of(p) == Some(self.node.node_id())
                && t.owner_epoch(p) == epoch + 1
        })
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
        let key = (meta.id, p, move_id);
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
            let segment = f.name.ends_with(".log");
            let from = if segment && have <= f.size {
                have
            } else if !segment && !frozen {
                continue;
            } else {
                // rewritten files, and a segment that shrank (cannot happen to a log that
                // only grows; copied again whole to be sure)
                let _ = std::fs::remove_file(&path);
                0
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
                if chunk.is_empty() || chunk.len() as u64 > len {
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

// ── the planner (on the leader) ──

/// A move the planner asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMove {
    pub topic: String,
    pub partition: u32,
    pub from: u64,
    pub to: u64,
    pub reason: String,
}

/// The moves that bring the placement closer to fair, at most `budget` of them (pure).
///
/// Receivers are the live voters not being decommissioned. First every partition owned by
/// a live member that is not a receiver (being decommissioned) goes to the receiver with
/// the fewest partitions; then, if `balance`, partitions go from the receiver with the most
/// to the one with the fewest until they differ by at most one (the fewest moves that do
/// it), each time the partition of the topic the giver holds most of and the taker least.
/// A partition in a move counts at its target already; one whose owner is down is never
/// planned (its data cannot be copied), nor is anything sent to a member that is down.
pub fn plan_moves(
    catalog: &narad_core::catalog::Catalog,
    voters: &[u64],
    alive: &HashSet<u64>,
    budget: usize,
    balance: bool,
) -> Vec<PlannedMove> {
    let draining = catalog.draining();
    let mut receivers: Vec<u64> = voters
        .iter()
        .copied()
        .filter(|v| alive.contains(v) && !draining.contains(v))
        .collect();
    receivers.sort_unstable();
    receivers.dedup();
    let mut out = Vec::new();
    if receivers.is_empty() || budget == 0 {
        return out;
    }
    let mut count: BTreeMap<u64, usize> = receivers.iter().map(|&r| (r, 0)).collect();
    let mut per_topic: HashMap<(u64, u64), usize> = HashMap::new();
    // (topic name, topic id, partition, owner)
    let mut movable: Vec<(String, u64, u32, u64)> = Vec::new();
    let mut drain: Vec<(String, u64, u32, u64)> = Vec::new();
    for t in catalog.topics() {
        if t.owners.is_empty() {
            continue;
        }
        for p in 0..t.config.partitions {
            let owner = t.owners[p as usize];
            let at = t.moves.get(&p).map_or(owner, |m| m.target);
            if let Some(c) = count.get_mut(&at) {
                *c += 1;
                *per_topic.entry((at, t.id)).or_default() += 1;
            }
            if t.moves.contains_key(&p) || !alive.contains(&owner) {
                continue;
            }
            let entry = (t.name.clone(), t.id, p, owner);
            if count.contains_key(&owner) {
                // (an admin placed it: balancing leaves it where it is)
                if !t.pinned.contains(&p) {
                    movable.push(entry);
                }
            } else {
                drain.push(entry);
            }
        }
    }
    let take = |out: &mut Vec<PlannedMove>,
                count: &mut BTreeMap<u64, usize>,
                per_topic: &mut HashMap<(u64, u64), usize>,
                (topic, id, p, from): (String, u64, u32, u64),
                to: u64,
                reason: &str| {
        *count.get_mut(&to).expect("a receiver") += 1;
        *per_topic.entry((to, id)).or_default() += 1;
        if let Some(c) = count.get_mut(&from) {
            *c -= 1;
            if let Some(t) = per_topic.get_mut(&(from, id)) {
                *t -= 1;
            }
        }
        out.push(PlannedMove {
            topic,
            partition: p,
            from,
            to,
            reason: reason.to_owned(),
        });
    };
    for d in drain {
        if out.len() >= budget {
            return out;
        }
        let id = d.1;
        let to = *receivers
            .iter()
            .min_by_key(|&&r| (count[&r], per_topic.get(&(r, id)).copied().unwrap_or(0), r))
            .expect("receivers");
        take(&mut out, &mut count, &mut per_topic, d, to, "decommission");
    }
    if !balance {
        return out;
    }
    while out.len() < budget {
        let (&most, &hi) = count
            .iter()
            .max_by_key(|&(&r, &c)| (c, std::cmp::Reverse(r)))
            .expect("receivers");
        let (&least, &lo) = count
            .iter()
            .min_by_key(|&(&r, &c)| (c, r))
            .expect("receivers");
        if hi <= lo + 1 {
            break;
        }
        let held = |node: u64, id: u64| per_topic.get(&(node, id)).copied().unwrap_or(0) as i64;
        let Some(i) = movable
            .iter()
            .enumerate()
            .filter(|(_, m)| m.3 == most)
            .max_by_key(|(_, m)| (held(most, m.1) - held(least, m.1), std::cmp::Reverse(m.2)))
            .map(|(i, _)| i)
        else {
            break;
        };
        let m = movable.swap_remove(i);
        take(&mut out, &mut count, &mut per_topic, m, least, "rebalance");
    }
    out
}

impl Mover {
    /// `POST /v1/cluster/rebalance` on the leader: one planning pass that balances whatever
    /// `cluster_auto_rebalance` says; the moves it asked for.
    pub async fn rebalance_here(&self) -> Result<Vec<PlannedMove>, ApiError> {
        if !self.node.meta.is_leader() {
            return Err(unavailable(
                "this member does not lead the cluster (any more); retry",
            ));
        }
        self.plan_pass(true).await
    }

    /// Asks the leader for a planning pass (`POST /v1/cluster/rebalance` on any member).
    pub async fn rebalance(&self) -> Result<Vec<PlannedMove>, ApiError> {
        if self.node.meta.is_leader() {
            return self.plan_pass(true).await;
        }
        let leader = self
            .node
            .meta
            .raft()
            .current_leader()
            .await
            .ok_or_else(|| unavailable("no leader elected; retry"))?;
        let reply = self
            .call_raw(leader, MOVE_REBALANCE, Vec::new())
            .await
            .map_err(unavailable)?;
        serde_json::from_slice(&reply).map_err(|e| unavailable(format!("the leader answered: {e}")))
    }

    /// One pass of the leader's planner: confirms it leads (read index), finds which voters
    /// answer, cancels moves whose target is gone or silent too long, asks for the moves
    /// [`plan_moves`] finds (balancing if `force` or `cluster_auto_rebalance`), and retires
    /// decommissioned members that hold nothing any more.
    async fn plan_pass(&self, force: bool) -> Result<Vec<PlannedMove>, ApiError> {
        let _one = self.planning.lock().await;
        self.node
            .meta
            .read_index(PROPOSE)
            .await
            .map_err(|e| unavailable(format!("the leader could not confirm its catalog: {e}")))?;
        let view = self.node.meta.view();
        let catalog = view.catalog.clone();
        let mut voters: Vec<u64> = view.membership.membership().voter_ids().collect();
        voters.sort_unstable();
        let me = self.node.node_id();
        let mut alive = HashSet::from([me]);
        let pings = voters
            .iter()
            .filter(|&&v| v != me)
            .map(|&v| async move { (v, self.answers(v, Duration::from_secs(1)).await) });
        for (v, ok) in futures_util::future::join_all(pings).await {
            let mut down = self.down_since.lock();
            if ok {
                alive.insert(v);
                down.remove(&v);
            } else {
                down.entry(v).or_insert_with(Instant::now);
            }
        }
        // moves to a member gone, or silent too long, are cancelled
        for t in catalog.topics() {
            for (&p, m) in &t.moves {
                let silent = self
                    .down_since
                    .lock()
                    .get(&m.target)
                    .is_some_and(|s| s.elapsed() >= self.settings.dead_target_abort);
                let leaving = catalog.draining().contains(&m.target);
                if voters.contains(&m.target) && !silent && !leaving {
                    continue;
                }
                tracing::warn!(topic = %t.name, partition = p, target = m.target, "cancelling a move: its target is gone, has not answered, or is being decommissioned");
                if self
                    .broker
                    .set_move_target(&t.name, p, None, "target_lost")
                    .await
                    .is_ok()
                {
                    self.metrics.aborted.inc();
                }
            }
        }
        let catalog = self.broker.catalog();
        let budget = self
            .settings
            .max_in_flight
            .saturating_sub(catalog.topics().map(|t| t.moves.len()).sum::<usize>());
        let balance = force || self.settings.auto_rebalance;
        let plan = plan_moves(&catalog, &voters, &alive, budget, balance);
        let mut asked = Vec::new();
        for m in plan {
            match self
                .broker
                .set_move_target(&m.topic, m.partition, Some(m.to), &m.reason)
                .await
            {
                Ok(_) => {
                    tracing::info!(topic = %m.topic, partition = m.partition, from = m.from, to = m.to, reason = %m.reason, "partition move planned");
                    asked.push(m);
                }
                Err(e) => {
                    tracing::warn!(topic = %m.topic, partition = m.partition, error = %e, "could not plan a partition move");
                }
            }
        }
        self.retire_drained(&catalog, &voters).await;
        Ok(asked)
    }

    /// Members being decommissioned that own nothing and are in no move: removed from the
    /// cluster (the leader first hands its leadership on); their mark is cleared once they
    /// are out. The three-voter floor is kept.
    async fn retire_drained(&self, catalog: &narad_core::catalog::Catalog, voters: &[u64]) {
        let me = self.node.node_id();
        for &d in catalog.draining() {
            if !voters.contains(&d) {
                let _ = self
                    .store
                    .replicate(CatalogCommand::SetDraining {
                        node: d,
                        draining: false,
                    })
                    .await;
                continue;
            }
            let holds = catalog
                .topics()
                .any(|t| t.owners.contains(&d) || t.moves.values().any(|m| m.target == d));
            if holds {
                continue;
            }
            if voters.len() <= 3 {
                tracing::warn!(
                    node_id = d,
                    "member drained but not removed: the cluster keeps at least three voters (add a member)"
                );
                continue;
            }
            if d == me {
                tracing::info!(
                    node_id = d,
                    "this member is drained and leads: handing the leadership on before it is removed"
                );
                self.node.meta.hand_off(true);
                // if no one removes it (the others cannot elect), it takes part again
                let node = self.node.clone();
                tokio::spawn(async move {
                    sleep(Duration::from_secs(60)).await;
                    node.meta.hand_off(false);
                });
                return;
            }
            match self.node.meta.remove_member(d, PROPOSE).await {
                Ok(()) => {
                    tracing::info!(
                        node_id = d,
                        "decommissioned member removed from the cluster"
                    );
                }
                Err(e) => {
                    tracing::warn!(node_id = d, error = ?e, "could not remove a drained member; retrying")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_core::catalog::{Catalog, CatalogCommand, MoveTarget, TopicMeta, apply};
    use narad_core::topic::TopicConfig;

    fn topic(id: u64, name: &str, owners: &[u64]) -> CatalogCommand {
        CatalogCommand::CreateTopic {
            topic: TopicMeta {
                id,
                name: name.into(),
                created_at_ms: 0,
                config: TopicConfig {
                    partitions: owners.len() as u32,
                    ..TopicConfig::default()
                },
                parent: None,
                owner: None,
                owner_id: None,
                schemas: Vec::new(),
                owners: owners.to_vec(),
                owner_epochs: Vec::new(),
                moves: Default::default(),
                rebuilt: Default::default(),
                role: Default::default(),
                carried_children: Vec::new(),
                pinned: Default::default(),
            },
        }
    }

    fn catalog(cmds: &[CatalogCommand]) -> Catalog {
        cmds.iter()
            .fold(Catalog::default(), |c, cmd| apply(&c, cmd).unwrap().0)
    }

    fn counts(c: &Catalog, plan: &[PlannedMove]) -> BTreeMap<u64, usize> {
        let mut n = BTreeMap::new();
        for t in c.topics() {
            for (p, &o) in t.owners.iter().enumerate() {
                let at = plan
                    .iter()
                    .find(|m| m.topic == t.name && m.partition == p as u32)
                    .map_or(o, |m| m.to);
                *n.entry(at).or_insert(0) += 1;
            }
        }
        n
    }

    /// A joiner gets a fair share with the fewest moves, every one onto it; balanced
    /// placements plan nothing; a down member is neither given nor drained; a member being
    /// decommissioned gives everything; the budget bounds a pass; moves in flight count at
    /// their target.
    #[test]
    fn the_planner_moves_the_fewest_partitions_to_a_fair_placement() {
        let c = catalog(&[
            topic(1, "a", &[1, 2, 3, 1, 2, 3]),
            topic(2, "b", &[1, 2, 3, 1, 2, 3]),
        ]);
        let all: HashSet<u64> = [1, 2, 3, 4].into();
        let plan = plan_moves(&c, &[1, 2, 3, 4], &all, 8, true);
        assert_eq!(plan.len(), 3, "{plan:?}");
        assert!(plan.iter().all(|m| m.to == 4 && m.reason == "rebalance"));
        assert!(counts(&c, &plan).values().all(|&n| n == 3));
        // spread over topics: the joiner does not get three partitions of one topic
        assert!(plan.iter().any(|m| m.topic == "a") && plan.iter().any(|m| m.topic == "b"));
        assert!(
            plan_moves(&c, &[1, 2, 3], &all, 8, true).is_empty(),
            "balanced"
        );
        assert!(
            plan_moves(&c, &[1, 2, 3, 4], &all, 8, false).is_empty(),
            "auto off"
        );
        assert_eq!(
            plan_moves(&c, &[1, 2, 3, 4], &all, 2, true).len(),
            2,
            "budget"
        );
        // member 4 down: nothing goes to it
        let up: HashSet<u64> = [1, 2, 3].into();
        assert!(plan_moves(&c, &[1, 2, 3, 4], &up, 8, true).is_empty());
        // member 3 decommissioned: its four partitions go, two to each of 1 and 2 (and
        // nothing else moves)
        let drain = apply(
            &c,
            &CatalogCommand::SetDraining {
                node: 3,
                draining: true,
            },
        )
        .unwrap()
        .0;
        let plan = plan_moves(&drain, &[1, 2, 3], &all, 8, true);
        assert_eq!(plan.len(), 4, "{plan:?}");
        assert!(
            plan.iter()
                .all(|m| m.from == 3 && m.reason == "decommission")
        );
        let n = counts(&drain, &plan);
        assert_eq!((n[&1], n[&2], n.get(&3)), (6, 6, None));
        // ... but not while member 3 is down: its data cannot be copied
        let no3: HashSet<u64> = [1, 2].into();
        assert!(plan_moves(&drain, &[1, 2, 3], &no3, 8, true).is_empty());
        // a move in flight counts at its target
        let moving = apply(
            &c,
            &CatalogCommand::SetMoveTarget {
                topic_id: 1,
                partition: 0,
                expect_owner: 1,
                expect_epoch: 0,
                target: Some(MoveTarget {
                    id: 5,
                    node: 4,
                    since_ms: 0,
                    reason: "admin".into(),
                }),
            },
        )
        .unwrap()
        .0;
        let plan = plan_moves(&moving, &[1, 2, 3, 4], &all, 8, true);
        assert_eq!(plan.len(), 2, "{plan:?}");
        assert!(
            plan.iter()
                .all(|m| m.to == 4 && !(m.topic == "a" && m.partition == 0))
        );
        // an admin's move, completed, is pinned: balancing never moves it back, and moves
        // others instead; a decommission still takes it; unpinned, it is the planner's again
        let moved = apply(
            &moving,
            &CatalogCommand::CompleteMove {
                topic_id: 1,
                partition: 0,
                move_id: 5,
                source: 1,
                target: 4,
                expect_epoch: 0,
                token: 9,
            },
        )
        .unwrap()
        .0;
        assert!(moved.get("a").unwrap().pinned.contains(&0));
        // (4 has one now, 1 one fewer: the planner evens it out with other partitions)
        let plan = plan_moves(&moved, &[1, 2, 3, 4], &all, 8, true);
        assert!(
            plan.iter().all(|m| !(m.topic == "a" && m.partition == 0)),
            "{plan:?}"
        );
        let draining4 = apply(
            &moved,
            &CatalogCommand::SetDraining {
                node: 4,
                draining: true,
            },
        )
        .unwrap()
        .0;
        assert!(
            plan_moves(&draining4, &[1, 2, 3, 4], &all, 8, true)
                .iter()
                .any(|m| m.topic == "a" && m.partition == 0 && m.reason == "decommission")
        );
        let unpinned = apply(
            &moved,
            &CatalogCommand::Unpin {
                topic_id: 1,
                partition: 0,
            },
        )
        .unwrap()
        .0;
        assert!(unpinned.get("a").unwrap().pinned.is_empty());
    }
}

// ── a member lost for good ──

/// A partition of a forgotten member, reassigned and rebuilt from the archive.
#[derive(Debug, Clone, Serialize)]
pub struct Forgotten {
    pub topic: String,
    pub partition: u32,
    pub to: u64,
    /// Offsets below this are in the archive (replayable on the new owner); the new owner's
    /// log starts here.
    pub archived_below: u64,
    /// `lost_from..lost_to`: acknowledged records no live member's copy or the archive
    /// holds (at least these: a record only the lost member saw acknowledged is not known).
    pub lost_from: u64,
    pub lost_to: u64,
    pub lost_at_least: u64,
    /// The archived records from this offset on (to `archived_below`) are delivered to the
    /// partition's queue consumers again once it is rebuilt: its lost owner's consumers had
    /// acked everything below it when the archive last heard from it (absent: nothing
    /// archived). Records older than local retention are not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redeliver_from: Option<u64>,
}

impl Mover {
    /// `POST /v1/cluster/members/{id}/forget`: member `id` is lost for good (its disk with
    /// it). Every partition it owns is reassigned to the live member with the fewest
    /// partitions, which rebuilds it from the archive: the archived records are served again
    /// (replay, through any member), the log goes on from the archive's end, and what the
    /// archive did not hold is reported lost (log, metric, this answer). Refused while `id`
    /// answers (decommission it instead) and without an archive.
    pub async fn forget(&self, id: u64) -> Result<Vec<Forgotten>, ApiError> {
        let archive = self.archive.clone().ok_or_else(|| {
            ApiError::new(
                ErrorCode::MemberNotRemovable,
                "forgetting a member rebuilds its partitions from the archive, and this cluster has no archive_url: its partitions' data is gone with it",
            )
        })?;
        if id == self.node.node_id() {
            return Err(ApiError::new(
                ErrorCode::MemberNotRemovable,
                "this member answers the request: it is not lost (decommission it instead)",
            ));
        }
        let members: Vec<u64> = self
            .node
            .meta
            .view()
            .membership
            .membership()
            .nodes()
            .map(|(n, _)| *n)
            .collect();
        if let Err(why) = self.lost(id, &members).await {
            return Err(ApiError::new(
                ErrorCode::MemberNotRemovable,
                format!(
                    "{why}: it is not lost; decommission it instead (its data moves, nothing is lost)"
                ),
            ));
        }
        self.node
            .meta
            .read_index(PROPOSE)
            .await
            .map_err(|e| unavailable(format!("the catalog could not be confirmed current: {e}")))?;
        let view = self.node.meta.view();
        let catalog = view.catalog.clone();
        let owned: Vec<(Arc<TopicMeta>, u32)> = catalog
            .topics()
            .flat_map(|t| {
                (0..t.config.partitions)
                    .filter(|&p| t.owner_of(p) == Some(id))
                    .map(move |p| (t.clone(), p))
            })
            .collect();
        if owned.is_empty() {
            if !view.membership.membership().nodes().any(|(n, _)| *n == id) {
                return Err(ApiError::new(
                    ErrorCode::MemberNotFound,
                    format!("node {id} is not a member and owns no partition"),
                ));
            }
            return Ok(Vec::new());
        }
        // receivers: live voters, not leaving, not the lost one
        let mut voters: Vec<u64> = view.membership.membership().voter_ids().collect();
        voters.sort_unstable();
        let me = self.node.node_id();
        let mut count: BTreeMap<u64, usize> = BTreeMap::new();
        for v in voters
            .into_iter()
            .filter(|v| *v != id && !catalog.draining().contains(v))
        {
            let live = v == me || self.answers(v, Duration::from_secs(1)).await;
            if live {
                let n = catalog
                    .topics()
                    .map(|t| t.owners.iter().filter(|o| **o == v).count())
                    .sum();
                count.insert(v, n);
            }
        }
        if count.is_empty() {
            return Err(unavailable("no live member could take the partitions"));
        }
        let seen = self.seen_ends(&count, &owned).await;
        let mut plan = Vec::with_capacity(owned.len());
        for ((t, p), seen_end) in owned.iter().zip(seen) {
            let (start, redeliver_from) = match archive.archive().load_manifest(&t.name, *p).await {
                Ok(Some(m)) if m.topic_id == t.id => {
                    let from = m
                        .queue_frontier
                        .unwrap_or(m.start_offset)
                        .max(m.start_offset);
                    (m.next_offset, (from < m.next_offset).then_some(from))
                }
                Ok(_) => (0, None),
                Err(e) => {
                    return Err(ApiError::new(
                        ErrorCode::ArchiveUnavailable,
                        format!(
                            "the archive's manifest of partition {p} of '{}' could not be read: {e}; nothing after it was reassigned",
                            t.name
                        ),
                    ));
                }
            };
            plan.push((t, *p, seen_end, start, redeliver_from));
        }
        // the watch above took seconds, the plan more: a member that came back meanwhile
        // (a restart, a freeze that ended) is not lost, and this is the last moment to say so
        if self.answers_fresh(id, PROBE_WITHIN).await {
            return Err(ApiError::new(
                ErrorCode::MemberNotRemovable,
                format!(
                    "node {id} answers this member again: it is not lost; decommission it instead (its data moves, nothing is lost)"
                ),
            ));
        }
        let mut out = Vec::new();
        for (t, p, seen_end, start, redeliver_from) in plan {
            let p = &p;
            let to = *count
                .iter()
                .min_by_key(|&(&n, &c)| (c, n))
                .map(|(n, _)| n)
                .expect("receivers");
            let epoch = t.owner_epoch(*p);
            let tail = narad_core::catalog::moves::LostTail {
                epoch: epoch + 1,
                lost_node: id,
                start,
                seen_end: seen_end.max(start),
                at_ms: self.broker.now_ms(),
            };
            self.broker
                .reassign_lost(t.id, *p, id, to, epoch, tail.clone())
                .await?;
            *count.get_mut(&to).expect("a receiver") += 1;
            let lost = tail.seen_end - start;
            self.metrics.lost_records.inc_by(lost);
            tracing::error!(topic = %t.name, partition = p, lost_node = id, to, archived_below = start, lost_from = start, lost_to = tail.seen_end, lost_at_least = lost, "partition of a forgotten member rebuilt from the archive; records it held that the archive did not are lost");
            out.push(Forgotten {
                topic: t.name.clone(),
                partition: *p,
                to,
                archived_below: start,
                lost_from: start,
                lost_to: tail.seen_end,
                lost_at_least: lost,
                redeliver_from,
            });
        }
        Ok(out)
    }

    /// Until `stop`, every [`WITNESS_EVERY`]: checks the partitions held since this member's
    /// start ([`Mover::verify_held`]), then reports the durable ends of the partitions it owns
    /// to every other voter (those that changed; all of them every [`FULL_WITNESS_EVERY`]th
    /// time), which keep the highest: what an owner restored from an older copy of its data
    /// directory is checked against. A report is one small call per voter; one lost is
    /// repeated by the next full report.
    pub async fn witness(self: Arc<Self>, stop: CancellationToken) {
        let mut sent: HashMap<(u64, u32), u64> = HashMap::new();
        let mut round: u64 = 0;
        // what owners told this member goes to its disk on a clock of its own: a round here
        // can take seconds when a voter is frozen (its report waits out the call), and a
        // witness that stopped meanwhile must not have held its last ends in memory only
        let persister = {
            let (ingress, stop) = (self.ingress.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    if let Some(i) = ingress.upgrade() {
                        i.persist_ends().await;
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = sleep(PERSIST_ENDS_EVERY) => {}
                    }
                }
            })
        };
        let _persister = AbortOnDrop(persister);
        loop {
            self.verify_held().await;
            let full = round.is_multiple_of(FULL_WITNESS_EVERY);
            round += 1;
            let ends = self.broker.owned_ends();
            let changed: Vec<(u64, u32, u64)> = ends
                .iter()
                .copied()
                .filter(|&(t, p, e)| full || sent.get(&(t, p)) != Some(&e))
                .collect();
            sent = ends.iter().map(|&(t, p, e)| ((t, p), e)).collect();
            if let Some(i) = self.ingress.upgrade() {
                // (not before the start's check confirmed the catalog current: a catalog
                // still catching up lacks topics whose remembered ends must stay)
                if full && !self.broker.verifying() {
                    let live = self.broker.catalog().topics().map(|t| t.id).collect();
                    i.prune_seen(&live);
                }
            }
            // (sent even when nothing changed: a witness that stopped answering is found
            // while the owner is idle too)
            let voters = self.node.other_voters();
            let mut failed = HashSet::new();
            for chunk in changed.chunks(MAX_SEEN_ASK.min(crate::witness::MAX_ENDS)) {
                let body = Bytes::from(serde_json::to_vec(chunk).expect("serialises"));
                failed.extend(self.report(&voters, body).await);
            }
            if changed.is_empty() {
                failed.extend(self.report(&voters, Bytes::from_static(b"[]")).await);
            }
            if let Some(i) = self.ingress.upgrade() {
                i.witnesses()
                    .maintain(&failed, || self.broker.owned_ends())
                    .await;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = sleep(WITNESS_EVERY) => {}
            }
        }
    }

    /// Sends one report (`body`) to each of `voters`; returns those that did not take it.
    async fn report(&self, voters: &[u64], body: Bytes) -> Vec<u64> {
        let calls = voters.iter().map(|&v| {
            let addr = self.node.meta.addr_of(v);
            let rpc = self.node.meta.rpc().clone();
            let body = body.clone();
            async move {
                let Some(addr) = addr else {
                    return Some(v);
                };
                let ok = rpc
                    .call(v, &addr, WITNESS, body, WITNESS_EVERY * 2)
                    .await
                    .is_ok();
                (!ok).then_some(v)
            }
        });
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The partitions held since this member's start: once the catalog is confirmed
    /// current, each one this member owns is compared with what the other voters (a
    /// majority of the voters with this one) saw acknowledged or were told by its owner, and
    /// with the archive's end. One whose log reaches that is served; one that ends below it
    /// (the data directory is an older copy) goes on after it with the range between
    /// recorded as a gap, logged and counted in `narad_partition_records_lost_total`.
    /// Partitions owned elsewhere are let go (nothing here serves them).
    async fn verify_held(&self) {
        // (a partition opened while the start's check ended may still be held: looked at
        // every time, not only while the check runs)
        let witnesses = self.ingress.upgrade().map(|i| i.witnesses().clone());
        if !self.broker.verifying() && self.broker.unverified().is_empty() {
            if let Some(w) = &witnesses {
                w.set_checking(false);
            }
            return;
        }
        // (no witness is dropped while the check may need what it holds)
        if let Some(w) = &witnesses {
            w.set_checking(true);
        }
        let not_yet = |why: String| {
            *self.unverified.lock() = Some(why);
        };
        if let Err(e) = self.node.meta.read_index(Duration::from_secs(2)).await {
            return not_yet(format!(
                "checking this member's partitions against what the cluster acknowledged: the catalog could not be confirmed current: {e}"
            ));
        }
        let view = self.node.meta.view();
        if !self
            .broker
            .catch_up(view.catalog.applied(), Duration::from_secs(2))
            .await
        {
            return not_yet(
                "checking this member's partitions against what the cluster acknowledged: following the catalog".into(),
            );
        }
        let me = self.node.node_id();
        let mut owned = Vec::new();
        for (meta, p, end) in self.broker.unverified() {
            if meta.owner_of(p) == Some(me) {
                owned.push((meta, p, end));
            } else {
                self.broker.set_verified(&meta.name, meta.id, p);
            }
        }
        if !owned.is_empty() {
            let voters: Vec<u64> = view.membership.membership().voter_ids().collect();
            let ask: Vec<(u64, u32)> = owned.iter().map(|(t, p, _)| (t.id, *p)).collect();
            let mut acked: Vec<u64> = match self.ingress.upgrade() {
                Some(i) => ask.iter().map(|&(t, p)| i.seen_end(t, p)).collect(),
                None => vec![0; ask.len()],
            };
            // the other voters that answered every chunk
            let others: Vec<u64> = voters.iter().copied().filter(|&v| v != me).collect();
            let mut answered_all: HashSet<u64> = others.iter().copied().collect();
            for chunk_start in (0..ask.len()).step_by(MAX_SEEN_ASK) {
                let chunk = &ask[chunk_start..(chunk_start + MAX_SEEN_ASK).min(ask.len())];
                let body = serde_json::to_vec(chunk).expect("serialises");
                let asks = others.iter().map(|&v| {
                    let body = body.clone();
                    async move { (v, self.call::<Vec<u64>>(v, SEEN_ENDS, body).await) }
                });
                for (v, r) in futures_util::future::join_all(asks).await {
                    match r {
                        Ok(theirs) if theirs.len() == chunk.len() => {
                            for (e, t) in acked[chunk_start..].iter_mut().zip(theirs) {
                                *e = (*e).max(t);
                            }
                        }
                        _ => {
                            answered_all.remove(&v);
                        }
                    }
                }
            }
            let answered = usize::from(voters.contains(&me)) + answered_all.len();
            if answered < voters.len() / 2 + 1 {
                return not_yet(format!(
                    "checking this member's partitions against what the cluster acknowledged: {answered} of {} voters answered, a majority is needed",
                    voters.len()
                ));
            }
            // every end this member acknowledged is held by each of its witnesses: one that
            // did not answer may be the only one that knows the last of them
            let silent: Vec<u64> = view
                .catalog
                .in_sync(me)
                .into_iter()
                .filter(|v| voters.contains(v) && !answered_all.contains(v))
                .collect();
            if !silent.is_empty() {
                return not_yet(format!(
                    "checking this member's partitions against what the cluster acknowledged: waiting for members {silent:?}, which hold the ends this member acknowledged last, to answer"
                ));
            }
            for ((meta, p, local_end), acked) in owned.iter().zip(acked) {
                let mut acked = acked;
                if let Some(a) = &self.archive {
                    match a.archive().load_manifest(&meta.name, *p).await {
                        Ok(Some(m)) if m.topic_id == meta.id => acked = acked.max(m.next_offset),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(topic = %meta.name, partition = p, error = %e, "the archive's manifest could not be read to check the partition against: checked against the members alone");
                        }
                    }
                }
                if acked <= *local_end {
                    self.broker.set_verified(&meta.name, meta.id, *p);
                    continue;
                }
                match self
                    .broker
                    .reopen_after(&meta.name, meta.id, *p, acked)
                    .await
                {
                    Ok(Some((from, to))) => {
                        let lost = to - from;
                        self.metrics.lost_records.inc_by(lost);
                        tracing::error!(topic = %meta.name, partition = p, lost_from = from, lost_to = to, lost_at_least = lost, "this member's log of the partition ended below what the cluster saw acknowledged (its data directory is an older copy): it goes on after the acknowledged end, and the records between are lost here");
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(topic = %meta.name, partition = p, local_end, acked_end = acked, error = %e, "could not reopen a partition after its acknowledged end; it is not served here, retrying");
                        return not_yet(format!(
                            "partition {p} of '{}' ends at {local_end}, below the acknowledged {acked}, and could not be reopened after it: {e}",
                            meta.name
                        ));
                    }
                }
            }
        }
        if self.broker.unverified().is_empty() {
            self.broker.end_verifying();
            *self.unverified.lock() = None;
            if let Some(w) = &witnesses {
                w.set_checking(false);
            }
        }
    }

    /// For each partition: one past the highest offset any live member saw acknowledged.
    async fn seen_ends(
        &self,
        live: &BTreeMap<u64, usize>,
        owned: &[(Arc<TopicMeta>, u32)],
    ) -> Vec<u64> {
        let ask: Vec<(u64, u32)> = owned.iter().map(|(t, p)| (t.id, *p)).collect();
        let body = serde_json::to_vec(&ask).expect("serialises");
        let me = self.node.node_id();
        let mut ends: Vec<u64> = match self.ingress.upgrade() {
            Some(i) => ask.iter().map(|&(t, p)| i.seen_end(t, p)).collect(),
            None => vec![0; ask.len()],
        };
        for &n in live.keys().filter(|&&n| n != me) {
            if let Ok(b) = self.call_raw(n, SEEN_ENDS, body.clone()).await
                && let Ok(theirs) = serde_json::from_slice::<Vec<u64>>(&b)
                && theirs.len() == ends.len()
            {
                for (e, t) in ends.iter_mut().zip(theirs) {
                    *e = (*e).max(t);
                }
            }
        }
        ends
    }
}
