//! Any-node ingress on a cluster member: produce, consume, replay and ack on partitions
//! other members own, as calls over the cluster endpoint (ops from 100 up), and this
//! member's service answering the same calls from the others.
//!
//! - **Produce**: the member that takes the request checks it whole (sizes, keys, headers,
//!   schema) as a single node does, places every message on a partition (pinned, by key, or
//!   round-robin), and hands each owner its messages in one call; the owner appends them
//!   (fsync) and answers their offsets. A `202` still means every message is durable. A
//!   keyless message, or a keyed one under the topic's `prefer` key policy, whose owner
//!   cannot be reached is placed again on a partition of another member (once: one of this
//!   member's, else the next one whose owner is not known down); a message pinned to a
//!   partition, or keyed under
//!   `strict`, is not moved (`503 cluster_unavailable`, at once while its owner is known
//!   to be down).
//! - **Consume**: every owner of the topic, this member included, in a rotating order, each
//!   asked not to wait; with nothing anywhere and a wait, the reader waits in the line of
//!   every owner at once: here directly, at the others through a delivery token (a waiter in
//!   the owner's FIFO line, no call held open), and the first owner with messages serves it
//!   (an owner pushes what its line hands a token). Whatever else was taken for the reader
//!   and cannot be answered is given back ([`Taken`] does it when dropped), and an owner
//!   whose answer to a look never reached this member takes it back itself
//!   (`DataService::undelivered`).
//! - **Ack, extend, nack**: a receipt handle names the member that leased it
//!   (`<node_id>.<handle>`); the call goes there.
//!
//! Every call names the catalog its sender acted on (how many catalog commands it had
//! followed): an owner that has not followed that far yet waits for it (briefly), so a topic
//! created or grown through one member takes messages through it at once.
//!
//! Here: [`Ingress`], the calling side (produce, replay, settle, stats, children, mirror
//! progress); `consume`, its long-poll side and [`Taken`]; [`service`], the answering side;
//! [`codec`], what crosses the wire. Every call's number is in [`narad_cluster::rpc::ops`].

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_cluster::rpc::{Op, RpcError};
use narad_core::broker::{
    AckAction, Broker, BrokerError, ChildInfo, CopyForwarder, ProduceMessage, Produced, ReplayFrom,
};
use narad_core::ids::{PartitionId, RemoteId};
use narad_core::record::NewRecord;
use narad_core::topic::KeyPolicy;
use narad_replay::ArchiveReader;
use narad_wire::ErrorCode;
use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::sync::Semaphore;

use crate::cluster::ClusterNode;
use crate::http::error::ApiError;
use crate::http::render;
use crate::reads::{PartitionStatsJson, history, local_stats};

pub mod codec;
mod consume;
mod request;
pub mod service;

use codec::*;
pub use consume::Taken;
use consume::{UserSlotTable, raw};
use narad_core::placement::{Placement, owner_of};
use request::DataRequest;

/// How long a forwarded produce, settle or read may take (the owner is told too). An
/// owner killed outright keeps its connection looking alive until the idle timeout, so an
/// owner that has not answered in this long is taken for unreachable: a produce of
/// messages that may not move answers `504 outcome_unknown` (messages that may move wait
/// only [`PLACE_DEADLINE`], then go to another owner).
const CALL_DEADLINE: Duration = Duration::from_secs(3);
/// How long a forwarded produce of messages that may move (keyless, or keyed under the
/// `prefer` policy) waits for their owner before they are placed on another one: an owner
/// that died or froze costs a producer at most about this much (`narad-bench owner-loss`,
/// docs/benchmarks.md). An owner only slow to answer (its disk, a busy machine) may have
/// written them too: a duplicate, as with any retry.
const PLACE_DEADLINE: Duration = Duration::from_millis(800);
/// Beyond a long-poll's wait, for its answer to come back.
const WAIT_SLACK: Duration = Duration::from_secs(2);
/// How often a member taken for unreachable is pinged until it answers again.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Delivery tokens this member keeps at one other member at once (one per parked reader
/// and owner). A token holds no call open (the owner pushes what its line hands the token),
/// so this bounds only the owner's table: a reader beyond it queues here for a slot at that
/// member (and waits in the other owners' lines meanwhile).
pub const MAX_WAITS_PER_MEMBER: usize = 1024;
/// Of those, the most one user's readers hold (a quarter, as a user's share of the byte
/// budget): one tenant's parked long-polls cannot take every slot and leave another
/// tenant's readers queued here until theirs end. A user's readers beyond it queue behind
/// one another, not in front of other users'.
pub const MAX_WAITS_PER_USER: usize = MAX_WAITS_PER_MEMBER / 4;
/// Tokens other members may keep at this one at once (each member at most
/// [`MAX_WAITS_PER_MEMBER`]; this bounds the table however many members there are).
const MAX_CANCELLABLE_WAITS: usize = 4096;
/// An owner ends a token's wait this much before the reader's, so what it pushes at the
/// last moment still finds the reader.
const TOKEN_MARGIN: Duration = Duration::from_millis(50);
/// How long one token lives at an owner before the reader leaves it again: what bounds the
/// time a reader goes unnoticed by an owner that dropped its token (a push to its member
/// failed) or lost it (a restart).
const TOKEN_TTL: Duration = Duration::from_secs(5);
/// How long an owner waits to follow the catalog a call names.
const CATCH_UP: Duration = Duration::from_secs(2);
/// How long a produce waits, at most, for a partition frozen for a move to reach its new
/// owner (or thaw) before it answers `503 partition_moving`.
const MOVE_WAIT: Duration = Duration::from_secs(10);

