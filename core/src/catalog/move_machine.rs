//! A partition move as its target runs it, without I/O: [`MoveMachine`] is told what each
//! call answered ([`Event`]) and answers the next thing to do ([`Action`]). The mover in the
//! server performs the actions over the network, the disk and Raft; the cluster simulation
//! performs the same actions on a simulated cluster, so the sequence tested under seeded
//! faults is the one that runs.
//!
//! ```text
//!  Start ─► Prepare ─► List ─► CatchUp ─┬─► List (the catch-up goes on)
//!                                       └─► Freeze ─► Finalize ─► Verify ─► Fence ─► Install ─► ProposeFlip
//!  ProposeFlip: committed (or refused, but the catalog names us owner) ─► Done
//!               refused ─► Retry │ answer lost ─► ReadIndex ─► committed: Done
//!                                                            not yet, still possible: ProposeFlip
//!                                                            never: Retry
//!                                                            unknown: Wait ─► ReadIndex
//!  any failed call before the flip ─► Retry (the runner waits, checks the move is still
//!  wanted, and starts another attempt with a new token)
//! ```
//!
//! Once the copy is installed an attempt never gives up on a bare error: only the catalog
//! says whether the flip committed.
//!
//! Beside it, the decisions the machine and its runners share: whether a move is still
//! wanted, when the catch-up ends, whether a flip committed, and what to make of a lost one.

use std::time::Duration;

use super::TopicMeta;

/// Catch-up passes before the freeze, at most.
pub const MAX_CATCH_UP_PASSES: usize = 20;
/// A catch-up pass that leaves at most this much to copy ends the catch-up.
pub const FREEZE_WHEN_LEFT: u64 = 4 << 20;
/// The wait before a failed attempt is tried again; it doubles up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_millis(200);
pub const RETRY_MAX: Duration = Duration::from_secs(5);
/// The wait between reads of the catalog while a flip's outcome is unknown; it doubles up
/// to [`RESOLVE_MAX`].
pub const RESOLVE_FIRST: Duration = Duration::from_millis(250);
pub const RESOLVE_MAX: Duration = Duration::from_secs(2);

/// A move a member works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoveKey {
    /// The topic's incarnation.
    pub topic_id: u64,
    pub partition: u32,
    pub move_id: u64,
}

impl MoveKey {
    pub fn new(topic_id: u64, partition: u32, move_id: u64) -> Self {
        Self {
            topic_id,
            partition,
            move_id,
        }
    }
}

/// The source to copy from (the partition's owner now) when the catalog `meta` still wants
/// move `key` to go to member `me`; `None` when it was cancelled, replaced by another move,
/// sent elsewhere, or the topic is another incarnation.
pub fn wanted_from(meta: &TopicMeta, key: MoveKey, me: u64) -> Option<u64> {
    let MoveKey {
        topic_id,
        partition: p,
        move_id,
    } = key;
    let m = meta.moves.get(&p)?;
    if meta.id != topic_id || m.id != move_id || m.target != me {
        return None;
    }
    meta.owner_of(p)
}

/// Whether the catalog's topic `now` (if it still has one of that name) says the flip of
/// partition `p` of incarnation `topic_id` to `me` committed: `me` owns it, one owner epoch
/// past `epoch` (the epoch the move froze at).
pub fn flipped(now: Option<&TopicMeta>, topic_id: u64, p: u32, me: u64, epoch: u64) -> bool {
    now.is_some_and(|t| {
        t.id == topic_id && t.owner_of(p) == Some(me) && t.owner_epoch(p) == epoch + 1
    })
}

/// The catch-up before the freeze: passes of copying while the source serves, until what a
/// pass copied is small ([`FREEZE_WHEN_LEFT`]: the freeze will be short), or producers
/// outpace the copy (three passes that did not shrink: freeze anyway, for longer), or
/// [`MAX_CATCH_UP_PASSES`] were made.
#[derive(Debug, Default)]
pub struct CatchUp {
    passes: usize,
    last: Option<u64>,
    growing: u32,
}

impl CatchUp {
    /// A pass copied `copied` bytes: whether to freeze now.
    pub fn freeze_after(&mut self, copied: u64) -> bool {
        self.passes += 1;
        if copied <= FREEZE_WHEN_LEFT {
            return true;
        }
        if self.last.is_some_and(|l| copied >= l) {
            self.growing += 1;
            if self.growing >= 3 {
                return true;
            }
        }
        self.last = Some(copied);
        self.passes >= MAX_CATCH_UP_PASSES
    }
}

/// What the catalog says of a flip whose answer was lost (read after a read index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// It committed: the partition is this member's.
    Committed,
    /// It did not commit and still can: the source owns the partition at the move's epoch,
    /// the move is the same and its freeze was not thawed. Proposed again (applied once).
    ProposeAgain,
    /// It did not commit and never will (the move changed, the freeze was thawed, the
    /// topic is gone or another incarnation).
    Lost,
}

