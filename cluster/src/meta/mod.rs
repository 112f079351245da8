//! The metastore: the cluster's metadata in an openraft 0.9 state machine, its log and
//! snapshots on this node's disk, its messages on the node RPC.
//!
//! ```text
//!  propose(cmd) ──▶ leader? ── yes ─▶ client_write ──▶ log (fsync) ─▶ replicated ─▶ committed
//!       │                                                                             │
//!       └── no: forward to the leader (Propose op), same request id                  ▼
//!                                                         every node: StateMachine::apply
//!  the proposer answers once its own replica applied the entry  ◀── MetaView published
//! ```
//!
//! Every request carries a random id; the state machine remembers the last
//! [`state::DEDUPE_ENTRIES`] answers by id, so a proposal retried after a leader change (the
//! first attempt may have committed) takes effect once. A proposal answers only after this
//! node's replica has applied it, so a client that created something through a node sees
//! it there next (no 404 right after a 201).

mod election;
mod log_store;
mod network;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_auth::store::{Refusal as UserRefusal, UserCommand};
use narad_core::catalog::{CatalogCommand, CatalogError};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{Config, Raft, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use log_store::{LogStore, OpenError};
pub use state::{MetaView, StateMachine};

pub use crate::rpc::NodeId;
use crate::rpc::{Rpc, RpcConfig, RpcError, RpcMetrics};

/// What the membership records of a node: where its RPC endpoint is (`host:port`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeInfo {
    pub rpc_addr: String,
}

/// One metadata change, with the id that makes retries safe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaRequest {
    pub id: u128,
    pub cmd: MetaCmd,
}

// (one command per proposal, held briefly: its size does not matter, and boxing would
// only add an allocation to every proposal)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum MetaCmd {
    Catalog(CatalogCommand),
    Users(UserCommand),
}

/// What applying a request did, and at which log index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaResponse {
    pub index: u64,
    pub outcome: Outcome,
}

