//! Message-lifecycle checker: records every send, 2xx, delivery, ack outcome and injected fault
//! with one monotonic clock, then checks the whole history against the delivery contract.
//!
//! Every rule is checked *soundly*: a violation is reported only when the recorded times prove
//! it. The broker's own instants (commit, lease start, ack) are unknown to the client, but each
//! lies between a request leaving and its response arriving, so the checker compares the bounds
//! that make a violation certain:
//!
//! - **lost**: a message whose produce got a 2xx was never delivered.
//! - **double lease**: delivery B of a message was *answered* before the earliest moment
//!   delivery A's lease could have ended (A's request sent + visibility timeout, or the send of a
//!   successful ack/nack of A's handle), with no fault in between.
//! - **redelivered after ack**: a delivery *requested* after a successful ack of the message was
//!   answered, unless a recorded fault window covers the ack (acks are persisted periodically, so
//!   a kill may forget the newest ones).
//! - **early**: a delayed message was answered before produce-sent + delay.
//! - **phantom**: a delivery of a message that was never sent.
//!
//! Memory: about 100 bytes per message while its history is open; call [`Recorder::compact`]
//! in long runs to fold settled messages into 24 bytes each.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

/// Nanoseconds since the recorder was created.
pub type Nanos = u64;

/// A message identity chosen by the client (it travels inside the payload).
pub type MsgId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The broker process was killed with SIGKILL and restarted.
    Kill,
    /// The broker was stopped gracefully and restarted.
    Restart,
}

/// A fault and the window during which its effects may be observed: from the moment it was
/// injected (minus the broker's ack persistence lag) until the broker was ready again.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub start: Nanos,
    pub end: Nanos,
}

#[derive(Debug, Clone)]
struct Delivery {
    reader: u32,
    req_at: Nanos,
    resp_at: Nanos,
    partition: u32,
    offset: u64,
    handle: String,
    /// Earliest moment this lease could have ended; `None` until known (set from the visibility
    /// timeout at delivery, lowered by a settle).
    lease_end_lb: Nanos,
}

#[derive(Debug, Clone)]
struct AckOk {
    sent_at: Nanos,
    resp_at: Nanos,
    /// The record (partition, offset) whose lease the ack ended, when known. A message may
    /// be stored twice (a producer's retry, or a cluster member placing it again after its
    /// owner did not answer in time): an ack of one copy says nothing about the other.
    record: Option<(u32, u64)>,
}

#[derive(Debug, Clone, Default)]
struct History {
    sent_at: Option<Nanos>,
    delay: Duration,
    accepted_at: Option<Nanos>,
    rejected: Option<u16>,
    deliveries: Vec<Delivery>,
    acks: Vec<AckOk>,
    ack_failures: u32,
    /// When the latest settle whose outcome is unknown was sent.
    unknown_settle_at: Option<Nanos>,
}

#[derive(Debug, Clone)]
enum Entry {
    Open(Box<History>),
    /// Settled and compacted: accepted, delivered, acked at `acked_at`, never redelivered since.
    Done {
        acked_at: Nanos,
        deliveries: u32,
        /// The copy acked last (see [`AckOk::record`]).
        record: Option<(u32, u64)>,
    },
}

#[derive(Default)]
struct State {
    messages: HashMap<MsgId, Entry>,
    faults: Vec<Fault>,
    phantoms: Vec<(Nanos, String)>,
    /// Deliveries of compacted messages found later (counted, checked against faults).
    late_after_compact: Vec<(MsgId, Nanos, Nanos)>,
    /// Deliveries of compacted messages from another copy than the acked one (duplicates,
    /// not redeliveries).
    copies_after_compact: u64,
}

/// The running counts of a history, cheap to compute for a live tally.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Tally {
    pub sent: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub delivered: u64,
    pub acked: u64,
    /// Accepted and not yet acked.
    pub outstanding: u64,
    /// Deliveries beyond the first, per message.
    pub duplicates: u64,
}

/// Records one run's history. Share it behind an `Arc`; every method takes `&self`.
pub struct Recorder {
    t0: Instant,
    visibility: Duration,
    ack_lag: Duration,
    state: Mutex<State>,
}

