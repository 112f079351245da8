//! A seeded, deterministic simulation of a Narad cluster, for the move protocol and the
//! queue contract under faults.
//!
//! One seed makes one run; the same seed makes the same run, so a failing seed is replayed
//! exactly (`NARAD_SIM_SEED=N cargo nextest run -p narad-sim`). What runs is the real code:
//! - the catalog's [`apply`] is the Raft state machine (the log is one ordered list of
//!   commands; proposals can be refused, unanswered yet committed, or committed late);
//! - each partition's queue is the real [`PartitionQueue`] (take, ack, expire, the moved
//!   leases a new owner holds);
//! - every move's target runs the real [`MoveMachine`], the source admits freezes with the
//!   real [`refuse_freeze`], and a lapsed freeze thaws only through the catalog;
//! - a produce is placed by the real [`Placement`] (by key or the keyless spread, owners
//!   the entry member cannot reach passed over, placed once more after a silent or
//!   unreachable owner), and every request is routed by what the entry member's applied
//!   catalog says (a stale view is normal); the owner serves only what its own view says it
//!   owns and is not frozen.
//!
//! Simulated: the network (a member cut off from all others, answers lost), the disk (what
//! a kill keeps: the log and the last persisted queue state; leases are lost), the clock, and
//! the clients. Faults: kill and restart, freeze (SIGSTOP: requests wait and are applied
//! when it resumes, their callers told nothing), a cut member, a metadata leader election,
//! lost answers, and commits that land late.
//!
//! The oracle is the lifecycle checker the process-level tests use
//! ([`narad_bench::lifecycle`]): no accepted message lost, no double lease, no redelivery
//! after an ack outside a fault window, no phantom; and besides it, no offset a producer was
//! told ever names another record.
//!
//! Moves are asked for at random as an admin would, planned by the real planner
//! ([`plan_moves`]) on a leader over the members it reaches, and made by decommissioning a
//! member (the planner drains it).
//!
//! Not simulated: forget and rebuild from the archive, fan-out and remote children.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use narad_bench::lifecycle::{FaultKind, Recorder, Report};
use narad_core::catalog::move_machine::{
    self, Action, Event, FlipAnswer, FreezeAsk, HeldFreeze, MoveKey, MoveMachine, refuse_freeze,
};
use narad_core::catalog::plan::plan_moves;
use narad_core::catalog::{Catalog, CatalogCommand, CatalogError, MoveTarget, TopicMeta, apply};
use narad_core::placement::Placement;
use narad_core::queue::{PartitionQueue, QueueSnapshot};
use narad_core::topic::TopicConfig;

mod rng;
pub use rng::Rng;

const TOPIC: &str = "t";
const TOPIC_ID: u64 = 1;
/// A lease's visibility timeout.
const VISIBILITY_MS: i64 = 3_000;
/// How often an owner persists its queue state (what a kill loses at most).
const PERSIST_EVERY_MS: i64 = 500;
/// A freeze's term, renewed while the copy goes on.
const FREEZE_TTL_MS: i64 = 2_000;
/// A record's size as the copy counts it (so that catch-up passes are many or few).
const RECORD_BYTES: u64 = 256 << 10;
const MAX_IN_FLIGHT: usize = 1_000;
/// Moves the planner keeps in flight at once (the server's default `move_max_in_flight`).
const MOVES_AT_ONCE: usize = 8;
/// Out-of-order acked ranges a queue keeps (the broker's default).
const MAX_ACK_RANGES: usize = 65_536;

/// What one run does.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub nodes: u64,
    pub partitions: u32,
    /// Steps of traffic and faults; a drain follows (faults healed, everything consumed).
    pub steps: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            nodes: 3,
            partitions: 4,
            steps: 1_500,
        }
    }
}

/// Counts of what a run went through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub moves_asked: u64,
    pub moves_planned: u64,
    pub drains: u64,
    pub moves_done: u64,
    pub attempts_failed: u64,
    pub flips_unknown: u64,
    pub thaws: u64,
    pub kills: u64,
    pub stops: u64,
    pub cuts: u64,
    pub elections: u64,
    pub produced: u64,
    pub accepted: u64,
    pub delivered: u64,
    pub acked: u64,
}

/// What a run found.
pub struct Outcome {
    pub report: Report,
    /// Offsets a producer was told that later named another record.
    pub renamed: Vec<String>,
    pub stats: Stats,
    /// A digest of the run's event trace (the same seed must give the same digest).
    pub trace: u64,
}

impl Outcome {
    pub fn is_clean(&self) -> bool {
        self.report.is_clean() && self.renamed.is_empty()
    }
}

// ── the metadata log ──

/// Raft as the members see it: one ordered list of catalogs, each the one before with a
/// command applied; proposals that commit late; an election that makes it unavailable.
struct Meta {
    log: Vec<Arc<Catalog>>,
    /// Proposals that will commit (or be refused) at a later time, unanswered.
    late: Vec<(i64, CatalogCommand)>,
    down_until: i64,
}

enum Proposed {
    Committed,
    Refused(CatalogError),
    /// No answer: it may have committed, or may still.
    Unknown,
}

impl Meta {
    fn committed(&self) -> &Arc<Catalog> {
        self.log.last().expect("a catalog")
    }

