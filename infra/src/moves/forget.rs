//! A member lost for good: `forget` reassigns its partitions and has them rebuilt from the
//! archive, once every live member agrees it is gone; the witness reports which partitions'
//! durable ends each member holds, so a rebuild never names less than was acknowledged.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_core::catalog::TopicMeta;
use narad_core::ids::PartitionId;
use narad_wire::ErrorCode;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use narad_cluster::rpc::ops::{SEEN_ENDS, WITNESS};

use crate::http::error::ApiError;

use super::{Mover, PROBE_WITHIN, PROPOSE, sleep, unavailable};

/// How often an owner reports the ends that changed; every [`FULL_WITNESS_EVERY`]th report
/// carries them all (for members that restarted and forgot them).
const WITNESS_EVERY: Duration = Duration::from_millis(500);
/// How often what owners told this member is written to its disk (when it changed).
const PERSIST_ENDS_EVERY: Duration = Duration::from_millis(100);

/// Aborts the task when dropped (the witness loop's persister ends with it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

const FULL_WITNESS_EVERY: u64 = 20;
/// Most partitions one [`SEEN_ENDS`] call asks about.
pub(super) const MAX_SEEN_ASK: usize = 65_536;

/// A partition of a forgotten member, reassigned and rebuilt from the archive.
#[derive(Debug, Clone, Serialize)]
pub struct Forgotten {
    pub topic: String,
    pub partition: u32,
    pub to: u64,
    /// Offsets below this are in the archive (replayable on the new owner); the new owner's
    /// log starts here.
    pub archived_below: u64,
    /// `lost_from..lost_to`: acknowledged records no live member's copy or the archive
    /// holds (at least these: a record only the lost member saw acknowledged is not known).
    pub lost_from: u64,
    pub lost_to: u64,
    pub lost_at_least: u64,
    /// The archived records from this offset on (to `archived_below`) are delivered to the
    /// partition's queue consumers again once it is rebuilt: its lost owner's consumers had
    /// acked everything below it when the archive last heard from it (absent: nothing
    /// archived). Records older than local retention are not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redeliver_from: Option<u64>,
}

