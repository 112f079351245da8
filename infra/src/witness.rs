//! An owner's acknowledged ends, held by the other voters before it answers a produce.
//!
//! A member restarted from an older copy of its data directory (a VM snapshot, a backup)
//! holds logs that end below offsets it acknowledged. At its start it asks the other voters
//! how far each of its partitions was acknowledged and goes on after that
//! ([`crate::moves`], `verify_held`). For that answer to be complete, an owner keeps a set
//! of **witnesses** in the catalog ([`CatalogCommand::SetInSync`]): the other voters that
//! hold every end it acknowledged. It answers a produce only once every witness holds the
//! new end of each partition it wrote ([`narad_cluster::rpc::ops::WITNESS`], in memory there; kept on
//! their disks within a second), or once a witness that did not answer in time
//! ([`WAIT`]: frozen, dead, cut off) is out of the set (committed). Its restarted self serves
//! a partition only after every witness answered (one left out is not trusted to know).
//!
//! A voter joins the witnesses once it answers: the owner waits for it in every flight from
//! then on, tells it the durable end of every partition it owns, and only then adds it
//! (committed). A witness that misses a flight while no quorum lets the owner drop it
//! (an owner cut off from the others) is no longer waited for and is dropped as soon as a
//! quorum lets it; produces are answered meanwhile, and a warning says when no voter held
//! them. While this member's partitions are checked after its start, no witness is dropped
//! (one may hold what the check needs).
//!
//! The member that forwarded a produce keeps what it is answered, so it is not told. Concurrent
//! produces share one flight: the ends that arrive while a flight is out go in the next one.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_cluster::meta::{MetaCmd, Outcome};
use narad_core::broker::Produced;
use narad_core::catalog::CatalogCommand;
use narad_core::ids::PartitionId;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::cluster::ClusterNode;

/// How long a flight waits for the voters it waits for.
const WAIT: Duration = Duration::from_millis(100);
/// How long a voter not waited for has to answer (it is told all the same), and a joining
/// one to take the ends of every partition.
const TELL: Duration = Duration::from_secs(2);
/// How long a change of the witnesses may take to commit before the owner goes on without.
const CHANGE: Duration = Duration::from_secs(1);
/// Ends in one call (as in a report).
pub const MAX_ENDS: usize = 65_536;
/// How often the warning for produces no voter witnessed is logged, at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// One partition's end in a flight.
struct End {
    t: u64,
    p: u32,
    e: u64,
    /// The voter not told (it forwarded every produce behind this end).
    skip: Option<u64>,
}

pub struct Witnesses {
    node: Arc<ClusterNode>,
    state: Mutex<Flights>,
    /// The last flight done.
    done: watch::Sender<u64>,
    /// Held while the witnesses change in the catalog: one change at a time.
    changing: tokio::sync::Mutex<()>,
    /// Set while this member's partitions are checked after its start: no witness is
    /// dropped meanwhile.
    checking: AtomicBool,
}

struct Flights {
    /// The flight the pending ends go out in.
    next: u64,
    /// Per (topic id, partition): the end to tell, and the voter that need not be told (the
    /// member that forwarded every produce behind it saw the end itself).
    pending: HashMap<PartitionId, (u64, Option<u64>)>,
    flying: bool,
    /// Voters that missed a flight's deadline: not waited for until one answers in time
    /// (witnesses excepted: they are waited for, or dropped).
    slow: HashSet<u64>,
    /// Slow voters with a call under way: not told more meanwhile (one call each at most;
    /// what they miss reaches them in the owner's next report).
    probing: HashSet<u64>,
    /// Voters being told every end to join the witnesses: waited for like them.
    joining: HashSet<u64>,
    /// Witnesses that missed a flight and could not be dropped yet: not waited for, dropped
    /// as soon as the catalog takes it.
    stale: HashSet<u64>,
    warned: Option<Instant>,
}

impl Witnesses {
    pub fn new(node: Arc<ClusterNode>) -> Arc<Self> {
        Arc::new(Self {
            node,
            state: Mutex::new(Flights {
                next: 1,
                pending: HashMap::new(),
                flying: false,
                slow: HashSet::new(),
                probing: HashSet::new(),
                joining: HashSet::new(),
                stale: HashSet::new(),
                warned: None,
            }),
            done: watch::Sender::new(0),
            changing: tokio::sync::Mutex::new(()),
            checking: AtomicBool::new(true),
        })
    }

    /// Whether this member's partitions are being checked (no witness is dropped
    /// meanwhile); set by the check.
    pub fn set_checking(&self, checking: bool) {
        self.checking.store(checking, Ordering::SeqCst);
    }

