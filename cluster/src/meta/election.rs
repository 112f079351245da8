//! Elections behind a pre-vote round.
//!
//! openraft 0.9 stands for election as soon as a follower's timer runs out, with a higher
//! term, and a leader that hears a higher term steps down. So a follower that was frozen
//! (SIGSTOP, a paused VM) or cut off for a few seconds came back, stood, and took the
//! leadership from a healthy leader: every gray failure cost an election. And a member
//! removed while it was away never learnt it: it stood every few seconds, for ever.
//!
//! Here openraft's own election timer is off. This node stands only after a pre-vote: it
//! asks every voter whether it would vote for it, without raising any term, and stands once
//! a majority (of each half of a joint membership) says yes. A voter says no while it leads,
//! or while it heard from a leader within the leader lease (openraft's own rule for refusing
//! votes), or when its log is ahead of the candidate's. A voter whose membership is newer
//! than the candidate's and does not list it tells it so: the candidate knows it was removed,
//! says so in its log and its readiness, and stops standing.
//!
//! The lease is `election_max_ms`: a voter refuses real votes that long after its leader's
//! last append, so a candidate waits that long, plus a random spread of
//! `election_max_ms - election_min_ms`, after the last leader contact before it asks.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::{LogId, Raft, ServerState};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{NodeId, Tuning, TypeConfig, random_bytes};
use crate::rpc::{Fault, WeakRpc};

use crate::rpc::ops::PRE_VOTE;

/// "Would you vote for me?", asked without raising any term.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PreVote {
    pub candidate: NodeId,
    pub last_log: Option<LogId<NodeId>>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PreVoteReply {
    pub granted: bool,
    /// Whether the candidate is a voter in the answering node's committed membership (an
    /// uncommitted one may still be undone: it never tells a node it was removed).
    pub member: bool,
    /// Where that committed membership was written in the log.
    pub membership: Option<LogId<NodeId>>,
    /// Why not, when not granted.
    pub why: String,
}

/// What a node's Raft state says about elections, read in one go.
struct Seen {
    state: ServerState,
    /// The leader lease from the last leader contact still holds.
    lease_held: bool,
    last_contact: Option<Instant>,
    /// The voters, one set per half of a joint membership.
    configs: Vec<BTreeSet<NodeId>>,
    membership: Option<LogId<NodeId>>,
    /// The committed membership: its voters and where it was written.
    committed: (BTreeSet<NodeId>, Option<LogId<NodeId>>),
}

async fn seen(raft: &Raft<TypeConfig>, lease: Duration) -> Option<Seen> {
    raft.with_raft_state(move |st| {
        let eff = st.membership_state.effective();
        let last_contact = st.vote_last_modified();
        Seen {
            state: st.server_state,
            lease_held: st.vote_ref().is_committed()
                && last_contact.is_some_and(|t| Instant::now() <= t + lease),
            last_contact,
            configs: eff.membership().get_joint_config().clone(),
            membership: *eff.log_id(),
            committed: {
                let c = st.membership_state.committed();
                (c.voter_ids().collect(), *c.log_id())
            },
        }
    })
    .await
    .ok()
}

/// The answer to a pre-vote from `req.candidate`.
pub(super) async fn answer(
    raft: &Raft<TypeConfig>,
    handing_off: bool,
    req: PreVote,
) -> Result<PreVoteReply, Fault> {
    let lease = Duration::from_millis(raft.config().election_timeout_max);
    let Some(s) = seen(raft, lease).await else {
        return Err(Fault::new(
            503,
            "metastore_stopped",
            "the metastore stopped",
        ));
    };
    let last_log = raft.data_metrics().borrow().last_log;
    let member = s.committed.0.contains(&req.candidate);
    let refuse = if s.state == ServerState::Leader && !handing_off {
        Some("this node leads".to_owned())
    } else if s.lease_held {
        Some("this node heard from its leader within the leader lease".to_owned())
    } else if req.last_log < last_log {
        Some(format!(
            "this node's log is ahead ({last_log:?} > {:?})",
            req.last_log
        ))
    } else {
        None
    };
    Ok(PreVoteReply {
        granted: refuse.is_none(),
        member,
        membership: s.committed.1,
        why: refuse.unwrap_or_default(),
    })
}

/// How long after the last leader contact this node asks: the lease and a random spread.
fn timeout(t: &Tuning) -> Duration {
    let spread = t.election_max_ms.saturating_sub(t.election_min_ms).max(1);
    let r = u64::from_le_bytes(random_bytes::<8>()) % spread;
    Duration::from_millis(t.election_max_ms + r)
}