impl Mover {
    /// `POST /v1/cluster/members/{id}/forget`: member `id` is lost for good (its disk with
    /// it). Every partition it owns is reassigned to the live member with the fewest
    /// partitions, which rebuilds it from the archive: the archived records are served again
    /// (replay, through any member), the log goes on from the archive's end, and what the
    /// archive did not hold is reported lost (log, metric, this answer). Refused while `id`
    /// answers (decommission it instead) and without an archive.
    pub async fn forget(&self, id: u64) -> Result<Vec<Forgotten>, ApiError> {
        let archive = self.archive.clone().ok_or_else(|| {
            ApiError::new(
                ErrorCode::MemberNotRemovable,
                "forgetting a member rebuilds its partitions from the archive, and this cluster has no archive_url: its partitions' data is gone with it",
            )
        })?;
        if id == self.node.node_id() {
            return Err(ApiError::new(
                ErrorCode::MemberNotRemovable,
                "this member answers the request: it is not lost (decommission it instead)",
            ));
        }
        let members: Vec<u64> = self
            .node
            .meta
            .view()
            .membership
            .membership()
            .nodes()
            .map(|(n, _)| *n)
            .collect();
        if let Err(why) = self.lost(id, &members).await {
            return Err(ApiError::new(
                ErrorCode::MemberNotRemovable,
                format!(
                    "{why}: it is not lost; decommission it instead (its data moves, nothing is lost)"
                ),
            ));
        }
        self.node
            .meta
            .read_index(PROPOSE)
            .await
            .map_err(|e| unavailable(format!("the catalog could not be confirmed current: {e}")))?;
        let view = self.node.meta.view();
        let catalog = view.catalog.clone();
        let owned: Vec<(Arc<TopicMeta>, u32)> = catalog
            .topics()
            .flat_map(|t| {
                (0..t.config.partitions)
                    .filter(|&p| t.owner_of(p) == Some(id))
                    .map(move |p| (t.clone(), p))
            })
            .collect();
        if owned.is_empty() {
            if !view.membership.membership().nodes().any(|(n, _)| *n == id) {
                return Err(ApiError::new(
                    ErrorCode::MemberNotFound,
                    format!("node {id} is not a member and owns no partition"),
                ));
            }
            return Ok(Vec::new());
        }
        // receivers: live voters, not leaving, not the lost one
        let mut voters: Vec<u64> = view.membership.membership().voter_ids().collect();
        voters.sort_unstable();
        let me = self.node.node_id();
        let mut count: BTreeMap<u64, usize> = BTreeMap::new();
        for v in voters
            .into_iter()
            .filter(|v| *v != id && !catalog.draining().contains(v))
        {
            let live = v == me || self.answers(v, Duration::from_secs(1)).await;
            if live {
                let n = catalog
                    .topics()
                    .map(|t| t.owners.iter().filter(|o| **o == v).count())
                    .sum();
                count.insert(v, n);
            }
        }
        if count.is_empty() {
            return Err(unavailable("no live member could take the partitions"));
        }
        let seen = self.seen_ends(&count, &owned).await;
        let mut plan = Vec::with_capacity(owned.len());
        for ((t, p), seen_end) in owned.iter().zip(seen) {
            let (start, redeliver_from) = match archive.archive().load_manifest(&t.name, *p).await {
                Ok(Some(m)) if m.topic_id == t.id => {
                    super::steps::rebuild_start(m.next_offset, m.start_offset, m.queue_frontier)
                }
                Ok(_) => (0, None),
                Err(e) => {
                    return Err(ApiError::new(
                        ErrorCode::ArchiveUnavailable,
                        format!(
                            "the archive's manifest of partition {p} of '{}' could not be read: {e}; nothing after it was reassigned",
                            t.name
                        ),
                    ));
                }
            };
            plan.push((t, *p, seen_end, start, redeliver_from));
        }
        // the watch above took seconds, the plan more: a member that came back meanwhile
        // (a restart, a freeze that ended) is not lost, and this is the last moment to say so
        if self.answers_fresh(id, PROBE_WITHIN).await {
            return Err(ApiError::new(
                ErrorCode::MemberNotRemovable,
                format!(
                    "node {id} answers this member again: it is not lost; decommission it instead (its data moves, nothing is lost)"
                ),
            ));
        }
        let mut out = Vec::new();
        for (t, p, seen_end, start, redeliver_from) in plan {
            let p = &p;
            let to = super::steps::least_loaded(&mut count).expect("receivers");
            let epoch = t.owner_epoch(*p);
            let (seen_end, lost) = super::steps::lost_span(start, seen_end);
            let tail = narad_core::catalog::moves::LostTail {
                epoch: epoch + 1,
                lost_node: id,
                start,
                seen_end,
                at_ms: self.broker.now_ms(),
            };
            self.broker
                .reassign_lost(t.id, *p, id, to, epoch, tail.clone())
                .await?;
            self.metrics.lost_records.inc_by(lost);
            tracing::error!(topic = %t.name, partition = p, lost_node = id, to, archived_below = start, lost_from = start, lost_to = tail.seen_end, lost_at_least = lost, "partition of a forgotten member rebuilt from the archive; records it held that the archive did not are lost");
            out.push(Forgotten {
                topic: t.name.clone(),
                partition: *p,
                to,
                archived_below: start,
                lost_from: start,
                lost_to: tail.seen_end,
                lost_at_least: lost,
                redeliver_from,
            });
        }
        Ok(out)
    }