    /// This owner's witnesses that are voters now, as the catalog holds them.
    pub fn current(&self) -> BTreeSet<u64> {
        let view = self.node.meta.view();
        let voters: HashSet<u64> = view.membership.membership().voter_ids().collect();
        view.catalog
            .in_sync(self.node.node_id())
            .into_iter()
            .filter(|v| voters.contains(v))
            .collect()
    }

    /// Returns once every witness holds the ends `produced` (on topic incarnation
    /// `topic_id`) reached, or is out of the witnesses (see the module's doc). `seen_by`:
    /// the member that forwarded the produce, which keeps what it was answered and is not
    /// told.
    pub async fn confirm(
        self: &Arc<Self>,
        topic_id: u64,
        produced: &[Produced],
        seen_by: Option<u64>,
    ) {
        if produced.is_empty() {
            return;
        }
        let mut done = self.done.subscribe();
        let target = {
            let mut s = self.state.lock();
            for p in produced {
                let e = s
                    .pending
                    .entry(PartitionId::new(topic_id, p.partition))
                    .or_insert((0, seen_by));
                e.0 = e.0.max(p.offset + 1);
                if e.1 != seen_by {
                    e.1 = None;
                }
            }
            if !s.flying {
                s.flying = true;
                tokio::spawn(self.clone().fly());
            }
            s.next
        };
        let _ = done.wait_for(|&d| d >= target).await;
    }

    /// Sends flights until nothing is pending.
    async fn fly(self: Arc<Self>) {
        loop {
            let (id, ends) = {
                let mut s = self.state.lock();
                if s.pending.is_empty() {
                    s.flying = false;
                    return;
                }
                let id = s.next;
                s.next += 1;
                let ends: Vec<End> = s
                    .pending
                    .drain()
                    .map(|(k, (e, skip))| End {
                        t: k.topic.0,
                        p: k.partition,
                        e,
                        skip,
                    })
                    .collect();
                (id, ends)
            };
            for chunk in ends.chunks(MAX_ENDS) {
                self.tell(chunk).await;
            }
            self.done.send_replace(id);
        }
    }