impl Recorder {
    /// `visibility` is the topic's lease length. `ack_lag` is how long an ack may stay
    /// unpersisted (the broker's `ack_flush_interval_ms` plus scheduling slack): a kill may forget
    /// acks that happened within `ack_lag` before it.
    pub fn new(visibility: Duration, ack_lag: Duration) -> Self {
        Self {
            t0: Instant::now(),
            visibility,
            ack_lag,
            state: Mutex::default(),
        }
    }

    pub fn now(&self) -> Nanos {
        self.t0.elapsed().as_nanos() as Nanos
    }

    /// Before the request leaves.
    pub fn sent(&self, id: MsgId, at: Nanos, delay: Duration) {
        let mut st = self.state.lock();
        let h = open(&mut st.messages, id);
        h.sent_at.get_or_insert(at);
        h.delay = delay;
    }

    /// The produce got a 2xx.
    pub fn accepted(&self, id: MsgId, at: Nanos) {
        let mut st = self.state.lock();
        open(&mut st.messages, id).accepted_at.get_or_insert(at);
    }

    /// The produce got a definite non-2xx answer (not a transport error: that outcome is unknown).
    pub fn rejected(&self, id: MsgId, status: u16) {
        let mut st = self.state.lock();
        open(&mut st.messages, id).rejected = Some(status);
    }

    /// A queue read returned the message. `payload` is only kept for reporting phantoms.
    #[allow(clippy::too_many_arguments)]
    pub fn delivered(
        &self,
        id: Option<MsgId>,
        payload: &str,
        reader: u32,
        req_at: Nanos,
        resp_at: Nanos,
        partition: u32,
        offset: u64,
        handle: &str,
    ) {
        let mut st = self.state.lock();
        let Some(id) = id else {
            st.phantoms
                .push((resp_at, payload.chars().take(64).collect()));
            return;
        };
        let vis = self.visibility.as_nanos() as Nanos;
        let lease_end_lb = req_at + vis - slew(vis);
        match st.messages.get_mut(&id) {
            None => st
                .phantoms
                .push((resp_at, payload.chars().take(64).collect())),
            Some(Entry::Done {
                acked_at, record, ..
            }) => {
                let acked_at = *acked_at;
                if record.is_none_or(|r| r == (partition, offset)) {
                    st.late_after_compact.push((id, acked_at, req_at));
                } else {
                    st.copies_after_compact += 1;
                }
            }
            Some(Entry::Open(h)) => h.deliveries.push(Delivery {
                reader,
                req_at,
                resp_at,
                partition,
                offset,
                handle: handle.to_owned(),
                lease_end_lb,
            }),
        }
    }

    /// A successful ack (or nack) of `handle` for message `id`: the lease ended after `sent_at`.
    /// `acked` is false for a nack (the message stays pending).
    pub fn settled(&self, id: MsgId, handle: &str, sent_at: Nanos, resp_at: Nanos, acked: bool) {
        let mut st = self.state.lock();
        let Some(Entry::Open(h)) = st.messages.get_mut(&id) else {
            return;
        };
        let mut record = None;
        if let Some(d) = h.deliveries.iter_mut().rev().find(|d| d.handle == handle) {
            d.lease_end_lb = d.lease_end_lb.min(sent_at);
            record = Some((d.partition, d.offset));
        }
        if acked {
            h.acks.push(AckOk {
                sent_at,
                resp_at,
                record,
            });
        }
    }

    /// A settle whose outcome is unknown (the request was sent, no answer came): it may have
    /// ended the lease, so the lease counts as possibly ended from `sent_at`.
    pub fn settle_unknown(&self, id: MsgId, handle: &str, sent_at: Nanos) {
        let mut st = self.state.lock();
        let Some(Entry::Open(h)) = st.messages.get_mut(&id) else {
            return;
        };
        if let Some(d) = h.deliveries.iter_mut().rev().find(|d| d.handle == handle) {
            d.lease_end_lb = d.lease_end_lb.min(sent_at);
        }
        h.unknown_settle_at = h.unknown_settle_at.max(Some(sent_at));
    }