    fn commit(&mut self, cmd: &CatalogCommand) -> Result<(), CatalogError> {
        let (next, _) = apply(self.committed(), cmd)?;
        self.log.push(Arc::new(next));
        Ok(())
    }
}

// ── members ──

#[derive(Debug, Clone, Copy)]
struct Freeze {
    token: u64,
    move_id: u64,
    until: i64,
}

/// A partition's data on a member.
struct Part {
    /// Record `i` is at offset `i`: the message id it carries.
    log: Vec<u64>,
    queue: PartitionQueue,
    /// The queue state on disk (what a kill keeps).
    persisted: QueueSnapshot,
    persisted_at: i64,
    freeze: Option<Freeze>,
    /// Leases handed over by the previous owner: (offset, deadline).
    moved_leases: Vec<(u64, i64)>,
}

/// A staged copy at a move's target.
#[derive(Clone, Default)]
struct Staged {
    log: Vec<u64>,
    queue: QueueSnapshot,
    leases: Vec<(u64, i64)>,
}

/// One move run by its target: the machine, its pending action, and when it may go on.
struct Mover {
    key: MoveKey,
    machine: MoveMachine,
    action: Action,
    ready_at: i64,
    /// The pending [`Action::Retry`]'s wait is over (or it is the first attempt).
    retry_due: bool,
    source: u64,
    epoch: u64,
    staged: Staged,
}

struct Node {
    up: bool,
    /// SIGSTOP from, until: nothing runs, requests wait.
    stopped_at: i64,
    stopped_until: i64,
    /// Cut off from every other member and from the metadata leader until then.
    cut_until: i64,
    restart_at: i64,
    incarnation: u64,
    /// How far into the metadata log this member applied.
    applied: usize,
    parts: BTreeMap<u32, Part>,
    movers: BTreeMap<MoveKey, Mover>,
    /// Requests that reached it while stopped: applied when it resumes.
    waiting: Vec<Request>,
}

/// What sending a message to an owner came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Written(u64),
    /// Answered: not written (not the owner in its own view, or frozen).
    Refused,
    /// Not reached: not written.
    Unreachable,
    /// No answer (the owner is stopped): it may be written later.
    Silent,
}

/// A client request waiting at a stopped owner.
#[derive(Debug, Clone)]
enum Request {
    Produce { p: u32, id: u64 },
    Ack { p: u32, offset: u64, nonce: u64 },
}

/// A delivery a client holds.
#[derive(Debug, Clone)]
struct Held {
    id: u64,
    p: u32,
    offset: u64,
    nonce: u64,
    owner: u64,
    incarnation: u64,
    handle: String,
}

struct World {
    rng: Rng,
    now: i64,
    cfg: SimConfig,
    meta: Meta,
    nodes: Vec<Node>,
    rec: Recorder,
    /// (partition, offset) -> the message a producer was told is there.
    told: BTreeMap<(u32, u64), u64>,
    renamed: Vec<String>,
    held: Vec<Held>,
    next_msg: u64,
    stats: Stats,
    trace: u64,
    /// Print what happens (`NARAD_SIM_TRACE=1`, for a replayed seed).
    verbose: bool,
}

fn nanos(ms: i64) -> u64 {
    (ms.max(0) as u64) * 1_000_000
}

impl World {
    fn new(seed: u64, cfg: SimConfig) -> Self {
        let mut meta = Meta {
            log: vec![Arc::new(Catalog::default())],
            late: Vec::new(),
            down_until: 0,
        };
        let owners: Vec<u64> = (0..cfg.partitions)
            .map(|p| 1 + u64::from(p) % cfg.nodes)
            .collect();
        let config = TopicConfig {
            partitions: cfg.partitions,
            ..TopicConfig::default()
        };
        let topic = TopicMeta {
            owner_epochs: vec![0; owners.len()],
            owners: owners.clone(),
            ..TopicMeta::new(TOPIC_ID, TOPIC, 0, config)
        };
        meta.commit(&CatalogCommand::CreateTopic { topic })
            .expect("the topic is made");
        let mut rng = Rng::new(seed);
        let nodes = (1..=cfg.nodes)
            .map(|id| {
                let mut parts = BTreeMap::new();
                for (p, &o) in owners.iter().enumerate() {
                    if o == id {
                        parts.insert(p as u32, Part::new(Staged::default(), rng.next_u64(), 0));
                    }
                }
                Node {
                    up: true,
                    stopped_at: 0,
                    stopped_until: 0,
                    cut_until: 0,
                    restart_at: 0,
                    incarnation: rng.next_u64(),
                    applied: meta.log.len(),
                    parts,
                    movers: BTreeMap::new(),
                    waiting: Vec::new(),
                }
            })
            .collect();
        Self {
            rng,
            now: 0,
            cfg,
            meta,
            nodes,
            rec: Recorder::new(
                Duration::from_millis(VISIBILITY_MS as u64),
                Duration::from_millis(PERSIST_EVERY_MS as u64),
            ),
            told: BTreeMap::new(),
            renamed: Vec::new(),
            held: Vec::new(),
            next_msg: 1,
            stats: Stats::default(),
            trace: 0xcbf2_9ce4_8422_2325,
            verbose: std::env::var_os("NARAD_SIM_TRACE").is_some(),
        }
    }