/// What the election needs from this member's Raft endpoint (the service answering the
/// other members), kept to these questions so the election does not depend on it.
pub(super) trait Standing: Send + Sync + 'static {
    /// Whether this member may stand now: not handing leadership off, not removed from the
    /// cluster, its log not halted.
    fn may_stand(&self) -> bool;
    /// Records that a voter with a newer membership left this member out; `true` when it
    /// was already known.
    fn mark_removed(&self) -> bool;
    fn is_removed(&self) -> bool;
}

/// Stands for election when the leader has been silent long enough and a majority agrees,
/// until the Raft node or the endpoint stops.
pub(super) async fn run(
    raft: Raft<TypeConfig>,
    rpc: WeakRpc,
    service: Arc<impl Standing>,
    me: NodeId,
    t: Tuning,
) {
    let lease = Duration::from_millis(t.election_max_ms);
    let tick = Duration::from_millis((t.heartbeat_ms / 2).clamp(10, 100));
    let ask_for = Duration::from_millis((t.election_min_ms / 2).max(100));
    let started = Instant::now();
    let mut last_try = started;
    let mut wait = timeout(&t);
    loop {
        // the election timer: on tokio's clock, as openraft's lease it is compared with
        #[allow(clippy::disallowed_methods)]
        tokio::time::sleep(tick).await;
        let Some(s) = seen(&raft, lease).await else {
            return;
        };
        if s.state == ServerState::Leader
            || !service.may_stand()
            || !s.configs.iter().any(|c| c.contains(&me))
        {
            continue;
        }
        let since = s.last_contact.map_or(last_try, |c| c.max(last_try));
        let alone = s.configs.iter().all(|c| c.len() == 1);
        if !alone && since.elapsed() < wait {
            continue;
        }
        if alone && s.state == ServerState::Candidate && since.elapsed() < wait {
            continue;
        }
        last_try = Instant::now();
        wait = timeout(&t);
        if alone {
            tracing::info!(node_id = me, "the only voter: standing for election");
            if raft.trigger().elect().await.is_err() {
                return;
            }
            continue;
        }
        let Some(rpc) = rpc.upgrade() else {
            return;
        };
        let ask = PreVote {
            candidate: me,
            last_log: raft.data_metrics().borrow().last_log,
        };
        let body = Bytes::from(serde_json::to_vec(&ask).expect("pre-votes serialise"));
        let peers: BTreeSet<NodeId> = s.configs.iter().flatten().copied().collect();
        let mut asked = tokio::task::JoinSet::new();
        for peer in peers.into_iter().filter(|p| *p != me) {
            let Some(addr) = raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&peer)
                .map(|n| n.rpc_addr.clone())
            else {
                continue;
            };
            let (rpc, body) = (rpc.clone(), body.clone());
            asked.spawn(async move {
                let reply = rpc.call(peer, &addr, PRE_VOTE, body, ask_for).await;
                (
                    peer,
                    reply
                        .ok()
                        .and_then(|b| serde_json::from_slice::<PreVoteReply>(&b).ok()),
                )
            });
        }
        drop(rpc);
        let mut granted = BTreeSet::from([me]);
        let mut refusals = Vec::new();
        while let Some(done) = asked.join_next().await {
            let Ok((peer, reply)) = done else { continue };
            match reply {
                Some(r) if !r.member && r.membership > s.membership => {
                    if service.mark_removed() {
                        continue;
                    }
                    tracing::error!(
                        node_id = me,
                        by = peer,
                        "this node was removed from the cluster (member {peer} holds a newer membership without it): it no longer stands for election; stop it, or wipe its data directory and join again under a new node_id"
                    );
                }
                Some(r) if r.granted => {
                    granted.insert(peer);
                }
                Some(r) => refusals.push(format!("{peer}: {}", r.why)),
                None => refusals.push(format!("{peer}: no answer")),
            }
        }
        if service.is_removed() {
            continue;
        }
        let majority = s
            .configs
            .iter()
            .all(|c| c.intersection(&granted).count() * 2 > c.len());
        // a leader may have been elected while this node asked (the answers are from
        // before): one it heard from since is followed, not deposed
        let now = seen(&raft, lease).await;
        if now
            .as_ref()
            .is_some_and(|n| n.lease_held || n.state == ServerState::Leader)
        {
            continue;
        }
        if majority {
            tracing::info!(
                node_id = me,
                granted = ?granted,
                "no leader heard from by a majority: standing for election"
            );
            if raft.trigger().elect().await.is_err() {
                return;
            }
        } else {
            tracing::debug!(node_id = me, refusals = ?refusals, "pre-vote refused: not standing");
        }
    }
}