/// The flip of move `move_id` (partition `p` of incarnation `topic_id`, frozen at owner
/// epoch `epoch` under freeze `token`, from `source` to `me`), judged from the catalog's
/// topic `now`.
pub fn resolve(
    now: Option<&TopicMeta>,
    MoveKey {
        topic_id,
        partition: p,
        move_id,
    }: MoveKey,
    me: u64,
    source: u64,
    epoch: u64,
    token: u64,
) -> Resolution {
    if flipped(now, topic_id, p, me, epoch) {
        return Resolution::Committed;
    }
    match now {
        Some(t)
            if t.id == topic_id
                && t.owner_of(p) == Some(source)
                && t.owner_epoch(p) == epoch
                && t.moves
                    .get(&p)
                    .is_some_and(|m| m.id == move_id && !m.thawed.contains(&token)) =>
        {
            Resolution::ProposeAgain
        }
        _ => Resolution::Lost,
    }
}

/// Why a source refuses to freeze a partition for a move (or to renew the freeze).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FreezeRefusal {
    /// Another move's freeze holds the partition until it thaws.
    HeldByAnother,
    /// A renewal, but no freeze holds the partition under its token (it lapsed and thawed).
    Lapsed,
    /// This member does not own the partition (`owner` does, 0 if none is known).
    NotOwner { owner: u64 },
    /// The partition is at another owner epoch than the move's.
    Epoch { now: u64 },
    /// The move is not in flight (cancelled or done).
    NotInFlight,
}

/// A freeze of a partition held at its source: its token, and the move it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldFreeze {
    pub token: u64,
    pub move_id: Option<u64>,
}

/// What a move's target asks of a partition's owner (see `Broker::freeze_partition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreezeAsk {
    /// The owner epoch the target copies from.
    pub owner_epoch: u64,
    /// The move the freeze is for: refused unless the catalog has it in flight (a freeze that
    /// arrives after its move was cancelled would hold the partition for a full term).
    pub move_id: u64,
    pub token: u64,
    /// How long the freeze holds unless renewed.
    pub ttl: Duration,
    /// Only renew a freeze held under `token`.
    pub renew: bool,
}

/// Whether the source `me` (`None`: a single node) grants freeze `ask` of partition `p` of
/// `meta` (the catalog it applied), holding `held` now. Asked again under the same token it
/// renews; a freeze this move took in an earlier attempt is taken over under the new token
/// (the partition stayed frozen since); another move's freeze is never.
pub fn refuse_freeze(
    held: Option<HeldFreeze>,
    meta: &TopicMeta,
    p: u32,
    me: Option<u64>,
    ask: FreezeAsk,
) -> Option<FreezeRefusal> {
    match held {
        Some(f) if f.token != ask.token && f.move_id == Some(ask.move_id) && !ask.renew => {}
        Some(f) if f.token != ask.token => return Some(FreezeRefusal::HeldByAnother),
        None if ask.renew => return Some(FreezeRefusal::Lapsed),
        _ => {}
    }
    if let (Some(me), Some(&owner)) = (me, meta.owners.get(p as usize))
        && owner != me
    {
        return Some(FreezeRefusal::NotOwner { owner });
    }
    let epoch = meta.owner_epoch(p);
    if epoch != ask.owner_epoch {
        return Some(FreezeRefusal::Epoch { now: epoch });
    }
    if meta.moves.get(&p).map(|m| m.id) != Some(ask.move_id) {
        return Some(FreezeRefusal::NotInFlight);
    }
    None
}