    /// Accepted messages not known to be acked, for a drain to wait on: as
    /// [`Tally::outstanding`], but leaving out a message whose latest delivery was settled
    /// with an unknown outcome more than `grace` ago. That settle may have been applied (then
    /// the message never comes back and no ack will ever be seen); had it not been, the lease
    /// would have ended within the visibility timeout and the message come back, so `grace`
    /// is the visibility timeout plus slack.
    pub fn unsettled(&self, grace: Duration) -> u64 {
        let now = self.now();
        let grace = grace.as_nanos() as Nanos;
        let st = self.state.lock();
        st.messages
            .values()
            .filter(|e| match e {
                Entry::Done { .. } => false,
                Entry::Open(h) => {
                    let settled_unknown = h.unknown_settle_at.is_some_and(|u| {
                        let latest = h.deliveries.iter().map(|d| d.resp_at).max().unwrap_or(0);
                        u >= latest && now.saturating_sub(u) > grace
                    });
                    h.accepted_at.is_some() && h.acks.is_empty() && !settled_unknown
                }
            })
            .count() as u64
    }

    /// Accepted messages with no successful ack: after a drain, each of these is lost (or
    /// stuck), whether or not it was ever delivered.
    pub fn unacked(&self) -> Vec<Violation> {
        let st = self.state.lock();
        let mut out: Vec<Violation> = st
            .messages
            .iter()
            .filter_map(|(id, e)| match e {
                Entry::Open(h) if h.accepted_at.is_some() && h.acks.is_empty() => Some(Violation {
                    rule: Rule::Lost,
                    id: *id,
                    detail: format!(
                        "accepted but never acked by the end of the drain; {}",
                        describe(h)
                    ),
                }),
                _ => None,
            })
            .collect();
        out.sort_by_key(|v| v.id);
        out
    }

    /// An ack that the broker refused (e.g. 410 for an expired or pre-restart handle).
    pub fn settle_failed(&self, id: MsgId) {
        let mut st = self.state.lock();
        if let Some(Entry::Open(h)) = st.messages.get_mut(&id) {
            h.ack_failures += 1;
        }
    }

    /// The outcome of one produce request carrying `ids`: `Some(status)` if the broker
    /// answered, `None` for a transport error (then the outcome is unknown: nothing recorded).
    pub fn produce_outcome(&self, ids: &[MsgId], status: Option<u16>) {
        let at = self.now();
        match status {
            Some(s) if (200..300).contains(&s) => ids.iter().for_each(|&id| self.accepted(id, at)),
            Some(s) => ids.iter().for_each(|&id| self.rejected(id, s)),
            None => {}
        }
    }

    /// The outcome of one batch settle (ack if `acked`, else nack) of `items` sent at
    /// `sent_at`: the per-handle statuses if the broker answered, `None` for a transport error
    /// (the settle may or may not have happened).
    pub fn settle_outcome(
        &self,
        items: &[(MsgId, String)],
        sent_at: Nanos,
        statuses: Option<&[u16]>,
        acked: bool,
    ) {
        let resp_at = self.now();
        match statuses {
            None => items
                .iter()
                .for_each(|(id, h)| self.settle_unknown(*id, h, sent_at)),
            Some(st) => {
                for ((id, h), s) in items.iter().zip(st) {
                    match *s {
                        204 => self.settled(*id, h, sent_at, resp_at, acked),
                        // the broker could not say (`outcome_unknown`): in a cluster, the member
                        // did not hear back from the owner, which may have applied it
                        504 => self.settle_unknown(*id, h, sent_at),
                        // 503 and every other refusal mean not applied: the lease holds, and
                        // the message comes back when it ends (had it been applied, the drain
                        // would wait for it in vain)
                        _ => self.settle_failed(*id),
                    }
                }
            }
        }
    }

    /// A fault was injected at `start` and the broker was ready again at `end`.
    pub fn fault(&self, kind: FaultKind, start: Nanos, end: Nanos) {
        let lag = self.ack_lag.as_nanos() as Nanos;
        self.state.lock().faults.push(Fault {
            kind,
            start: start.saturating_sub(lag),
            end,
        });
    }

