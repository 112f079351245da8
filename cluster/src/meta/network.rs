//! Raft's messages and forwarded proposals on the node RPC.
//!
//! Payloads are JSON (openraft's types are serde): metadata is small and rarely written, and
//! JSON keeps a captured message readable. Snapshot chunks are capped well below the RPC
//! request limit, and an append batch the peer refuses as too large is split (openraft's
//! `PayloadTooLarge`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use openraft::Raft;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::election;
use super::{Attempt, MetaRequest, MetaResponse, NodeId, NodeInfo, TypeConfig, client_write_error};
use crate::rpc::{BoxFuture, Fault, Op, Rpc, RpcError, Service, WeakRpc};

use crate::rpc::ops::{
    DATA_OPS, JOIN, PRE_VOTE, PROPOSE, RAFT_APPEND, RAFT_SNAPSHOT, RAFT_VOTE, READ_INDEX, REMOVE,
};

/// A node asking to become a voter.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinRequest {
    id: NodeId,
    node: NodeInfo,
}

pub struct Network {
    rpc: Rpc,
}

impl Network {
    pub fn new(rpc: Rpc) -> Self {
        Self { rpc }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Conn;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> Conn {
        Conn {
            rpc: self.rpc.clone(),
            target,
            node: node.clone(),
        }
    }
}

pub struct Conn {
    rpc: Rpc,
    target: NodeId,
    node: NodeInfo,
}

type RaftRpcError<E = openraft::error::Infallible> =
    RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>;

impl Conn {
    async fn send<Req, Resp, E>(
        &self,
        op: Op,
        action: RPCTypes,
        req: &Req,
        entries: u64,
        option: &RPCOption,
    ) -> Result<Resp, RaftRpcError<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = Bytes::from(serde_json::to_vec(req).expect("raft messages serialise"));
        let ttl = option.hard_ttl();
        match self
            .rpc
            .call(self.target, &self.node.rpc_addr, op, body, ttl)
            .await
        {
            Ok(reply) => match serde_json::from_slice::<Result<Resp, RaftError<NodeId, E>>>(&reply)
            {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(RPCError::RemoteError(RemoteError::new_with_node(
                    self.target,
                    self.node.clone(),
                    e,
                ))),
                Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
            },
            Err(RpcError::Remote { fault, .. })
                if fault.status == 413 && action == RPCTypes::AppendEntries =>
            {
                Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint((entries / 2).max(1)),
                ))
            }
            // not served (not ready yet, or refused): like unreachable, back off
            Err(e @ RpcError::Remote { .. }) => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) if e.not_sent() => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(RpcError::Timeout { .. }) => Err(RPCError::Timeout(Timeout {
                action,
                id: self.rpc.node_id(),
                target: self.target,
                timeout: ttl,
            })),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RaftRpcError> {
        let n = rpc.entries.len() as u64;
        self.send(RAFT_APPEND, RPCTypes::AppendEntries, &rpc, n, &option)
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RaftRpcError<InstallSnapshotError>> {
        self.send(RAFT_SNAPSHOT, RPCTypes::InstallSnapshot, &rpc, 0, &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RaftRpcError> {
        self.send(RAFT_VOTE, RPCTypes::Vote, &rpc, 0, &option).await
    }

    /// 100 ms doubling to 2 s while a peer is unreachable (openraft's default retries every
    /// 500 ms forever, and logs each).
    fn backoff(&self) -> Backoff {
        Backoff::new((0..).map(|i: u32| {
            Duration::from_millis(100u64.saturating_mul(1 << i.min(5))).min(Duration::from_secs(2))
        }))
    }
}

/// Serves Raft's messages and forwarded proposals, and hands the data plane's ops to the
/// service set for them.
#[derive(Default)]
pub struct MetaService {
    raft: OnceLock<Raft<TypeConfig>>,
    /// Weak: the endpoint owns this service.
    rpc: OnceLock<WeakRpc>,
    data: OnceLock<Arc<dyn Service>>,
    /// A leader handing its leadership on: it takes no proposal and confirms no read index
    /// (either would reach the others as a heartbeat, and keep them from electing).
    pub handing_off: std::sync::atomic::AtomicBool,
    /// A voter with a newer membership told this node it is no longer a member.
    pub removed: std::sync::atomic::AtomicBool,
    /// The log, to check what a leader sends against what this member committed.
    log: OnceLock<super::LogStore>,
    /// The snapshot a leader is sending, gathered to check it before its last chunk goes
    /// on: its id and the bytes so far.
    incoming: Arc<parking_lot::Mutex<Option<Incoming>>>,
}

impl MetaService {
    fn incoming_handle(&self) -> Arc<parking_lot::Mutex<Option<Incoming>>> {
        self.incoming.clone()
    }

    pub fn set(&self, raft: Raft<TypeConfig>, rpc: &Rpc, log: super::LogStore) {
        let _ = self.rpc.set(rpc.downgrade());
        let _ = self.raft.set(raft);
        let _ = self.log.set(log);
    }

    /// Why this member stopped taking part in the metastore, if it did.
    pub fn halted(&self) -> Option<String> {
        self.log.get().and_then(super::LogStore::halted)
    }

    /// Serves ops from [`DATA_OPS`] up with `data` (once; later calls change nothing).
    pub fn serve_data(&self, data: Arc<dyn Service>) {
        let _ = self.data.set(data);
    }
}

/// A snapshot being received: its id and the bytes so far.
type Incoming = (String, Vec<u8>);

/// Most snapshot bytes gathered for the check (a larger one goes on unchecked).
const MAX_CHECKED_SNAPSHOT: usize = 256 << 20;

/// Gathers a snapshot's chunks in `incoming`; at its last chunk, why it conflicts with what
/// `log` committed, if it does.
fn self_snapshot_check(
    incoming: &parking_lot::Mutex<Option<Incoming>>,
    req: &InstallSnapshotRequest<TypeConfig>,
    log: &super::LogStore,
) -> Option<String> {
    let mut slot = incoming.lock();
    if req.offset == 0 {
        *slot = Some((req.meta.snapshot_id.clone(), Vec::new()));
    }
    let whole = match slot.as_mut() {
        Some((id, bytes))
            if *id == req.meta.snapshot_id
                && bytes.len() as u64 == req.offset
                && bytes.len() + req.data.len() <= MAX_CHECKED_SNAPSHOT =>
        {
            bytes.extend_from_slice(&req.data);
            req.done
        }
        // a chunk sent again (its answer was lost): held already
        Some((id, bytes))
            if *id == req.meta.snapshot_id
                && req.offset.saturating_add(req.data.len() as u64) <= bytes.len() as u64 =>
        {
            req.done && req.offset + req.data.len() as u64 == bytes.len() as u64
        }
        _ => {
            // (out of order, or too large: openraft judges it as it comes)
            *slot = None;
            false
        }
    };
    if !whole {
        return None;
    }
    let (_, bytes) = slot.take()?;
    drop(slot);
    super::state::snapshot_conflict(&bytes, log)
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, Fault> {
    serde_json::from_slice(body).map_err(|e| Fault::new(400, "malformed_request", e.to_string()))
}

fn encode<T: Serialize>(v: &T) -> Result<Bytes, Fault> {
    Ok(Bytes::from(
        serde_json::to_vec(v).expect("raft replies serialise"),
    ))
}

impl Service for MetaService {
    fn call(&self, from: NodeId, op: Op, body: Bytes) -> BoxFuture<Result<Bytes, Fault>> {
        if op.0 >= DATA_OPS {
            return match self.data.get() {
                Some(data) => data.call(from, op, body),
                None => Box::pin(async {
                    Err(Fault::new(
                        503,
                        "not_ready",
                        "this node's broker is not open yet",
                    ))
                }),
            };
        }
        if matches!(op, PROPOSE | READ_INDEX | JOIN | REMOVE)
            && self.handing_off.load(std::sync::atomic::Ordering::Acquire)
        {
            return Box::pin(async {
                Err(Fault::new(
                    421,
                    "not_leader",
                    "this node is handing its leadership on; ask again shortly",
                ))
            });
        }
        let (Some(raft), Some(rpc)) = (
            self.raft.get().cloned(),
            self.rpc.get().and_then(WeakRpc::upgrade),
        ) else {
            return Box::pin(async {
                Err(Fault::new(503, "not_ready", "the metastore is starting"))
            });
        };
        let handing_off = self.handing_off.load(std::sync::atomic::Ordering::Acquire);
        let log = self.log.get().cloned();
        let incoming = self.incoming_handle();
        // a member that found its committed metadata conflicting takes no part any more
        if let Some(why) = log.as_ref().and_then(super::LogStore::halted)
            && matches!(op, RAFT_APPEND | RAFT_VOTE | PRE_VOTE | RAFT_SNAPSHOT)
        {
            return Box::pin(async move { Err(Fault::new(409, "member_halted", why)) });
        }
        Box::pin(async move {
            match op {
                RAFT_APPEND => {
                    let req = decode::<AppendEntriesRequest<TypeConfig>>(&body)?;
                    // (only from a leader this member would follow: openraft refuses an older
                    // one, a frozen ex-leader say, which is no news about this member's log)
                    let current = raft.metrics().borrow().vote;
                    if let Some(log) = &log
                        && req.vote >= current
                        && let Some(why) = log.committed_conflict(
                            req.prev_log_id,
                            req.entries.iter().map(|e| e.log_id),
                        )
                    {
                        log.halt(why.clone());
                        return Err(Fault::new(409, "member_halted", why));
                    }
                    encode(&raft.append_entries(req).await)
                }
                RAFT_VOTE => encode(&raft.vote(decode::<VoteRequest<NodeId>>(&body)?).await),
                PRE_VOTE => encode(&election::answer(&raft, handing_off, decode(&body)?).await?),
                RAFT_SNAPSHOT => {
                    let req = decode::<InstallSnapshotRequest<TypeConfig>>(&body)?;
                    // (from a leader this member would follow) a snapshot is checked whole
                    // before its last chunk reaches openraft, which would install it past the
                    // commit point without looking, and purge the log first
                    let current = raft.metrics().borrow().vote;
                    if let Some(log) = &log
                        && req.vote >= current
                        && let Some(why) = self_snapshot_check(&incoming, &req, log)
                    {
                        log.halt(why.clone());
                        return Err(Fault::new(409, "member_halted", why));
                    }
                    encode(&raft.install_snapshot(req).await)
                }
                PROPOSE => {
                    let req: MetaRequest = decode(&body)?;
                    match write_here(&raft, req).await {
                        Ok(resp) => encode(&resp),
                        Err(Attempt::Retry { reason, .. }) => {
                            Err(Fault::new(421, "not_leader", reason))
                        }
                        Err(Attempt::Fatal(e)) => Err(Fault::new(503, "metastore_stopped", e)),
                    }
                }
                READ_INDEX => match raft.ensure_linearizable().await {
                    Ok(at) => encode(&at.map_or(0, |l| l.index)),
                    Err(e) => Err(Fault::new(421, "not_leader", e.to_string())),
                },
                JOIN => {
                    let req: JoinRequest = decode(&body)?;
                    join_here(&raft, &rpc, req).await.map(|()| Bytes::new())
                }
                REMOVE => {
                    let id: NodeId = decode(&body)?;
                    remove_here(&raft, id).await.map(|()| Bytes::new())
                }
                op => Err(Fault::unknown_op(op)),
            }
        })
    }

    fn wants_receipt(&self, op: Op) -> bool {
        op.0 >= DATA_OPS && self.data.get().is_some_and(|d| d.wants_receipt(op))
    }

    fn undelivered(&self, op: Op, reply: Bytes) {
        if op.0 >= DATA_OPS
            && let Some(d) = self.data.get()
        {
            d.undelivered(op, reply);
        }
    }
}

/// Writes on this node, which must lead.
pub(super) async fn write_here(
    raft: &Raft<TypeConfig>,
    req: MetaRequest,
) -> Result<MetaResponse, Attempt> {
    raft.client_write(req)
        .await
        .map(|r| r.data)
        .map_err(client_write_error)
}

/// Hands a proposal to the leader.
pub(super) async fn forward(
    rpc: &Rpc,
    leader: NodeId,
    addr: &str,
    req: &MetaRequest,
    deadline: Duration,
) -> Result<MetaResponse, Attempt> {
    let body = Bytes::from(serde_json::to_vec(req).expect("requests serialise"));
    let reply = rpc
        .call(leader, addr, PROPOSE, body, deadline)
        .await
        .map_err(|e| match e {
            RpcError::Remote { fault, .. } if fault.code == "not_leader" => Attempt::Retry {
                reason: fault.message,
                sent: false,
            },
            e => Attempt::from(e),
        })?;
    serde_json::from_slice(&reply).map_err(|e| Attempt::Retry {
        reason: format!("the leader's answer is unreadable: {e}"),
        sent: true,
    })
}

/// The leader's commit point, confirmed by a quorum (its read index).
pub(super) async fn read_index_at(
    rpc: &Rpc,
    leader: NodeId,
    addr: &str,
    deadline: Duration,
) -> Result<u64, String> {
    let reply = rpc
        .call(leader, addr, READ_INDEX, Bytes::new(), deadline)
        .await
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&reply).map_err(|e| format!("unreadable read index: {e}"))
}

pub(super) async fn join_at(
    rpc: &Rpc,
    seed: NodeId,
    addr: &str,
    me: NodeId,
    node: &NodeInfo,
    deadline: Duration,
) -> Result<(), String> {
    let body = serde_json::to_vec(&JoinRequest {
        id: me,
        node: node.clone(),
    })
    .expect("join requests serialise");
    rpc.call(seed, addr, JOIN, Bytes::from(body), deadline)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// How a member that does not lead names the leader to a joiner.
const LEADER_IS: &str = "the leader is node ";

/// The leader a `not_leader` answer to a join named: (id, address).
pub(super) fn leader_named(error: &str) -> Option<(NodeId, String)> {
    let rest = &error[error.find(LEADER_IS)? + LEADER_IS.len()..];
    let (id, addr) = rest.split_once(" at ")?;
    let addr = addr.split_whitespace().next()?;
    Some((id.parse().ok()?, addr.to_owned()))
}

/// A learner is made a voter only once its log is within this many entries of the leader's.
const CAUGHT_UP: u64 = 64;

/// Makes `req.id` a voter, on the leader (elsewhere: `not_leader`, the joiner asks another).
/// Refused (`node_conflict`) when its id is known at another address or its address belongs
/// to another node: that is how two nodes end up at one address. Before the node is added,
/// the leader calls it at the address it gave (the handshake proves its id and the secret),
/// so a node nobody can reach never becomes a voter (with 3 voters and a 4th unreachable,
/// one failure would lose the quorum); it is added as a learner first and promoted once its
/// log has caught up (`learner_catching_up` until then: the joiner asks again). A node that
/// is a voter already at that address is left as it is.
async fn join_here(raft: &Raft<TypeConfig>, rpc: &Rpc, req: JoinRequest) -> Result<(), Fault> {
    let metrics = raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership().clone();
    if let Some(n) = membership.get_node(&req.id)
        && *n != req.node
    {
        return Err(Fault::new(
            409,
            "node_conflict",
            format!(
                "node {} is known at {}, not {}",
                req.id, n.rpc_addr, req.node.rpc_addr
            ),
        ));
    }
    if membership
        .nodes()
        .any(|(id, n)| *id != req.id && n.rpc_addr == req.node.rpc_addr)
    {
        return Err(Fault::new(
            409,
            "node_conflict",
            format!("another node is at {}", req.node.rpc_addr),
        ));
    }
    if membership.voter_ids().any(|id| id == req.id) {
        return Ok(());
    }
    let not_leader = |e: String| Fault::new(421, "not_leader", e);
    match metrics.current_leader {
        Some(l) if l == metrics.id => {}
        // (the joiner asks the leader named: its seeds need not list it)
        Some(l) => {
            let at = membership.get_node(&l).map(|n| n.rpc_addr.clone());
            return Err(not_leader(match at {
                Some(addr) => format!("this node does not lead; {LEADER_IS}{l} at {addr}"),
                None => "this node does not lead; ask the leader".into(),
            }));
        }
        None => {
            return Err(not_leader(
                "this node does not lead and knows no leader yet; ask again".into(),
            ));
        }
    }
    rpc.call(
        req.id,
        &req.node.rpc_addr,
        Op::PING,
        Bytes::new(),
        Duration::from_secs(2),
    )
    .await
    .map_err(|e| {
        Fault::new(
            503,
            "joiner_unreachable",
            format!(
                "the leader cannot reach node {} at its address {}: {e}",
                req.id, req.node.rpc_addr
            ),
        )
    })?;
    if membership.get_node(&req.id).is_none() {
        raft.add_learner(req.id, req.node.clone(), true)
            .await
            .map_err(|e| not_leader(e.to_string()))?;
    }
    let now = raft.metrics().borrow().clone();
    let last = now.last_log_index.unwrap_or(0);
    let matched = now
        .replication
        .as_ref()
        .and_then(|r| r.get(&req.id).cloned().flatten())
        .map(|l| l.index);
    if matched.is_none_or(|m| m + CAUGHT_UP < last) {
        return Err(Fault::new(
            503,
            "learner_catching_up",
            format!(
                "node {} is a learner at index {matched:?} of {last}; ask again once it has caught up",
                req.id
            ),
        ));
    }
    raft.change_membership(openraft::ChangeMembers::AddVoterIds([req.id].into()), false)
        .await
        .map_err(|e| not_leader(e.to_string()))?;
    Ok(())
}

/// Fewest voters a removal may leave (two voters lose the quorum to either's failure, and
/// openraft's own FAQ warns of a two-voter cluster that never elects).
pub const MIN_VOTERS: usize = 3;

/// Removes voter `id`, on the leader. Refused: an unknown id (`member_not_found`), the
/// leader itself, or a removal that would leave fewer than [`MIN_VOTERS`]
/// (`member_not_removable`). The leadership is confirmed with a quorum first, so a deposed
/// leader with a stale view removes nothing.
pub(super) async fn remove_here(raft: &Raft<TypeConfig>, id: NodeId) -> Result<(), Fault> {
    let not_leader = |e: String| Fault::new(421, "not_leader", e);
    raft.ensure_linearizable()
        .await
        .map_err(|e| not_leader(e.to_string()))?;
    let metrics = raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership().clone();
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    if membership.get_node(&id).is_none() {
        return Err(Fault::new(
            404,
            "member_not_found",
            format!("node {id} is not a member"),
        ));
    }
    if metrics.current_leader == Some(id) {
        return Err(Fault::new(
            409,
            "member_not_removable",
            format!(
                "node {id} leads the cluster: stop it (another member takes over), then remove it"
            ),
        ));
    }
    if voters.contains(&id) && voters.len() <= MIN_VOTERS {
        return Err(Fault::new(
            409,
            "member_not_removable",
            format!(
                "removing node {id} would leave {} voters; a cluster keeps at least {MIN_VOTERS}: add a member first",
                voters.len() - 1
            ),
        ));
    }
    // a voter leaves the voters and the nodes at once (retain = false); a learner that was
    // never promoted only has a node entry
    let change = if voters.contains(&id) {
        openraft::ChangeMembers::RemoveVoters([id].into())
    } else {
        openraft::ChangeMembers::RemoveNodes([id].into())
    };
    raft.change_membership(change, false)
        .await
        .map_err(|e| not_leader(e.to_string()))?;
    Ok(())
}

/// Asks the leader to remove `id`.
pub(super) async fn remove_at(
    rpc: &Rpc,
    leader: NodeId,
    addr: &str,
    id: NodeId,
    deadline: Duration,
) -> Result<(), RpcError> {
    let body = Bytes::from(serde_json::to_vec(&id).expect("ids serialise"));
    rpc.call(leader, addr, REMOVE, body, deadline)
        .await
        .map(|_| ())
}

impl election::Standing for MetaService {
    fn may_stand(&self) -> bool {
        !(self.handing_off.load(std::sync::atomic::Ordering::Acquire)
            || self.is_removed()
            || self.halted().is_some())
    }

    fn mark_removed(&self) -> bool {
        self.removed.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    fn is_removed(&self) -> bool {
        self.removed.load(std::sync::atomic::Ordering::Acquire)
    }
}
