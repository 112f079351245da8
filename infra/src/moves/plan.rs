//! The planner (on the leader): runs [`plan_moves`] (the choice, pure, in the catalog) over
//! the catalog and the live voters, proposes the moves it answers, and retires members
//! drained out of the voters once they hold nothing.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use narad_core::catalog::CatalogCommand;
pub use narad_core::catalog::plan::{PlannedMove, plan_moves};

use narad_cluster::rpc::ops::MOVE_REBALANCE;

use crate::http::error::ApiError;

use super::{Mover, PROPOSE, sleep, unavailable};

impl Mover {
    /// `POST /v1/cluster/rebalance` on the leader: one planning pass that balances whatever
    /// `cluster_auto_rebalance` says; the moves it asked for.
    pub async fn rebalance_here(&self) -> Result<Vec<PlannedMove>, ApiError> {
        if !self.node.meta.is_leader() {
            return Err(unavailable(
                "this member does not lead the cluster (any more); retry",
            ));
        }
        self.plan_pass(true).await
    }

    /// Asks the leader for a planning pass (`POST /v1/cluster/rebalance` on any member).
    pub async fn rebalance(&self) -> Result<Vec<PlannedMove>, ApiError> {
        if self.node.meta.is_leader() {
            return self.plan_pass(true).await;
        }
        let leader = self
            .node
            .meta
            .raft()
            .current_leader()
            .await
            .ok_or_else(|| unavailable("no leader elected; retry"))?;
        let reply = self
            .call_raw(leader, MOVE_REBALANCE, Vec::new())
            .await
            .map_err(unavailable)?;
        serde_json::from_slice(&reply).map_err(|e| unavailable(format!("the leader answered: {e}")))
    }

    /// One pass of the leader's planner: confirms it leads (read index), finds which voters
    /// answer, cancels moves whose target is gone or silent too long, asks for the moves
    /// [`plan_moves`] finds (balancing if `force` or `cluster_auto_rebalance`), and retires
    /// decommissioned members that hold nothing any more.
    pub(super) async fn plan_pass(&self, force: bool) -> Result<Vec<PlannedMove>, ApiError> {
        let _one = self.planning.lock().await;
        self.node
            .meta
            .read_index(PROPOSE)
            .await
            .map_err(|e| unavailable(format!("the leader could not confirm its catalog: {e}")))?;
        let view = self.node.meta.view();
        let catalog = view.catalog.clone();
        let mut voters: Vec<u64> = view.membership.membership().voter_ids().collect();
        voters.sort_unstable();
        let me = self.node.node_id();
        let mut alive = HashSet::from([me]);
        let pings = voters
            .iter()
            .filter(|&&v| v != me)
            .map(|&v| async move { (v, self.answers(v, Duration::from_secs(1)).await) });
        for (v, ok) in futures_util::future::join_all(pings).await {
            let mut down = self.down_since.lock();
            if ok {
                alive.insert(v);
                down.remove(&v);
            } else {
                down.entry(v).or_insert_with(Instant::now);
            }
        }
        // moves to a member gone, or silent too long, are cancelled
        for t in catalog.topics() {
            for (&p, m) in &t.moves {
                let silent = self
                    .down_since
                    .lock()
                    .get(&m.target)
                    .is_some_and(|s| s.elapsed() >= self.settings.dead_target_abort);
                let leaving = catalog.draining().contains(&m.target);
                if voters.contains(&m.target) && !silent && !leaving {
                    continue;
                }
                tracing::warn!(topic = %t.name, partition = p, target = m.target, "cancelling a move: its target is gone, has not answered, or is being decommissioned");
                if self
                    .broker
                    .set_move_target(&t.name, p, None, "target_lost")
                    .await
                    .is_ok()
                {
                    self.metrics.aborted.inc();
                }
            }
        }
        let catalog = self.broker.catalog();
        let budget = self
            .settings
            .max_in_flight
            .saturating_sub(catalog.topics().map(|t| t.moves.len()).sum::<usize>());
        let balance = force || self.settings.auto_rebalance;
        let plan = plan_moves(&catalog, &voters, &alive, budget, balance);
        let mut asked = Vec::new();
        for m in plan {
            match self
                .broker
                .set_move_target(&m.topic, m.partition, Some(m.to), &m.reason)
                .await
            {
                Ok(_) => {
                    tracing::info!(topic = %m.topic, partition = m.partition, from = m.from, to = m.to, reason = %m.reason, "partition move planned");
                    asked.push(m);
                }
                Err(e) => {
                    tracing::warn!(topic = %m.topic, partition = m.partition, error = %e, "could not plan a partition move");
                }
            }
        }
        self.retire_drained(&catalog, &voters).await;
        Ok(asked)
    }

    /// Members being decommissioned that own nothing and are in no move: removed from the
    /// cluster (the leader first hands its leadership on); their mark is cleared once they
    /// are out. The three-voter floor is kept.
    async fn retire_drained(&self, catalog: &narad_core::catalog::Catalog, voters: &[u64]) {
        let me = self.node.node_id();
        for &d in catalog.draining() {
            if !voters.contains(&d) {
                let _ = self
                    .store
                    .replicate(CatalogCommand::SetDraining {
                        node: d,
                        draining: false,
                    })
                    .await;
                continue;
            }
            let holds = catalog
                .topics()
                .any(|t| t.owners.contains(&d) || t.moves.values().any(|m| m.target == d));
            if holds {
                continue;
            }
            if voters.len() <= 3 {
                tracing::warn!(
                    node_id = d,
                    "member drained but not removed: the cluster keeps at least three voters (add a member)"
                );
                continue;
            }
            if d == me {
                tracing::info!(
                    node_id = d,
                    "this member is drained and leads: handing the leadership on before it is removed"
                );
                self.node.meta.hand_off(true);
                // if no one removes it (the others cannot elect), it takes part again
                let node = self.node.clone();
                tokio::spawn(async move {
                    sleep(Duration::from_secs(60)).await;
                    node.meta.hand_off(false);
                });
                return;
            }
            match self.node.meta.remove_member(d, PROPOSE).await {
                Ok(()) => {
                    tracing::info!(
                        node_id = d,
                        "decommissioned member removed from the cluster"
                    );
                }
                Err(e) => {
                    tracing::warn!(node_id = d, error = ?e, "could not remove a drained member; retrying")
                }
            }
        }
    }
}
