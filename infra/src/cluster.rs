//! This node's place in its cluster: the metastore (Raft), how the node forms or joins the
//! cluster, and what readiness means for a member.
//!
//! A node listed in `cluster_members` bootstraps with the others (openraft needs the same
//! list on every one of them; on a node that already has state this does nothing). A node
//! not listed asks the listed ones to add it, until one of them (the leader) does. Then,
//! every second, the node confirms its view of the metadata is current with a read index
//! (the leader proves it still leads to a quorum, this node applies up to its commit point):
//! `/readyz` is 503 until that succeeds, and again whenever it fails (no leader, no quorum,
//! this node cut off).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use narad_auth::store::{ROOT_USER, UserCommand, UserStore};
use narad_cluster::meta::{
    MetaCmd, MetaConfig, MetaView, Metastore, NodeInfo, Outcome, ProposeError, Tuning,
};
use narad_cluster::rpc::{Keys, Limits, RpcConfig, RpcMetrics};
use narad_core::catalog::store::{MetaStore, Proposal, Publish, Replication, StoreError};
use narad_core::catalog::{Catalog, CatalogCommand};
use narad_core::clock::SharedClock;
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ClusterSettings;
use narad_auth::root::announce_root;

/// Why a member removed from the cluster is not ready.
const REMOVED: &str = "this node was removed from the cluster: stop it, or wipe its data directory and join again under a new node_id";

/// How often a member re-checks that its metadata is current.
const READY_CHECK: Duration = Duration::from_secs(1);
const READ_INDEX_DEADLINE: Duration = Duration::from_secs(2);
/// How long a metadata change made through the HTTP API waits for a leader and its commit.
pub const PROPOSE_DEADLINE: Duration = Duration::from_secs(10);

/// The member's Raft figures, filled in at scrape time.
#[derive(Debug, Default)]
pub struct RaftGauges {
    term: Gauge,
    leader: Gauge,
    is_leader: Gauge,
    applied: Gauge,
    last_log: Gauge,
    voters: Gauge,
    ready: Gauge,
}

impl RaftGauges {
    pub fn register(&self, r: &mut Registry) {
        for (name, help, g) in [
            (
                "narad_raft_term",
                "the metastore's current Raft term",
                &self.term,
            ),
            (
                "narad_raft_leader",
                "the node id of the metastore's leader (0: none known)",
                &self.leader,
            ),
            (
                "narad_raft_is_leader",
                "1 while this node leads the metastore",
                &self.is_leader,
            ),
            (
                "narad_raft_applied_index",
                "the last metadata log index applied on this node",
                &self.applied,
            ),
            (
                "narad_raft_last_log_index",
                "the last metadata log index on this node's disk",
                &self.last_log,
            ),
            (
                "narad_raft_voters",
                "voters in the membership this node has applied",
                &self.voters,
            ),
            (
                "narad_cluster_ready",
                "1 while this member's metadata is confirmed current (/readyz)",
                &self.ready,
            ),
        ] {
            r.register(name, help, g.clone());
        }
    }
}

pub struct ClusterNode {
    pub meta: Metastore,
    pub rpc_metrics: Arc<RpcMetrics>,
    pub gauges: RaftGauges,
    advertise: String,
    initial: BTreeMap<u64, NodeInfo>,
    is_initial: bool,
    ready: AtomicBool,
    /// Why the node is not ready, for `/readyz`.
    not_ready: Mutex<String>,
    /// With security on: the users, mirrored from the metastore, and the root password to
    /// seed the cluster's root user with if it has none (else one is generated).
    users: Option<Arc<UserStore>>,
    admin_password: Option<String>,
}