/// What the runner does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Make the local state ready for an install (the server checkpoints its write-ahead
    /// log). Answer [`Event::Prepared`].
    Prepare,
    /// List the source's files. Answer [`Event::Listed`].
    List,
    /// Copy what was listed while the source serves (paced); `first`: the attempt's first
    /// pass (what an earlier attempt staged from the same source process may be kept).
    /// Answer [`Event::Copied`].
    CatchUp { first: bool },
    /// Freeze the source's partition under `token`. Answer [`Event::Frozen`].
    Freeze { token: u64 },
    /// Copy exactly the frozen files, renewing the freeze under `token` as it goes, and make
    /// the copy durable. Answer [`Event::Finalized`].
    Finalize { token: u64 },
    /// Open the staged copy. Answer [`Event::Verified`] with its end.
    Verify,
    /// Renew the freeze once more, then look whether the move is still wanted. Answer
    /// [`Event::Fenced`].
    Fence { token: u64 },
    /// Put the staged copy in place (not served until the flip). Answer [`Event::Installed`].
    Install,
    /// Propose the flip (`CompleteMove` naming `token`). Answer [`Event::Flip`].
    ProposeFlip { token: u64 },
    /// Read the committed catalog (a read index) and judge the flip with [`resolve`].
    /// Answer [`Event::Read`]. `token`: the attempt's freeze token (a flip naming a thawed
    /// one never commits).
    ReadIndex { token: u64 },
    /// Wait, then answer [`Event::Waited`].
    Wait(Duration),
    /// The partition is this member's: the move is done.
    Done,
    /// The attempt failed: wait `after`, then start another ([`Event::Start`]) if the move
    /// is still wanted. `staged_stale`: the source restarted, so what was staged from it is
    /// not to be kept.
    Retry {
        after: Duration,
        error: String,
        staged_stale: bool,
    },
}

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Start an attempt; `token` is this attempt's freeze token (random, never 0).
    Start {
        token: u64,
    },
    Prepared,
    /// The source's files were listed; `incarnation` names the source process.
    Listed {
        incarnation: u64,
    },
    /// A catch-up pass copied `bytes`.
    Copied {
        bytes: u64,
    },
    /// The source froze at `end` (its next offset).
    Frozen {
        incarnation: u64,
        end: u64,
    },
    Finalized,
    /// The staged copy opened and ends at `end`.
    Verified {
        end: u64,
    },
    /// The freeze was renewed: the source's process and end now, and whether the catalog
    /// still wants the move.
    Fenced {
        incarnation: u64,
        end: u64,
        wanted: bool,
    },
    Installed,
    Flip(FlipAnswer),
    /// What [`resolve`] made of the committed catalog (`None`: no read index could be had).
    Read(Option<Resolution>),
    Waited,
    /// A call failed (the source, the disk, the network).
    Failed(String),
}

/// What a flip's proposal answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlipAnswer {
    Committed,
    /// Refused; `owns`: the catalog this member applied names it the owner one epoch on
    /// anyway (an earlier try of the same proposal committed).
    Refused {
        owns: bool,
        why: String,
    },
    /// No answer (a lost reply, a leader change): it may or may not have committed.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between attempts (before the first, or after a [`Action::Retry`]).
    Idle,
    Preparing,
    Listing,
    CatchingUp,
    Freezing,
    Finalizing,
    Verifying,
    Fencing,
    Installing,
    /// A flip was proposed (`again`: from the resolve loop).
    Flipping {
        again: bool,
    },
    Reading,
    Waiting,
    Done,
}

/// One move's sequence at its target, attempt after attempt.
#[derive(Debug)]
pub struct MoveMachine {
    state: State,
    token: u64,
    /// The source process the attempt's first list came from.
    incarnation: Option<u64>,
    /// The source's end when it froze.
    frozen_end: u64,
    catch_up: CatchUp,
    retry: Duration,
    resolve_wait: Duration,
    attempts: u32,
}

impl Default for MoveMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl MoveMachine {
    pub fn new() -> Self {
        Self {
            state: State::Idle,
            token: 0,
            incarnation: None,
            frozen_end: 0,
            catch_up: CatchUp::default(),
            retry: RETRY_FIRST,
            resolve_wait: RESOLVE_FIRST,
            attempts: 0,
        }
    }