    /// Folds settled messages (accepted, acked, delivered, no lease open) into compact entries
    /// so a run of days keeps memory bounded. Their rules were already checked here.
    pub fn compact(&self, older_than: Duration) -> Vec<Violation> {
        let horizon = self.now().saturating_sub(older_than.as_nanos() as Nanos);
        let mut st = self.state.lock();
        let faults = st.faults.clone();
        let mut out = Vec::new();
        for (id, e) in st.messages.iter_mut() {
            let Entry::Open(h) = e else { continue };
            let Some(last) = h.acks.iter().max_by_key(|a| a.resp_at) else {
                continue;
            };
            let (last_ack, record) = (last.resp_at, last.record);
            if last_ack > horizon || h.deliveries.iter().any(|d| d.resp_at > horizon) {
                continue;
            }
            check_one(*id, h, &faults, &mut out);
            *e = Entry::Done {
                acked_at: last_ack,
                deliveries: h.deliveries.len() as u32,
                record,
            };
        }
        out
    }

    pub fn tally(&self) -> Tally {
        let st = self.state.lock();
        let mut t = Tally::default();
        for e in st.messages.values() {
            match e {
                Entry::Done { deliveries, .. } => {
                    t.sent += 1;
                    t.accepted += 1;
                    t.delivered += 1;
                    t.acked += 1;
                    t.duplicates += u64::from(deliveries.saturating_sub(1));
                }
                Entry::Open(h) => {
                    t.sent += u64::from(h.sent_at.is_some());
                    t.accepted += u64::from(h.accepted_at.is_some());
                    t.rejected += u64::from(h.rejected.is_some());
                    t.delivered += u64::from(!h.deliveries.is_empty());
                    t.acked += u64::from(!h.acks.is_empty());
                    t.outstanding += u64::from(h.accepted_at.is_some() && h.acks.is_empty());
                    t.duplicates += h.deliveries.len().saturating_sub(1) as u64;
                }
            }
        }
        t.duplicates += st.late_after_compact.len() as u64 + st.copies_after_compact;
        t
    }

