//! An owner's acknowledged ends, held by the other voters before it answers a produce.
//!
//! A member restarted from an older copy of its data directory (a VM snapshot, a backup)
//! holds logs that end below offsets it acknowledged. At its start it asks the other voters
//! how far each of its partitions was acknowledged and goes on after that
//! ([`crate::moves`], `verify_held`). Reports of an owner's ends every 500 ms left the last
//! half second out: records acknowledged just before the owner stopped were known to nobody
//! else, and a restored copy handed their offsets out again. So an owner answers a produce
//! only once every other voter that answers in time holds the new end of each partition it
//! wrote ([`crate::moves::WITNESS`], in memory there; kept on their disks within a second).
//! A member that forwarded the produce keeps what it is answered anyway, so it is not told.
//!
//! Concurrent produces share one flight: the ends that arrive while a flight is out go in
//! the next one. A voter that misses a flight's deadline ([`WAIT`]: a frozen or dead
//! member) is still told, but not waited for until it answers a flight in time again, so
//! it costs producers one wait. With no voter answering (an owner cut off from the others)
//! produces are answered anyway, as before, and a warning says so.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_core::broker::Produced;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::cluster::ClusterNode;

/// How long a flight waits for the voters it waits for.
const WAIT: Duration = Duration::from_millis(100);
/// How long a voter not waited for has to answer (it is told all the same).
const TELL: Duration = Duration::from_secs(2);
/// Ends in one call (as in a report).
const MAX_ENDS: usize = 65_536;
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
}

struct Flights {
    /// The flight the pending ends go out in.
    next: u64,
    /// Per (topic id, partition): the end to tell, and the voter that need not be told (the
    /// member that forwarded every produce behind it saw the end itself).
    pending: HashMap<(u64, u32), (u64, Option<u64>)>,
    flying: bool,
    /// Voters that missed a flight's deadline: not waited for until one answers in time.
    slow: HashSet<u64>,
    /// Slow voters with a call under way: not told more meanwhile (one call each at most;
    /// what they miss reaches them in the owner's next report).
    probing: HashSet<u64>,
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
                warned: None,
            }),
            done: watch::Sender::new(0),
        })
    }

    /// Returns once the other voters hold the ends `produced` (on topic incarnation
    /// `topic_id`) reached, or the flight that told them is over (see the module's doc).
    /// `seen_by`: the member that forwarded the produce, which keeps what it was answered
    /// and is not told.
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
                    .entry((topic_id, p.partition))
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
                    .map(|((t, p), (e, skip))| End { t, p, e, skip })
                    .collect();
                (id, ends)
            };
            for chunk in ends.chunks(MAX_ENDS) {
                self.tell(chunk).await;
            }
            self.done.send_replace(id);
        }
    }

    /// Tells every other voter `ends`, waiting up to [`WAIT`] for those not known slow.
    async fn tell(self: &Arc<Self>, ends: &[End]) {
        let voters = self.node.other_voters();
        if voters.is_empty() {
            return;
        }
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
            let slow = {
                let mut s = self.state.lock();
                let slow = s.slow.contains(&v);
                if slow && !s.probing.insert(v) {
                    continue;
                }
                slow
            };
            let (rpc, me) = (self.node.meta.rpc().clone(), self.clone());
            let call = tokio::spawn(async move {
                let ok = rpc
                    .call(v, &addr, crate::moves::WITNESS, body, TELL)
                    .await
                    .is_ok();
                let mut s = me.state.lock();
                if slow {
                    s.probing.remove(&v);
                }
                if ok {
                    s.slow.remove(&v);
                }
                ok
            });
            if !slow {
                waited.push((v, call));
            }
        }
        let mut answered = 0;
        let deadline = tokio::time::Instant::now() + WAIT;
        for (v, call) in waited {
            match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(true)) => answered += 1,
                _ => {
                    self.state.lock().slow.insert(v);
                }
            }
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
}