impl ClusterNode {
    /// Opens the metastore under `<data_dir>/raft` and binds the cluster endpoint.
    pub async fn start(
        s: &ClusterSettings,
        data_dir: &Path,
        users: Option<Arc<UserStore>>,
        admin_password: Option<String>,
    ) -> Result<Arc<Self>, String> {
        let rpc_metrics = Arc::new(RpcMetrics::default());
        let meta = Metastore::start(
            MetaConfig {
                node_id: s.node_id,
                dir: data_dir.join("raft"),
                tuning: match narad_core::failpoint::number("meta.snapshot_after") {
                    None | Some(0) => Tuning::default(),
                    Some(n) => Tuning {
                        snapshot_after: n,
                        keep_after_snapshot: (n / 4).max(1),
                        ..Tuning::default()
                    },
                },
            },
            RpcConfig {
                node_id: s.node_id,
                bind: s.bind,
                keys: Keys::new(&s.secrets.current, s.secrets.previous.as_deref()),
                features: 0,
                limits: Limits::default(),
            },
            rpc_metrics.clone(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let initial = s
            .members
            .iter()
            .map(|m| {
                (
                    m.id,
                    NodeInfo {
                        rpc_addr: m.addr.clone(),
                    },
                )
            })
            .collect();
        Ok(Arc::new(Self {
            meta,
            rpc_metrics,
            gauges: RaftGauges::default(),
            advertise: s.advertise.clone(),
            initial,
            is_initial: s.is_initial_member(),
            ready: AtomicBool::new(false),
            not_ready: Mutex::new("the cluster is forming".into()),
            users,
            admin_password,
        }))
    }

    pub fn node_id(&self) -> u64 {
        self.meta.node_id()
    }

    /// The voters of the applied membership, this node left out.
    pub fn other_voters(&self) -> Vec<u64> {
        let me = self.node_id();
        self.meta
            .view()
            .membership
            .membership()
            .voter_ids()
            .filter(|&v| v != me)
            .collect()
    }

    /// `Ok` when this node is a voter whose metadata was confirmed current within the last
    /// check; else why not.
    pub fn ready(&self) -> Result<(), String> {
        if self.meta.removed() {
            Err(REMOVED.into())
        } else if self.ready.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(self.not_ready.lock().clone())
        }
    }

    fn set_ready(&self, r: Result<(), String>) {
        let was = self.ready.load(Ordering::Acquire);
        match r {
            Ok(()) => {
                if !was {
                    tracing::info!(
                        node_id = self.node_id(),
                        "cluster member ready: its metadata is current"
                    );
                }
                self.ready.store(true, Ordering::Release);
            }
            Err(why) => {
                if was {
                    tracing::warn!(node_id = self.node_id(), reason = %why, "cluster member not ready");
                }
                *self.not_ready.lock() = why;
                self.ready.store(false, Ordering::Release);
            }
        }
    }

    /// Follows the metastore until `stop`: the user store mirrors its users, and the
    /// cluster endpoint learns its members' addresses (the initial list and the membership),
    /// whose handshakes get slots strangers cannot take.
    pub async fn follow(self: Arc<Self>, stop: CancellationToken) {
        let mut view = self.meta.subscribe();
        let mut known: Vec<String> = Vec::new();
        loop {
            let v = view.borrow_and_update().clone();
            if let Some(store) = &self.users {
                store.replace_all(v.users.clone(), v.deleted_users.clone());
            }
            let mut addrs: Vec<String> = self
                .initial
                .values()
                .chain(v.membership.membership().nodes().map(|(_, n)| n))
                .map(|n| n.rpc_addr.clone())
                .collect();
            addrs.sort();
            addrs.dedup();
            if addrs != known {
                let mut resolved = Vec::new();
                for a in &addrs {
                    // a name resolves now; bounded, and a failure only leaves it out for now
                    if let Ok(Ok(found)) = tokio::time::timeout(
                        Duration::from_secs(2),
                        tokio::net::lookup_host(a.as_str()),
                    )
                    .await
                    {
                        resolved.extend(found);
                    }
                }
                self.meta.rpc().set_known_peers(resolved);
                known = addrs;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                r = view.changed() => if r.is_err() { return },
            }
        }
    }

    /// Proposes a user change, and once this node has applied it, mirrors the users (so the
    /// caller reads its own write). The inner result is the state machine's verdict.
    pub async fn propose_users(
        &self,
        cmd: UserCommand,
    ) -> Result<Result<(), narad_auth::store::Refusal>, ProposeError> {
        let r = self
            .meta
            .propose(MetaCmd::Users(cmd), PROPOSE_DEADLINE)
            .await?;
        if let Some(store) = &self.users {
            let v = self.meta.view();
            store.replace_all(v.users.clone(), v.deleted_users.clone());
        }
        match r.outcome {
            Outcome::Users(verdict) => Ok(verdict),
            other => Err(ProposeError::Stopped(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Creates the cluster's root user if it has none: with `NARAD_ADMIN_PASSWORD`, or a
    /// generated password printed once on stderr by the node whose proposal won.
    async fn seed_root(&self) -> Result<(), String> {
        if self.users.is_none() || self.meta.view().users.contains_key(ROOT_USER) {
            return Ok(());
        }
        let (root, generated) = narad_auth::root::new_root(self.admin_password.clone()).await?;
        match self.propose_users(UserCommand::Create { user: root }).await {
            Ok(Ok(())) => {
                announce_root(generated.as_deref());
                Ok(())
            }
            // another member created it first
            Ok(Err(_)) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Forms or joins the cluster, then keeps readiness current, until `stop`.
    pub async fn run(self: Arc<Self>, clock: SharedClock, stop: CancellationToken) {
        let mut backoff = Duration::from_millis(250);
        loop {
            let step = if self.is_initial {
                self.meta.bootstrap(&self.initial).await
            } else if self.meta.is_voter() {
                Ok(())
            } else {
                let seeds: Vec<(u64, String)> = self
                    .initial
                    .iter()
                    .map(|(id, n)| (*id, n.rpc_addr.clone()))
                    .collect();
                let me = NodeInfo {
                    rpc_addr: self.advertise.clone(),
                };
                self.meta
                    .join(&seeds, me, Duration::from_secs(30))
                    .await
                    .map_err(|e| format!("joining the cluster: {e}"))
            };
            match step {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "cluster not joined yet; retrying");
                    self.set_ready(Err(e));
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = clock.sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        loop {
            let check = if self.meta.removed() {
                Err(REMOVED.into())
            } else if let Some(why) = self.meta.halted() {
                Err(why)
            } else if self.meta.handing_off() {
                Err("handing its leadership on before it leaves the cluster".into())
            } else if self.meta.is_voter() {
                self.meta
                    .read_index(READ_INDEX_DEADLINE)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("metadata not confirmed current: {e}"))
            } else {
                Err("not a voter yet".into())
            };
            // a member is ready only once the cluster has a root user to log in as
            let check = match check {
                Ok(()) => self
                    .seed_root()
                    .await
                    .map_err(|e| format!("creating the root user: {e}")),
                e => e,
            };
            self.set_ready(check);
            tokio::select! {
                () = stop.cancelled() => return,
                () = clock.sleep(READY_CHECK) => {}
            }
        }
    }

    /// What `GET /v1/cluster` answers.
    pub fn status(&self) -> serde_json::Value {
        let s = self.meta.status();
        let raft = self.meta.raft().metrics().borrow().clone();
        let matched = raft.replication.clone().unwrap_or_default();
        let catalog = self.meta.view().catalog.clone();
        let owned = |id: u64| -> usize {
            catalog
                .topics()
                .map(|t| t.owners.iter().filter(|o| **o == id).count())
                .sum()
        };
        let members: Vec<serde_json::Value> = s
            .members
            .iter()
            .map(|(id, addr, voter)| {
                let mut m = serde_json::json!({
                    "node_id": id,
                    "rpc_addr": addr,
                    "voter": voter,
                    "partitions": owned(*id),
                    "draining": catalog.draining().contains(id),
                    "witnesses": catalog.in_sync(*id),
                });
                // the leader knows how far each member's log matches its own
                if s.leader == Some(self.node_id()) {
                    m["matched_index"] = serde_json::json!(if *id == self.node_id() {
                        s.last_log
                    } else {
                        matched.get(id).cloned().flatten().map(|l| l.index)
                    });
                }
                m
            })
            .collect();
        serde_json::json!({
            "node_id": self.node_id(),
            "leader": s.leader,
            "term": s.term,
            "state": s.state,
            "ready": self.ready().is_ok(),
            "last_applied": s.last_applied,
            "last_log": s.last_log,
            "members": members,
        })
    }

    /// Fills the Raft gauges (at scrape time).
    pub fn observe(&self) {
        let s = self.meta.status();
        let g = &self.gauges;
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        g.term.set(n(s.term));
        g.leader.set(n(s.leader.unwrap_or(0)));
        g.is_leader.set(i64::from(s.leader == Some(self.node_id())));
        g.applied.set(n(s.last_applied.unwrap_or(0)));
        g.last_log.set(n(s.last_log.unwrap_or(0)));
        g.voters
            .set(s.members.iter().filter(|m| m.2).count() as i64);
        g.ready.set(i64::from(self.ready().is_ok()));
    }

    pub async fn shutdown(&self) {
        self.meta.shutdown().await;
    }
}

/// The broker's catalog on a cluster member: commands go through the metastore (Raft), and
/// every member's broker follows the catalog its state machine publishes
/// ([`follow_catalog`]). Partitions are placed round-robin over the voters, starting at a
/// point the topic's incarnation id picks (so topics do not all start on one node).
pub struct ReplicatedCatalog {
    node: Arc<ClusterNode>,
    published: watch::Sender<Arc<Catalog>>,
}

impl std::fmt::Debug for ReplicatedCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatedCatalog")
            .field("node_id", &self.node.node_id())
            .finish_non_exhaustive()
    }
}

impl ReplicatedCatalog {
    pub fn new(node: Arc<ClusterNode>) -> Arc<Self> {
        let published = watch::Sender::new(node.meta.view().catalog.clone());
        Arc::new(Self { node, published })
    }
}

impl MetaStore for ReplicatedCatalog {
    fn propose(&self, _cmd: CatalogCommand, _publish: Publish) -> Proposal {
        Box::pin(async {
            Err(StoreError::Unavailable(
                "a cluster member's catalog changes through replicate".into(),
            ))
        })
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.node.meta.view().catalog.clone()
    }

    fn subscribe(&self) -> watch::Receiver<Arc<Catalog>> {
        self.published.subscribe()
    }

    fn replicated(&self) -> bool {
        true
    }

    fn replicate(&self, cmd: CatalogCommand) -> Replication {
        let node = self.node.clone();
        // (spawned: a caller that gives up does not abandon a command half way)
        let task = tokio::spawn(async move {
            let r = node
                .meta
                .propose(MetaCmd::Catalog(cmd), PROPOSE_DEADLINE)
                .await
                .map_err(|e| StoreError::Unavailable(unavailable(&e)))?;
            match r.outcome {
                Outcome::Catalog(Ok(_)) => Ok(()),
                Outcome::Catalog(Err(e)) => Err(StoreError::Refused(e)),
                other => Err(StoreError::Unavailable(format!(
                    "the metastore answered {other:?}"
                ))),
            }
        });
        Box::pin(async move {
            task.await
                .unwrap_or_else(|e| Err(StoreError::Unavailable(e.to_string())))
        })
    }

    fn node_id(&self) -> Option<u64> {
        Some(self.node.node_id())
    }

    fn place(&self, topic_id: u64, from: u32, to: u32) -> Vec<u64> {
        let view = self.node.meta.view();
        let mut voters: Vec<u64> = view.membership.membership().voter_ids().collect();
        if voters.is_empty() {
            voters.push(self.node.node_id());
        }
        voters.sort_unstable();
        let n = voters.len() as u64;
        (from..to)
            .map(|p| voters[((topic_id % n + u64::from(p)) % n) as usize])
            .collect()
    }
}

/// What a client is told when a metadata change could not be committed.
fn unavailable(e: &ProposeError) -> String {
    match e {
        ProposeError::Unknown(why) => format!(
            "the cluster did not confirm the change in time ({why}); it may or may not have taken effect: retry"
        ),
        other => format!("the cluster cannot change its metadata now ({other}); retry shortly"),
    }
}

/// Makes `broker` follow the catalog the metastore publishes, until `stop`: topics made,
/// changed or deleted through any member open, change or go here too. A pass that fails (a
/// disk failure opening a partition) is retried on the next change, or after a second.
pub async fn follow_catalog(
    node: Arc<ClusterNode>,
    store: Arc<ReplicatedCatalog>,
    broker: Arc<narad_core::broker::Broker>,
    stop: CancellationToken,
) {
    let mut view = node.meta.subscribe();
    let mut swept = false;
    loop {
        let catalog = view.borrow_and_update().catalog.clone();
        let retry = match broker.follow_catalog(&catalog).await {
            Ok(()) => {
                store.published.send_if_modified(|c| {
                    let newer = catalog.applied() > c.applied();
                    if newer {
                        *c = catalog.clone();
                    }
                    newer
                });
                if !swept {
                    swept = sweep_once_current(&node, &view, &catalog, &broker).await;
                }
                // until the sweep is done, look again every second: readiness can come
                // without a catalog change
                (!swept).then_some(READY_CHECK)
            }
            Err(e) => {
                tracing::error!(error = %e, "could not follow the cluster's catalog; retrying");
                Some(Duration::from_secs(1))
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            r = view.changed() => if r.is_err() { return },
            () = pause(retry) => {}
        }
    }
}

/// Once per start, as soon as this member is ready (its catalog confirmed current by a read
/// index) and has followed everything its state machine applied: removes directories of
/// topics deleted while it was stopped ([`narad_core::broker::Broker::sweep_deleted_topics`]).
/// Whether that is done.
async fn sweep_once_current(
    node: &ClusterNode,
    view: &watch::Receiver<Arc<MetaView>>,
    followed: &Catalog,
    broker: &Arc<narad_core::broker::Broker>,
) -> bool {
    // ready first, then what was applied: the read index that made it ready is at or below
    if node.ready().is_err() || followed.applied() < view.borrow().catalog.applied() {
        return false;
    }
    match broker.sweep_deleted_topics().await {
        Ok(n) => {
            if n > 0 {
                tracing::info!(
                    removed = n,
                    "removed the data of topics deleted while this member was down"
                );
            }
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not sweep deleted topics' data; retrying");
            false
        }
    }
}

/// Waits `d`, or forever for `None`.
async fn pause(d: Option<Duration>) {
    match d {
        // a retry after a failure, in real time (no broker clock involved)
        #[allow(clippy::disallowed_methods)]
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