/// This member's ingress: its broker, its cluster node, the members taken for unreachable
/// (passed over when placing messages and reading, pinged in the background until they
/// answer, so no request waits on them meanwhile), and the long-polls waiting at each.
pub struct Ingress {
    pub broker: Arc<Broker>,
    pub node: Arc<ClusterNode>,
    /// History older than local data, for replay reads of this member's partitions.
    archive: Option<Arc<ArchiveReader>>,
    down: Mutex<HashMap<u64, Instant>>,
    waits: Mutex<HashMap<u64, Arc<Semaphore>>>,
    /// Per (member, user): that user's share of the slots at that member
    /// ([`MAX_WAITS_PER_USER`]); an entry goes once no reader of the user holds or waits
    /// for it.
    user_waits: Arc<UserSlotTable>,
    /// Delivery tokens this member's parked readers left at other owners: (owner, token id)
    /// → the reader, which takes what that owner pushes ([`DELIVER`](narad_cluster::rpc::ops::DELIVER)).
    tokens: Mutex<HashMap<RemoteId, tokio::sync::oneshot::Sender<Taken>>>,
    /// Per (topic id, partition): one past the highest offset this member saw acknowledged
    /// (produces it took), so that a partition whose owner is lost for good can be told
    /// how much of it was lost (see `crate::moves`). One entry per partition produced to.
    seen: Mutex<HashMap<PartitionId, u64>>,
    /// Per (topic id, partition): the highest durable log end its owner reported here
    /// ([`narad_cluster::rpc::ops::WITNESS`]): so that an owner restored from an older copy of its data
    /// directory learns, at its start, how far it had acknowledged (see
    /// [`narad_core::broker::Broker::reopen_after`]). One entry per partition of the cluster.
    witnessed: Mutex<HashMap<PartitionId, u64>>,
    /// Where `seen` and `witnessed` are kept across restarts ([`crate::acked_ends`]), and
    /// what was last written there.
    ends_file: Option<std::path::PathBuf>,
    ends_written: tokio::sync::Mutex<crate::acked_ends::Ends>,
    /// Tells the other voters the ends of what this member, as owner, acknowledges.
    witnesses: Arc<crate::witness::Witnesses>,
}

/// One message's outcome in a forwarded produce.
pub type Outcome = Result<Produced, ApiError>;

/// An owner's answer to a purge: how many messages went, and its partitions frozen for a
/// move (not purged).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Purged {
    pub(crate) purged: u64,
    pub(crate) frozen: Vec<u32>,
}

/// Why a call to another member failed: it could not be reached (nothing is known of the
/// request's fate), or it answered with a refusal.
enum CallError {
    /// No answer: `true` if the request may have reached the member (a timeout, a cut
    /// connection), so its outcome is unknown; `false` if it surely did not.
    Unreachable(ApiError, bool),
    Answered(ApiError),
}

impl CallError {
    fn api(self) -> ApiError {
        match self {
            Self::Unreachable(e, _) | Self::Answered(e) => e,
        }
    }
}

impl Ingress {
    /// `ends_file`: where what this member saw acknowledged is kept across its restarts
    /// (loaded here; see [`Ingress::persist_ends`]).
    pub fn new(
        broker: Arc<Broker>,
        node: Arc<ClusterNode>,
        archive: Option<Arc<ArchiveReader>>,
        ends_file: Option<std::path::PathBuf>,
    ) -> Arc<Self> {
        let remembered = ends_file
            .as_deref()
            .map(crate::acked_ends::load)
            .unwrap_or_default();
        Arc::new(Self {
            broker,
            witnesses: crate::witness::Witnesses::new(node.clone()),
            node,
            archive,
            down: Mutex::new(HashMap::new()),
            waits: Mutex::new(HashMap::new()),
            user_waits: Arc::default(),
            tokens: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            witnessed: Mutex::new(remembered.clone()),
            ends_file,
            ends_written: tokio::sync::Mutex::new(remembered),
        })
    }

    fn me(&self) -> u64 {
        self.node.node_id()
    }

    fn is_down(&self, id: u64) -> bool {
        id != self.me() && self.down.lock().contains_key(&id)
    }

    fn mark_up(&self, id: u64) {
        if self.down.lock().remove(&id).is_some() {
            tracing::info!(node_id = id, "cluster member answers again");
        }
    }