    /// Attempts started.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The phase shown in a move's progress.
    pub fn phase(&self) -> &'static str {
        match self.state {
            State::Idle => "retrying",
            State::Preparing | State::Listing | State::CatchingUp => "catch_up",
            State::Freezing => "freeze",
            State::Finalizing => "finalize",
            State::Verifying | State::Fencing => "verify",
            State::Installing => "install",
            State::Flipping { again: false } => "flip",
            State::Flipping { again: true } | State::Reading | State::Waiting => "resolve",
            State::Done => "done",
        }
    }

    /// Feeds what the last action answered; returns the next action.
    pub fn step(&mut self, event: Event) -> Action {
        use State as S;
        match (self.state, event) {
            (S::Idle, Event::Start { token }) => {
                debug_assert_ne!(token, 0, "a freeze token is never 0");
                self.token = token;
                self.incarnation = None;
                self.frozen_end = 0;
                self.catch_up = CatchUp::default();
                self.resolve_wait = RESOLVE_FIRST;
                self.attempts += 1;
                self.go(S::Preparing, Action::Prepare)
            }
            (S::Preparing, Event::Prepared) => self.go(S::Listing, Action::List),
            (S::Listing, Event::Listed { incarnation }) => {
                let first = self.incarnation.is_none();
                if *self.incarnation.get_or_insert(incarnation) != incarnation {
                    return self.fail("the source restarted during the copy", true);
                }
                self.go(S::CatchingUp, Action::CatchUp { first })
            }
            (S::CatchingUp, Event::Copied { bytes }) => {
                if self.catch_up.freeze_after(bytes) {
                    let token = self.token;
                    self.go(S::Freezing, Action::Freeze { token })
                } else {
                    self.go(S::Listing, Action::List)
                }
            }
            (S::Freezing, Event::Frozen { incarnation, end }) => {
                if self.incarnation != Some(incarnation) {
                    return self.fail("the source restarted during the copy", true);
                }
                self.frozen_end = end;
                let token = self.token;
                self.go(S::Finalizing, Action::Finalize { token })
            }
            (S::Finalizing, Event::Finalized) => self.go(S::Verifying, Action::Verify),
            (S::Verifying, Event::Verified { end }) => {
                if end != self.frozen_end {
                    let e = format!(
                        "the staged copy ends at offset {end}, the source at {}",
                        self.frozen_end
                    );
                    return self.fail(e, false);
                }
                let token = self.token;
                self.go(S::Fencing, Action::Fence { token })
            }
            (
                S::Fencing,
                Event::Fenced {
                    incarnation,
                    end,
                    wanted,
                },
            ) => {
                if self.incarnation != Some(incarnation) || end != self.frozen_end {
                    return self.fail("the source's partition changed since the freeze", false);
                }
                if !wanted {
                    return self.fail("the move was cancelled", false);
                }
                self.go(S::Installing, Action::Install)
            }
            (S::Installing, Event::Installed) => {
                let token = self.token;
                self.go(S::Flipping { again: false }, Action::ProposeFlip { token })
            }
            (S::Flipping { again }, Event::Flip(answer)) => match answer {
                FlipAnswer::Committed | FlipAnswer::Refused { owns: true, .. } => {
                    self.go(S::Done, Action::Done)
                }
                FlipAnswer::Refused { owns: false, why } => {
                    self.fail(format!("the flip was refused: {why}"), false)
                }
                FlipAnswer::Unknown if again => self.wait(),
                FlipAnswer::Unknown => self.read_index(),
            },
            // (a failed proposal is an unknown outcome, never a refusal)
            (S::Flipping { again }, Event::Failed(_)) => {
                if again {
                    self.wait()
                } else {
                    self.read_index()
                }
            }
            (S::Reading, Event::Read(judged)) => match judged {
                Some(Resolution::Committed) => self.go(S::Done, Action::Done),
                Some(Resolution::ProposeAgain) => {
                    let token = self.token;
                    self.go(S::Flipping { again: true }, Action::ProposeFlip { token })
                }
                Some(Resolution::Lost) => self.fail(
                    "the flip did not commit (the move changed meanwhile)",
                    false,
                ),
                None => self.wait(),
            },
            (S::Reading, Event::Failed(_)) => self.wait(),
            (S::Waiting, Event::Waited | Event::Failed(_)) => {
                self.resolve_wait = (self.resolve_wait * 2).min(RESOLVE_MAX);
                self.read_index()
            }
            (
                S::Preparing
                | S::Listing
                | S::CatchingUp
                | S::Freezing
                | S::Finalizing
                | S::Verifying
                | S::Fencing
                | S::Installing,
                Event::Failed(e),
            ) => self.fail(e, false),
            (state, event) => {
                // a runner's slip: never acted on as if the call had answered (the attempt
                // is given up, which is always safe before the install, and after it the
                // catalog is read again)
                debug_assert!(false, "{event:?} answered in state {state:?}");
                match state {
                    S::Flipping { .. } | S::Reading | S::Waiting => self.wait(),
                    S::Done => Action::Done,
                    _ => self.fail(format!("{event:?} answered in state {state:?}"), false),
                }
            }
        }
    }

    fn go(&mut self, state: State, action: Action) -> Action {
        self.state = state;
        action
    }

    fn read_index(&mut self) -> Action {
        let token = self.token;
        self.go(State::Reading, Action::ReadIndex { token })
    }

    fn wait(&mut self) -> Action {
        self.go(State::Waiting, Action::Wait(self.resolve_wait))
    }

    fn fail(&mut self, error: impl Into<String>, staged_stale: bool) -> Action {
        let after = self.retry;
        self.retry = (self.retry * 2).min(RETRY_MAX);
        self.state = State::Idle;
        Action::Retry {
            after,
            error: error.into(),
            staged_stale,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::PartitionMove;
    use crate::topic::TopicConfig;

    use super::*;

    const ME: u64 = 2;
    const SOURCE: u64 = 1;

    /// Topic 7, partition 0 owned by `owner` at `epoch`, moving to `target` (move 42) if set.
    fn topic(owner: u64, epoch: u64, target: Option<u64>, thawed: &[u64]) -> TopicMeta {
        TopicMeta {
            config: TopicConfig {
                partitions: 2,
                ..TopicConfig::default()
            },
            owners: vec![owner, 3],
            owner_epochs: vec![epoch, 0],
            moves: target
                .map(|target| {
                    (
                        0,
                        PartitionMove {
                            id: 42,
                            target,
                            since_ms: 0,
                            reason: "admin".into(),
                            thawed: thawed.to_vec(),
                        },
                    )
                })
                .into_iter()
                .collect(),
            ..TopicMeta::new(7, "t", 0, TopicConfig::default())
        }
    }

    #[test]
    fn a_move_is_wanted_only_as_the_catalog_names_it() {
        let t = topic(SOURCE, 0, Some(ME), &[]);
        assert_eq!(wanted_from(&t, MoveKey::new(7, 0, 42), ME), Some(SOURCE));
        assert_eq!(
            wanted_from(&t, MoveKey::new(7, 0, 41), ME),
            None,
            "a cancelled move's id"
        );
        assert_eq!(
            wanted_from(&t, MoveKey::new(8, 0, 42), ME),
            None,
            "another incarnation"
        );
        assert_eq!(
            wanted_from(&t, MoveKey::new(7, 1, 42), ME),
            None,
            "no move of that partition"
        );
        assert_eq!(
            wanted_from(&t, MoveKey::new(7, 0, 42), 3),
            None,
            "sent to another member"
        );
        let gone = topic(SOURCE, 0, None, &[]);
        assert_eq!(
            wanted_from(&gone, MoveKey::new(7, 0, 42), ME),
            None,
            "cancelled"
        );
    }

    #[test]
    fn the_catch_up_freezes_once_little_is_left() {
        let mut c = CatchUp::default();
        assert!(!c.freeze_after(100 << 20));
        assert!(!c.freeze_after(30 << 20));
        assert!(c.freeze_after(FREEZE_WHEN_LEFT));
    }

    #[test]
    fn the_catch_up_freezes_after_three_passes_that_did_not_shrink() {
        let mut c = CatchUp::default();
        assert!(!c.freeze_after(64 << 20));
        assert!(!c.freeze_after(64 << 20), "one");
        assert!(!c.freeze_after(32 << 20), "shrank: not counted");
        assert!(!c.freeze_after(40 << 20), "two");
        assert!(c.freeze_after(50 << 20), "three");
    }

    #[test]
    fn the_catch_up_freezes_after_its_last_pass_whatever_it_copied() {
        let mut c = CatchUp::default();
        let mut size = 1u64 << 60;
        for pass in 1..MAX_CATCH_UP_PASSES {
            size /= 2;
            assert!(!c.freeze_after(size), "pass {pass}");
        }
        assert!(c.freeze_after(size / 2));
    }

    #[test]
    fn a_flip_committed_when_this_member_owns_the_partition_one_epoch_on() {
        let after = topic(ME, 4, None, &[]);
        assert!(flipped(Some(&after), 7, 0, ME, 3));
        assert!(
            !flipped(Some(&after), 7, 0, ME, 4),
            "an epoch further: another flip"
        );
        assert!(!flipped(Some(&after), 8, 0, ME, 3), "another incarnation");
        assert!(!flipped(Some(&topic(SOURCE, 4, None, &[])), 7, 0, ME, 3));
        assert!(!flipped(None, 7, 0, ME, 3), "the topic is gone");
    }

    #[test]
    fn a_lost_flip_answer_is_resolved_from_the_catalog() {
        let key = MoveKey::new(7, 0, 42);
        let token = 99;
        let judge = |t: Option<&TopicMeta>| resolve(t, key, ME, SOURCE, 3, token);
        assert_eq!(judge(Some(&topic(ME, 4, None, &[]))), Resolution::Committed);
        assert_eq!(
            judge(Some(&topic(SOURCE, 3, Some(ME), &[]))),
            Resolution::ProposeAgain,
            "not committed, the same move, the freeze held"
        );
        assert_eq!(
            judge(Some(&topic(SOURCE, 3, Some(ME), &[token]))),
            Resolution::Lost,
            "the freeze was thawed: a flip naming it is refused"
        );
        assert_eq!(
            judge(Some(&topic(SOURCE, 4, Some(ME), &[]))),
            Resolution::Lost,
            "the source moved on an epoch"
        );
        assert_eq!(
            judge(Some(&topic(SOURCE, 3, None, &[]))),
            Resolution::Lost,
            "cancelled"
        );
        assert_eq!(
            judge(Some(&topic(3, 4, None, &[]))),
            Resolution::Lost,
            "moved elsewhere"
        );
        assert_eq!(judge(None), Resolution::Lost, "the topic is gone");
    }

    #[test]
    fn a_source_freezes_only_for_the_move_in_flight_at_its_epoch() {
        let t = topic(SOURCE, 3, Some(ME), &[]);
        let ask = FreezeAsk {
            owner_epoch: 3,
            move_id: 42,
            token: 9,
            ttl: Duration::from_secs(5),
            renew: false,
        };
        let held = |token, move_id| Some(HeldFreeze { token, move_id });
        let refuse = |held, ask| refuse_freeze(held, &t, 0, Some(SOURCE), ask);
        assert_eq!(refuse(None, ask), None);
        assert_eq!(refuse(held(9, Some(42)), ask), None, "renewed");
        assert_eq!(
            refuse(held(8, Some(42)), ask),
            None,
            "this move's earlier freeze is taken over"
        );
        assert_eq!(
            refuse(held(8, Some(42)), FreezeAsk { renew: true, ..ask }),
            Some(FreezeRefusal::HeldByAnother),
            "but never by a renewal"
        );
        assert_eq!(
            refuse(held(8, Some(41)), ask),
            Some(FreezeRefusal::HeldByAnother)
        );
        assert_eq!(
            refuse(None, FreezeAsk { renew: true, ..ask }),
            Some(FreezeRefusal::Lapsed)
        );
        assert_eq!(
            refuse(
                None,
                FreezeAsk {
                    owner_epoch: 2,
                    ..ask
                }
            ),
            Some(FreezeRefusal::Epoch { now: 3 })
        );
        assert_eq!(
            refuse(None, FreezeAsk { move_id: 41, ..ask }),
            Some(FreezeRefusal::NotInFlight)
        );
        assert_eq!(
            refuse_freeze(None, &t, 0, Some(ME), ask),
            Some(FreezeRefusal::NotOwner { owner: SOURCE })
        );
    }

    // ── the machine ──

    /// Drives `m` from `action` with `answer` until it asks for something `answer` does not
    /// answer; returns the actions asked for, in order.
    fn drive(
        m: &mut MoveMachine,
        first: Event,
        answer: impl Fn(&Action) -> Option<Event>,
    ) -> Vec<Action> {
        let mut seen = vec![m.step(first)];
        while let Some(e) = answer(seen.last().unwrap()) {
            seen.push(m.step(e));
            assert!(seen.len() < 1000, "runs away: {seen:?}");
        }
        seen
    }

    /// Answers every call as a healthy source and cluster would: `pass` bytes copied per
    /// catch-up pass (halving), frozen at end 77.
    fn healthy(a: &Action) -> Option<Event> {
        Some(match a {
            Action::Prepare => Event::Prepared,
            Action::List => Event::Listed { incarnation: 5 },
            Action::CatchUp { .. } => Event::Copied { bytes: 1 << 20 },
            Action::Freeze { .. } => Event::Frozen {
                incarnation: 5,
                end: 77,
            },
            Action::Finalize { .. } => Event::Finalized,
            Action::Verify => Event::Verified { end: 77 },
            Action::Fence { .. } => Event::Fenced {
                incarnation: 5,
                end: 77,
                wanted: true,
            },
            Action::Install => Event::Installed,
            Action::ProposeFlip { .. } => Event::Flip(FlipAnswer::Committed),
            _ => return None,
        })
    }

    #[test]
    fn a_move_goes_copy_freeze_verify_fence_install_flip() {
        let mut m = MoveMachine::new();
        let big = std::cell::Cell::new(2u32);
        let seen = drive(&mut m, Event::Start { token: 9 }, |a| match a {
            // two big passes, then little is left
            Action::CatchUp { .. } if big.get() > 0 => {
                big.set(big.get() - 1);
                Some(Event::Copied { bytes: 64 << 20 })
            }
            a => healthy(a),
        });
        assert_eq!(
            seen,
            vec![
                Action::Prepare,
                Action::List,
                Action::CatchUp { first: true },
                Action::List,
                Action::CatchUp { first: false },
                Action::List,
                Action::CatchUp { first: false },
                Action::Freeze { token: 9 },
                Action::Finalize { token: 9 },
                Action::Verify,
                Action::Fence { token: 9 },
                Action::Install,
                Action::ProposeFlip { token: 9 },
                Action::Done,
            ]
        );
        assert_eq!(m.phase(), "done");
        assert_eq!(m.attempts(), 1);
    }

    fn retried(a: &Action) -> (&str, bool, Duration) {
        match a {
            Action::Retry {
                after,
                error,
                staged_stale,
            } => (error.as_str(), *staged_stale, *after),
            other => panic!("not a retry: {other:?}"),
        }
    }

    #[test]
    fn a_source_that_restarted_mid_copy_fails_the_attempt_and_its_staged_copy() {
        let mut m = MoveMachine::new();
        let lists = std::cell::Cell::new(0);
        let seen = drive(&mut m, Event::Start { token: 9 }, |a| match a {
            Action::List => {
                lists.set(lists.get() + 1);
                Some(Event::Listed {
                    incarnation: lists.get(),
                })
            }
            Action::CatchUp { .. } => Some(Event::Copied { bytes: 64 << 20 }),
            a => healthy(a),
        });
        let (error, stale, after) = retried(seen.last().unwrap());
        assert_eq!(
            (error, stale, after),
            ("the source restarted during the copy", true, RETRY_FIRST)
        );
        // and a restart found at the freeze
        let seen = drive(&mut m, Event::Start { token: 10 }, |a| match a {
            Action::Freeze { .. } => Some(Event::Frozen {
                incarnation: 6,
                end: 77,
            }),
            a => healthy(a),
        });
        assert!(!seen.contains(&Action::Finalize { token: 10 }));
        let (_, stale, after) = retried(seen.last().unwrap());
        assert!(stale);
        assert_eq!(after, RETRY_FIRST * 2, "the wait doubles");
        assert_eq!(m.attempts(), 2);
    }

    #[test]
    fn nothing_is_installed_unless_the_copy_ends_where_the_source_froze_and_the_move_stands() {
        type Answer = fn(&Action) -> Option<Event>;
        let cases: [(&str, Answer); 3] = [
            (
                "the staged copy ends at offset 76, the source at 77",
                |a| match a {
                    Action::Verify => Some(Event::Verified { end: 76 }),
                    a => healthy(a),
                },
            ),
            (
                "the source's partition changed since the freeze",
                |a| match a {
                    Action::Fence { .. } => Some(Event::Fenced {
                        incarnation: 5,
                        end: 78,
                        wanted: true,
                    }),
                    a => healthy(a),
                },
            ),
            ("the move was cancelled", |a| match a {
                Action::Fence { .. } => Some(Event::Fenced {
                    incarnation: 5,
                    end: 77,
                    wanted: false,
                }),
                a => healthy(a),
            }),
        ];
        for (why, answer) in cases {
            let mut m = MoveMachine::new();
            let seen = drive(&mut m, Event::Start { token: 9 }, answer);
            assert!(!seen.contains(&Action::Install), "{why}: {seen:?}");
            assert_eq!(retried(seen.last().unwrap()).0, why);
        }
    }

    #[test]
    fn a_lost_flip_answer_is_read_from_the_catalog_until_it_is_known() {
        let mut m = MoveMachine::new();
        let reads = std::cell::Cell::new(0);
        let seen = drive(&mut m, Event::Start { token: 9 }, |a| match a {
            Action::ProposeFlip { .. } => Some(Event::Flip(FlipAnswer::Unknown)),
            Action::ReadIndex { .. } => {
                reads.set(reads.get() + 1);
                Some(Event::Read(match reads.get() {
                    1 | 2 => None,
                    3 => Some(Resolution::ProposeAgain),
                    _ => Some(Resolution::Committed),
                }))
            }
            Action::Wait(_) => Some(Event::Waited),
            a => healthy(a),
        });
        let after_install: Vec<_> = seen
            .iter()
            .skip_while(|a| **a != Action::Install)
            .cloned()
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(
            after_install,
            vec![
                Action::Install,
                Action::ProposeFlip { token: 9 },
                Action::ReadIndex { token: 9 },
                Action::Wait(ms(250)),
                Action::ReadIndex { token: 9 },
                Action::Wait(ms(500)),
                Action::ReadIndex { token: 9 },
                Action::ProposeFlip { token: 9 },
                Action::Wait(ms(1000)),
                Action::ReadIndex { token: 9 },
                Action::Done,
            ]
        );
        assert_eq!(m.phase(), "done");
    }

    #[test]
    fn a_refused_flip_ends_the_attempt_unless_the_catalog_names_this_member() {
        let mut m = MoveMachine::new();
        let seen = drive(&mut m, Event::Start { token: 9 }, |a| match a {
            Action::ProposeFlip { .. } => Some(Event::Flip(FlipAnswer::Refused {
                owns: true,
                why: "conflict".into(),
            })),
            a => healthy(a),
        });
        assert_eq!(seen.last(), Some(&Action::Done), "an earlier try committed");
        let mut m = MoveMachine::new();
        let seen = drive(&mut m, Event::Start { token: 9 }, |a| match a {
            Action::ProposeFlip { .. } => Some(Event::Flip(FlipAnswer::Refused {
                owns: false,
                why: "thawed".into(),
            })),
            a => healthy(a),
        });
        assert_eq!(
            retried(seen.last().unwrap()).0,
            "the flip was refused: thawed"
        );
    }

    fn any_event() -> impl Strategy<Value = Event> {
        prop_oneof![
            Just(Event::Prepared),
            (0u64..3).prop_map(|incarnation| Event::Listed { incarnation }),
            prop_oneof![Just(0u64), Just(64 << 20)].prop_map(|bytes| Event::Copied { bytes }),
            (0u64..3, 76u64..79).prop_map(|(incarnation, end)| Event::Frozen { incarnation, end }),
            Just(Event::Finalized),
            (76u64..79).prop_map(|end| Event::Verified { end }),
            (0u64..3, 76u64..79, any::<bool>()).prop_map(|(incarnation, end, wanted)| {
                Event::Fenced {
                    incarnation,
                    end,
                    wanted,
                }
            }),
            Just(Event::Installed),
            prop_oneof![
                Just(FlipAnswer::Committed),
                Just(FlipAnswer::Unknown),
                any::<bool>().prop_map(|owns| FlipAnswer::Refused {
                    owns,
                    why: "no".into()
                }),
            ]
            .prop_map(Event::Flip),
            prop_oneof![
                Just(None),
                Just(Some(Resolution::Committed)),
                Just(Some(Resolution::ProposeAgain)),
                Just(Some(Resolution::Lost)),
            ]
            .prop_map(Event::Read),
            Just(Event::Waited),
            Just(Event::Failed("boom".into())),
        ]
    }

    /// The answer a runner may give to `a` (events that answer another action are not fed).
    fn answers(a: &Action, e: &Event) -> bool {
        matches!(
            (a, e),
            (Action::Prepare, Event::Prepared | Event::Failed(_))
                | (Action::List, Event::Listed { .. } | Event::Failed(_))
                | (
                    Action::CatchUp { .. },
                    Event::Copied { .. } | Event::Failed(_)
                )
                | (
                    Action::Freeze { .. },
                    Event::Frozen { .. } | Event::Failed(_)
                )
                | (Action::Finalize { .. }, Event::Finalized | Event::Failed(_))
                | (Action::Verify, Event::Verified { .. } | Event::Failed(_))
                | (
                    Action::Fence { .. },
                    Event::Fenced { .. } | Event::Failed(_)
                )
                | (Action::Install, Event::Installed | Event::Failed(_))
                | (
                    Action::ProposeFlip { .. },
                    Event::Flip(_) | Event::Failed(_)
                )
                | (Action::ReadIndex { .. }, Event::Read(_) | Event::Failed(_))
                | (Action::Wait(_), Event::Waited)
                | (Action::Retry { .. }, Event::Start { .. })
        )
    }

    proptest! {
        /// Whatever the calls answer: nothing is installed but a copy verified to end where
        /// the source froze and fenced at that end while the move stood; the move is done
        /// only on the catalog's word; and once installed, an attempt ends only on the
        /// catalog's word too (never on a bare error).
        #[test]
        fn only_the_catalog_ends_an_installed_attempt(events in proptest::collection::vec(any_event(), 1..300)) {
            let mut m = MoveMachine::new();
            let mut action = m.step(Event::Start { token: 9 });
            let (mut frozen_end, mut verified, mut fenced) = (None, false, false);
            let mut installed = false;
            let mut tokens = 9u64;
            for e in events {
                let e = match &action {
                    Action::Retry { .. } => {
                        tokens += 1;
                        Event::Start { token: tokens }
                    }
                    Action::Done => break,
                    a if answers(a, &e) => e,
                    _ => continue,
                };
                let last = action.clone();
                match (&last, &e) {
                    (_, Event::Start { .. }) => {
                        frozen_end = None;
                        (verified, fenced, installed) = (false, false, false);
                    }
                    (Action::Freeze { .. }, Event::Frozen { end, .. }) => frozen_end = Some(*end),
                    (Action::Verify, Event::Verified { end }) => verified = frozen_end == Some(*end),
                    (Action::Fence { .. }, Event::Fenced { end, wanted, .. }) => {
                        fenced = verified && *wanted && frozen_end == Some(*end);
                    }
                    (Action::Install, Event::Installed) => installed = true,
                    _ => {}
                }
                let catalog_said = matches!(
                    &e,
                    Event::Flip(FlipAnswer::Committed | FlipAnswer::Refused { .. })
                        | Event::Read(Some(Resolution::Committed | Resolution::Lost))
                );
                action = m.step(e);
                match &action {
                    Action::Install => prop_assert!(fenced, "installed unverified after {last:?}"),
                    Action::Done => prop_assert!(catalog_said && installed, "done without the catalog after {last:?}"),
                    Action::Retry { .. } if installed => {
                        prop_assert!(catalog_said, "an installed attempt given up on a bare error after {last:?}");
                    }
                    Action::Freeze { token } | Action::Finalize { token } | Action::Fence { token } | Action::ProposeFlip { token } => {
                        prop_assert_eq!(*token, tokens, "the attempt's own token");
                    }
                    _ => {}
                }
            }
        }
    }
}