impl MetaResponse {
    fn done(index: u64) -> Self {
        Self {
            index,
            outcome: Outcome::Done,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Outcome {
    /// A blank or membership entry.
    Done,
    Catalog(Result<CatalogDone, CatalogError>),
    Users(Result<(), UserRefusal>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum CatalogDone {
    Topic {
        id: u64,
        name: String,
    },
    Disowned(Vec<u64>),
    Deleted {
        id: u64,
        name: String,
        unlinked: Vec<u64>,
    },
    Remote {
        id: u64,
        version: u64,
    },
    RemoteDeleted {
        id: u64,
    },
    RemoteChild {
        epoch: u64,
    },
    /// The members being decommissioned.
    Draining(Vec<u64>),
    ClusterId(u64),
    /// An owner's witnesses.
    InSync(Vec<u64>),
}

openraft::declare_raft_types!(
    pub TypeConfig:
        D = MetaRequest,
        R = MetaResponse,
        NodeId = NodeId,
        Node = NodeInfo,
);

pub type Entry = openraft::Entry<TypeConfig>;

/// Raft timing. The defaults suit a loaded machine (openraft's own 50 ms heartbeat and
/// 150–300 ms elections call elections whenever a 2-core box is busy for a moment).
#[derive(Debug, Clone)]
pub struct Tuning {
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// A snapshot is taken after this many entries since the last one.
    pub snapshot_after: u64,
    /// Entries kept in the log behind a snapshot (so a briefly lagging follower catches up
    /// from the log, not a snapshot).
    pub keep_after_snapshot: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            heartbeat_ms: 200,
            election_min_ms: 1000,
            election_max_ms: 2000,
            snapshot_after: 5000,
            keep_after_snapshot: 1000,
        }
    }
}

pub struct MetaConfig {
    pub node_id: NodeId,
    /// Where the log, its state and the snapshot live (`<data_dir>/raft`).
    pub dir: PathBuf,
    pub tuning: Tuning,
}

/// How long one forwarded proposal may take before it is sent again (same request id, so it
/// applies once): a dead leader is noticed by an election within 1–2 s, not by its connection.
const FORWARD_ATTEMPT: Duration = Duration::from_secs(2);

/// Largest request proposed (its JSON); larger ones are refused before they reach the log.
pub const MAX_REQUEST_BYTES: usize = 2 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Log(#[from] OpenError),
    #[error("the metadata snapshot is unreadable: {0}")]
    Snapshot(String),
    #[error("cannot bind the cluster endpoint: {0}")]
    Bind(#[source] std::io::Error),
    #[error("raft: {0}")]
    Raft(String),
}

/// Why a proposal did not take effect (or may have, for [`ProposeError::Unknown`]).
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// No leader could take it within the deadline (an election, or no quorum). Retryable.
    #[error("no metadata leader is reachable: {0}")]
    Unavailable(String),
    /// Proposed, but not known to be applied here within the deadline: it may take effect.
    /// Retrying with a new request is safe only for changes that are idempotent by content.
    #[error("the metadata change was sent but not confirmed within the deadline: {0}")]
    Unknown(String),
    #[error("the metadata change is {0} bytes, over the {MAX_REQUEST_BYTES}-byte limit")]
    TooLarge(usize),
    /// The Raft node has stopped (shut down or a storage failure).
    #[error("the metastore has stopped: {0}")]
    Stopped(String),
}

/// The cluster's metadata, as seen and changed from this node.
#[derive(Clone)]
pub struct Metastore {
    me: NodeId,
    raft: Raft<TypeConfig>,
    rpc: Rpc,
    view: watch::Receiver<Arc<MetaView>>,
    service: Arc<network::MetaService>,
}

impl Metastore {
    /// Starts (or ends) handing this node's leadership on: it stops heartbeating and
    /// standing for election, and takes no proposal and confirms no read index meanwhile,
    /// so that the others elect a leader among themselves within their election timeout.
    pub fn hand_off(&self, on: bool) {
        self.service
            .handing_off
            .store(on, std::sync::atomic::Ordering::Release);
        let rc = self.raft.runtime_config();
        rc.heartbeat(!on);
    }

    /// Whether a voter with a newer membership told this node it was removed from the
    /// cluster (it no longer stands for election).
    pub fn removed(&self) -> bool {
        self.service
            .removed
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Why this member stopped taking part in the metastore, if it did: a leader's log
    /// conflicts with metadata it committed (see [`LogStore::committed_conflict`]).
    pub fn halted(&self) -> Option<String> {
        self.service.halted()
    }

    /// Whether this node is handing its leadership on ([`Metastore::hand_off`]).
    pub fn handing_off(&self) -> bool {
        self.service
            .handing_off
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Serves the data plane's ops (from [`crate::rpc::ops::DATA_OPS`] up) on this node's endpoint
    /// with `data`; until then they answer `not_ready`.
    pub fn serve_data(&self, data: Arc<dyn crate::rpc::Service>) {
        self.service.serve_data(data);
    }

    /// Where node `id` takes calls: its address in the applied membership.
    pub fn addr_of(&self, id: NodeId) -> Option<String> {
        self.view
            .borrow()
            .membership
            .membership()
            .get_node(&id)
            .map(|n| n.rpc_addr.clone())
    }

    /// Opens the log and snapshot in `cfg.dir`, binds the RPC endpoint and starts the Raft
    /// node. A node with no log yet waits to be bootstrapped or added by a leader.
    pub async fn start(
        cfg: MetaConfig,
        rpc: RpcConfig,
        rpc_metrics: Arc<RpcMetrics>,
    ) -> Result<Self, StartError> {
        let dir = cfg.dir.clone();
        let (log, sm) = tokio::task::spawn_blocking(move || {
            let log = LogStore::open(&dir)?;
            let sm = StateMachine::open(&dir).map_err(StartError::Snapshot)?;
            // purged entries live only in the snapshot: without it they are gone
            if let Some(p) = log.last_purged()
                && !sm.had_snapshot()
            {
                return Err(StartError::Snapshot(format!(
                    "{} is missing, but the raft log was purged up to index {} (those entries live only in the snapshot): restore it, or remove this node's raft directory and join again under a new node_id",
                    dir.join("snapshot").display(),
                    p.index
                )));
            }
            Ok::<_, StartError>((log, sm))
        })
        .await
        .map_err(|e| StartError::Raft(e.to_string()))??;
        let view = sm.subscribe();
        let service = Arc::new(network::MetaService::default());
        let rpc = Rpc::bind(rpc, service.clone(), rpc_metrics).map_err(StartError::Bind)?;
        let t = &cfg.tuning;
        let config = Config {
            cluster_name: "narad".into(),
            heartbeat_interval: t.heartbeat_ms,
            election_timeout_min: t.election_min_ms,
            election_timeout_max: t.election_max_ms,
            install_snapshot_timeout: 5000,
            max_payload_entries: 64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(t.snapshot_after),
            max_in_snapshot_log_to_keep: t.keep_after_snapshot,
            // chunks are JSON on the wire (up to 4 bytes per byte): well below the RPC cap
            snapshot_max_chunk_size: 256 * 1024,
            ..Config::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let net = network::Network::new(rpc.clone());
        let guard = log.clone();
        let mut sm = sm;
        sm.guard(log.clone());
        let raft = Raft::new(cfg.node_id, Arc::new(config), net, log, sm)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        service.set(raft.clone(), &rpc, guard);
        // elections only after a pre-vote ([`election`]); `initialize` still elects at once
        raft.runtime_config().elect(false);
        tokio::spawn(election::run(
            raft.clone(),
            rpc.downgrade(),
            service.clone(),
            cfg.node_id,
            cfg.tuning.clone(),
        ));
        Ok(Self {
            me: cfg.node_id,
            raft,
            rpc,
            view,
            service,
        })
    }

    /// Forms the cluster from its initial voters. Every initial member calls this with the
    /// same list (openraft requires identical memberships); on a node that already has
    /// state it does nothing.
    pub async fn bootstrap(&self, members: &BTreeMap<NodeId, NodeInfo>) -> Result<(), String> {
        match self.raft.initialize(members.clone()).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.me
    }

    pub fn rpc(&self) -> &Rpc {
        &self.rpc
    }

    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// The metadata as last applied on this node.
    pub fn view(&self) -> Arc<MetaView> {
        self.view.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<MetaView>> {
        self.view.clone()
    }

    /// Proposes `cmd` and returns what applying it did, once this node has applied it.
    pub async fn propose(
        &self,
        cmd: MetaCmd,
        deadline: Duration,
    ) -> Result<MetaResponse, ProposeError> {
        // a member that stopped taking part passes nothing on (nothing is applied: say so)
        if let Some(why) = self.halted() {
            return Err(ProposeError::Stopped(why));
        }
        let req = MetaRequest {
            id: u128::from_le_bytes(random_bytes()),
            cmd,
        };
        let size = serde_json::to_vec(&req)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_REQUEST_BYTES {
            return Err(ProposeError::TooLarge(size));
        }
        let end = Instant::now() + deadline;
        let mut sent = false;
        let mut last = String::from("no leader yet");
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(if sent {
                    ProposeError::Unknown(last)
                } else {
                    ProposeError::Unavailable(last)
                });
            }
            let leader = self.raft.current_leader().await;
            let attempt = match leader {
                Some(l) if l == self.me && self.handing_off() => Err(Attempt::Retry {
                    reason: "this node is handing its leadership on".into(),
                    sent: false,
                }),
                Some(l) if l == self.me => {
                    sent = true;
                    // a leader cut off from its quorum would wait for a commit forever
                    tokio::time::timeout(left, network::write_here(&self.raft, req.clone()))
                        .await
                        .unwrap_or_else(|_| {
                            Err(Attempt::Retry {
                                reason: "not committed in time (no quorum?)".into(),
                                sent: true,
                            })
                        })
                }
                Some(l) => match self.leader_addr(l) {
                    Some(addr) => {
                        // a leader killed outright keeps its connection looking alive until
                        // the idle timeout: each attempt is short, and retried (same id)
                        let attempt = left.min(FORWARD_ATTEMPT);
                        let r = network::forward(&self.rpc, l, &addr, &req, attempt).await;
                        sent |= !matches!(&r, Err(Attempt::Retry { sent: false, .. }));
                        r
                    }
                    None => Err(Attempt::Retry {
                        reason: format!("leader {l} is not in the membership"),
                        sent: false,
                    }),
                },
                None => Err(Attempt::Retry {
                    reason: "no leader elected".into(),
                    sent: false,
                }),
            };
            match attempt {
                Ok(resp) => {
                    let left = end.saturating_duration_since(Instant::now());
                    self.raft
                        .wait(Some(left.max(Duration::from_millis(1))))
                        .applied_index_at_least(Some(resp.index), "proposal applied here")
                        .await
                        .map_err(|e| {
                            ProposeError::Unknown(format!(
                                "applied on the leader, not yet here: {e}"
                            ))
                        })?;
                    return Ok(resp);
                }
                Err(Attempt::Fatal(e)) => return Err(ProposeError::Stopped(e)),
                Err(Attempt::Retry { reason, .. }) => {
                    last = reason;
                    // wait for the leadership to change (or a moment), never spin
                    let left = end.saturating_duration_since(Instant::now());
                    let wait = left.min(Duration::from_millis(200));
                    let _ = self
                        .raft
                        .wait(Some(wait))
                        .metrics(
                            |m| m.current_leader.is_some() && m.current_leader != leader,
                            "leader change",
                        )
                        .await;
                }
            }
        }
    }

    /// Confirms this node's view is current: the leader proves it still leads (a quorum
    /// answers its heartbeat) and names its commit point, and this node waits until it has
    /// applied that far. What to call before anything destructive, and what readiness means.
    /// Returns the applied index it reached.
    pub async fn read_index(&self, deadline: Duration) -> Result<u64, ProposeError> {
        let end = Instant::now() + deadline;
        let index = match self.raft.current_leader().await {
            None => return Err(ProposeError::Unavailable("no leader elected".into())),
            Some(l) if l == self.me && self.handing_off() => {
                return Err(ProposeError::Unavailable(
                    "this node is handing its leadership on".into(),
                ));
            }
            Some(l) if l == self.me => {
                tokio::time::timeout(deadline, self.raft.ensure_linearizable())
                    .await
                    .map_err(|_| {
                        ProposeError::Unavailable(
                            "no quorum confirmed the leadership in time".into(),
                        )
                    })?
                    .map_err(|e| ProposeError::Unavailable(e.to_string()))?
                    .map_or(0, |l| l.index)
            }
            Some(l) => {
                let addr = self.leader_addr(l).ok_or_else(|| {
                    ProposeError::Unavailable(format!("leader {l} is not in the membership"))
                })?;
                network::read_index_at(&self.rpc, l, &addr, deadline)
                    .await
                    .map_err(ProposeError::Unavailable)?
            }
        };
        let left = end.saturating_duration_since(Instant::now());
        self.raft
            .wait(Some(left.max(Duration::from_millis(1))))
            .applied_index_at_least(Some(index), "read index")
            .await
            .map_err(|e| ProposeError::Unavailable(format!("not caught up to {index}: {e}")))?;
        Ok(index)
    }

    /// Whether this node is a voter in the membership it has applied.
    pub fn is_voter(&self) -> bool {
        let m = self.raft.metrics().borrow().membership_config.clone();
        m.membership().voter_ids().any(|id| id == self.me)
    }

    /// Removes member `id` from the cluster (through the leader). The error is the refusal
    /// (`member_not_found`, `member_not_removable`) or why the leader could not be asked.
    pub async fn remove_member(&self, id: NodeId, deadline: Duration) -> Result<(), RemoveError> {
        match self.raft.current_leader().await {
            None => Err(RemoveError::Unavailable("no leader elected".into())),
            Some(l) if l == self.me => {
                tokio::time::timeout(deadline, network::remove_here(&self.raft, id))
                    .await
                    .map_err(|_| {
                        RemoveError::Unavailable(format!(
                            "not done within {} ms (no quorum?); it may still take effect",
                            deadline.as_millis()
                        ))
                    })?
                    .map_err(RemoveError::from_fault)
            }
            Some(l) => {
                let addr = self.leader_addr(l).ok_or_else(|| {
                    RemoveError::Unavailable(format!("leader {l} is not in the membership"))
                })?;
                match network::remove_at(&self.rpc, l, &addr, id, deadline).await {
                    Ok(()) => Ok(()),
                    Err(RpcError::Remote { fault, .. }) => Err(RemoveError::from_fault(fault)),
                    Err(e) => Err(RemoveError::Unavailable(e.to_string())),
                }
            }
        }
    }

    /// Asks the cluster (through any of `seeds`) to make this node a voter, and returns once
    /// the request was accepted. Safe to repeat: a node that is a voter already stays one.
    pub async fn join(
        &self,
        seeds: &[(NodeId, String)],
        me: NodeInfo,
        deadline: Duration,
    ) -> Result<(), String> {
        let mut errors = Vec::new();
        let mut asked: BTreeSet<NodeId> = BTreeSet::new();
        let mut ask: std::collections::VecDeque<(NodeId, String)> = seeds.iter().cloned().collect();
        while let Some((id, addr)) = ask.pop_front() {
            if id == self.me || !asked.insert(id) {
                continue;
            }
            match network::join_at(&self.rpc, id, &addr, self.me, &me, deadline).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    // a member that does not lead names the leader: asked next, even when
                    // the seeds do not list it
                    if let Some(leader) = network::leader_named(&e) {
                        ask.push_front(leader);
                    }
                    errors.push(format!("node {id} at {addr}: {e}"));
                }
            }
        }
        Err(errors.join("; "))
    }

    fn leader_addr(&self, leader: NodeId) -> Option<String> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        m.membership().get_node(&leader).map(|n| n.rpc_addr.clone())
    }

    /// Whether this node is the Raft leader, as far as it knows.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.me)
    }

    /// Who leads, the term, what is applied here, and the voters.
    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        Status {
            node_id: self.me,
            leader: m.current_leader,
            term: m.current_term,
            last_applied: m.last_applied.map(|l| l.index),
            last_log: m.last_log_index,
            members: membership
                .nodes()
                .map(|(id, n)| (*id, n.rpc_addr.clone(), voters.contains(id)))
                .collect(),
            state: format!("{:?}", m.state),
        }
    }