    /// Takes member `id` for unreachable, and pings it every [`PROBE_EVERY`] until it
    /// answers (one prober per member).
    fn mark_down(self: &Arc<Self>, id: u64) {
        if self.down.lock().insert(id, Instant::now()).is_some() {
            return;
        }
        tracing::warn!(
            node_id = id,
            "cluster member unreachable: its partitions are passed over until it answers"
        );
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                // (real time: a peer's liveness, no broker clock involved)
                #[allow(clippy::disallowed_methods)]
                tokio::time::sleep(PROBE_EVERY).await;
                let Some(me) = me.upgrade() else { return };
                if !me.is_down(id) {
                    return;
                }
                let Some(addr) = me.node.meta.addr_of(id) else {
                    me.mark_up(id);
                    return;
                };
                let rpc = me.node.meta.rpc().clone();
                let ping = rpc.call(id, &addr, Op::PING, Bytes::new(), Duration::from_secs(1));
                if ping.await.is_ok() {
                    me.mark_up(id);
                    return;
                }
            }
        });
    }

    /// Calls `op` on member `id` (which must be a member: see [`Self::call`]); a member
    /// that answers is taken for up, one that cannot be reached (or did not answer in time,
    /// unless the call is a long-poll) for down.
    async fn call_rpc(
        self: &Arc<Self>,
        id: u64,
        addr: &str,
        op: Op,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, RpcError> {
        let r = self
            .node
            .meta
            .rpc()
            .call(id, addr, op, body, deadline)
            .await;
        match &r {
            Ok(_) | Err(RpcError::Remote { .. }) => self.mark_up(id),
            Err(RpcError::Timeout { .. }) if deadline > CALL_DEADLINE => {}
            Err(_) => self.mark_down(id),
        }
        r
    }

    /// Calls `op` on member `id`; a member that cannot be reached is taken for down.
    async fn call(
        self: &Arc<Self>,
        id: u64,
        op: Op,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, CallError> {
        let Some(addr) = self.node.meta.addr_of(id) else {
            return Err(CallError::Unreachable(
                ApiError::new(
                    ErrorCode::ClusterUnavailable,
                    format!("node {id} is not a member of this cluster"),
                ),
                false,
            ));
        };
        let r = self.call_rpc(id, &addr, op, body, deadline).await;
        match r {
            Ok(b) => Ok(b),
            Err(RpcError::Remote { fault, .. }) => {
                let e = from_fault(&fault);
                if e.code == ErrorCode::OutcomeUnknown {
                    // the owner ran out of the caller's time mid-way: as with an owner that
                    // never answered, it may have applied it
                    Err(CallError::Unreachable(e, true))
                } else {
                    Err(CallError::Answered(e))
                }
            }
            // a long-poll that ran out is not the owner's fault
            Err(RpcError::Timeout { .. }) if deadline > CALL_DEADLINE => {
                Err(CallError::Answered(ApiError::new(
                    ErrorCode::ClusterUnavailable,
                    format!("node {id} did not answer a wait in time"),
                )))
            }
            Err(e) => {
                let sent = !e.not_sent();
                Err(CallError::Unreachable(
                    ApiError::new(
                        ErrorCode::ClusterUnavailable,
                        format!("the partition's owner could not be reached: {e}; retry"),
                    ),
                    sent,
                ))
            }
        }
    }

    // ── produce ──

    /// Produces `msgs` (checked whole by the caller) on their owners: one outcome per
    /// message, in order. A message whose partition is frozen for a move (or moved since
    /// this member routed it) is sent again once the catalog changes, for up to
    /// [`MOVE_WAIT`]: a move costs producers latency, not errors.
    pub async fn produce(
        self: &Arc<Self>,
        topic: &str,
        mut msgs: Vec<ProduceMessage>,
    ) -> Result<Vec<Outcome>, ApiError> {
        let pinned: Vec<bool> = msgs.iter().map(|m| m.partition.is_some()).collect();
        let mut out = self.produce_once(topic, &mut msgs).await?;
        let deadline = Instant::now() + MOVE_WAIT;
        loop {
            let moving: Vec<usize> = out
                .iter()
                .enumerate()
                .filter(|(_, o)| matches!(o, Err(e) if e.code == ErrorCode::PartitionMoving))
                .map(|(i, _)| i)
                .collect();
            if moving.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
            // the flip (a catalog change) or a thaw: whichever comes, look again soon
            let followed = self.broker.followed();
            self.broker
                .catch_up(followed + 1, Duration::from_millis(100))
                .await;
            let mut again: Vec<ProduceMessage> = moving
                .iter()
                .map(|&i| {
                    let mut m = msgs[i].clone();
                    if !pinned[i] {
                        // placed again: by key, or round-robin among live partitions
                        m.partition = None;
                    }
                    m
                })
                .collect();
            let res = self.produce_once(topic, &mut again).await?;
            for (o, i) in res.into_iter().zip(moving) {
                out[i] = o;
            }
        }
    }

    async fn produce_once(
        self: &Arc<Self>,
        topic: &str,
        msgs: &mut [ProduceMessage],
    ) -> Result<Vec<Outcome>, ApiError> {
        let meta = self.broker.topic_meta(topic)?;
        let n = meta.config.partitions;
        // the members known down, read once for the whole request (usually none)
        let down: Vec<u64> = {
            let me = self.me();
            self.down
                .lock()
                .keys()
                .copied()
                .filter(|&id| id != me)
                .collect()
        };
        let place = Placement::new(n, &meta.owners, self.me(), |o| down.contains(&o));
        let owner = |p: u32| place.owner(p);
        // pinned messages are judged before anything is written (400 for the whole request)
        for (index, m) in msgs.iter().enumerate() {
            if let Some(p) = m.partition
                && p >= n
            {
                return Err(BrokerError::PartitionOutOfRange {
                    index: Some(index),
                    partition: p,
                    partitions: n,
                }
                .into());
            }
        }
        // a message pinned to its partition, or keyed under the `strict` policy, never moves
        let strict = meta.config.key_policy == KeyPolicy::Strict;
        let sticky: Vec<bool> = msgs
            .iter()
            .map(|m| m.partition.is_some() || (strict && m.key.is_some()))
            .collect();
        // keyless messages spread as on a single node (within `max_open_logs`, which a wide
        // batch would otherwise exceed at an owner)
        let spread = self.broker.keyless_spread(topic, msgs)?;
        for m in msgs.iter_mut() {
            if m.partition.is_none() {
                m.partition = Some(place.first(m.key.as_deref(), strict, || spread.place()));
            }
        }
        let catalog = self.broker.followed();
        let mut out: Vec<Option<Outcome>> = (0..msgs.len()).map(|_| None).collect();
        // a message that cannot move, whose owner is known to be down, is told so at once
        let mut todo: Vec<usize> = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.iter().enumerate() {
            let p = m.partition.unwrap_or(0);
            if sticky[i]
                && let Some(node) = place.known_down(p)
            {
                out[i] = Some(Err(owner_down(p, node)));
            } else {
                todo.push(i);
            }
        }
        let mut failed: Vec<u64> = Vec::new();
        // a message sent in the first round to an owner that never answered may be written
        // there: what its second try fails with is not its outcome ("unknown" is)
        let mut maybe_written: Vec<Option<ApiError>> = vec![None; msgs.len()];
        for round in 0..2 {
            let mut groups: HashMap<u64, Vec<usize>> = HashMap::new();
            for &i in &todo {
                let p = msgs[i].partition.unwrap_or(0);
                groups.entry(owner(p)).or_default().push(i);
            }
            let calls = groups.into_iter().map(|(node, idx)| {
                let group: Vec<ProduceMessage> = idx.iter().map(|&i| msgs[i].clone()).collect();
                // messages that may move are not kept waiting on a silent owner: placed
                // again after PLACE_DEADLINE (a second try waits no less: nowhere else to go)
                let deadline = if round == 0 && idx.iter().all(|&i| !sticky[i]) {
                    PLACE_DEADLINE
                } else {
                    CALL_DEADLINE
                };
                async move {
                    let r = self
                        .produce_on(node, topic, meta.id, catalog, group, deadline)
                        .await;
                    (node, idx, r)
                }
            });
            let results = futures_util::future::join_all(calls).await;
            todo.clear();
            for (node, idx, r) in results {
                match r {
                    Ok(produced) => {
                        for (i, p) in idx.into_iter().zip(produced) {
                            out[i] = Some(Ok(p));
                        }
                    }
                    Err(CallError::Unreachable(e, sent)) if round == 0 => {
                        let e = if sent { unanswered_produce(node, e) } else { e };
                        failed.push(node);
                        for i in idx {
                            // placed by this member (not pinned): placed again, once, on a
                            // partition of this member if it owns one (it is surely up:
                            // another guess could meet a second owner that is down too)
                            let p = msgs[i].partition.unwrap_or(0);
                            match place.again(p, node, &failed) {
                                Some(q) if !sticky[i] => {
                                    msgs[i].partition = Some(q);
                                    if sent {
                                        maybe_written[i] = Some(e.clone());
                                    }
                                    todo.push(i);
                                }
                                _ => out[i] = Some(Err(e.clone())),
                            }
                        }
                    }
                    Err(e) => {
                        let e = match e {
                            CallError::Unreachable(e, true) => unanswered_produce(node, e),
                            e => e.api(),
                        };
                        for i in idx {
                            out[i] =
                                Some(Err(maybe_written[i].take().unwrap_or_else(|| e.clone())));
                        }
                    }
                }
            }
            if todo.is_empty() {
                break;
            }
        }
        {
            let mut seen = self.seen.lock();
            for p in out.iter().flatten().flatten() {
                let end = seen
                    .entry(PartitionId::new(meta.id, p.partition))
                    .or_insert(0);
                *end = (*end).max(p.offset + 1);
            }
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(ApiError::new(
                        ErrorCode::ClusterUnavailable,
                        "not produced; retry",
                    ))
                })
            })
            .collect())
    }

    /// The witnesses of this member's acknowledged ends.
    pub fn witnesses(&self) -> &Arc<crate::witness::Witnesses> {
        &self.witnesses
    }

    /// One past the highest offset of partition `p` of topic `topic_id` this member saw
    /// acknowledged (0 if none).
    pub fn seen_end(&self, topic_id: u64, p: u32) -> u64 {
        let key = PartitionId::new(topic_id, p);
        let seen = self.seen.lock().get(&key).copied().unwrap_or(0);
        let witnessed = self.witnessed.lock().get(&key).copied().unwrap_or(0);
        seen.max(witnessed)
    }

    /// Takes an owner's report of its partitions' durable log ends (each only ever grows for
    /// one topic incarnation: moves copy whole logs, rebuilds start above what was seen).
    pub fn witness(&self, ends: &[(u64, u32, u64)]) {
        let mut w = self.witnessed.lock();
        for &(t, p, end) in ends {
            let e = w.entry(PartitionId::new(t, p)).or_insert(0);
            *e = (*e).max(end);
        }
    }

    /// Writes what this member saw acknowledged and was told by owners to its file, if it
    /// changed since the last write, so that it answers an owner restored from an older copy
    /// of its data directory even after its own restart. Called by the witness task.
    pub async fn persist_ends(&self) {
        let Some(path) = self.ends_file.clone() else {
            return;
        };
        let mut written = self.ends_written.lock().await;
        let mut now = self.witnessed.lock().clone();
        for (&k, &e) in self.seen.lock().iter() {
            let slot = now.entry(k).or_insert(0);
            *slot = (*slot).max(e);
        }
        if *written == now {
            return;
        }
        let ends = now.clone();
        match tokio::task::spawn_blocking(move || crate::acked_ends::store(&path, &ends)).await {
            Ok(Ok(())) => *written = now,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not keep what this member saw acknowledged on its disk; retried in a moment");
            }
            Err(e) => tracing::warn!(error = %e, "writing the acknowledged ends failed"),
        }
    }

    /// Forgets what was seen and witnessed of topics no longer in the catalog (`live`: the
    /// incarnation ids it names).
    pub fn prune_seen(&self, live: &std::collections::HashSet<u64>) {
        self.witnessed
            .lock()
            .retain(|k, _| live.contains(&k.topic.0));
        self.seen.lock().retain(|k, _| live.contains(&k.topic.0));
    }

    /// `p`, or the next partition after it whose owner is not known to be down (nor in
    /// `failed`); `p` itself when every owner is.
    async fn produce_on(
        self: &Arc<Self>,
        node: u64,
        topic: &str,
        topic_id: u64,
        catalog: u64,
        msgs: Vec<ProduceMessage>,
        deadline: Duration,
    ) -> Result<Vec<Produced>, CallError> {
        if node == self.me() {
            let produced = self
                .broker
                .produce(topic, msgs)
                .await
                .map_err(|e| CallError::Answered(e.into()))?;
            // answered once the others hold the new ends (a restored copy is checked
            // against them)
            self.witnesses.confirm(topic_id, &produced, None).await;
            return Ok(produced);
        }
        let count = msgs.len();
        let (op, body) = DataRequest::Produce(ProduceRequest {
            topic: topic.to_owned(),
            topic_id,
            catalog,
            msgs,
        })
        .frame();
        let reply = self.call(node, op, body, deadline).await?;
        let malformed = |what: String| {
            CallError::Answered(ApiError::new(
                ErrorCode::ClusterUnavailable,
                format!("node {node} answered a produce with {what}"),
            ))
        };
        let produced =
            decode_produced(&reply).ok_or_else(|| malformed("a malformed reply".into()))?;
        if produced.len() != count {
            return Err(malformed(format!(
                "{} outcomes for {count} messages",
                produced.len(),
            )));
        }
        Ok(produced)
    }

    // ── replay ──

    /// A replay read of partition `partition`, on its owner: the messages as JSON objects.
    pub async fn replay(
        self: &Arc<Self>,
        topic: &str,
        partition: u32,
        from: ReplayFrom,
        max: usize,
    ) -> Result<Vec<Box<RawValue>>, ApiError> {
        let meta = self.broker.topic_meta(topic)?;
        let owner = owner_of(&meta.owners, partition, self.me());
        if owner == self.me() || partition >= meta.config.partitions {
            let recs = history(
                &self.broker,
                self.archive.as_deref(),
                topic,
                partition,
                from,
                max,
            )
            .await?;
            return Ok(recs
                .iter()
                .map(|r| raw(&render::record(topic, partition, r)))
                .collect());
        }
        let (offset, from_time_ms) = match from {
            ReplayFrom::Offset(o) => (Some(o), None),
            ReplayFrom::TimeMs(t) => (None, Some(t)),
        };
        let req = ReplayRequest {
            topic: topic.to_owned(),
            partition,
            offset,
            from_time_ms,
            max,
            catalog: self.broker.followed(),
        };
        let (op, body) = DataRequest::Replay { req, from }.frame();
        let reply = self
            .call(owner, op, body, CALL_DEADLINE)
            .await
            .map_err(CallError::api)?;
        serde_json::from_slice(&reply).map_err(|e| {
            ApiError::new(
                ErrorCode::ClusterUnavailable,
                format!("node {owner} answered a replay with a malformed reply: {e}"),
            )
        })
    }

    // ── statistics ──

    /// Asks every other owner of `meta`'s partitions (or only of `only`) `op` about the
    /// topic, at once: per owner, the partitions it owns and its answer (`None`: it could
    /// not be asked, or answered something unreadable).
    async fn ask_owners<T: serde::de::DeserializeOwned>(
        self: &Arc<Self>,
        meta: &narad_core::catalog::TopicMeta,
        only: Option<u32>,
        ask: fn(StatsRequest) -> DataRequest,
    ) -> Vec<(Vec<u32>, Option<T>)> {
        let mut theirs: HashMap<u64, Vec<u32>> = HashMap::new();
        for (p, &o) in meta.owners.iter().enumerate() {
            let p = p as u32;
            if o != self.me() && only.is_none_or(|x| x == p) {
                theirs.entry(o).or_default().push(p);
            }
        }
        let req = StatsRequest {
            topic: meta.name.clone(),
            catalog: self.broker.followed(),
            topic_id: Some(meta.id),
        };
        let (op, body) = ask(req).frame();
        let (nodes, parts): (Vec<u64>, Vec<Vec<u32>>) = theirs.into_iter().unzip();
        self.call_each(nodes, op, body)
            .await
            .into_iter()
            .zip(parts)
            .map(|((_, got), parts)| {
                (
                    parts,
                    got.and_then(|b| serde_json::from_slice::<T>(&b).ok()),
                )
            })
            .collect()
    }

    /// Calls `op` with `body` on each of `nodes` at once (none on a member taken for down):
    /// each node with its answer, if it gave one.
    async fn call_each(
        self: &Arc<Self>,
        nodes: Vec<u64>,
        op: Op,
        body: Bytes,
    ) -> Vec<(u64, Option<Bytes>)> {
        let calls = nodes.into_iter().map(|node| {
            let body = body.clone();
            async move {
                let got = if self.is_down(node) {
                    None
                } else {
                    self.call(node, op, body, CALL_DEADLINE).await.ok()
                };
                (node, got)
            }
        });
        futures_util::future::join_all(calls).await
    }

    /// Purges the queue of the partitions of `meta` other members own: how many messages
    /// went, and the partitions not purged (frozen for a move, or whose owner did not
    /// answer: it may or may not have purged them).
    pub(crate) async fn purge_others(
        self: &Arc<Self>,
        meta: &narad_core::catalog::TopicMeta,
    ) -> (u64, Vec<u32>) {
        let (mut purged, mut left) = (0, Vec::new());
        for (parts, got) in self
            .ask_owners::<Purged>(meta, None, DataRequest::Purge)
            .await
        {
            match got {
                Some(p) => {
                    purged += p.purged;
                    left.extend(p.frozen.into_iter().filter(|f| parts.contains(f)));
                }
                None => left.extend(parts),
            }
        }
        left.sort_unstable();
        (purged, left)
    }

    /// The figures of the partitions of `meta` other members own (or only of `only`), from
    /// their owners, and the partitions whose owner could not be asked.
    pub(crate) async fn partition_stats(
        self: &Arc<Self>,
        meta: &narad_core::catalog::TopicMeta,
        only: Option<u32>,
    ) -> (Vec<PartitionStatsJson>, Vec<u32>) {
        let mut stats = Vec::new();
        let mut missing = Vec::new();
        for (parts, got) in self
            .ask_owners::<Vec<PartitionStatsJson>>(meta, only, DataRequest::Stats)
            .await
        {
            match got {
                Some(s) => stats.extend(s.into_iter().filter(|s| parts.contains(&s.partition))),
                None => missing.extend(parts),
            }
        }
        missing.sort_unstable();
        (stats, missing)
    }

    // ── mirrors ──

    /// The members other than this one owning partitions of `meta`.
    fn other_owners(&self, meta: &narad_core::catalog::TopicMeta) -> Vec<u64> {
        let mut others: Vec<u64> = meta
            .owners
            .iter()
            .copied()
            .filter(|&o| o != self.me())
            .collect();
        others.sort_unstable();
        others.dedup();
        others
    }

    /// Passes a mirror's source progress on to the other members owning its partitions
    /// (each settles the records of its own). Returns the members that did not take it:
    /// the source sends its progress again within seconds, so they catch up then.
    pub async fn mirror_progress(
        self: &Arc<Self>,
        meta: &narad_core::catalog::TopicMeta,
        mut req: MirrorProgressRequest,
    ) -> Vec<u64> {
        req.catalog = self.broker.followed();
        let (op, body) = DataRequest::MirrorProgress(req).frame();
        self.call_each(self.other_owners(meta), op, body)
            .await
            .into_iter()
            .filter_map(|(node, got)| got.is_none().then_some(node))
            .collect()
    }

    /// The other members' shares of mirror `meta`'s report (`last`: settle and drop, for a
    /// promote): their reports and what they settled, and the members that could not be
    /// asked.
    pub async fn mirror_reports(
        self: &Arc<Self>,
        meta: &narad_core::catalog::TopicMeta,
        last: bool,
    ) -> (Vec<narad_core::broker::MirrorReport>, u64, Vec<u64>) {
        let req = MirrorReportRequest {
            topic: meta.name.clone(),
            topic_id: meta.id,
            catalog: self.broker.followed(),
            last,
        };
        let (op, body) = DataRequest::MirrorReport(req).frame();
        let (mut reports, mut settled, mut unanswered) = (Vec::new(), 0, Vec::new());
        for (node, got) in self.call_each(self.other_owners(meta), op, body).await {
            match got.and_then(|b| serde_json::from_slice::<MirrorReportReply>(&b).ok()) {
                Some(r) => {
                    settled += r.settled;
                    reports.extend(r.report);
                }
                None => unanswered.push(node),
            }
        }
        (reports, settled, unanswered)
    }

    // ── fan-out ──

    /// The next offset of every partition of `meta`, from their owners (a new fan-out link
    /// starts there). `503` if an owner cannot be asked: a link must not start past records
    /// it never saw, nor before records it should not get.
    pub async fn tails(
        self: &Arc<Self>,
        meta: &narad_core::catalog::TopicMeta,
    ) -> Result<Vec<u64>, ApiError> {
        self.positions(meta, false).await
    }

    /// Every partition's next offset (`frontier` false) or ack frontier (true), from their
    /// owners; `503` if an owner cannot be asked.
    pub async fn positions(
        self: &Arc<Self>,
        meta: &narad_core::catalog::TopicMeta,
        frontier: bool,
    ) -> Result<Vec<u64>, ApiError> {
        let info = self.broker.topic_info(&meta.name)?;
        if info.meta.id != meta.id {
            return Err(ApiError::new(
                ErrorCode::ClusterUnavailable,
                format!("'{}' was re-created meanwhile; retry", meta.name),
            ));
        }
        let mut stats = local_stats(&self.broker, &info, None);
        let (theirs, missing) = self.partition_stats(meta, None).await;
        if !missing.is_empty() {
            return Err(ApiError::new(
                ErrorCode::ClusterUnavailable,
                format!(
                    "the owners of partitions {missing:?} of '{}' could not be asked where the link starts; retry",
                    meta.name
                ),
            ));
        }
        stats.extend(theirs);
        let mut tails = vec![None; meta.config.partitions as usize];
        for s in &stats {
            if let Some(t) = tails.get_mut(s.partition as usize) {
                *t = Some(if frontier { s.frontier } else { s.next_offset });
            }
        }
        tails
            .into_iter()
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::ClusterUnavailable,
                    format!("'{}' changed its partitions meanwhile; retry", meta.name),
                )
            })
    }

    /// The children of `parent` with their lag summed over every owner of its partitions
    /// (each knows the lag of the cursors it runs), and the members that could not be asked.
    pub async fn children(
        self: &Arc<Self>,
        parent: &narad_core::catalog::TopicMeta,
    ) -> Result<(Vec<ChildInfo>, Vec<u32>), ApiError> {
        let mut list = self.broker.children(&parent.name)?;
        let mut missing = Vec::new();
        for (parts, got) in self
            .ask_owners::<Vec<ChildInfo>>(parent, None, DataRequest::Children)
            .await
        {
            let Some(got) = got else {
                missing.extend(parts);
                continue;
            };
            for g in got {
                if let Some(c) = list.iter_mut().find(|c| c.name == g.name) {
                    c.lag_messages = c.lag_messages.saturating_add(g.lag_messages);
                    c.due_lag_seconds = c.due_lag_seconds.max(g.due_lag_seconds);
                    if let (Some(mine), Some(theirs)) = (c.remote.as_mut(), g.remote) {
                        // the worst state of any owner's cursors, the oldest unshipped record
                        if narad_core::broker::state_rank(&theirs.state)
                            > narad_core::broker::state_rank(&mine.state)
                        {
                            mine.state = theirs.state.clone();
                            mine.last_error = theirs.last_error.clone().or(mine.last_error.take());
                        }
                        mine.lag_seconds = mine.lag_seconds.max(theirs.lag_seconds);
                        // (each owner reports its own partitions' blocked records)
                        mine.blocked.extend(theirs.blocked);
                    }
                }
            }
        }
        missing.sort_unstable();
        Ok((list, missing))
    }

    /// Appends fan-out copies to partition `partition` of `topic` on its owner `owner`.
    async fn append_copies(
        self: &Arc<Self>,
        owner: u64,
        topic: String,
        topic_id: u64,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> Result<(), BrokerError> {
        let (op, body) = DataRequest::FanoutAppend(request::FanoutAppend {
            topic,
            topic_id,
            catalog: self.broker.followed(),
            partition,
            records,
        })
        .frame();
        self.call(owner, op, body, CALL_DEADLINE)
            .await
            .map(|_| ())
            .map_err(|e| BrokerError::ClusterUnavailable(e.api().message))
    }

    // ── ack, extend, nack ──

    /// Settles each of `handles` on the member that leased it: one outcome per handle.
    pub async fn settle(
        self: &Arc<Self>,
        topic: &str,
        handles: &[String],
        action: AckAction,
    ) -> Vec<Result<(), ApiError>> {
        let mut out: Vec<Option<Result<(), ApiError>>> = (0..handles.len()).map(|_| None).collect();
        let mut by_node: HashMap<u64, Vec<(usize, String)>> = HashMap::new();
        for (i, h) in handles.iter().enumerate() {
            match split_handle(h) {
                Some((node, inner)) => by_node.entry(node).or_default().push((i, inner.to_owned())),
                None => {
                    out[i] = Some(Err(ApiError::new(
                        ErrorCode::InvalidReceiptHandle,
                        "receipt handle is malformed",
                    )));
                }
            }
        }
        for (node, items) in by_node {
            if node == self.me() {
                let (at, inner): (Vec<usize>, Vec<String>) = items.into_iter().unzip();
                let results = self.broker.settle_many(topic, &inner, action).await;
                for (i, r) in at.into_iter().zip(results) {
                    out[i] = Some(r.map_err(ApiError::from));
                }
                continue;
            }
            match self.settle_on(node, topic, &items, action).await {
                Ok(outcomes) => {
                    for ((i, _), o) in items.into_iter().zip(outcomes) {
                        out[i] = Some(o.into_result());
                    }
                }
                Err(e) => {
                    for (i, _) in items {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(ApiError::new(
                        ErrorCode::ClusterUnavailable,
                        "not settled; retry",
                    ))
                })
            })
            .collect()
    }

    async fn settle_on(
        self: &Arc<Self>,
        node: u64,
        topic: &str,
        items: &[(usize, String)],
        action: AckAction,
    ) -> Result<Vec<SettleOutcome>, ApiError> {
        // a member no longer in the cluster: its leases are gone with it
        let Some(addr) = self.node.meta.addr_of(node) else {
            return Err(ApiError::new(
                ErrorCode::LeaseGone,
                format!(
                    "the receipt handle names node {node}, which is not a member of this cluster"
                ),
            ));
        };
        let req = SettleRequest {
            topic: topic.to_owned(),
            handles: items.iter().map(|(_, h)| h.clone()).collect(),
            action: Some(action_name(action).into_owned()),
            catalog: self.broker.followed(),
            deadline_ms: Some(
                self.broker
                    .now_ms()
                    .saturating_add(CALL_DEADLINE.as_millis() as i64),
            ),
        };
        let (op, body) = DataRequest::Settle {
            req,
            action: Some(action),
        }
        .frame();
        let reply = match self.call_rpc(node, &addr, op, body, CALL_DEADLINE).await {
            Ok(b) => b,
            Err(RpcError::Remote { fault, .. }) => return Err(from_fault(&fault)),
            // never reached the owner: surely not applied
            Err(e) if e.not_sent() => {
                return Err(ApiError::new(
                    ErrorCode::ClusterUnavailable,
                    format!(
                        "the member that leased the message could not be reached: {e}; not applied, retry"
                    ),
                ));
            }
            // it left: the owner may have applied it, or may still (it refuses one that
            // reaches it after `deadline_ms`, as its clock reads it)
            Err(e) => {
                return Err(ApiError::new(
                    ErrorCode::OutcomeUnknown,
                    format!(
                        "the member that leased the message did not answer: {e}; it may or may not have been applied: retry while the lease lasts (410 lease_gone then means it was, or the lease ended)"
                    ),
                ));
            }
        };
        // the owner ran the settle: a reply that cannot be read leaves its outcome unknown
        let outcomes: Vec<SettleOutcome> = serde_json::from_slice(&reply).map_err(|e| {
            ApiError::new(
                ErrorCode::OutcomeUnknown,
                format!("node {node} answered an ack with a malformed reply: {e}; it may or may not have been applied"),
            )
        })?;
        if outcomes.len() != items.len() {
            return Err(ApiError::new(
                ErrorCode::OutcomeUnknown,
                format!(
                    "node {node} answered a different number of outcomes; they may or may not have been applied"
                ),
            ));
        }
        Ok(outcomes)
    }
}