    /// Until `stop`, every [`WITNESS_EVERY`]: checks the partitions held since this member's
    /// start ([`Mover::verify_held`]), then reports the durable ends of the partitions it owns
    /// to every other voter (those that changed; all of them every [`FULL_WITNESS_EVERY`]th
    /// time), which keep the highest: what an owner restored from an older copy of its data
    /// directory is checked against. A report is one small call per voter; one lost is
    /// repeated by the next full report.
    pub async fn witness(self: Arc<Self>, stop: CancellationToken) {
        let mut sent: HashMap<PartitionId, u64> = HashMap::new();
        let mut round: u64 = 0;
        // what owners told this member goes to its disk on a clock of its own: a round here
        // can take seconds when a voter is frozen (its report waits out the call), and a
        // witness that stopped meanwhile must not have held its last ends in memory only
        let persister = {
            let (ingress, stop) = (self.ingress.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    if let Some(i) = ingress.upgrade() {
                        i.persist_ends().await;
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = sleep(PERSIST_ENDS_EVERY) => {}
                    }
                }
            })
        };
        let _persister = AbortOnDrop(persister);
        loop {
            self.verify_held().await;
            let full = round.is_multiple_of(FULL_WITNESS_EVERY);
            round += 1;
            let ends = self.broker.owned_ends();
            let changed: Vec<(u64, u32, u64)> = ends
                .iter()
                .copied()
                .filter(|&(t, p, e)| full || sent.get(&PartitionId::new(t, p)) != Some(&e))
                .collect();
            sent = ends
                .iter()
                .map(|&(t, p, e)| (PartitionId::new(t, p), e))
                .collect();
            if let Some(i) = self.ingress.upgrade() {
                // (not before the start's check confirmed the catalog current: a catalog
                // still catching up lacks topics whose remembered ends must stay)
                if full && !self.broker.verifying() {
                    let live = self.broker.catalog().topics().map(|t| t.id).collect();
                    i.prune_seen(&live);
                }
            }
            // (sent even when nothing changed: a witness that stopped answering is found
            // while the owner is idle too)
            let voters = self.node.other_voters();
            let mut failed = HashSet::new();
            for chunk in changed.chunks(MAX_SEEN_ASK.min(crate::witness::MAX_ENDS)) {
                let body = Bytes::from(serde_json::to_vec(chunk).expect("serialises"));
                failed.extend(self.report(&voters, body).await);
            }
            if changed.is_empty() {
                failed.extend(self.report(&voters, Bytes::from_static(b"[]")).await);
            }
            if let Some(i) = self.ingress.upgrade() {
                i.witnesses()
                    .maintain(&failed, || self.broker.owned_ends())
                    .await;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = sleep(WITNESS_EVERY) => {}
            }
        }
    }

    /// Sends one report (`body`) to each of `voters`; returns those that did not take it.
    async fn report(&self, voters: &[u64], body: Bytes) -> Vec<u64> {
        let calls = voters.iter().map(|&v| {
            let addr = self.node.meta.addr_of(v);
            let rpc = self.node.meta.rpc().clone();
            let body = body.clone();
            async move {
                let Some(addr) = addr else {
                    return Some(v);
                };
                let ok = rpc
                    .call(v, &addr, WITNESS, body, WITNESS_EVERY * 2)
                    .await
                    .is_ok();
                (!ok).then_some(v)
            }
        });
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The partitions held since this member's start: once the catalog is confirmed
    /// current, each one this member owns is compared with what the other voters (a
    /// majority of the voters with this one) saw acknowledged or were told by its owner, and
    /// with the archive's end. One whose log reaches that is served; one that ends below it
    /// (the data directory is an older copy) goes on after it with the range between
    /// recorded as a gap, logged and counted in `narad_partition_records_lost_total`.
    /// Partitions owned elsewhere are let go (nothing here serves them).
    async fn verify_held(&self) {
        // (a partition opened while the start's check ended may still be held: looked at
        // every time, not only while the check runs)
        let witnesses = self.ingress.upgrade().map(|i| i.witnesses().clone());
        if !self.broker.verifying() && self.broker.unverified().is_empty() {
            if let Some(w) = &witnesses {
                w.set_checking(false);
            }
            return;
        }
        // (no witness is dropped while the check may need what it holds)
        if let Some(w) = &witnesses {
            w.set_checking(true);
        }
        let not_yet = |why: String| {
            *self.unverified.lock() = Some(why);
        };
        if let Err(e) = self.node.meta.read_index(Duration::from_secs(2)).await {
            return not_yet(format!(
                "checking this member's partitions against what the cluster acknowledged: the catalog could not be confirmed current: {e}"
            ));
        }
        let view = self.node.meta.view();
        if !self
            .broker
            .catch_up(view.catalog.applied(), Duration::from_secs(2))
            .await
        {
            return not_yet(
                "checking this member's partitions against what the cluster acknowledged: following the catalog".into(),
            );
        }
        let me = self.node.node_id();
        let mut owned = Vec::new();
        for (meta, p, end) in self.broker.unverified() {
            if meta.owner_of(p) == Some(me) {
                owned.push((meta, p, end));
            } else {
                self.broker.set_verified(&meta.name, meta.id, p);
            }
        }
        if !owned.is_empty() {
            let voters: Vec<u64> = view.membership.membership().voter_ids().collect();
            let ask: Vec<(u64, u32)> = owned.iter().map(|(t, p, _)| (t.id, *p)).collect();
            let mut acked: Vec<u64> = match self.ingress.upgrade() {
                Some(i) => ask.iter().map(|&(t, p)| i.seen_end(t, p)).collect(),
                None => vec![0; ask.len()],
            };
            // the other voters that answered every chunk
            let others: Vec<u64> = voters.iter().copied().filter(|&v| v != me).collect();
            let mut answered_all: HashSet<u64> = others.iter().copied().collect();
            for chunk_start in (0..ask.len()).step_by(MAX_SEEN_ASK) {
                let chunk = &ask[chunk_start..(chunk_start + MAX_SEEN_ASK).min(ask.len())];
                let body = serde_json::to_vec(chunk).expect("serialises");
                let asks = others.iter().map(|&v| {
                    let body = body.clone();
                    async move { (v, self.call::<Vec<u64>>(v, SEEN_ENDS, body).await) }
                });
                for (v, r) in futures_util::future::join_all(asks).await {
                    match r {
                        Ok(theirs) if theirs.len() == chunk.len() => {
                            for (e, t) in acked[chunk_start..].iter_mut().zip(theirs) {
                                *e = (*e).max(t);
                            }
                        }
                        _ => {
                            answered_all.remove(&v);
                        }
                    }
                }
            }
            let answered = usize::from(voters.contains(&me)) + answered_all.len();
            if answered < voters.len() / 2 + 1 {
                return not_yet(format!(
                    "checking this member's partitions against what the cluster acknowledged: {answered} of {} voters answered, a majority is needed",
                    voters.len()
                ));
            }
            // every end this member acknowledged is held by each of its witnesses: one that
            // did not answer may be the only one that knows the last of them
            let silent: Vec<u64> = view
                .catalog
                .in_sync(me)
                .into_iter()
                .filter(|v| voters.contains(v) && !answered_all.contains(v))
                .collect();
            if !silent.is_empty() {
                return not_yet(format!(
                    "checking this member's partitions against what the cluster acknowledged: waiting for members {silent:?}, which hold the ends this member acknowledged last, to answer"
                ));
            }
            for ((meta, p, local_end), acked) in owned.iter().zip(acked) {
                let mut acked = acked;
                if let Some(a) = &self.archive {
                    match a.archive().load_manifest(&meta.name, *p).await {
                        Ok(Some(m)) if m.topic_id == meta.id => acked = acked.max(m.next_offset),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(topic = %meta.name, partition = p, error = %e, "the archive's manifest could not be read to check the partition against: checked against the members alone");
                        }
                    }
                }
                if acked <= *local_end {
                    self.broker.set_verified(&meta.name, meta.id, *p);
                    continue;
                }
                match self
                    .broker
                    .reopen_after(&meta.name, meta.id, *p, acked)
                    .await
                {
                    Ok(Some((from, to))) => {
                        let lost = to - from;
                        self.metrics.lost_records.inc_by(lost);
                        tracing::error!(topic = %meta.name, partition = p, lost_from = from, lost_to = to, lost_at_least = lost, "this member's log of the partition ended below what the cluster saw acknowledged (its data directory is an older copy): it goes on after the acknowledged end, and the records between are lost here");
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(topic = %meta.name, partition = p, local_end, acked_end = acked, error = %e, "could not reopen a partition after its acknowledged end; it is not served here, retrying");
                        return not_yet(format!(
                            "partition {p} of '{}' ends at {local_end}, below the acknowledged {acked}, and could not be reopened after it: {e}",
                            meta.name
                        ));
                    }
                }
            }
        }
        if self.broker.unverified().is_empty() {
            self.broker.end_verifying();
            *self.unverified.lock() = None;
            if let Some(w) = &witnesses {
                w.set_checking(false);
            }
        }
    }

    /// For each partition: one past the highest offset any live member saw acknowledged.
    async fn seen_ends(
        &self,
        live: &BTreeMap<u64, usize>,
        owned: &[(Arc<TopicMeta>, u32)],
    ) -> Vec<u64> {
        let ask: Vec<(u64, u32)> = owned.iter().map(|(t, p)| (t.id, *p)).collect();
        let body = serde_json::to_vec(&ask).expect("serialises");
        let me = self.node.node_id();
        let mut ends: Vec<u64> = match self.ingress.upgrade() {
            Some(i) => ask.iter().map(|&(t, p)| i.seen_end(t, p)).collect(),
            None => vec![0; ask.len()],
        };
        for &n in live.keys().filter(|&&n| n != me) {
            if let Ok(b) = self.call_raw(n, SEEN_ENDS, body.clone()).await
                && let Ok(theirs) = serde_json::from_slice::<Vec<u64>>(&b)
                && theirs.len() == ends.len()
            {
                for (e, t) in ends.iter_mut().zip(theirs) {
                    *e = (*e).max(t);
                }
            }
        }
        ends
    }
}