    /// Tells every other voter `ends`: waits up to [`WAIT`] for the witnesses, the joining
    /// and the voters not known slow; drops the witnesses that did not answer.
    async fn tell(self: &Arc<Self>, ends: &[End]) {
        let voters = self.node.other_voters();
        if voters.is_empty() {
            return;
        }
        // (the joining first: one whose addition commits meanwhile is then a witness)
        let joining = self.state.lock().joining.clone();
        let witnesses = self.current();
        let mut waited = Vec::new();
        let mut needed = 0;
        for v in voters {
            let Some(addr) = self.node.meta.addr_of(v) else {
                continue;
            };
            let theirs: Vec<(u64, u32, u64)> = ends
                .iter()
                .filter(|e| e.skip != Some(v))
                .map(|e| (e.t, e.p, e.e))
                .collect();
            if theirs.is_empty() {
                continue;
            }
            needed += 1;
            let body = Bytes::from(serde_json::to_vec(&theirs).expect("serialises"));
            let (must, wait) = {
                let mut s = self.state.lock();
                let must =
                    (witnesses.contains(&v) || joining.contains(&v)) && !s.stale.contains(&v);
                let wait = must || !s.slow.contains(&v);
                if !wait && !s.probing.insert(v) {
                    continue;
                }
                (must, wait)
            };
            let (rpc, me) = (self.node.meta.rpc().clone(), self.clone());
            let call = tokio::spawn(async move {
                let ok = rpc
                    .call(v, &addr, narad_cluster::rpc::ops::WITNESS, body, TELL)
                    .await
                    .is_ok();
                let mut s = me.state.lock();
                if !wait {
                    s.probing.remove(&v);
                }
                if ok {
                    s.slow.remove(&v);
                }
                ok
            });
            if wait {
                waited.push((v, must, call));
            }
        }
        let mut answered = 0;
        let mut missed = Vec::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        for (v, must, call) in waited {
            match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(true)) => answered += 1,
                _ => {
                    let mut s = self.state.lock();
                    s.slow.insert(v);
                    s.joining.remove(&v);
                    if must && witnesses.contains(&v) {
                        missed.push(v);
                    }
                }
            }
        }
        if !missed.is_empty() {
            self.drop_witnesses(&missed).await;
        }
        if needed > 0 && answered == 0 {
            let mut s = self.state.lock();
            if s.warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                s.warned = Some(Instant::now());
                tracing::warn!(
                    "produces acknowledged while no other member confirmed holding their offsets: if this member's data directory is later replaced by an older copy, the offsets acknowledged meanwhile may be handed out again"
                );
            }
        }
    }

    /// Drops `missed` (witnesses that did not answer) and the stale ones from the witnesses,
    /// in the catalog; those it could not drop (no quorum, or the start's check under way)
    /// are stale until it can.
    async fn drop_witnesses(&self, missed: &[u64]) {
        let _one = self.changing.lock().await;
        let drop: HashSet<u64> = {
            let mut s = self.state.lock();
            s.stale.extend(missed.iter().copied());
            s.stale.clone()
        };
        if drop.is_empty() || self.checking.load(Ordering::SeqCst) {
            return;
        }
        let now = self.node.meta.view().catalog.in_sync(self.node.node_id());
        let next: Vec<u64> = now.iter().copied().filter(|v| !drop.contains(v)).collect();
        if next.len() == now.len() || self.set(&now, &next).await {
            let mut s = self.state.lock();
            s.stale.retain(|v| !drop.contains(v));
            if next.len() < now.len() {
                tracing::info!(witnesses = ?next, dropped = ?drop, "members that did not answer are no longer waited for as witnesses of this member's acknowledged offsets");
            }
        }
    }

    /// Commits this owner's witnesses `next` if they are still `now`.
    async fn set(&self, now: &[u64], next: &[u64]) -> bool {
        let cmd = CatalogCommand::SetInSync {
            owner: self.node.node_id(),
            expect: now.to_vec(),
            voters: next.to_vec(),
        };
        match self.node.meta.propose(MetaCmd::Catalog(cmd), CHANGE).await {
            Ok(r) => matches!(r.outcome, Outcome::Catalog(Ok(_))),
            Err(e) => {
                tracing::debug!(error = %e, "the witnesses of this member's acknowledged offsets could not be changed now");
                false
            }
        }
    }

    /// Called after each report of this owner's ends to every other voter, with the voters
    /// that did not take it: drops witnesses among them (and stale ones), and adds a voter
    /// that answers and is not a witness once it took the end of every partition here
    /// (read by `ends` after it is waited for in every flight). Nothing while this
    /// member's partitions are checked.
    pub async fn maintain(&self, failed: &HashSet<u64>, ends: impl Fn() -> Vec<(u64, u32, u64)>) {
        if self.checking.load(Ordering::SeqCst) {
            return;
        }
        let witnesses = self.current();
        let missed: Vec<u64> = {
            let mut s = self.state.lock();
            for v in failed {
                s.slow.insert(*v);
                s.joining.remove(v);
            }
            // (a voter that took the report answers again)
            s.slow.retain(|v| failed.contains(v));
            witnesses
                .iter()
                .copied()
                .filter(|v| failed.contains(v))
                .collect()
        };
        if !missed.is_empty() || !self.state.lock().stale.is_empty() {
            self.drop_witnesses(&missed).await;
        }
        let join: Vec<u64> = {
            let s = self.state.lock();
            self.node
                .other_voters()
                .into_iter()
                .filter(|v| {
                    !witnesses.contains(v)
                        && !failed.contains(v)
                        && !s.slow.contains(v)
                        && !s.stale.contains(v)
                })
                .collect()
        };
        for v in join {
            self.join(v, &ends).await;
        }
    }

    /// Makes voter `v` a witness: waited for in every flight from now on, told the end of
    /// every partition here, then added in the catalog unless it missed a flight meanwhile.
    async fn join(&self, v: u64, ends: &impl Fn() -> Vec<(u64, u32, u64)>) {
        let Some(addr) = self.node.meta.addr_of(v) else {
            return;
        };
        self.state.lock().joining.insert(v);
        let all = ends();
        let rpc = self.node.meta.rpc().clone();
        for chunk in all.chunks(MAX_ENDS) {
            let body = Bytes::from(serde_json::to_vec(chunk).expect("serialises"));
            if rpc
                .call(v, &addr, narad_cluster::rpc::ops::WITNESS, body, TELL)
                .await
                .is_err()
            {
                let mut s = self.state.lock();
                s.joining.remove(&v);
                s.slow.insert(v);
                return;
            }
        }
        let _one = self.changing.lock().await;
        if !self.state.lock().joining.contains(&v) || self.checking.load(Ordering::SeqCst) {
            return;
        }
        let now = self.node.meta.view().catalog.in_sync(self.node.node_id());
        let mut next = now.clone();
        next.push(v);
        // (one not added stays joining: an add whose outcome is unknown may still commit)
        if self.set(&now, &next).await {
            tracing::info!(
                node_id = v,
                "a member holds every end this member acknowledged: it is waited for as a witness"
            );
            self.state.lock().joining.remove(&v);
        }
    }
}