    /// Every message that got a 2xx (compacted ones included), in id order.
    pub fn accepted_ids(&self) -> Vec<MsgId> {
        let st = self.state.lock();
        let mut ids: Vec<MsgId> = st
            .messages
            .iter()
            .filter(|(_, e)| match e {
                Entry::Open(h) => h.accepted_at.is_some(),
                Entry::Done { .. } => true,
            })
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Messages accepted more than `age` ago and never delivered: lost unless they show up.
    pub fn overdue(&self, age: Duration) -> u64 {
        let horizon = self.now().saturating_sub(age.as_nanos() as Nanos);
        let st = self.state.lock();
        st.messages
            .values()
            .filter(|e| match e {
                Entry::Open(h) => {
                    h.deliveries.is_empty() && h.accepted_at.is_some_and(|t| t < horizon)
                }
                Entry::Done { .. } => false,
            })
            .count() as u64
    }

    /// Checks every rule over the whole history.
    pub fn check(&self) -> Report {
        let st = self.state.lock();
        let mut violations = Vec::new();
        let mut report = Report {
            tally: Tally::default(),
            faults: st.faults.clone(),
            violations: Vec::new(),
            counts: RuleCounts::default(),
        };
        let mut ids: Vec<&MsgId> = st.messages.keys().collect();
        ids.sort_unstable();
        for id in ids {
            if let Entry::Open(h) = &st.messages[id] {
                check_one(*id, h, &st.faults, &mut violations);
            }
        }
        for (id, acked_at, req_at) in &st.late_after_compact {
            if !fault_covers_ack(&st.faults, *acked_at, *req_at) {
                violations.push(Violation {
                    rule: Rule::RedeliveredAfterAck,
                    id: *id,
                    detail: format!(
                        "delivery requested at {} after an ack answered at {} (compacted history)",
                        ms(*req_at),
                        ms(*acked_at)
                    ),
                });
            }
        }
        for (at, payload) in &st.phantoms {
            violations.push(Violation {
                rule: Rule::Phantom,
                id: 0,
                detail: format!("delivered at {} a payload never sent: {payload:?}", ms(*at)),
            });
        }
        drop(st);
        report.tally = self.tally();
        for v in &violations {
            report.count(v.rule);
        }
        report.violations = violations;
        report
    }
}

fn open(messages: &mut HashMap<MsgId, Entry>, id: MsgId) -> &mut History {
    let e = messages
        .entry(id)
        .or_insert_with(|| Entry::Open(Box::default()));
    if let Entry::Done { .. } = e {
        // An id reused after compaction: start a fresh history (clients never reuse ids).
        *e = Entry::Open(Box::default());
    }
    match e {
        Entry::Open(h) => h,
        Entry::Done { .. } => unreachable!("replaced above"),
    }
}

/// The broker times leases and delays by its wall clock, which NTP may slew by up to 500 ppm
/// against the monotonic clock the recorder uses; intervals are shortened by that much before
/// they count as proof.
fn slew(interval: Nanos) -> Nanos {
    interval / 2000
}

fn ms(n: Nanos) -> String {
    format!("{:.3}ms", n as f64 / 1e6)
}

fn fault_between(faults: &[Fault], from: Nanos, to: Nanos) -> bool {
    faults.iter().any(|f| f.end >= from && f.start <= to)
}

/// An ack answered at `ack_at` may be forgotten by a fault whose window contains it, and the
/// message may then come back in any later delivery.
fn fault_covers_ack(faults: &[Fault], ack_at: Nanos, delivery_req: Nanos) -> bool {
    faults
        .iter()
        .any(|f| f.start <= ack_at && ack_at <= f.end && f.start <= delivery_req)
}

fn check_one(id: MsgId, h: &History, faults: &[Fault], out: &mut Vec<Violation>) {
    let history = || describe(h);
    if h.accepted_at.is_some() && h.deliveries.is_empty() {
        out.push(Violation {
            rule: Rule::Lost,
            id,
            detail: format!("got a 2xx but was never delivered; {}", history()),
        });
    }
    let mut ds: Vec<&Delivery> = h.deliveries.iter().collect();
    ds.sort_by_key(|d| d.resp_at);
    for (i, a) in ds.iter().enumerate() {
        for b in &ds[i + 1..] {
            // the same record, each answered (so started) before the other's lease could
            // have ended, and no fault in between: the two leases overlapped (two copies of
            // a message may be leased at once: they are two records)
            if (a.partition, a.offset) == (b.partition, b.offset)
                && b.resp_at < a.lease_end_lb
                && a.resp_at < b.lease_end_lb
                && !fault_between(faults, a.req_at, b.resp_at)
            {
                out.push(Violation {
                    rule: Rule::DoubleLease,
                    id,
                    detail: format!(
                        "leased to reader {} (p{} o{}) and reader {} at overlapping times; {}",
                        a.reader,
                        a.partition,
                        a.offset,
                        b.reader,
                        history()
                    ),
                });
            }
        }
    }
    for ack in &h.acks {
        let same = |d: &&&Delivery| ack.record.is_none_or(|r| r == (d.partition, d.offset));
        for d in ds.iter().filter(|d| d.req_at > ack.resp_at).filter(same) {
            if !fault_covers_ack(faults, ack.resp_at, d.req_at) {
                out.push(Violation {
                    rule: Rule::RedeliveredAfterAck,
                    id,
                    detail: format!(
                        "delivered again (requested {}) after an ack answered at {} outside any fault window; {}",
                        ms(d.req_at),
                        ms(ack.resp_at),
                        history()
                    ),
                });
            }
        }
    }
    if let (Some(sent), Some(first)) = (h.sent_at, ds.first())
        && !h.delay.is_zero()
        && first.resp_at < sent + h.delay.as_nanos() as Nanos - slew(h.delay.as_nanos() as Nanos)
    {
        out.push(Violation {
            rule: Rule::Early,
            id,
            detail: format!(
                "delay {:?} but delivered {} after the produce was sent; {}",
                h.delay,
                ms(first.resp_at - sent),
                history()
            ),
        });
    }
}

fn describe(h: &History) -> String {
    let mut s = String::new();
    if let Some(t) = h.sent_at {
        s += &format!("sent {}", ms(t));
    }
    if let Some(t) = h.accepted_at {
        s += &format!(", 2xx {}", ms(t));
    }
    for d in &h.deliveries {
        s += &format!(
            ", delivered to reader {} [{}..{}] p{} o{} lease-end>={}",
            d.reader,
            ms(d.req_at),
            ms(d.resp_at),
            d.partition,
            d.offset,
            ms(d.lease_end_lb)
        );
    }
    for a in &h.acks {
        s += &format!(", acked [{}..{}]", ms(a.sent_at), ms(a.resp_at));
    }
    if h.ack_failures > 0 {
        s += &format!(", {} refused acks", h.ack_failures);
    }
    s
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    Lost,
    DoubleLease,
    RedeliveredAfterAck,
    Early,
    Phantom,
}

#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub rule: Rule,
    pub id: MsgId,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RuleCounts {
    pub lost: u64,
    pub double_lease: u64,
    pub redelivered_after_ack: u64,
    pub early: u64,
    pub phantom: u64,
}

impl RuleCounts {
    fn bump(&mut self, r: Rule) {
        *match r {
            Rule::Lost => &mut self.lost,
            Rule::DoubleLease => &mut self.double_lease,
            Rule::RedeliveredAfterAck => &mut self.redelivered_after_ack,
            Rule::Early => &mut self.early,
            Rule::Phantom => &mut self.phantom,
        } += 1;
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tally: Tally,
    pub faults: Vec<Fault>,
    pub counts: RuleCounts,
    pub violations: Vec<Violation>,
}

impl Report {
    /// Counts a violation found outside [`Recorder::check`] (e.g. by a replay reader).
    pub fn count(&mut self, rule: Rule) {
        self.counts.bump(rule);
    }

    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.tally;
        writeln!(
            f,
            "lifecycle: sent {} accepted {} rejected {} delivered {} acked {} outstanding {} duplicates {} faults {}",
            t.sent,
            t.accepted,
            t.rejected,
            t.delivered,
            t.acked,
            t.outstanding,
            t.duplicates,
            self.faults.len()
        )?;
        let c = &self.counts;
        writeln!(
            f,
            "violations: lost {} double_lease {} redelivered_after_ack {} early {} phantom {}",
            c.lost, c.double_lease, c.redelivered_after_ack, c.early, c.phantom
        )?;
        // the first few of each rule, so one noisy rule does not hide another
        let mut shown: Vec<(Rule, usize)> = Vec::new();
        for v in &self.violations {
            let n = match shown.iter_mut().find(|(r, _)| *r == v.rule) {
                Some((_, n)) => n,
                None => {
                    shown.push((v.rule, 0));
                    &mut shown.last_mut().expect("just pushed").1
                }
            };
            *n += 1;
            if *n <= 3 {
                writeln!(f, "  {:?} message {}: {}", v.rule, v.id, v.detail)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    fn rec() -> Recorder {
        Recorder::new(Duration::from_secs(30), Duration::from_millis(500))
    }

    fn deliver(r: &Recorder, id: MsgId, reader: u32, req: Nanos, resp: Nanos, h: &str) {
        r.delivered(Some(id), "", reader, req, resp, 0, id, h);
    }

    fn clean_cycle(r: &Recorder, id: MsgId, t: Nanos) {
        r.sent(id, t, Duration::ZERO);
        r.accepted(id, t + 1);
        deliver(r, id, 1, t + 2, t + 3, "h");
        r.settled(id, "h", t + 4, t + 5, true);
    }

    #[test]
    fn clean_history_has_no_violations() {
        let r = rec();
        for id in 0..100 {
            clean_cycle(&r, id, id * 10);
        }
        let rep = r.check();
        assert!(rep.is_clean(), "{rep}");
        assert_eq!(rep.tally.acked, 100);
        assert_eq!(rep.tally.outstanding, 0);
    }

    #[test]
    fn accepted_but_never_delivered_is_lost() {
        let r = rec();
        r.sent(1, 0, Duration::ZERO);
        r.accepted(1, 5);
        r.sent(2, 0, Duration::ZERO); // no 2xx: not owed
        let rep = r.check();
        assert_eq!(rep.counts.lost, 1, "{rep}");
        assert_eq!(rep.violations[0].id, 1);
    }

    #[test]
    fn overlapping_leases_are_caught_but_expiry_and_faults_are_not() {
        let r = rec();
        r.sent(1, 0, Duration::ZERO);
        r.accepted(1, 1);
        deliver(&r, 1, 1, 10, 20, "a");
        deliver(&r, 1, 2, 30, 40, "b"); // inside a's 30 s lease
        assert_eq!(r.check().counts.double_lease, 1);

        let r = rec();
        r.sent(1, 0, Duration::ZERO);
        deliver(&r, 1, 1, 10, 20, "a");
        deliver(&r, 1, 2, 31 * SEC, 31 * SEC + 5, "b"); // after expiry
        r.settled(1, "a", 5 * SEC, 5 * SEC + 1, false); // nacked early
        deliver(&r, 1, 3, 6 * SEC, 6 * SEC + 1, "c");
        assert_eq!(
            r.check().counts.double_lease,
            1,
            "b is answered inside c's lease"
        );

        let r = rec();
        r.sent(1, 0, Duration::ZERO);
        deliver(&r, 1, 1, 10, 20, "a");
        r.fault(FaultKind::Kill, SEC, 2 * SEC);
        deliver(&r, 1, 2, 3 * SEC, 3 * SEC + 1, "b");
        assert!(r.check().is_clean());
    }

    #[test]
    fn a_late_answer_does_not_prove_an_overlap() {
        // B was leased first but its answer arrived after its lease could have expired; A was
        // then leased legitimately and answered earlier than B
        let r = Recorder::new(Duration::from_secs(2), Duration::ZERO);
        r.sent(1, 0, Duration::ZERO);
        deliver(&r, 1, 2, 0, 5 * SEC, "b");
        deliver(&r, 1, 1, 4 * SEC, 4 * SEC + SEC / 5, "a");
        assert!(r.check().is_clean(), "{}", r.check());
        // a nack whose answer was lost may still have ended the lease
        let r = rec();
        r.sent(1, 0, Duration::ZERO);
        deliver(&r, 1, 1, 0, 10, "a");
        r.settle_unknown(1, "a", SEC);
        deliver(&r, 1, 2, 2 * SEC, 2 * SEC + 1, "b");
        assert!(r.check().is_clean());
        // and accepted-but-unacked messages are reported after a drain
        r.accepted(1, 5);
        assert_eq!(r.unacked().len(), 1);
    }

    /// A message stored twice (placed again after its owner did not answer in time, though
    /// it had written it): the copies are two records, each leased and acked on its own.
    #[test]
    fn two_copies_of_a_message_are_duplicates_not_violations() {
        let r = rec();
        r.sent(1, 0, Duration::ZERO);
        r.accepted(1, 1);
        r.delivered(Some(1), "", 1, 10, 20, 0, 7, "a");
        r.delivered(Some(1), "", 2, 15, 25, 3, 9, "b"); // the other copy, inside a's lease
        r.settled(1, "a", 30, 40, true);
        r.settled(1, "b", 41, 42, false); // b nacked
        r.delivered(Some(1), "", 1, 50, 60, 3, 9, "c"); // b's copy again after a's ack
        let rep = r.check();
        assert!(rep.is_clean(), "{rep}");
        assert_eq!(rep.tally.duplicates, 2);
        // the acked copy itself again, or twice at once, still is a violation
        r.delivered(Some(1), "", 2, 70, 80, 0, 7, "d");
        r.delivered(Some(1), "", 3, 75, 85, 0, 7, "e");
        let rep = r.check();
        assert_eq!(rep.counts.redelivered_after_ack, 2, "{rep}");
        assert_eq!(rep.counts.double_lease, 1, "{rep}");
    }

    /// A settle answered 504 `outcome_unknown` (a cluster member that did not hear back from
    /// the owner) may have been applied: a drain stops waiting for it once its lease would
    /// have come back. A 503 says not applied, so the drain waits for the message.
    #[test]
    fn a_settle_of_unknown_outcome_is_waited_for_until_its_lease_would_have_ended() {
        let r = rec();
        r.sent(1, 0, Duration::ZERO);
        r.accepted(1, 1);
        deliver(&r, 1, 1, 10, 20, "a");
        assert_eq!(r.unsettled(Duration::ZERO), 1);
        r.settle_outcome(&[(1, "a".into())], 25, Some(&[503]), true);
        assert_eq!(r.unsettled(Duration::ZERO), 1, "503: not applied");
        r.settle_outcome(&[(1, "a".into())], 30, Some(&[504]), true);
        assert_eq!(r.tally().outstanding, 1, "not known to be acked");
        assert_eq!(
            r.unsettled(Duration::from_secs(3600)),
            1,
            "may still come back"
        );
        assert_eq!(r.unsettled(Duration::ZERO), 0);
        // delivered again after it: that settle did not take, so the wait is on again
        deliver(&r, 1, 2, 40, 50, "b");
        assert_eq!(r.unsettled(Duration::ZERO), 1);
        // a definite refusal is not an unknown outcome
        r.settle_outcome(&[(1, "b".into())], 60, Some(&[410]), true);
        assert_eq!(r.unsettled(Duration::ZERO), 1);
        assert!(r.check().is_clean(), "{}", r.check());
    }

    #[test]
    fn redelivery_after_ack_needs_a_fault_covering_the_ack() {
        let r = rec();
        clean_cycle(&r, 1, 0);
        deliver(&r, 1, 2, 40 * SEC, 40 * SEC + 1, "b");
        assert_eq!(r.check().counts.redelivered_after_ack, 1);

        // ack 100 ms before a kill (within the 500 ms lag): may be forgotten
        let r = rec();
        clean_cycle(&r, 1, 10 * SEC);
        r.fault(FaultKind::Kill, 10 * SEC + 100_000_000, 12 * SEC);
        deliver(&r, 1, 2, 13 * SEC, 13 * SEC + 1, "b");
        assert!(r.check().is_clean(), "{}", r.check());

        // ack 5 s before the kill: must have been persisted
        let r = rec();
        clean_cycle(&r, 1, 10 * SEC);
        r.fault(FaultKind::Kill, 15 * SEC, 16 * SEC);
        deliver(&r, 1, 2, 17 * SEC, 17 * SEC + 1, "b");
        assert_eq!(r.check().counts.redelivered_after_ack, 1);
    }

    #[test]
    fn early_delayed_delivery_is_caught() {
        let r = rec();
        r.sent(1, 0, Duration::from_secs(2));
        r.accepted(1, 10);
        deliver(&r, 1, 1, SEC, SEC + 10, "a");
        assert_eq!(r.check().counts.early, 1);

        let r = rec();
        r.sent(1, 0, Duration::from_secs(2));
        deliver(&r, 1, 1, 2 * SEC, 2 * SEC + 10, "a");
        assert!(r.check().is_clean());
    }

    #[test]
    fn phantoms_and_compaction() {
        let r = rec();
        r.delivered(None, "garbage", 1, 0, 1, 0, 0, "h");
        r.delivered(Some(99), "m99", 1, 0, 1, 0, 0, "h");
        assert_eq!(r.check().counts.phantom, 2);

        let r = rec();
        for id in 0..10 {
            clean_cycle(&r, id, id);
        }
        assert!(r.compact(Duration::ZERO).is_empty());
        let t = r.tally();
        assert_eq!((t.sent, t.acked, t.duplicates), (10, 10, 0));
        // a compacted message coming back without a fault is still caught
        deliver(&r, 3, 2, 100 * SEC, 100 * SEC + 1, "z");
        let rep = r.check();
        assert_eq!(rep.counts.redelivered_after_ack, 1, "{rep}");
        assert_eq!(rep.tally.duplicates, 1);
    }
}
