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

use std::collections::{BTreeMap, HashSet};
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

use crate::cluster::ClusterNode;
use crate::http::ApiError;

pub const MOVE_LIST: Op = Op(120);
pub const MOVE_READ: Op = Op(121);
pub const MOVE_FREEZE: Op = Op(122);
pub const MOVE_PROGRESS: Op = Op(123);

/// Moves one node copies at once (as a target); more wait their turn.
pub const MOVES_PER_NODE: usize = 2;
/// Catch-up passes before the freeze, at most.
const MAX_CATCH_UP_PASSES: usize = 20;
/// A catch-up pass that leaves at most this much to copy ends the catch-up.
const FREEZE_WHEN_LEFT: u64 = 4 << 20;
/// A freeze's term: the source thaws (through Raft) a freeze not renewed within it.
pub const FREEZE_TTL: Duration = Duration::from_secs(30);
/// How often a mover renews its freeze while it copies the frozen tail.
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// Deadline of one call to the source.
const CALL: Duration = Duration::from_secs(10);
/// Deadline of a proposal or read index.
const PROPOSE: Duration = Duration::from_secs(10);

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
    token: u64,
    ttl_ms: u64,
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
            req.owner_epoch,
            req.token,
            Duration::from_millis(req.ttl_ms),
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
            "narad_move_thaws",
            "freezes a source thawed because its mover did not flip in time",
            self.thaws.clone(),
        );
    }
}

// ── the mover ──

/// Runs the moves targeted at this member, and thaws this member's lapsed freezes.
pub struct Mover {
    node: Arc<ClusterNode>,
    broker: Arc<Broker>,
    store: Arc<dyn MetaStore>,
    pub metrics: Arc<MoveMetrics>,
    running: Mutex<HashSet<(u64, u32, u64)>>,
    progress: Mutex<BTreeMap<(u64, u32), Progress>>,
    slots: Arc<Semaphore>,
}