/// `<node_id>.<handle>` → (node id, the owner's own handle).
pub fn split_handle(h: &str) -> Option<(u64, &str)> {
    let (node, inner) = h.split_once('.')?;
    if node.is_empty()
        || node.len() > 20
        || !node.bytes().all(|b| b.is_ascii_digit())
        || inner.is_empty()
    {
        return None;
    }
    Some((node.parse().ok()?, inner))
}

/// A settle action as the settle call names it (`extend:<ms>` for a lease of its own
/// length).
fn action_name(a: AckAction) -> std::borrow::Cow<'static, str> {
    match a {
        AckAction::Ack => "ack".into(),
        AckAction::Extend => "extend".into(),
        AckAction::ExtendFor(ms) => format!("extend:{ms}").into(),
        AckAction::Nack => "nack".into(),
    }
}

/// A produce sent to `node` that did not answer: it may have written the messages, or may
/// still (a frozen owner resumed), so the answer says the outcome is unknown, not "not
/// applied". A retry is safe: at worst a duplicate.
fn unanswered_produce(node: u64, e: ApiError) -> ApiError {
    ApiError::new(
        ErrorCode::OutcomeUnknown,
        format!(
            "node {node}, the partition's owner, did not answer in time ({}): the message may or may not have been written; retry (a duplicate is possible)",
            e.message
        ),
    )
}