    /// Stops the Raft node and the RPC endpoint.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
        self.rpc.shutdown().await;
    }
}

/// Why a member was not removed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    NotRemovable(String),
    /// No leader could be asked, or it did not answer: retryable.
    #[error("{0}")]
    Unavailable(String),
}

impl RemoveError {
    fn from_fault(f: crate::rpc::Fault) -> Self {
        match f.code.as_str() {
            "member_not_found" => Self::NotFound(f.message),
            "member_not_removable" => Self::NotRemovable(f.message),
            _ => Self::Unavailable(f.to_string()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub node_id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_applied: Option<u64>,
    pub last_log: Option<u64>,
    /// (id, RPC address, voter)
    pub members: Vec<(NodeId, String, bool)>,
    pub state: String,
}

enum Attempt {
    /// Try again (another leader, or after an election); `sent` if it may have been applied.
    Retry {
        reason: String,
        sent: bool,
    },
    Fatal(String),
}

impl From<RpcError> for Attempt {
    fn from(e: RpcError) -> Self {
        Attempt::Retry {
            sent: !e.not_sent(),
            reason: e.to_string(),
        }
    }
}

fn client_write_error(e: RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>) -> Attempt {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => Attempt::Retry {
            reason: format!("leadership moved (to {:?})", f.leader_id),
            sent: false,
        },
        RaftError::APIError(e) => Attempt::Retry {
            reason: e.to_string(),
            sent: true,
        },
        RaftError::Fatal(f) => Attempt::Fatal(f.to_string()),
    }
}

/// Random bytes that are no secret (request and snapshot ids, log nonces, election
/// timeouts): from [`narad_core::random_u64`], so a deterministic run draws the same ones.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(8) {
        let v = narad_core::random_u64().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    out
}

// `declare_raft_types!` names `Cursor` for the default snapshot data.
const _: fn() = || {
    let _: Cursor<Vec<u8>> = Cursor::new(Vec::new());
};