impl Mover {
    pub fn new(
        node: Arc<ClusterNode>,
        broker: Arc<Broker>,
        store: Arc<dyn MetaStore>,
        metrics: Arc<MoveMetrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            node,
            broker,
            store,
            metrics,
            running: Mutex::new(HashSet::new()),
            progress: Mutex::new(BTreeMap::new()),
            slots: Arc::new(Semaphore::new(MOVES_PER_NODE)),
        })
    }

    /// The moves this member is copying in now.
    pub fn progress(&self) -> Vec<Progress> {
        self.progress.lock().values().cloned().collect()
    }

    fn set_phase(&self, key: (u64, u32), phase: &str) {
        if let Some(p) = self.progress.lock().get_mut(&key) {
            phase.clone_into(&mut p.phase);
        }
    }

    fn add_bytes(&self, key: (u64, u32), n: u64) {
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
        loop {
            let catalog = view.borrow_and_update().catalog.clone();
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
                    let stop = stop.clone();
                    let name = t.name.clone();
                    tokio::spawn(async move {
                        this.run_move(name, key, stop).await;
                        this.running.lock().remove(&key);
                    });
                }
            }
            self.thaw_lapsed().await;
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
        for f in self.broker.lapsed_freezes(Instant::now()) {
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
    async fn run_move(
        self: &Arc<Self>,
        topic: String,
        key: (u64, u32, u64),
        stop: CancellationToken,
    ) {
        let (topic_id, p, move_id) = key;
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let pkey = (topic_id, p);
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
        let mut backoff = Duration::from_millis(200);
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
            match self.attempt(&meta, p, move_id, source).await {
                Ok(frozen_for) => {
                    self.metrics.completed.inc();
                    self.metrics
                        .seconds
                        .observe(started.elapsed().as_secs_f64());
                    self.metrics
                        .freeze_seconds
                        .observe(frozen_for.as_secs_f64());
                    tracing::info!(topic = %topic, partition = p, from = source, to = self.node.node_id(), seconds = started.elapsed().as_secs_f64(), frozen_ms = frozen_for.as_millis() as u64, "partition moved here");
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
        if let Some(meta) = self.broker.catalog().get(&topic) {
            let staging = self.broker.staging_dir(meta, p);
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(staging)).await;
        }
    }

    /// The topic and the partition's owner, if the catalog still moves it here under `key`.
    fn wanted(&self, topic: &str, key: (u64, u32, u64)) -> Option<(Arc<TopicMeta>, u64)> {
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
    ) -> Result<Duration, String> {
        let pkey = (meta.id, p);
        let epoch = meta.owner_epoch(p);
        let staging = self.broker.staging_dir(meta, p);
        {
            let staging = staging.clone();
            tokio::task::spawn_blocking(move || {
                let _ = std::fs::remove_dir_all(&staging);
                narad_core::fsutil::create_dir_private(&staging)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("staging directory: {e}"))?;
        }
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
        let mut incarnation = None;
        for _ in 0..MAX_CATCH_UP_PASSES {
            let listed: ListReply = self
                .call(source, MOVE_LIST, list_req(self.broker.followed()))
                .await?;
            if *incarnation.get_or_insert(listed.incarnation) != listed.incarnation {
                return Err("the source restarted during the copy".into());
            }
            let copied = self
                .sync(meta, p, source, &staging, &listed.files, None)
                .await?;
            if copied <= FREEZE_WHEN_LEFT {
                break;
            }
        }
        // freeze, copy exactly what the frozen partition holds
        self.set_phase(pkey, "freeze");
        let token = loop {
            let t = narad_core::random_u64();
            if t != 0 {
                break t;
            }
        };
        let freeze_req = serde_json::to_vec(&FreezeRequest {
            topic: meta.name.clone(),
            topic_id: meta.id,
            partition: p,
            catalog: self.broker.followed(),
            owner_epoch: epoch,
            token,
            ttl_ms: FREEZE_TTL.as_millis() as u64,
        })
        .expect("serialises");
        let frozen_at = Instant::now();
        let frozen: FreezeReply = self.call(source, MOVE_FREEZE, freeze_req.clone()).await?;
        if incarnation.is_some_and(|i| i != frozen.incarnation) {
            return Err("the source restarted during the copy".into());
        }
        self.set_phase(pkey, "finalize");
        self.sync(
            meta,
            p,
            source,
            &staging,
            &frozen.frozen.files,
            Some(&freeze_req),
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
        let fenced: FreezeReply = self.call(source, MOVE_FREEZE, freeze_req.clone()).await?;
        if fenced.incarnation != frozen.incarnation
            || fenced.frozen.next_offset != frozen.frozen.next_offset
        {
            return Err("the source's partition changed since the freeze".into());
        }
        if self.wanted(&meta.name, (meta.id, p, move_id)).is_none() {
            return Err("the move was cancelled".into());
        }
        self.set_phase(pkey, "install");
        self.broker
            .install_partition(&meta.name, meta.id, p, &staging)
            .await
            .map_err(|e| format!("install: {e}"))?;
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
    async fn sync(
        &self,
        meta: &TopicMeta,
        p: u32,
        source: u64,
        staging: &Path,
        files: &[PartitionFile],
        renew: Option<&Vec<u8>>,
    ) -> Result<u64, String> {
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
                let len = (f.size - pos).min(MAX_FILE_CHUNK);
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
                self.add_bytes((meta.id, p), n);
                if let Some(req) = renew
                    && renewed.elapsed() >= RENEW_EVERY
                {
                    let _: FreezeReply = self.call(source, MOVE_FREEZE, req.clone()).await?;
                    renewed = Instant::now();
                }
            }
            if pos == 0 && f.size == 0 && !path.exists() {
                std::fs::File::create(&path)
                    .map_err(|e| format!("writing the staged copy: {e}"))?;
            }
        }
        if frozen {
            // everything the copy wrote reaches the disk before the flip can name it
            let staging = staging.to_owned();
            tokio::task::spawn_blocking(move || sync_tree(&staging))
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