/// A message that may not move (pinned, or keyed under `strict`) whose owner is down.
fn owner_down(partition: u32, node: u64) -> ApiError {
    ApiError::new(
        ErrorCode::ClusterUnavailable,
        format!("partition {partition}'s owner (node {node}) cannot be reached; retry"),
    )
}

/// Fan-out copies from this member's cursors to child partitions other members own.
pub struct Copies(pub std::sync::Weak<Ingress>);

impl CopyForwarder for Copies {
    fn append(
        &self,
        owner: u64,
        topic: String,
        topic_id: u64,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BrokerError>> + Send>> {
        let ingress = self.0.upgrade();
        Box::pin(async move {
            let Some(ingress) = ingress else {
                return Err(BrokerError::ShuttingDown);
            };
            ingress
                .append_copies(owner, topic, topic_id, partition, records)
                .await
        })
    }
}

/// Writes the per-message outcomes of a produce as the batch reply.
pub fn batch_reply(outcomes: &[Outcome]) -> (axum::http::StatusCode, String) {
    let accepted = outcomes.iter().filter(|o| o.is_ok()).count();
    let mut out = String::with_capacity(32 + outcomes.len() * 32);
    let _ = write!(out, "{{\"accepted\":{accepted},\"results\":[");
    for (i, o) in outcomes.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        match o {
            Ok(r) => {
                let _ = write!(
                    out,
                    "{sep}{{\"partition\":{},\"offset\":{}}}",
                    r.partition, r.offset
                );
            }
            Err(e) => {
                // each failure in the shape of an error body
                let err = serde_json::json!({"error": e.message, "code": e.code.as_str()});
                let _ = write!(out, "{sep}{err}");
            }
        }
    }
    out.push_str("]}");
    let status = if accepted == outcomes.len() {
        axum::http::StatusCode::ACCEPTED
    } else {
        axum::http::StatusCode::MULTI_STATUS
    };
    (status, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_name_their_member() {
        assert_eq!(split_handle("12.abc"), Some((12, "abc")));
        for bad in [
            "",
            ".",
            "1.",
            ".x",
            "x.y",
            "+1.x",
            "-1.x",
            "1",
            "99999999999999999999999.x",
        ] {
            assert_eq!(split_handle(bad), None, "{bad}");
        }
    }
}
