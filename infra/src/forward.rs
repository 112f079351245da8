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
//!   every owner at once: here directly, at the others through a delivery token
//!   ([`WAIT_TOKEN`]: a waiter in the owner's FIFO line, no call held open), and the first
//!   owner with messages serves it (an owner pushes what its line hands a token,
//!   [`DELIVER`]). Whatever else was taken for the reader and cannot be answered is given
//!   back ([`Taken`] does it when dropped), and an owner whose answer to a look never
//!   reached this member takes it back itself ([`DataService::undelivered`]).
//! - **Ack, extend, nack**: a receipt handle names the member that leased it
//!   (`<node_id>.<handle>`); the call goes there.
//!
//! Every call names the catalog its sender acted on (how many catalog commands it had
//! followed): an owner that has not followed that far yet waits for it (briefly), so a topic
//! created or grown through one member takes messages through it at once.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use narad_cluster::rpc::{BoxFuture, Fault, Op, RpcError, Service};
use narad_core::broker::{
    AckAction, Broker, BrokerError, ChildInfo, CopyForwarder, Delivery, ProduceMessage, Produced,
    ReplayFrom,
};
use narad_core::record::NewRecord;
use narad_core::topic::KeyPolicy;
use narad_replay::ArchiveReader;

use crate::http::consume::history;
use narad_wire::ErrorCode;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::Semaphore;

use crate::cluster::ClusterNode;
use crate::http::{ApiError, render};

use narad_cluster::rpc::ops::{
    CANCEL_WAIT, CHILDREN, CONSUME, DELIVER, FANOUT_APPEND, GIVE_BACK, MIRROR_PROGRESS,
    MIRROR_REPORT, PRODUCE, REPLAY, SETTLE, STATS, WAIT_TOKEN,
};

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
    /// → the reader, which takes what that owner pushes ([`DELIVER`]).
    tokens: Mutex<HashMap<(u64, u64), tokio::sync::oneshot::Sender<Taken>>>,
    /// Per (topic id, partition): one past the highest offset this member saw acknowledged
    /// (produces it took), so that a partition whose owner is lost for good can be told
    /// how much of it was lost (see `crate::moves`). One entry per partition produced to.
    seen: Mutex<HashMap<(u64, u32), u64>>,
    /// Per (topic id, partition): the highest durable log end its owner reported here
    /// ([`narad_cluster::rpc::ops::WITNESS`]): so that an owner restored from an older copy of its data
    /// directory learns, at its start, how far it had acknowledged (see
    /// [`narad_core::broker::Broker::reopen_after`]). One entry per partition of the cluster.
    witnessed: Mutex<HashMap<(u64, u32), u64>>,
    /// Where `seen` and `witnessed` are kept across restarts ([`crate::acked_ends`]), and
    /// what was last written there.
    ends_file: Option<std::path::PathBuf>,
    ends_written: tokio::sync::Mutex<crate::acked_ends::Ends>,
    /// Tells the other voters the ends of what this member, as owner, acknowledges.
    witnesses: Arc<crate::witness::Witnesses>,
}