    fn note(&mut self, what: u64) {
        // FNV-1a over the trace of what happened
        for b in what.to_le_bytes() {
            self.trace ^= u64::from(b);
            self.trace = self.trace.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.verbose {
            println!("{:>8} {}", self.now, what());
        }
    }

    fn node(&self, id: u64) -> &Node {
        &self.nodes[(id - 1) as usize]
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        &mut self.nodes[(id - 1) as usize]
    }

    /// Whether member `id` runs now (up, not stopped).
    fn runs(&self, id: u64) -> bool {
        let n = self.node(id);
        n.up && n.stopped_until <= self.now
    }

    fn cut(&self, id: u64) -> bool {
        self.node(id).cut_until > self.now
    }

    /// Whether `from` reaches `to` over the network (and `to` is up).
    fn reaches(&self, from: u64, to: u64) -> bool {
        from == to || (!self.cut(from) && !self.cut(to) && self.node(to).up)
    }

    fn view(&self, id: u64) -> Arc<Catalog> {
        self.meta.log[self.node(id).applied - 1].clone()
    }

    fn topic_seen_by(&self, id: u64) -> Arc<TopicMeta> {
        self.view(id).get(TOPIC).expect("the topic").clone()
    }

    /// A proposal from member `from`.
    fn propose(&mut self, from: u64, cmd: CatalogCommand) -> Proposed {
        if self.cut(from) || self.meta.down_until > self.now {
            // never reached a leader, or the leader stepped down before it was replicated;
            // an election may still commit it later
            if self.rng.chance(0.2) {
                let at = self.now + self.rng.range(10, 3_000) as i64;
                self.meta.late.push((at, cmd));
            }
            return Proposed::Unknown;
        }
        if self.rng.chance(0.05) {
            let at = self.now + self.rng.range(10, 2_000) as i64;
            self.meta.late.push((at, cmd));
            return Proposed::Unknown;
        }
        let r = self.meta.commit(&cmd);
        self.log(|| format!("n{from} proposed {cmd:?}: {r:?}"));
        self.note(0x10 + u64::from(r.is_ok()));
        if self.rng.chance(0.1) {
            return Proposed::Unknown;
        }
        match r {
            Ok(()) => Proposed::Committed,
            Err(e) => Proposed::Refused(e),
        }
    }

    // ── each tick ──

    fn tick(&mut self, faults: bool) {
        self.now += self.rng.range(1, 40) as i64;
        // late commits
        let now = self.now;
        let mut due = Vec::new();
        self.meta.late.retain(|(at, cmd)| {
            if *at <= now {
                due.push(cmd.clone());
                false
            } else {
                true
            }
        });
        for cmd in due {
            let r = self.meta.commit(&cmd);
            self.log(|| format!("late commit {cmd:?}: {r:?}"));
        }
        for id in 1..=self.cfg.nodes {
            self.restart_if_due(id);
            if !self.runs(id) {
                continue;
            }
            self.resume(id);
            self.apply_catalog(id);
            self.react(id);
            self.thaw_lapsed(id);
            self.persist(id);
            self.expire(id);
            self.run_movers(id);
        }
        if faults {
            self.inject();
        }
    }

    fn restart_if_due(&mut self, id: u64) {
        let now = self.now;
        let n = self.node(id);
        if n.up || n.restart_at > now {
            return;
        }
        let inc = self.rng.next_u64();
        let seed = self.rng.next_u64();
        self.log(|| format!("n{id} restarted"));
        let n = self.node_mut(id);
        n.up = true;
        n.incarnation = inc;
        n.stopped_until = 0;
        n.waiting.clear();
        // the log and the persisted queue state survive; leases do not, a freeze does (its
        // marker is on disk: it runs its term again)
        for part in n.parts.values_mut() {
            part.queue = PartitionQueue::new(
                part.persisted.clone(),
                0,
                part.log.len() as u64,
                seed,
                MAX_ACK_RANGES,
            );
            for &(o, d) in &part.moved_leases {
                if d > now {
                    part.queue.hold(o, d);
                }
            }
            if let Some(f) = part.freeze.as_mut() {
                f.until = now + FREEZE_TTL_MS;
            }
        }
        n.movers.clear();
    }

    /// A stopped member resumes: what waited for it is applied now (its senders were told
    /// nothing: their outcome stays unknown).
    fn resume(&mut self, id: u64) {
        let waiting = std::mem::take(&mut self.node_mut(id).waiting);
        for r in waiting {
            match r {
                Request::Produce { p, id: msg } => {
                    let _ = self.append(id, p, msg);
                }
                Request::Ack { p, offset, nonce } => {
                    let _ = self.ack_at(id, p, offset, nonce);
                }
            }
        }
    }

    /// Applies what the metadata log committed (all of it, or some, as a follower lags).
    fn apply_catalog(&mut self, id: u64) {
        if self.cut(id) {
            return;
        }
        let len = self.meta.log.len();
        let n = self.node(id).applied;
        let to = if self.rng.chance(0.7) {
            len
        } else {
            n + self.rng.below((len - n + 1) as u64) as usize
        };
        if to > n {
            self.node_mut(id).applied = to;
        }
    }

    /// What a member does with the catalog it applied: gives away partitions it no longer
    /// owns, thaws freezes whose move is gone, starts movers for moves to it.
    fn react(&mut self, id: u64) {
        let t = self.topic_seen_by(id);
        let me = id;
        let now = self.now;
        let verbose = self.verbose;
        let n = self.node_mut(id);
        let mut gone = Vec::new();
        for (&p, part) in &mut n.parts {
            let owner = t.owner_of(p);
            let moving_here = t.moves.get(&p).is_some_and(|m| m.target == me);
            if owner != Some(me) && !moving_here {
                gone.push(p);
                continue;
            }
            // a freeze whose move is no longer in flight thaws at once (no flip can name it)
            if let Some(f) = part.freeze
                && owner == Some(me)
                && t.moves.get(&p).is_none_or(|m| m.id != f.move_id)
            {
                part.freeze = None;
                if verbose {
                    println!("{now:>8} n{me} p{p}: orphaned freeze thawed");
                }
            }
        }
        for p in &gone {
            n.parts.remove(p);
        }
        if !gone.is_empty() {
            self.log(|| format!("n{id} gave away {gone:?}"));
        }
        let n = self.node_mut(id);
        for (&p, m) in &t.moves {
            if m.target != me {
                continue;
            }
            let key = MoveKey::new(t.id, p, m.id);
            if !n.movers.contains_key(&key) && n.movers.keys().all(|k| k.partition != p) {
                n.movers.insert(
                    key,
                    Mover {
                        key,
                        machine: MoveMachine::new(),
                        action: Action::Retry {
                            after: Duration::ZERO,
                            error: String::new(),
                            staged_stale: false,
                        },
                        ready_at: now,
                        retry_due: true,
                        source: 0,
                        epoch: 0,
                        staged: Staged::default(),
                    },
                );
            }
        }
    }

    /// Freezes past their deadline: thawed once the catalog recorded the thaw.
    fn thaw_lapsed(&mut self, id: u64) {
        let t = self.topic_seen_by(id);
        let lapsed: Vec<(u32, Freeze)> = self
            .node(id)
            .parts
            .iter()
            .filter_map(|(&p, part)| part.freeze.map(|f| (p, f)))
            .filter(|(p, f)| f.until <= self.now && t.owner_of(*p) == Some(id))
            .collect();
        for (p, f) in lapsed {
            let cmd = CatalogCommand::ThawPartition {
                topic_id: TOPIC_ID,
                partition: p,
                owner: id,
                expect_epoch: t.owner_epoch(p),
                token: f.token,
            };
            if let Proposed::Committed = self.propose(id, cmd)
                && let Some(part) = self.node_mut(id).parts.get_mut(&p)
                && part.freeze.is_some_and(|h| h.token == f.token)
            {
                part.freeze = None;
                self.stats.thaws += 1;
                self.log(|| format!("n{id} p{p}: thawed through the catalog"));
            }
        }
    }

    fn persist(&mut self, id: u64) {
        let now = self.now;
        for part in self.node_mut(id).parts.values_mut() {
            if now - part.persisted_at >= PERSIST_EVERY_MS {
                part.persisted = part.queue.snapshot();
                part.persisted_at = now;
            }
        }
    }

    fn expire(&mut self, id: u64) {
        let now = self.now;
        for part in self.node_mut(id).parts.values_mut() {
            part.queue.expire(now);
        }
    }

    // ── the data plane ──

    /// The owner of partition `p` in member `via`'s view, if `via` reaches it.
    fn route(&self, via: u64, p: u32) -> Option<u64> {
        let owner = self.topic_seen_by(via).owner_of(p)?;
        self.reaches(via, owner).then_some(owner)
    }

    /// Whether `owner` serves partition `p` now: its own view names it, and not frozen.
    fn serves(&self, owner: u64, p: u32) -> bool {
        self.topic_seen_by(owner).owner_of(p) == Some(owner)
            && self
                .node(owner)
                .parts
                .get(&p)
                .is_some_and(|part| part.freeze.is_none())
    }

    fn append(&mut self, owner: u64, p: u32, msg: u64) -> Option<u64> {
        if !self.serves(owner, p) {
            return None;
        }
        let part = self.node_mut(owner).parts.get_mut(&p)?;
        let offset = part.log.len() as u64;
        part.log.push(msg);
        part.queue.on_append(offset + 1);
        Some(offset)
    }

    /// A produce through a member: placed by the real placement (by key, or the keyless
    /// spread; owners this member cannot reach passed over), sent to the owner, and placed
    /// once more if the owner could not be reached or never answered.
    fn produce(&mut self) {
        let msg = self.next_msg;
        self.next_msg += 1;
        self.stats.produced += 1;
        let at = nanos(self.now);
        self.rec.sent(msg, at, Duration::ZERO);
        let via = self.rng.range(1, self.cfg.nodes + 1);
        let key = self
            .rng
            .chance(0.5)
            .then(|| self.rng.below(8).to_le_bytes());
        let spread = self.rng.below(u64::from(self.cfg.partitions)) as u32;
        if !self.runs(via) {
            // the connection is refused or times out: nothing was written (a stopped entry
            // member never forwards it)
            self.rec.rejected(msg, 503);
            return;
        }
        let t = self.topic_seen_by(via);
        // (what the entry member knows down: the members it cannot reach now)
        let down: Vec<u64> = (1..=self.cfg.nodes)
            .filter(|&o| !self.reaches(via, o))
            .collect();
        let place = Placement::new(self.cfg.partitions, &t.owners, via, |o| down.contains(&o));
        let p = place.first(key.as_ref().map(|k| &k[..]), false, || spread);
        let owner = place.owner(p);
        let first = self.send(via, owner, p, msg);
        let (p, tried) = match first {
            Sent::Unreachable | Sent::Silent => match place.again(p, owner, &[owner]) {
                Some(q) => (q, self.send(via, place.owner(q), q, msg)),
                None => (p, first),
            },
            other => (p, other),
        };
        match tried {
            Sent::Written(offset) if self.rng.chance(0.95) => {
                self.rec.accepted(msg, at);
                self.stats.accepted += 1;
                self.told_of(p, offset, msg);
            }
            Sent::Written(_) => {} // the answer was lost: unknown
            // the first owner may still write it: unknown
            _ if first == Sent::Silent => {}
            Sent::Silent => {}
            Sent::Refused | Sent::Unreachable => self.rec.rejected(msg, 503),
        }
    }

    /// `via` sends message `msg` for partition `p` to `owner`.
    fn send(&mut self, via: u64, owner: u64, p: u32, msg: u64) -> Sent {
        if !self.reaches(via, owner) {
            return Sent::Unreachable;
        }
        if !self.runs(owner) {
            // stopped: it appends it when it resumes; the sender hears nothing
            self.node_mut(owner)
                .waiting
                .push(Request::Produce { p, id: msg });
            return Sent::Silent;
        }
        match self.append(owner, p, msg) {
            Some(offset) => Sent::Written(offset),
            None => Sent::Refused,
        }
    }

    fn told_of(&mut self, p: u32, offset: u64, msg: u64) {
        if let Some(&was) = self.told.get(&(p, offset))
            && was != msg
        {
            self.renamed.push(format!(
                "offset {offset} of partition {p} was told for message {was}, then for {msg}"
            ));
        }
        self.told.insert((p, offset), msg);
    }

    fn consume(&mut self) {
        let via = self.rng.range(1, self.cfg.nodes + 1);
        let p = self.rng.below(u64::from(self.cfg.partitions)) as u32;
        if !self.runs(via) {
            return;
        }
        let Some(owner) = self.route(via, p) else {
            return;
        };
        if !self.runs(owner) || !self.serves(owner, p) {
            return;
        }
        let now = self.now;
        let max = self.rng.range(1, 5) as usize;
        let inc = self.node(owner).incarnation;
        let part = self.node_mut(owner).parts.get_mut(&p).expect("served");
        let mut due = |_| Some(0i64);
        let leased = part
            .queue
            .take(now, max, MAX_IN_FLIGHT, VISIBILITY_MS, &mut due);
        let got: Vec<(u64, u64, u64)> = leased
            .iter()
            .map(|l| (l.offset, l.nonce, part.log[l.offset as usize]))
            .collect();
        for (offset, nonce, msg) in got {
            self.stats.delivered += 1;
            if let Some(&told) = self.told.get(&(p, offset))
                && told != msg
            {
                self.renamed.push(format!(
                    "offset {offset} of partition {p} delivered message {msg}, told for {told}"
                ));
            }
            let handle = format!("{owner}.{inc:x}.{p}.{offset}.{nonce:x}");
            self.rec
                .delivered(Some(msg), "", 0, nanos(now), nanos(now), p, offset, &handle);
            self.note(msg);
            self.log(|| format!("n{owner} p{p} delivered o{offset} (m{msg}) nonce {nonce:x}"));
            self.held.push(Held {
                id: msg,
                p,
                offset,
                nonce,
                owner,
                incarnation: inc,
                handle,
            });
        }
    }

    fn ack_at(&mut self, owner: u64, p: u32, offset: u64, nonce: u64) -> bool {
        if !self.serves(owner, p) {
            return false;
        }
        let now = self.now;
        let Some(part) = self.node_mut(owner).parts.get_mut(&p) else {
            return false;
        };
        let r = part.queue.ack(offset, nonce, now);
        self.log(|| format!("n{owner} p{p} ack o{offset}: {r:?}"));
        r.is_ok()
    }

    /// Settles a held delivery (acked, or dropped to let its lease run out).
    fn settle(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let i = self.rng.below(self.held.len() as u64) as usize;
        let h = self.held.swap_remove(i);
        if self.rng.chance(0.1) {
            return; // the reader gives up: the lease runs out
        }
        let at = nanos(self.now);
        let via = self.rng.range(1, self.cfg.nodes + 1);
        // the handle names the member that leased it; a member routes it there
        let stale = self.node(h.owner).incarnation != h.incarnation || !self.node(h.owner).up;
        if !self.runs(via) || !self.reaches(via, h.owner) || stale {
            self.rec.settle_failed(h.id);
            return;
        }
        if !self.runs(h.owner) {
            self.node_mut(h.owner).waiting.push(Request::Ack {
                p: h.p,
                offset: h.offset,
                nonce: h.nonce,
            });
            self.rec.settle_unknown(h.id, &h.handle, at);
            return;
        }
        if self.ack_at(h.owner, h.p, h.offset, h.nonce) {
            self.stats.acked += 1;
            if self.rng.chance(0.95) {
                self.rec.settled(h.id, &h.handle, at, at, true);
            } else {
                self.rec.settle_unknown(h.id, &h.handle, at);
            }
        } else {
            self.rec.settle_failed(h.id);
        }
    }

    // ── moves ──

    /// An admin asks for a move (or cancels one), through a member.
    fn ask_move(&mut self) {
        let via = self.rng.range(1, self.cfg.nodes + 1);
        if !self.runs(via) {
            return;
        }
        let t = self.topic_seen_by(via);
        let p = self.rng.below(u64::from(self.cfg.partitions)) as u32;
        let owner = t.owner_of(p).expect("owned");
        let target = if t.moves.contains_key(&p) && self.rng.chance(0.3) {
            None
        } else {
            let to = self.rng.range(1, self.cfg.nodes + 1);
            if to == owner {
                return;
            }
            self.stats.moves_asked += 1;
            Some(MoveTarget {
                id: self.rng.next_u64(),
                node: to,
                since_ms: self.now,
                reason: "admin".into(),
            })
        };
        let cmd = CatalogCommand::SetMoveTarget {
            topic_id: TOPIC_ID,
            partition: p,
            expect_owner: owner,
            expect_epoch: t.owner_epoch(p),
            target,
        };
        let _ = self.propose(via, cmd);
    }

    /// The leader's planner: [`plan_moves`] over the committed catalog and the members it
    /// reaches, each planned move proposed as the planner does (at the owner and epoch it
    /// planned from).
    fn plan(&mut self) {
        let leader = self.rng.range(1, self.cfg.nodes + 1);
        if !self.runs(leader) || self.cut(leader) || self.meta.down_until > self.now {
            return;
        }
        let catalog = self.meta.committed().clone();
        let voters: Vec<u64> = (1..=self.cfg.nodes).collect();
        let alive: HashSet<u64> = voters
            .iter()
            .copied()
            .filter(|&n| self.reaches(leader, n) && self.runs(n))
            .collect();
        let in_flight: usize = catalog.topics().map(|t| t.moves.len()).sum();
        let budget = MOVES_AT_ONCE.saturating_sub(in_flight);
        for m in plan_moves(&catalog, &voters, &alive, budget, true) {
            let t = catalog.get(&m.topic).expect("planned from it");
            self.stats.moves_planned += 1;
            let cmd = CatalogCommand::SetMoveTarget {
                topic_id: t.id,
                partition: m.partition,
                expect_owner: m.from,
                expect_epoch: t.owner_epoch(m.partition),
                target: Some(MoveTarget {
                    id: self.rng.next_u64(),
                    node: m.to,
                    since_ms: self.now,
                    reason: m.reason.clone(),
                }),
            };
            let _ = self.propose(leader, cmd);
        }
    }

    /// An admin starts or ends the decommission of a member (one at a time: the others
    /// receive its partitions).
    fn drain(&mut self) {
        let via = self.rng.range(1, self.cfg.nodes + 1);
        if !self.runs(via) {
            return;
        }
        let now_draining: Vec<u64> = self.view(via).draining().iter().copied().collect();
        let cmd = match now_draining.first() {
            Some(&node) => CatalogCommand::SetDraining {
                node,
                draining: false,
            },
            None => {
                self.stats.drains += 1;
                CatalogCommand::SetDraining {
                    node: self.rng.range(1, self.cfg.nodes + 1),
                    draining: true,
                }
            }
        };
        let _ = self.propose(via, cmd);
    }

    fn run_movers(&mut self, id: u64) {
        let keys: Vec<MoveKey> = self.node(id).movers.keys().copied().collect();
        for key in keys {
            let Some(mut m) = self.node_mut(id).movers.remove(&key) else {
                continue;
            };
            if m.ready_at > self.now {
                self.node_mut(id).movers.insert(key, m);
                continue;
            }
            let keep = self.step_mover(id, &mut m);
            if keep && self.node(id).up {
                self.node_mut(id).movers.insert(key, m);
            }
        }
    }

    /// Performs a mover's pending action (one or two, as calls answer at once); `false` once
    /// the move ended here.
    fn step_mover(&mut self, me: u64, m: &mut Mover) -> bool {
        for _ in 0..self.rng.range(1, 3) {
            let event = match m.action.clone() {
                Action::Done => {
                    self.stats.moves_done += 1;
                    return false;
                }
                Action::Retry { after, .. } if !m.retry_due => {
                    m.retry_due = true;
                    m.ready_at = self.now + after.as_millis() as i64;
                    return true;
                }
                Action::Retry { .. } => {
                    m.retry_due = false;
                    let t = self.topic_seen_by(me);
                    let Some(source) = move_machine::wanted_from(&t, m.key, me) else {
                        // cancelled or replaced: a copy installed for it and never flipped
                        // goes (the member gives away what it does not own on its next look)
                        return false;
                    };
                    m.source = source;
                    m.epoch = t.owner_epoch(m.key.partition);
                    let token = loop {
                        let t = self.rng.next_u64();
                        if t != 0 {
                            break t;
                        }
                    };
                    Event::Start { token }
                }
                Action::Wait(d) => {
                    m.ready_at = self.now + d.as_millis() as i64;
                    m.action = m.machine.step(Event::Waited);
                    return true;
                }
                a => self.perform(me, m, a),
            };
            self.log(|| format!("n{me} move {:?}: {event:?}", m.key));
            m.action = m.machine.step(event);
            self.log(|| format!("n{me} move {:?} -> {:?}", m.key, m.action));
            if let Action::Retry { .. } = m.action {
                self.stats.attempts_failed += 1;
            }
            self.note(m.machine.phase().len() as u64);
        }
        true
    }

    /// One action of a mover at `me`, against the simulated cluster.
    fn perform(&mut self, me: u64, m: &mut Mover, action: Action) -> Event {
        let (p, move_id) = (m.key.partition, m.key.move_id);
        let source = m.source;
        let now = self.now;
        let unreachable = || Event::Failed(format!("node {source} does not answer"));
        let source_answers = self.reaches(me, source) && self.runs(source);
        match action {
            Action::Prepare => Event::Prepared,
            Action::List | Action::CatchUp { .. } if !source_answers => unreachable(),
            Action::List => {
                if self.topic_seen_by(source).owner_of(p) != Some(source)
                    || !self.node(source).parts.contains_key(&p)
                {
                    return Event::Failed("the source does not own the partition".into());
                }
                Event::Listed {
                    incarnation: self.node(source).incarnation,
                }
            }
            Action::CatchUp { first } => {
                if first {
                    m.staged = Staged::default();
                }
                let Some(part) = self.node(source).parts.get(&p) else {
                    return Event::Failed("the source has no such partition".into());
                };
                let from = m.staged.log.len();
                if part.log.len() < from {
                    return Event::Failed("the source's log shrank".into());
                }
                m.staged.log.extend_from_slice(&part.log[from..]);
                Event::Copied {
                    bytes: (part.log.len() - from) as u64 * RECORD_BYTES,
                }
            }
            Action::Freeze { token } | Action::Finalize { token } | Action::Fence { token } => {
                if !source_answers {
                    return unreachable();
                }
                let renew = !matches!(action, Action::Freeze { .. });
                let t = self.topic_seen_by(source);
                let inc = self.node(source).incarnation;
                let Some(part) = self.node_mut(source).parts.get_mut(&p) else {
                    return Event::Failed("the source has no such partition".into());
                };
                let held = part.freeze.map(|f| HeldFreeze {
                    token: f.token,
                    move_id: Some(f.move_id),
                });
                let ask = FreezeAsk {
                    owner_epoch: m.epoch,
                    move_id,
                    token,
                    ttl: Duration::from_millis(FREEZE_TTL_MS as u64),
                    renew,
                };
                if let Some(refused) = refuse_freeze(held, &t, p, Some(source), ask) {
                    return Event::Failed(format!("the source refused the freeze: {refused:?}"));
                }
                part.freeze = Some(Freeze {
                    token,
                    move_id,
                    until: now + FREEZE_TTL_MS,
                });
                let end = part.log.len() as u64;
                match action {
                    Action::Freeze { .. } => {
                        // the queue state is written and the leases handed over
                        part.persisted = part.queue.snapshot();
                        part.persisted_at = now;
                        Event::Frozen {
                            incarnation: inc,
                            end,
                        }
                    }
                    Action::Finalize { .. } => {
                        m.staged = Staged {
                            log: part.log.clone(),
                            queue: part.queue.snapshot(),
                            leases: part.queue.held_leases(),
                        };
                        Event::Finalized
                    }
                    _ => Event::Fenced {
                        incarnation: inc,
                        end,
                        wanted: move_machine::wanted_from(&self.topic_seen_by(me), m.key, me)
                            .is_some(),
                    },
                }
            }
            Action::Verify => Event::Verified {
                end: m.staged.log.len() as u64,
            },
            Action::Install => {
                let seed = self.rng.next_u64();
                let part = Part::new(m.staged.clone(), seed, now);
                self.node_mut(me).parts.insert(p, part);
                Event::Installed
            }
            Action::ProposeFlip { token } => {
                let cmd = CatalogCommand::CompleteMove {
                    topic_id: TOPIC_ID,
                    partition: p,
                    move_id,
                    source,
                    target: me,
                    expect_epoch: m.epoch,
                    token,
                };
                Event::Flip(match self.propose(me, cmd) {
                    Proposed::Committed => FlipAnswer::Committed,
                    Proposed::Refused(e) => FlipAnswer::Refused {
                        owns: move_machine::flipped(
                            Some(&self.topic_seen_by(me)),
                            TOPIC_ID,
                            p,
                            me,
                            m.epoch,
                        ),
                        why: e.to_string(),
                    },
                    Proposed::Unknown => {
                        self.stats.flips_unknown += 1;
                        FlipAnswer::Unknown
                    }
                })
            }
            Action::ReadIndex { token } => {
                if self.cut(me) || self.meta.down_until > now {
                    return Event::Read(None);
                }
                self.node_mut(me).applied = self.meta.log.len();
                let t = self.topic_seen_by(me);
                Event::Read(Some(move_machine::resolve(
                    Some(&t),
                    m.key,
                    me,
                    source,
                    m.epoch,
                    token,
                )))
            }
            Action::Wait(_) | Action::Done | Action::Retry { .. } => {
                unreachable!("handled by the caller")
            }
        }
    }

    // ── faults ──

    fn inject(&mut self) {
        let id = self.rng.range(1, self.cfg.nodes + 1);
        let now = self.now;
        if self.rng.chance(0.004) && self.nodes.iter().all(|n| n.up) {
            // kill -9, back after a while
            self.stats.kills += 1;
            let back = now + self.rng.range(50, 2_000) as i64;
            self.log(|| format!("n{id} killed until {back}"));
            // (a process killed while stopped persisted nothing since it was stopped)
            let from = if self.node(id).stopped_until > now {
                self.node(id).stopped_at
            } else {
                now
            };
            let n = self.node_mut(id);
            n.up = false;
            n.restart_at = back;
            n.waiting.clear();
            self.held.retain(|h| h.owner != id);
            self.rec
                .fault(FaultKind::Kill, nanos(from), nanos(back + VISIBILITY_MS));
        } else if self.rng.chance(0.004) {
            self.stats.stops += 1;
            let until = now + self.rng.range(100, 4_000) as i64;
            self.log(|| format!("n{id} stopped until {until}"));
            let n = self.node_mut(id);
            if n.stopped_until <= now {
                n.stopped_at = now;
            }
            n.stopped_until = until;
        } else if self.rng.chance(0.004) {
            self.stats.cuts += 1;
            let until = now + self.rng.range(100, 4_000) as i64;
            self.log(|| format!("n{id} cut off until {until}"));
            self.node_mut(id).cut_until = until;
        } else if self.rng.chance(0.003) {
            self.stats.elections += 1;
            self.meta.down_until = now + self.rng.range(100, 2_000) as i64;
        }
    }

    fn heal(&mut self) {
        let now = self.now;
        self.meta.down_until = 0;
        for n in &mut self.nodes {
            n.cut_until = n.cut_until.min(now);
            n.stopped_until = n.stopped_until.min(now);
            if !n.up {
                n.restart_at = now;
            }
        }
    }
}

impl Part {
    fn new(staged: Staged, seed: u64, now: i64) -> Self {
        let hwm = staged.log.len() as u64;
        let mut queue = PartitionQueue::new(staged.queue.clone(), 0, hwm, seed, MAX_ACK_RANGES);
        for &(o, d) in &staged.leases {
            if d > now {
                queue.hold(o, d);
            }
        }
        Self {
            log: staged.log,
            persisted: staged.queue,
            persisted_at: now,
            queue,
            freeze: None,
            moved_leases: staged.leases,
        }
    }
}

/// Runs seed `seed`: traffic, moves and faults for `cfg.steps` steps, then a drain with
/// every fault healed (moves may finish or be cancelled; every message is consumed and
/// acked), then the oracle.
pub fn run(seed: u64, cfg: SimConfig) -> Outcome {
    let mut w = World::new(seed, cfg);
    let steps = w.cfg.steps;
    for _ in 0..steps {
        w.tick(true);
        let r = w.rng.below(100);
        match r {
            0..=39 => w.produce(),
            40..=64 => w.consume(),
            65..=94 => w.settle(),
            _ => match w.rng.below(20) {
                0..=2 => w.ask_move(),
                3..=5 => w.plan(),
                6 => w.drain(),
                _ => {}
            },
        }
    }
    // the drain: heal, let moves settle, consume and ack everything
    w.heal();
    for _ in 0..20_000 {
        w.tick(false);
        w.heal();
        w.consume();
        while let Some(h) = w.held.pop() {
            if w.ack_at(h.owner, h.p, h.offset, h.nonce) {
                let at = nanos(w.now);
                w.rec.settled(h.id, &h.handle, at, at, true);
                w.stats.acked += 1;
            } else {
                w.rec.settle_failed(h.id);
            }
        }
        if w.drained() {
            break;
        }
    }
    let report = w.rec.check();
    Outcome {
        report,
        renamed: w.renamed,
        stats: w.stats,
        trace: w.trace,
    }
}

impl World {
    /// Whether every partition's owner (as the committed catalog says) has applied it, serves
    /// it, and has nothing left to deliver, and no move is in flight.
    fn drained(&self) -> bool {
        let t = self.meta.committed().get(TOPIC).expect("the topic").clone();
        if !t.moves.is_empty() || !self.meta.late.is_empty() {
            return false;
        }
        (0..self.cfg.partitions).all(|p| {
            let owner = t.owner_of(p).expect("owned");
            self.node(owner).applied == self.meta.log.len()
                && self.serves(owner, p)
                && self.node(owner).parts[&p].queue.stats().ready == 0
                && self.node(owner).parts[&p].queue.in_flight() == 0
                && self.node(owner).parts[&p].queue.frontier()
                    == self.node(owner).parts[&p].log.len() as u64
        })
    }
}