/// One message's outcome in a forwarded produce.
pub type Outcome = Result<Produced, ApiError>;

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
            Err(RpcError::Remote { fault, .. }) => Err(CallError::Answered(from_fault(&fault))),
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
        let owner = |p: u32| meta.owners.get(p as usize).copied().unwrap_or(self.me());
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
                m.partition = Some(match &m.key {
                    Some(k) if strict => narad_core::topic::partition_for_key(k, n),
                    Some(k) => {
                        let p = narad_core::topic::partition_for_key(k, n);
                        self.live_partition(p, n, &owner, &[])
                    }
                    None => self.live_partition(spread.place(), n, &owner, &[]),
                });
            }
        }
        let catalog = self.broker.followed();
        let mut out: Vec<Option<Outcome>> = (0..msgs.len()).map(|_| None).collect();
        // a message that cannot move, whose owner is known to be down, is told so at once
        let mut todo: Vec<usize> = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.iter().enumerate() {
            let p = m.partition.unwrap_or(0);
            if sticky[i] && self.is_down(owner(p)) {
                out[i] = Some(Err(owner_down(p, owner(p))));
            } else {
                todo.push(i);
            }
        }
        let mut failed: Vec<u64> = Vec::new();
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
                            let again = (1..=n)
                                .map(|d| (p + d) % n)
                                .find(|&q| owner(q) == self.me())
                                .unwrap_or_else(|| self.live_partition(p + 1, n, &owner, &failed));
                            if !sticky[i] && owner(again) != node {
                                msgs[i].partition = Some(again);
                                todo.push(i);
                            } else {
                                out[i] = Some(Err(e.clone()));
                            }
                        }
                    }
                    Err(e) => {
                        let e = match e {
                            CallError::Unreachable(e, true) => unanswered_produce(node, e),
                            e => e.api(),
                        };
                        for i in idx {
                            out[i] = Some(Err(e.clone()));
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
                let end = seen.entry((meta.id, p.partition)).or_insert(0);
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
        let seen = self.seen.lock().get(&(topic_id, p)).copied().unwrap_or(0);
        let witnessed = self
            .witnessed
            .lock()
            .get(&(topic_id, p))
            .copied()
            .unwrap_or(0);
        seen.max(witnessed)
    }

    /// Takes an owner's report of its partitions' durable log ends (each only ever grows for
    /// one topic incarnation: moves copy whole logs, rebuilds start above what was seen).
    pub fn witness(&self, ends: &[(u64, u32, u64)]) {
        let mut w = self.witnessed.lock();
        for &(t, p, end) in ends {
            let e = w.entry((t, p)).or_insert(0);
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
        self.witnessed.lock().retain(|(t, _), _| live.contains(t));
        self.seen.lock().retain(|(t, _), _| live.contains(t));
    }

    /// `p`, or the next partition after it whose owner is not known to be down (nor in
    /// `failed`); `p` itself when every owner is.
    fn live_partition(&self, p: u32, n: u32, owner: &impl Fn(u32) -> u64, failed: &[u64]) -> u32 {
        (0..n)
            .map(|i| (p + i) % n)
            .find(|&q| {
                let o = owner(q);
                !failed.contains(&o) && !self.is_down(o)
            })
            .unwrap_or(p % n)
    }

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
        let body = encode_produce(topic, topic_id, catalog, &msgs);
        let reply = self.call(node, PRODUCE, body, deadline).await?;
        let malformed = |what: String| {
            CallError::Answered(ApiError::new(
                ErrorCode::ClusterUnavailable,
                format!("node {node} answered a produce with {what}"),
            ))
        };
        let produced =
            decode_produced(&reply).ok_or_else(|| malformed("a malformed reply".into()))?;
        if produced.len() != msgs.len() {
            return Err(malformed(format!(
                "{} outcomes for {} messages",
                produced.len(),
                msgs.len()
            )));
        }
        Ok(produced)
    }

    // ── consume ──

    /// Leases up to `max` messages from the topic's owners, this member included, waiting up
    /// to `wait` in every owner's line when there are none: the messages as JSON objects
    /// (handles naming their owner). Dropped before [`Taken::sent`], they are given back.
    ///
    /// `user` (security on): whose share of the delivery-token slots a wait takes.
    pub async fn consume(
        self: &Arc<Self>,
        topic: &str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
        user: Option<&str>,
    ) -> Result<Taken, ApiError> {
        let meta = self.broker.topic_meta(topic)?;
        if let Some(p) = partition {
            if p >= meta.config.partitions {
                return Err(BrokerError::PartitionOutOfRange {
                    index: None,
                    partition: p,
                    partitions: meta.config.partitions,
                }
                .into());
            }
            let owner = meta.owners.get(p as usize).copied().unwrap_or(self.me());
            if wait.is_zero() {
                return self
                    .consume_on(owner, topic, partition, max, wait, 0)
                    .await
                    .map_err(CallError::api);
            }
            if owner == self.me() {
                // (in a line that follows the partition if it moves away meanwhile)
                return self
                    .wait_in_lines(vec![owner], topic, partition, max, wait, user)
                    .await;
            }
            // another member's partition: a look, then a token in its owner's line
            let taken = self
                .consume_on(owner, topic, partition, max, Duration::ZERO, 0)
                .await
                .map_err(CallError::api)?;
            if !taken.is_empty() {
                return Ok(taken);
            }
            return self
                .wait_in_lines(vec![owner], topic, partition, max, wait, user)
                .await;
        }
        let mut owners: Vec<u64> = meta.owners.clone();
        owners.push(self.me());
        owners.sort_unstable();
        owners.dedup();
        // a rotating start, so no owner (this one included) is always asked first
        let start = self.broker.consume_cursor(topic)? as usize % owners.len();
        owners.rotate_left(start);
        let mut taken = Taken::default();
        // an owner's error answer (a partition it cannot read, say) is the reply only if no
        // other owner had a message to give, as on a single node
        let mut failed = None;
        for &o in &owners {
            // one reply's worth, as on a single node (each owner stops at its own 4 MiB, so
            // a reply holds at most one owner's more)
            if taken.len() >= max || taken.bytes() >= narad_core::broker::MAX_READ_BYTES {
                break;
            }
            if self.is_down(o) {
                continue;
            }
            match self
                .consume_on(o, topic, None, max - taken.len(), Duration::ZERO, 0)
                .await
            {
                Ok(t) => taken.extend(t),
                Err(CallError::Unreachable(..)) => {}
                Err(CallError::Answered(e)) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if taken.is_empty()
            && let Some(e) = failed
        {
            return Err(e);
        }
        if !taken.is_empty() || wait.is_zero() {
            return Ok(taken);
        }
        self.wait_in_lines(owners, topic, None, max, wait, user)
            .await
    }

    /// Nothing anywhere: waits up to `wait` in the line of every one of `owners` at once
    /// (this member's directly, the others' through a delivery token each); the first to
    /// serve wins, and what the others hand over later is given back. A partition that
    /// moves meanwhile to a member not waited on yet (the topic's, or `partition` alone)
    /// brings that member's line in too, so a reader parked across a move is woken by it.
    async fn wait_in_lines(
        self: &Arc<Self>,
        owners: Vec<u64>,
        topic: &str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
        user: Option<&str>,
    ) -> Result<Taken, ApiError> {
        let mut waits = Waits {
            set: tokio::task::JoinSet::new(),
            local: None,
            remote: Vec::new(),
            ingress: self.clone(),
            stop: tokio_util::sync::CancellationToken::new(),
        };
        let until = tokio::time::Instant::now() + wait;
        let mut changes = self.broker.catalog_changes();
        changes.mark_unchanged();
        let mut following = true;
        let mut waited: Vec<u64> = Vec::with_capacity(owners.len());
        for o in owners {
            self.wait_in_line(
                &mut waits,
                &mut waited,
                o,
                topic,
                partition,
                max,
                until,
                user,
            );
        }
        let mut first_err = None;
        loop {
            let r = tokio::select! {
                r = waits.set.join_next() => match r {
                    Some(r) => r,
                    None => break,
                },
                c = changes.changed(), if following => {
                    if c.is_err() {
                        // (the broker is going away: the waits end with it)
                        following = false;
                        continue;
                    }
                    if let Ok(meta) = self.broker.topic_meta(topic) {
                        let now: Vec<u64> = match partition {
                            Some(p) => meta.owners.get(p as usize).copied().into_iter().collect(),
                            None => meta.owners.clone(),
                        };
                        for o in now {
                            if !waited.contains(&o) {
                                self.wait_in_line(&mut waits, &mut waited, o, topic, partition, max, until, user);
                            }
                        }
                    }
                    continue;
                }
            };
            match r {
                Ok(Ok(t)) if !t.is_empty() => return Ok(t),
                Ok(Ok(_)) | Err(_) | Ok(Err(CallError::Unreachable(..))) => {}
                Ok(Err(CallError::Answered(e))) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if e.code != ErrorCode::ClusterUnavailable => Err(e),
            _ => Ok(Taken::default()),
        }
    }

    /// Starts the reader's wait in member `o`'s line until `until` (see
    /// [`Self::wait_in_lines`]), and notes `o` in `waited`.
    #[allow(clippy::too_many_arguments)]
    fn wait_in_line(
        self: &Arc<Self>,
        waits: &mut Waits,
        waited: &mut Vec<u64>,
        o: u64,
        topic: &str,
        partition: Option<u32>,
        max: usize,
        until: tokio::time::Instant,
        user: Option<&str>,
    ) {
        waited.push(o);
        let (me, topic) = (self.clone(), topic.to_owned());
        if o == self.me() {
            let wait = until.saturating_duration_since(tokio::time::Instant::now());
            let h = waits
                .set
                .spawn(async move { me.consume_on(o, &topic, partition, max, wait, 0).await });
            waits.local = Some(h);
            return;
        }
        if self.is_down(o) {
            return;
        }
        // a reader beyond the member's tokens there queues for a slot (it is woken when
        // one frees, with what is left of its wait)
        let slots = self.wait_slots(o);
        let share = user.map(|u| UserSlots::of(&self.user_waits, o, u));
        let id = narad_core::random_u64() | 1;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tokens.lock().insert((o, id), tx);
        waits.remote.push((o, id));
        let stop = waits.stop.clone();
        waits.set.spawn(async move {
            // the user's share first, then the member's slot: a user's readers beyond
            // its share wait behind one another, never ahead of other users'
            let _share = match &share {
                None => None,
                Some(share) => {
                    let s = tokio::select! {
                        s = tokio::time::timeout_at(until, share.sem.clone().acquire_owned()) => s,
                        () = stop.cancelled() => return Ok(Taken::default()),
                    };
                    let Ok(Ok(s)) = s else {
                        return Ok(Taken::default());
                    };
                    Some(s)
                }
            };
            let slot = tokio::select! {
                s = tokio::time::timeout_at(until, slots.acquire_owned()) => s,
                () = stop.cancelled() => return Ok(Taken::default()),
            };
            let Ok(Ok(_slot)) = slot else {
                return Ok(Taken::default());
            };
            let mut rx = rx;
            loop {
                let now = tokio::time::Instant::now();
                let left = until.saturating_duration_since(now);
                if left <= TOKEN_MARGIN || stop.is_cancelled() {
                    return Ok(Taken::default());
                }
                // a token in the owner's line for at most TOKEN_TTL: what the line hands
                // it is pushed here; one that ended (or that the owner dropped, or lost
                // in a restart) is left again, so a reader is never forgotten for long
                let ttl = left.min(TOKEN_TTL);
                match me
                    .leave_token(o, &topic, partition, max, ttl - TOKEN_MARGIN, id)
                    .await
                {
                    Ok(()) | Err(CallError::Unreachable(..)) => {}
                    Err(e) => return Err(e),
                }
                match tokio::time::timeout_at(now + ttl, &mut rx).await {
                    Ok(Ok(taken)) => return Ok(taken),
                    Ok(Err(_)) => return Ok(Taken::default()),
                    Err(_) => {}
                }
            }
        });
    }

    /// Leaves delivery token `id` in member `node`'s line for a reader here: the owner
    /// answers at once, keeps the token for `wait`, and pushes what its line hands the
    /// token ([`DELIVER`]).
    async fn leave_token(
        self: &Arc<Self>,
        node: u64,
        topic: &str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
        id: u64,
    ) -> Result<(), CallError> {
        let req = ConsumeRequest {
            topic: topic.to_owned(),
            partition,
            max,
            wait_ms: wait.as_millis() as u64,
            catalog: self.broker.followed(),
            wait_id: id,
        };
        let body = Bytes::from(serde_json::to_vec(&req).expect("requests serialise"));
        self.call(node, WAIT_TOKEN, body, CALL_DEADLINE)
            .await
            .map(|_| ())
    }

    /// What owner `from` pushed for token `id` (its handles name the owner): handed to the
    /// reader that left the token, or given back at once if that reader is gone.
    fn delivered(
        self: &Arc<Self>,
        from: u64,
        topic: String,
        id: u64,
        messages: Vec<Box<RawValue>>,
    ) {
        let mut taken = Taken::from_remote(from, messages);
        taken.owner = Some((self.clone(), topic));
        if let Some(tx) = self.tokens.lock().remove(&(from, id)) {
            // (a reader gone meanwhile drops it: given back then)
            let _ = tx.send(taken);
        }
    }

    /// The slots for long-polls waiting at member `id`.
    fn wait_slots(&self, id: u64) -> Arc<Semaphore> {
        self.waits
            .lock()
            .entry(id)
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_WAITS_PER_MEMBER)))
            .clone()
    }

    /// Consumes on `node`; a remote wait names itself with `wait_id` (non-zero), so it can
    /// be cancelled ([`CANCEL_WAIT`]).
    async fn consume_on(
        self: &Arc<Self>,
        node: u64,
        topic: &str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
        wait_id: u64,
    ) -> Result<Taken, CallError> {
        if node == self.me() {
            let got = self
                .broker
                .consume(topic, partition, max, wait)
                .await
                .map_err(|e| CallError::Answered(e.into()))?;
            let mut t = Taken::local(topic, self.me(), got);
            t.owner = Some((self.clone(), topic.to_owned()));
            return Ok(t);
        }
        let req = ConsumeRequest {
            topic: topic.to_owned(),
            partition,
            max,
            wait_ms: wait.as_millis() as u64,
            catalog: self.broker.followed(),
            wait_id,
        };
        let body = Bytes::from(serde_json::to_vec(&req).expect("requests serialise"));
        let deadline = if wait.is_zero() {
            CALL_DEADLINE
        } else {
            wait + WAIT_SLACK
        };
        let reply = self.call(node, CONSUME, body, deadline).await?;
        let messages: Vec<Box<RawValue>> = serde_json::from_slice(&reply).map_err(|e| {
            CallError::Answered(ApiError::new(
                ErrorCode::ClusterUnavailable,
                format!("node {node} answered a consume with a malformed reply: {e}"),
            ))
        })?;
        let mut t = Taken::from_remote(node, messages);
        t.owner = Some((self.clone(), topic.to_owned()));
        Ok(t)
    }

    /// Gives back messages taken for a reader that was not answered.
    fn give_back(&self, topic: &str, local: &[Delivery], remote: Vec<(u64, String)>) {
        if !local.is_empty() {
            self.broker.give_back(topic, local);
        }
        let mut by_node: HashMap<u64, Vec<String>> = HashMap::new();
        for (node, h) in remote {
            by_node.entry(node).or_default().push(h);
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for (node, handles) in by_node {
            let req = SettleRequest {
                topic: topic.to_owned(),
                handles,
                action: None,
                catalog: 0,
                deadline_ms: None,
            };
            let body = Bytes::from(serde_json::to_vec(&req).expect("requests serialise"));
            let Some(addr) = self.node.meta.addr_of(node) else {
                continue;
            };
            let rpc = self.node.meta.rpc().clone();
            // best effort: a message not given back is redelivered after its lease
            rt.spawn(async move {
                let _ = rpc.call(node, &addr, GIVE_BACK, body, CALL_DEADLINE).await;
            });
        }
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
        let owner = meta
            .owners
            .get(partition as usize)
            .copied()
            .unwrap_or(self.me());
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
        let body = Bytes::from(serde_json::to_vec(&req).expect("requests serialise"));
        let reply = self
            .call(owner, REPLAY, body, CALL_DEADLINE)
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
        op: Op,
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
        let body = Bytes::from(serde_json::to_vec(&req).expect("requests serialise"));
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

    /// The figures of the partitions of `meta` other members own (or only of `only`), from
    /// their owners, and the partitions whose owner could not be asked.
    pub(crate) async fn partition_stats(
        self: &Arc<Self>,
        meta: &narad_core::catalog::TopicMeta,
        only: Option<u32>,
    ) -> (Vec<crate::http::topics::PartitionStatsJson>, Vec<u32>) {
        let mut stats = Vec::new();
        let mut missing = Vec::new();
        for (parts, got) in self
            .ask_owners::<Vec<crate::http::topics::PartitionStatsJson>>(meta, only, STATS)
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
        let body = Bytes::from(serde_json::to_vec(&req).expect("requests serialise"));
        self.call_each(self.other_owners(meta), MIRROR_PROGRESS, body)
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
        let body = Bytes::from(serde_json::to_vec(&req).expect("requests serialise"));
        let (mut reports, mut settled, mut unanswered) = (Vec::new(), 0, Vec::new());
        for (node, got) in self
            .call_each(self.other_owners(meta), MIRROR_REPORT, body)
            .await
        {
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
        let mut stats = crate::http::topics::local_stats(&self.broker, &info, None);
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
            .ask_owners::<Vec<ChildInfo>>(parent, None, CHILDREN)
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
        let msgs: Vec<ProduceMessage> = records
            .into_iter()
            .map(|r| ProduceMessage {
                key: r.key,
                partition: Some(partition),
                delay_ms: (r.delay_ms > 0).then_some(i64::from(r.delay_ms)),
                headers: r.headers,
                payload: r.payload,
            })
            .collect();
        let body = encode_produce(&topic, topic_id, self.broker.followed(), &msgs);
        self.call(owner, FANOUT_APPEND, body, CALL_DEADLINE)
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
            action: Some(action_name(action).to_owned()),
            catalog: self.broker.followed(),
            deadline_ms: Some(
                self.broker
                    .now_ms()
                    .saturating_add(CALL_DEADLINE.as_millis() as i64),
            ),
        };
        let body = Bytes::from(serde_json::to_vec(&req).expect("requests serialise"));
        let reply = match self
            .call_rpc(node, &addr, SETTLE, body, CALL_DEADLINE)
            .await
        {
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

/// Per (member, user): the user's share of the delivery-token slots at that member.
type UserSlotTable = Mutex<HashMap<(u64, String), Arc<Semaphore>>>;

/// A reader's hold on its user's share of the delivery-token slots at one member (see
/// [`MAX_WAITS_PER_USER`]): its semaphore, and on drop, the table entry removed once no
/// reader of the user holds or waits for it.
struct UserSlots {
    sem: Arc<Semaphore>,
    key: (u64, String),
    table: Arc<UserSlotTable>,
}

impl UserSlots {
    fn of(table: &Arc<UserSlotTable>, member: u64, user: &str) -> Self {
        let key = (member, user.to_owned());
        let sem = table
            .lock()
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_WAITS_PER_USER)))
            .clone();
        Self {
            sem,
            key,
            table: table.clone(),
        }
    }
}

impl Drop for UserSlots {
    fn drop(&mut self) {
        let mut table = self.table.lock();
        // the table's and this one's: nobody else holds or waits for the share
        if Arc::strong_count(&self.sem) == 2 {
            table.remove(&self.key);
        }
    }
}

/// A reader's waits at every owner. When it ends (one owner served it, or the reader went
/// away) the wait here is abandoned (the local line is cancel-safe) and the remote ones are
/// cancelled at their owners and left to finish on their own: an owner that served one
/// meanwhile answers with the messages, which are given back when that answer drops. (An
/// abandoned call could lose an answer already on its way; a cancelled one cannot.)
struct Waits {
    set: tokio::task::JoinSet<Result<Taken, CallError>>,
    local: Option<tokio::task::AbortHandle>,
    remote: Vec<(u64, u64)>,
    ingress: Arc<Ingress>,
    /// Ends the waits still queueing for a slot (they never start).
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Waits {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(h) = self.local.take() {
            h.abort();
        }
        // (a token's task holds its reader's end: what an owner pushes later is given back)
        self.set.abort_all();
        {
            let mut tokens = self.ingress.tokens.lock();
            for token in &self.remote {
                tokens.remove(token);
            }
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for (node, wait_id) in self.remote.drain(..) {
            let Some(addr) = self.ingress.node.meta.addr_of(node) else {
                continue;
            };
            let rpc = self.ingress.node.meta.rpc().clone();
            let body = Bytes::from(
                serde_json::to_vec(&CancelWait { wait_id }).expect("requests serialise"),
            );
            rt.spawn(async move {
                let _ = rpc
                    .call(node, &addr, CANCEL_WAIT, body, CALL_DEADLINE)
                    .await;
            });
        }
    }
}

/// Messages a consume took for a reader, rendered, and how to give them back: dropped
/// before [`Taken::sent`] (the reader went away, the reply did not fit the budget, another
/// owner served the reader first), they are given back at once.
#[derive(Default)]
pub struct Taken {
    pub messages: Vec<Box<RawValue>>,
    /// Leased on this member.
    local: Vec<Delivery>,
    /// Leased on other members: (member, its own handle).
    remote: Vec<(u64, String)>,
    /// Who gives them back, for which topic (`None`: nothing to give back).
    owner: Option<(Arc<Ingress>, String)>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some((ingress, topic)) = self.owner.take()
            && !(self.local.is_empty() && self.remote.is_empty())
        {
            ingress.give_back(&topic, &self.local, std::mem::take(&mut self.remote));
        }
    }
}

impl Taken {
    fn local(topic: &str, me: u64, got: Vec<Delivery>) -> Self {
        let messages = got
            .iter()
            .map(|d| {
                let handle = format!("{me}.{}", d.receipt_handle);
                raw(&render::delivery_as(topic, d, &handle))
            })
            .collect();
        Self {
            messages,
            local: got,
            remote: Vec::new(),
            owner: None,
        }
    }

    /// Messages an owner answered (their handles already name it).
    fn from_remote(node: u64, messages: Vec<Box<RawValue>>) -> Self {
        let remote = messages
            .iter()
            .filter_map(|m| serde_json::from_str::<HandleOnly>(m.get()).ok())
            .filter_map(|h| {
                split_handle(&h.receipt_handle).map(|(_, inner)| (node, inner.to_owned()))
            })
            .collect();
        Self {
            messages,
            local: Vec::new(),
            remote,
            owner: None,
        }
    }

    /// Messages of a replay read (nothing leased).
    pub fn read(messages: Vec<Box<RawValue>>) -> Self {
        Self {
            messages,
            local: Vec::new(),
            remote: Vec::new(),
            owner: None,
        }
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// The messages' size as JSON.
    fn bytes(&self) -> usize {
        self.messages.iter().map(|m| m.get().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    fn extend(&mut self, mut other: Taken) {
        self.messages.append(&mut other.messages);
        self.local.append(&mut other.local);
        self.remote.append(&mut other.remote);
        if self.owner.is_none() {
            self.owner = other.owner.take();
        }
    }

    /// The reply body: one message alone, or `{"messages": [...]}`.
    pub fn body(&self, batch: bool) -> String {
        if !batch {
            return self
                .messages
                .first()
                .map(|m| m.get().to_owned())
                .unwrap_or_default();
        }
        let mut out = String::from("{\"messages\":[");
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(m.get());
        }
        out.push_str("]}");
        out
    }

    /// The messages went out in a reply: nothing to give back any more.
    pub fn sent(mut self) {
        self.owner = None;
    }
}

#[derive(Deserialize)]
struct HandleOnly {
    receipt_handle: String,
}

#[derive(Deserialize)]
struct TopicAndHandle {
    topic: String,
    receipt_handle: String,
}

fn raw<T: Serialize>(v: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).expect("messages serialise")
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

fn action_name(a: AckAction) -> &'static str {
    match a {
        AckAction::Ack => "ack",
        AckAction::Extend => "extend",
        AckAction::Nack => "nack",
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

fn from_fault(f: &Fault) -> ApiError {
    match ErrorCode::from_code(&f.code) {
        Some(code) => ApiError::new(code, f.message.clone()),
        None => ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!("the owner answered {} {}: {}", f.status, f.code, f.message),
        ),
    }
}

fn to_fault(e: &ApiError) -> Fault {
    Fault::new(e.code.http_status(), e.code.as_str(), e.message.clone())
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumeRequest {
    topic: String,
    partition: Option<u32>,
    max: usize,
    wait_ms: u64,
    /// Catalog commands the sender had followed.
    catalog: u64,
    /// Names a wait so the sender can cancel it (0: not cancellable).
    #[serde(default)]
    wait_id: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelWait {
    wait_id: u64,
}

/// One progress message of a mirror's source, passed on to the members that own the
/// mirror's other partitions (the member the link reached checked it).
#[derive(Debug, Serialize, Deserialize)]
pub struct MirrorProgressRequest {
    pub topic: String,
    pub topic_id: u64,
    pub catalog: u64,
    pub source: narad_core::catalog::role::Source,
    pub partition: u32,
    pub progress: narad_core::broker::PartitionProgress,
    #[serde(default)]
    pub end: Option<narad_core::broker::SourceEnd>,
    #[serde(default)]
    pub returned: Vec<(u32, u64, u64)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct MirrorReportRequest {
    topic: String,
    topic_id: u64,
    catalog: u64,
    /// A promote's last look: settle what the progress covers and drop the index.
    last: bool,
}

/// One member's share of a mirror's report (`last`: only what it settled).
#[derive(Debug, Default, Serialize, Deserialize)]
struct MirrorReportReply {
    report: Option<narad_core::broker::MirrorReport>,
    settled: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatsRequest {
    topic: String,
    catalog: u64,
    /// The incarnation the caller means: an owner holding another answers `404` (its
    /// figures would be another topic's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic_id: Option<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    topic: String,
    partition: u32,
    offset: Option<u64>,
    from_time_ms: Option<i64>,
    max: usize,
    catalog: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleRequest {
    topic: String,
    handles: Vec<String>,
    /// `None`: give the leases back (a consume that could not be answered).
    action: Option<String>,
    catalog: u64,
    /// When the caller gives up waiting for the answer (its clock, ms since the epoch): a
    /// settle that reaches the owner later is refused, not applied, so a caller that answered
    /// "unknown" is not followed by a late apply when clocks are in step. Absent: no limit
    /// (a give-back, which must always take effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deadline_ms: Option<i64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleOutcome {
    code: Option<String>,
    message: Option<String>,
}

impl SettleOutcome {
    fn of(r: Result<(), ApiError>) -> Self {
        match r {
            Ok(()) => Self {
                code: None,
                message: None,
            },
            Err(e) => Self {
                code: Some(e.code.as_str().to_owned()),
                message: Some(e.message),
            },
        }
    }

    fn into_result(self) -> Result<(), ApiError> {
        match self.code {
            None => Ok(()),
            Some(code) => Err(from_fault(&Fault::new(
                0,
                code,
                self.message.unwrap_or_default(),
            ))),
        }
    }
}

// ── the produce call's encoding ──
//
// Records travel as bytes (no JSON escaping of payloads): u64 topic id, u64 catalog, u16 name
// length, name, u32 count, then per message: u32 partition, u8 flags (1: key, 2: delay), [u32
// key length, key], [i64 delay], u16 header count, per header (u16 name length, name, u32
// value length, value), u32 payload length, payload. The reply: u32 count, then (u32
// partition, u64 offset) per message.

/// The fewest bytes one message takes: partition, flags, header count, payload length.
const MIN_MESSAGE_BYTES: usize = 4 + 1 + 2 + 4;

fn encode_produce(topic: &str, topic_id: u64, catalog: u64, msgs: &[ProduceMessage]) -> Bytes {
    let size: usize = msgs
        .iter()
        .map(|m| {
            24 + m.key.as_ref().map_or(0, Bytes::len)
                + m.headers
                    .iter()
                    .map(|(k, v)| 6 + k.len() + v.len())
                    .sum::<usize>()
                + m.payload.len()
        })
        .sum();
    let mut b = BytesMut::with_capacity(24 + topic.len() + size);
    b.put_u64(topic_id);
    b.put_u64(catalog);
    b.put_u16(topic.len() as u16);
    b.put_slice(topic.as_bytes());
    b.put_u32(msgs.len() as u32);
    for m in msgs {
        b.put_u32(m.partition.unwrap_or(0));
        let flags = u8::from(m.key.is_some()) | (u8::from(m.delay_ms.is_some()) << 1);
        b.put_u8(flags);
        if let Some(k) = &m.key {
            b.put_u32(k.len() as u32);
            b.put_slice(k);
        }
        if let Some(d) = m.delay_ms {
            b.put_i64(d);
        }
        b.put_u16(m.headers.len() as u16);
        for (k, v) in &m.headers {
            b.put_u16(k.len() as u16);
            b.put_slice(k.as_bytes());
            b.put_u32(v.len() as u32);
            b.put_slice(v);
        }
        b.put_u32(m.payload.len() as u32);
        b.put_slice(&m.payload);
    }
    b.freeze()
}

/// A bounds-checked reader over a request: every read that would run past the end is
/// `None`, never a panic (another member's bytes carry a client's).
struct Reader {
    b: Bytes,
    at: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> Option<Bytes> {
        let end = self.at.checked_add(n)?;
        if end > self.b.len() {
            return None;
        }
        let s = self.b.slice(self.at..end);
        self.at = end;
        Some(s)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.as_ref().try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.array()?))
    }

    fn left(&self) -> usize {
        self.b.len() - self.at
    }
}

struct ProduceRequest {
    topic: String,
    topic_id: u64,
    catalog: u64,
    msgs: Vec<ProduceMessage>,
}

fn decode_produce(body: Bytes) -> Option<ProduceRequest> {
    let mut r = Reader { b: body, at: 0 };
    let topic_id = r.u64()?;
    let catalog = r.u64()?;
    let len = r.u16()? as usize;
    let topic = String::from_utf8(r.take(len)?.to_vec()).ok()?;
    let count = r.u32()? as usize;
    // a count that the bytes left cannot hold is a lie (and would size a huge Vec)
    if count > r.left() / MIN_MESSAGE_BYTES {
        return None;
    }
    let mut msgs = Vec::with_capacity(count);
    for _ in 0..count {
        let partition = r.u32()?;
        let flags = r.u8()?;
        if flags & !3 != 0 {
            return None;
        }
        let key = if flags & 1 != 0 {
            let n = r.u32()? as usize;
            Some(r.take(n)?)
        } else {
            None
        };
        let delay_ms = if flags & 2 != 0 {
            Some(i64::from_be_bytes(r.array()?))
        } else {
            None
        };
        let nh = r.u16()? as usize;
        let mut headers = Vec::with_capacity(nh.min(64));
        for _ in 0..nh {
            let kl = r.u16()? as usize;
            let k = String::from_utf8(r.take(kl)?.to_vec()).ok()?;
            let vl = r.u32()? as usize;
            headers.push((k, r.take(vl)?));
        }
        let pl = r.u32()? as usize;
        let payload = r.take(pl)?;
        msgs.push(ProduceMessage {
            key,
            partition: Some(partition),
            delay_ms,
            headers,
            payload,
        });
    }
    (r.left() == 0).then_some(ProduceRequest {
        topic,
        topic_id,
        catalog,
        msgs,
    })
}

fn encode_produced(produced: &[Produced]) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + produced.len() * 12);
    b.put_u32(produced.len() as u32);
    for p in produced {
        b.put_u32(p.partition);
        b.put_u64(p.offset);
    }
    b.freeze()
}

fn decode_produced(body: &Bytes) -> Option<Vec<Produced>> {
    let mut r = Reader {
        b: body.clone(),
        at: 0,
    };
    let count = r.u32()? as usize;
    if count > r.left() / 12 {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(Produced {
            partition: r.u32()?,
            offset: r.u64()?,
        });
    }
    (r.left() == 0).then_some(out)
}

// ── this member's side ──

/// Waits other members may cancel: (member, wait id) → what ends the wait.
/// Waits and tokens other members may cancel: (member, id) → (the registration's own
/// number, its cancel). A token left again under the same id is a new registration: the
/// old one's end must not remove it.
pub type CancellableWaits =
    Arc<Mutex<HashMap<(u64, u64), (u64, tokio::sync::oneshot::Sender<()>)>>>;

/// Serves the other members' produce, consume, replay and ack calls on this member's
/// broker.
pub struct DataService {
    pub broker: Arc<Broker>,
    pub me: u64,
    /// History older than local data, for replay reads of this member's partitions.
    pub archive: Option<Arc<ArchiveReader>>,
    /// Waits (and delivery tokens) other members may cancel, by (member, id).
    pub waits: CancellableWaits,
    /// Cancels that found nothing to cancel, for a few seconds: a reader that gave up at
    /// once sends its cancel right behind its token, and the cancel may arrive first; the
    /// token it overtook is then not kept (it would take messages for nobody).
    cancelled: Arc<Mutex<HashMap<(u64, u64), Instant>>>,
    pushes: Arc<Pushes>,
    /// This member's ingress: its readers' tokens take what other owners push, and it
    /// pushes what its line hands the others' tokens.
    ingress: std::sync::Weak<Ingress>,
    /// This member's partition mover (its progress, for `GET /v1/cluster/moves`).
    mover: Option<Arc<crate::moves::Mover>>,
}

/// How long a cancel that overtook its token is remembered, and how many are.
const CANCEL_MEMORY: Duration = Duration::from_secs(10);
const MAX_CANCEL_MEMORY: usize = 4096;

/// Remembers a cancel that found no wait (bounded: the oldest are forgotten first, and a
/// full table forgets the new one, which only lets an orphan token live its wait).
fn remember_cancel(cancelled: &Mutex<HashMap<(u64, u64), Instant>>, key: (u64, u64)) {
    let mut c = cancelled.lock();
    if c.len() >= MAX_CANCEL_MEMORY {
        c.retain(|_, at| at.elapsed() < CANCEL_MEMORY);
    }
    if c.len() < MAX_CANCEL_MEMORY {
        c.insert(key, Instant::now());
    }
}

/// Ends every wait and token member `from` has here: a push to it failed, so its readers'
/// tokens would go on taking messages that cannot reach them (each held until its lease
/// ends). Its readers, if alive, are served by the other owners or leave new tokens.
fn drop_tokens_of(waits: &CancellableWaits, from: u64) {
    let gone: Vec<_> = {
        let mut w = waits.lock();
        let keys: Vec<(u64, u64)> = w.keys().filter(|k| k.0 == from).copied().collect();
        keys.into_iter().filter_map(|k| w.remove(&k)).collect()
    };
    for (_, tx) in gone {
        let _ = tx.send(());
    }
}

impl DataService {
    pub fn new(ingress: &Arc<Ingress>, mover: Option<Arc<crate::moves::Mover>>) -> Self {
        Self {
            broker: ingress.broker.clone(),
            me: ingress.me(),
            archive: ingress.archive.clone(),
            waits: Arc::default(),
            cancelled: Arc::default(),
            pushes: Arc::default(),
            ingress: Arc::downgrade(ingress),
            mover,
        }
    }
}

/// A delivery token left by another member's reader: what this owner's line hands it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Delivered {
    topic: String,
    token: u64,
    messages: Vec<Box<RawValue>>,
}

/// Keeps token `req.wait_id` of member `from` in this owner's line for `req.wait_ms`, then
/// pushes what the line handed it to `from` ([`DELIVER`]). Once the push reached `from`,
/// the messages are its to hand on or give back; a push that surely never left gives them
/// back here; one whose fate is unknown leaves them leased (redelivered after their lease,
/// never to two readers at once).
/// Pushes this owner sends to one member at once. A member that died (or froze) is found
/// out by the first push to it failing, up to [`CALL_DEADLINE`] later; the pushes already
/// under way then stay leased until their lease ends (their fate is unknown), so this
/// bounds what a dead member can hold: this many pushes of at most 100 messages each. The
/// pushes that wait for a slot meanwhile give their messages back instead.
const PUSHES_PER_MEMBER: usize = 8;

/// The pushes to each member: their slots, and how many times a push to it failed (a
/// token left before the latest failure is not pushed to).
#[derive(Default)]
pub struct Pushes {
    slots: Mutex<HashMap<u64, Arc<Semaphore>>>,
    failures: Mutex<HashMap<u64, u64>>,
}

impl Pushes {
    fn failures(&self, member: u64) -> u64 {
        self.failures.lock().get(&member).copied().unwrap_or(0)
    }

    fn failed(&self, member: u64) {
        *self.failures.lock().entry(member).or_default() += 1;
    }

    fn slots(&self, member: u64) -> Arc<Semaphore> {
        self.slots
            .lock()
            .entry(member)
            .or_insert_with(|| Arc::new(Semaphore::new(PUSHES_PER_MEMBER)))
            .clone()
    }
}

async fn keep_token(
    broker: Arc<Broker>,
    ingress: std::sync::Weak<Ingress>,
    (waits, pushes): (CancellableWaits, Arc<Pushes>),
    from: u64,
    req: ConsumeRequest,
    cancelled: tokio::sync::oneshot::Receiver<()>,
) {
    let failures = pushes.failures(from);
    let wait = Duration::from_millis(req.wait_ms.min(3_600_000));
    let max = req.max.clamp(1, 100);
    let got = tokio::select! {
        got = broker.consume(&req.topic, req.partition, max, wait) => got,
        _ = cancelled => return,
    };
    let Ok(got) = got else { return };
    if got.is_empty() {
        return;
    }
    let Some(ingress) = ingress.upgrade() else {
        broker.give_back(&req.topic, &got);
        return;
    };
    // one of the member's push slots; a push to it that failed meanwhile means the reader
    // this token was left for is unreachable: the messages go back, never sent
    let slots = pushes.slots(from);
    let _slot = slots.acquire().await;
    if pushes.failures(from) != failures {
        broker.give_back(&req.topic, &got);
        return;
    }
    let me = ingress.me();
    let mut taken = Taken::local(&req.topic, me, got);
    let body = Bytes::from(
        serde_json::to_vec(&Delivered {
            topic: req.topic.clone(),
            token: req.wait_id,
            messages: std::mem::take(&mut taken.messages),
        })
        .expect("deliveries serialise"),
    );
    let pushed = match ingress.node.meta.addr_of(from) {
        Some(addr) => {
            ingress
                .node
                .meta
                .rpc()
                .call(from, &addr, DELIVER, body, CALL_DEADLINE)
                .await
        }
        None => Err(RpcError::Unreachable {
            peer: from,
            reason: "not a member".into(),
        }),
    };
    let Err(e) = pushed else { return };
    pushes.failed(from);
    if e.not_sent() {
        broker.give_back(&req.topic, &taken.local);
    } else {
        tracing::warn!(node_id = from, topic = %req.topic, error = %e, "a delivery token's push may not have arrived; its messages are redelivered after their lease");
    }
    drop_tokens_of(&waits, from);
}

/// A cancellable wait's entry, removed when the wait ends however it ends (if it is still
/// this registration's).
struct WaitEntry {
    waits: CancellableWaits,
    key: (u64, u64),
    registration: u64,
}

impl WaitEntry {
    /// Registers `tx` as the cancel of `key` (the caller checked the table's bound).
    fn register(
        waits: CancellableWaits,
        key: (u64, u64),
        tx: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        let registration = narad_core::random_u64();
        waits.lock().insert(key, (registration, tx));
        Self {
            waits,
            key,
            registration,
        }
    }
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        let mut w = self.waits.lock();
        if w.get(&self.key)
            .is_some_and(|(r, _)| *r == self.registration)
        {
            w.remove(&self.key);
        }
    }
}

fn malformed(what: &str) -> Fault {
    Fault::new(
        400,
        "malformed_request",
        format!("a malformed {what} request"),
    )
}

/// Waits (briefly) until this member has followed the catalog a call names.
/// `topic` here is incarnation `id` (one re-created since is another topic).
fn same_topic(broker: &Broker, topic: &str, id: u64) -> Result<(), Fault> {
    let here = broker
        .topic_meta(topic)
        .map_err(|e| to_fault(&e.into()))?
        .id;
    if here != id {
        return Err(to_fault(&ApiError::new(
            ErrorCode::TopicNotFound,
            format!("topic '{topic}' not found (it was re-created)"),
        )));
    }
    Ok(())
}

async fn caught_up(broker: &Broker, catalog: u64) -> Result<(), Fault> {
    if broker.catch_up(catalog, CATCH_UP).await {
        Ok(())
    } else {
        Err(to_fault(&ApiError::new(
            ErrorCode::ClusterUnavailable,
            "the partition's owner has not caught up with the cluster's topics yet; retry",
        )))
    }
}

impl Service for DataService {
    fn call(&self, from: u64, op: Op, body: Bytes) -> BoxFuture<Result<Bytes, Fault>> {
        let (broker, me, waits) = (self.broker.clone(), self.me, self.waits.clone());
        let (archive, ingress) = (self.archive.clone(), self.ingress.clone());
        let (cancelled, pushes) = (self.cancelled.clone(), self.pushes.clone());
        let mover = self.mover.clone();
        Box::pin(async move {
            if let Some(r) = crate::moves::serve(&broker, mover.as_ref(), op, &body).await {
                return r;
            }
            match op {
                PRODUCE => {
                    let req = decode_produce(body).ok_or_else(|| malformed("produce"))?;
                    caught_up(&broker, req.catalog).await?;
                    // the incarnation the sender placed for: a topic re-created since is
                    // another topic
                    let id = broker
                        .topic_meta(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?
                        .id;
                    if id != req.topic_id {
                        return Err(to_fault(&ApiError::new(
                            ErrorCode::TopicNotFound,
                            format!("topic '{}' not found (it was re-created)", req.topic),
                        )));
                    }
                    let produced = broker
                        .produce(&req.topic, req.msgs)
                        .await
                        .map_err(|e| to_fault(&e.into()))?;
                    if let Some(i) = ingress.upgrade() {
                        // (the member that forwarded it keeps what it is answered)
                        i.witnesses
                            .confirm(req.topic_id, &produced, Some(from))
                            .await;
                    }
                    Ok(encode_produced(&produced))
                }
                CONSUME => {
                    let req: ConsumeRequest =
                        serde_json::from_slice(&body).map_err(|_| malformed("consume"))?;
                    caught_up(&broker, req.catalog).await?;
                    let wait = Duration::from_millis(req.wait_ms.min(3_600_000));
                    let max = req.max.clamp(1, 100);
                    let consume = broker.consume(&req.topic, req.partition, max, wait);
                    let got = if req.wait_id == 0 || wait.is_zero() {
                        consume.await
                    } else {
                        // cancellable: a cancel ends the wait (leaving the line gives back
                        // whatever was handed over meanwhile) and answers empty
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let key = (from, req.wait_id);
                        if waits.lock().len() >= MAX_CANCELLABLE_WAITS {
                            return Err(Fault::new(
                                503,
                                "server_busy",
                                "too many waits from other members",
                            ));
                        }
                        let _entry = WaitEntry::register(waits, key, tx);
                        tokio::select! {
                            got = consume => got,
                            _ = rx => Ok(Vec::new()),
                        }
                    }
                    .map_err(|e| to_fault(&e.into()))?;
                    // (their handles name this member: the caller passes them on as they
                    // are; an answer that never reaches it is given back by `undelivered`)
                    let taken = Taken::local(&req.topic, me, got);
                    Ok(Bytes::from(
                        serde_json::to_vec(&taken.messages).expect("messages serialise"),
                    ))
                }
                REPLAY => {
                    let req: ReplayRequest =
                        serde_json::from_slice(&body).map_err(|_| malformed("replay"))?;
                    caught_up(&broker, req.catalog).await?;
                    let from = match (req.offset, req.from_time_ms) {
                        (Some(o), _) => ReplayFrom::Offset(o),
                        (None, Some(t)) => ReplayFrom::TimeMs(t),
                        (None, None) => return Err(malformed("replay")),
                    };
                    let max = req.max.clamp(1, 100);
                    let recs = history(
                        &broker,
                        archive.as_deref(),
                        &req.topic,
                        req.partition,
                        from,
                        max,
                    )
                    .await
                    .map_err(|e| to_fault(&e))?;
                    let msgs: Vec<Box<RawValue>> = recs
                        .iter()
                        .map(|r| raw(&render::record(&req.topic, req.partition, r)))
                        .collect();
                    Ok(Bytes::from(
                        serde_json::to_vec(&msgs).expect("messages serialise"),
                    ))
                }
                SETTLE | GIVE_BACK => {
                    let req: SettleRequest =
                        serde_json::from_slice(&body).map_err(|_| malformed("ack"))?;
                    if req.handles.len() > 100 {
                        return Err(malformed("ack"));
                    }
                    let action = match req.action.as_deref() {
                        None => None,
                        Some("ack") => Some(AckAction::Ack),
                        Some("extend") => Some(AckAction::Extend),
                        Some("nack") => Some(AckAction::Nack),
                        Some(_) => return Err(malformed("ack")),
                    };
                    let Some(action) = action else {
                        broker.give_back_handles(&req.topic, &req.handles);
                        return Ok(Bytes::new());
                    };
                    caught_up(&broker, req.catalog).await?;
                    if let Some(d) = req.deadline_ms
                        && broker.now_ms() > d
                    {
                        // the caller has given up and answered "unknown": applying it now
                        // would surprise a client that retries or lets the lease run out
                        let late = SettleOutcome::of(Err(ApiError::new(
                            ErrorCode::ClusterUnavailable,
                            "the settle reached the member that leased the message after its caller's deadline; not applied, retry",
                        )));
                        tracing::warn!(topic = %req.topic, handles = req.handles.len(), late_ms = broker.now_ms() - d, "settle refused: it arrived after its caller's deadline");
                        let out: Vec<&SettleOutcome> = req.handles.iter().map(|_| &late).collect();
                        return Ok(Bytes::from(
                            serde_json::to_vec(&out).expect("outcomes serialise"),
                        ));
                    }
                    let out: Vec<SettleOutcome> = broker
                        .settle_many(&req.topic, &req.handles, action)
                        .await
                        .into_iter()
                        .map(|r| SettleOutcome::of(r.map_err(ApiError::from)))
                        .collect();
                    Ok(Bytes::from(
                        serde_json::to_vec(&out).expect("outcomes serialise"),
                    ))
                }
                FANOUT_APPEND => {
                    let req = decode_produce(body).ok_or_else(|| malformed("fan-out append"))?;
                    caught_up(&broker, req.catalog).await?;
                    // one partition per call (a cursor's group for one child partition)
                    let Some(partition) = req.msgs.first().and_then(|m| m.partition) else {
                        return Err(malformed("fan-out append"));
                    };
                    let mut records = Vec::with_capacity(req.msgs.len());
                    for m in req.msgs {
                        let delay = m.delay_ms.unwrap_or(0);
                        if m.partition != Some(partition)
                            || !(0..=i64::from(u32::MAX)).contains(&delay)
                        {
                            return Err(malformed("fan-out append"));
                        }
                        records.push(NewRecord {
                            key: m.key,
                            headers: m.headers,
                            payload: m.payload,
                            delay_ms: delay as u32,
                        });
                    }
                    broker
                        .append_copies(&req.topic, req.topic_id, partition, records)
                        .await
                        .map_err(|e| to_fault(&e.into()))?;
                    Ok(Bytes::new())
                }
                CHILDREN => {
                    let req: StatsRequest =
                        serde_json::from_slice(&body).map_err(|_| malformed("children"))?;
                    caught_up(&broker, req.catalog).await?;
                    let id = broker
                        .topic_meta(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?
                        .id;
                    if req.topic_id.is_some_and(|want| want != id) {
                        return Err(to_fault(&ApiError::new(
                            ErrorCode::TopicNotFound,
                            format!("topic '{}' not found (it was re-created)", req.topic),
                        )));
                    }
                    let list = broker
                        .children(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?;
                    Ok(Bytes::from(
                        serde_json::to_vec(&list).expect("children serialise"),
                    ))
                }
                MIRROR_PROGRESS => {
                    let req: MirrorProgressRequest =
                        serde_json::from_slice(&body).map_err(|_| malformed("mirror progress"))?;
                    caught_up(&broker, req.catalog).await?;
                    same_topic(&broker, &req.topic, req.topic_id)?;
                    if !req.returned.is_empty() {
                        broker
                            .settle_returned(&req.topic, req.source, &req.returned)
                            .await
                            .map_err(|e| to_fault(&e.into()))?;
                    }
                    broker
                        .take_mirror_progress(
                            &req.topic,
                            req.source,
                            req.partition,
                            req.progress,
                            req.end,
                        )
                        .await
                        .map_err(|e| to_fault(&e.into()))?;
                    Ok(Bytes::new())
                }
                MIRROR_REPORT => {
                    let req: MirrorReportRequest =
                        serde_json::from_slice(&body).map_err(|_| malformed("mirror report"))?;
                    caught_up(&broker, req.catalog).await?;
                    same_topic(&broker, &req.topic, req.topic_id)?;
                    let reply = if req.last {
                        MirrorReportReply {
                            report: None,
                            settled: broker
                                .settle_mirror_progress(&req.topic)
                                .await
                                .map_err(|e| to_fault(&e.into()))?,
                        }
                    } else {
                        MirrorReportReply {
                            report: broker
                                .mirror_report(&req.topic)
                                .await
                                .map_err(|e| to_fault(&e.into()))?,
                            settled: 0,
                        }
                    };
                    Ok(Bytes::from(
                        serde_json::to_vec(&reply).expect("reports serialise"),
                    ))
                }
                STATS => {
                    let req: StatsRequest =
                        serde_json::from_slice(&body).map_err(|_| malformed("stats"))?;
                    caught_up(&broker, req.catalog).await?;
                    let info = broker
                        .topic_info(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?;
                    if req.topic_id.is_some_and(|id| id != info.meta.id) {
                        return Err(to_fault(&ApiError::new(
                            ErrorCode::TopicNotFound,
                            format!("topic '{}' not found (it was re-created)", req.topic),
                        )));
                    }
                    let stats = crate::http::topics::local_stats(&broker, &info, None);
                    Ok(Bytes::from(
                        serde_json::to_vec(&stats).expect("stats serialise"),
                    ))
                }
                WAIT_TOKEN => {
                    let req: ConsumeRequest =
                        serde_json::from_slice(&body).map_err(|_| malformed("token"))?;
                    if req.wait_id == 0 {
                        return Err(malformed("token"));
                    }
                    caught_up(&broker, req.catalog).await?;
                    broker
                        .topic_meta(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?;
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let key = (from, req.wait_id);
                    if cancelled.lock().remove(&key).is_some() {
                        // its reader gave up before the token got here
                        return Ok(Bytes::new());
                    }
                    {
                        let w = waits.lock();
                        if w.contains_key(&key) {
                            // left again while the last one is still here (it was pushing)
                            return Ok(Bytes::new());
                        }
                        if w.len() >= MAX_CANCELLABLE_WAITS {
                            return Err(Fault::new(
                                503,
                                "server_busy",
                                "too many delivery tokens from other members",
                            ));
                        }
                    }
                    let entry = WaitEntry::register(waits, key, tx);
                    let ingress = ingress.clone();
                    tokio::spawn(async move {
                        let all = entry.waits.clone();
                        keep_token(broker, ingress, (all, pushes), from, req, rx).await;
                        drop(entry);
                    });
                    Ok(Bytes::new())
                }
                DELIVER => {
                    let req: Delivered =
                        serde_json::from_slice(&body).map_err(|_| malformed("delivery"))?;
                    if req.messages.len() > 100 {
                        return Err(malformed("delivery"));
                    }
                    if let Some(ingress) = ingress.upgrade() {
                        ingress.delivered(from, req.topic, req.token, req.messages);
                    }
                    Ok(Bytes::new())
                }
                CANCEL_WAIT => {
                    let req: CancelWait =
                        serde_json::from_slice(&body).map_err(|_| malformed("cancel"))?;
                    let found = waits.lock().remove(&(from, req.wait_id));
                    match found {
                        Some((_, tx)) => {
                            let _ = tx.send(());
                        }
                        None => remember_cancel(&cancelled, (from, req.wait_id)),
                    }
                    Ok(Bytes::new())
                }
                op => Err(Fault::unknown_op(op)),
            }
        })
    }

    fn wants_receipt(&self, op: Op) -> bool {
        op == CONSUME
    }

    /// A consume's answer that never reached its caller: its messages are given back.
    fn undelivered(&self, op: Op, reply: Bytes) {
        if op != CONSUME {
            return;
        }
        let Ok(msgs) = serde_json::from_slice::<Vec<TopicAndHandle>>(&reply) else {
            return;
        };
        let mut by_topic: HashMap<String, Vec<String>> = HashMap::new();
        for m in msgs {
            if let Some((_, inner)) = split_handle(&m.receipt_handle) {
                by_topic.entry(m.topic).or_default().push(inner.to_owned());
            }
        }
        for (topic, handles) in by_topic {
            self.broker.give_back_handles(&topic, &handles);
        }
    }
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

    fn msg(payload: &'static [u8]) -> ProduceMessage {
        ProduceMessage {
            payload: Bytes::from_static(payload),
            partition: Some(2),
            ..Default::default()
        }
    }

    #[test]
    fn produce_calls_round_trip_however_small_their_messages() {
        let mut msgs: Vec<ProduceMessage> = (0..50).map(|_| msg(b"1")).collect();
        msgs.push(ProduceMessage {
            key: Some(Bytes::from_static(b"k")),
            delay_ms: Some(7),
            headers: vec![("h".into(), Bytes::from_static(b"v"))],
            ..msg(b"")
        });
        let b = encode_produce("t", 9, 4, &msgs);
        let r = decode_produce(b).expect("decodes");
        assert_eq!((r.topic.as_str(), r.topic_id, r.catalog), ("t", 9, 4));
        assert_eq!(r.msgs.len(), 51);
        assert_eq!(r.msgs[50].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.msgs[50].delay_ms, Some(7));
        assert_eq!(r.msgs[0].payload, Bytes::from_static(b"1"));
    }

    #[test]
    fn junk_produce_calls_are_refused_without_panicking() {
        let good = encode_produce("topic", 1, 2, &[msg(b"payload"), msg(b"x")]);
        // every truncation, and every single-byte change, decodes or is refused: no panic
        for n in 0..good.len() {
            let _ = decode_produce(good.slice(..n));
        }
        for i in 0..good.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = good.to_vec();
                b[i] = v;
                let _ = decode_produce(Bytes::from(b));
            }
        }
        // a count far beyond what the bytes hold
        let mut b = BytesMut::new();
        b.put_u64(1);
        b.put_u64(0);
        b.put_u16(1);
        b.put_slice(b"t");
        b.put_u32(u32::MAX);
        assert!(decode_produce(b.freeze()).is_none());
        // trailing bytes
        let mut b = good.to_vec();
        b.push(0);
        assert!(decode_produce(Bytes::from(b)).is_none());
    }

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
