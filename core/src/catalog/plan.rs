//! The planner's choice, without I/O: which partitions to move for a fair placement, and
//! the fewest moves that reach it. The leader's planner (in the server) runs it over the
//! catalog and the live voters and proposes what it answers; the cluster simulation runs it
//! too.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::Catalog;
use crate::ids::{NodeId, TopicId};

/// A move the planner asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMove {
    pub topic: String,
    pub partition: u32,
    pub from: u64,
    pub to: u64,
    pub reason: String,
}

/// The moves that bring the placement closer to fair, at most `budget` of them (pure).
///
/// Receivers are the live voters not being decommissioned. First every partition owned by
/// a live member that is not a receiver (being decommissioned) goes to the receiver with
/// the fewest partitions; then, if `balance`, partitions go from the receiver with the most
/// to the one with the fewest until they differ by at most one (the fewest moves that do
/// it), each time the partition of the topic the giver holds most of and the taker least.
/// A partition in a move counts at its target already; one whose owner is down is never
/// planned (its data cannot be copied), nor is anything sent to a member that is down.
pub fn plan_moves(
    catalog: &Catalog,
    voters: &[u64],
    alive: &HashSet<u64>,
    budget: usize,
    balance: bool,
) -> Vec<PlannedMove> {
    let draining = catalog.draining();
    let mut receivers: Vec<u64> = voters
        .iter()
        .copied()
        .filter(|v| alive.contains(v) && !draining.contains(v))
        .collect();
    receivers.sort_unstable();
    receivers.dedup();
    let mut out = Vec::new();
    if receivers.is_empty() || budget == 0 {
        return out;
    }
    let mut count: BTreeMap<u64, usize> = receivers.iter().map(|&r| (r, 0)).collect();
    let mut per_topic: HashMap<(NodeId, TopicId), usize> = HashMap::new();
    // (topic name, topic id, partition, owner)
    let mut movable: Vec<(String, u64, u32, u64)> = Vec::new();
    let mut drain: Vec<(String, u64, u32, u64)> = Vec::new();
    for t in catalog.topics() {
        if t.owners.is_empty() {
            continue;
        }
        for p in 0..t.config.partitions {
            let owner = t.owners[p as usize];
            let at = t.moves.get(&p).map_or(owner, |m| m.target);
            if let Some(c) = count.get_mut(&at) {
                *c += 1;
                *per_topic.entry((NodeId(at), TopicId(t.id))).or_default() += 1;
            }
            if t.moves.contains_key(&p) || !alive.contains(&owner) {
                continue;
            }
            let entry = (t.name.clone(), t.id, p, owner);
            if count.contains_key(&owner) {
                // (an admin placed it: balancing leaves it where it is)
                if !t.pinned.contains(&p) {
                    movable.push(entry);
                }
            } else {
                drain.push(entry);
            }
        }
    }
    let take = |out: &mut Vec<PlannedMove>,
                count: &mut BTreeMap<u64, usize>,
                per_topic: &mut HashMap<(NodeId, TopicId), usize>,
                (topic, id, p, from): (String, u64, u32, u64),
                to: u64,
                reason: &str| {
        *count.get_mut(&to).expect("a receiver") += 1;
        *per_topic.entry((NodeId(to), TopicId(id))).or_default() += 1;
        if let Some(c) = count.get_mut(&from) {
            *c -= 1;
            if let Some(t) = per_topic.get_mut(&(NodeId(from), TopicId(id))) {
                *t -= 1;
            }
        }
        out.push(PlannedMove {
            topic,
            partition: p,
            from,
            to,
            reason: reason.to_owned(),
        });
    };
    for d in drain {
        if out.len() >= budget {
            return out;
        }
        let id = d.1;
        let to = *receivers
            .iter()
            .min_by_key(|&&r| {
                (
                    count[&r],
                    per_topic
                        .get(&(NodeId(r), TopicId(id)))
                        .copied()
                        .unwrap_or(0),
                    r,
                )
            })
            .expect("receivers");
        take(&mut out, &mut count, &mut per_topic, d, to, "decommission");
    }
    if !balance {
        return out;
    }
    while out.len() < budget {
        let (&most, &hi) = count
            .iter()
            .max_by_key(|&(&r, &c)| (c, std::cmp::Reverse(r)))
            .expect("receivers");
        let (&least, &lo) = count
            .iter()
            .min_by_key(|&(&r, &c)| (c, r))
            .expect("receivers");
        if hi <= lo + 1 {
            break;
        }
        let held = |node: u64, id: u64| {
            per_topic
                .get(&(NodeId(node), TopicId(id)))
                .copied()
                .unwrap_or(0) as i64
        };
        let Some(i) = movable
            .iter()
            .enumerate()
            .filter(|(_, m)| m.3 == most)
            .max_by_key(|(_, m)| (held(most, m.1) - held(least, m.1), std::cmp::Reverse(m.2)))
            .map(|(i, _)| i)
        else {
            break;
        };
        let m = movable.swap_remove(i);
        take(&mut out, &mut count, &mut per_topic, m, least, "rebalance");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, CatalogCommand, MoveTarget, TopicMeta, apply};
    use crate::topic::TopicConfig;

    fn topic(id: u64, name: &str, owners: &[u64]) -> CatalogCommand {
        CatalogCommand::CreateTopic {
            topic: TopicMeta {
                config: TopicConfig {
                    partitions: owners.len() as u32,
                    ..TopicConfig::default()
                },
                owners: owners.to_vec(),
                ..TopicMeta::new(id, name, 0, TopicConfig::default())
            },
        }
    }

    fn catalog(cmds: &[CatalogCommand]) -> Catalog {
        cmds.iter()
            .fold(Catalog::default(), |c, cmd| apply(&c, cmd).unwrap().0)
    }

    fn counts(c: &Catalog, plan: &[PlannedMove]) -> BTreeMap<u64, usize> {
        let mut n = BTreeMap::new();
        for t in c.topics() {
            for (p, &o) in t.owners.iter().enumerate() {
                let at = plan
                    .iter()
                    .find(|m| m.topic == t.name && m.partition == p as u32)
                    .map_or(o, |m| m.to);
                *n.entry(at).or_insert(0) += 1;
            }
        }
        n
    }

    /// A joiner gets a fair share with the fewest moves, every one onto it; balanced
    /// placements plan nothing; a down member is neither given nor drained; a member being
    /// decommissioned gives everything; the budget bounds a pass; moves in flight count at
    /// their target.
    #[test]
    fn the_planner_moves_the_fewest_partitions_to_a_fair_placement() {
        let c = catalog(&[
            topic(1, "a", &[1, 2, 3, 1, 2, 3]),
            topic(2, "b", &[1, 2, 3, 1, 2, 3]),
        ]);
        let all: HashSet<u64> = [1, 2, 3, 4].into();
        let plan = plan_moves(&c, &[1, 2, 3, 4], &all, 8, true);
        assert_eq!(plan.len(), 3, "{plan:?}");
        assert!(plan.iter().all(|m| m.to == 4 && m.reason == "rebalance"));
        assert!(counts(&c, &plan).values().all(|&n| n == 3));
        // spread over topics: the joiner does not get three partitions of one topic
        assert!(plan.iter().any(|m| m.topic == "a") && plan.iter().any(|m| m.topic == "b"));
        assert!(
            plan_moves(&c, &[1, 2, 3], &all, 8, true).is_empty(),
            "balanced"
        );
        assert!(
            plan_moves(&c, &[1, 2, 3, 4], &all, 8, false).is_empty(),
            "auto off"
        );
        assert_eq!(
            plan_moves(&c, &[1, 2, 3, 4], &all, 2, true).len(),
            2,
            "budget"
        );
        // member 4 down: nothing goes to it
        let up: HashSet<u64> = [1, 2, 3].into();
        assert!(plan_moves(&c, &[1, 2, 3, 4], &up, 8, true).is_empty());
        // member 3 decommissioned: its four partitions go, two to each of 1 and 2 (and
        // nothing else moves)
        let drain = apply(
            &c,
            &CatalogCommand::SetDraining {
                node: 3,
                draining: true,
            },
        )
        .unwrap()
        .0;
        let plan = plan_moves(&drain, &[1, 2, 3], &all, 8, true);
        assert_eq!(plan.len(), 4, "{plan:?}");
        assert!(
            plan.iter()
                .all(|m| m.from == 3 && m.reason == "decommission")
        );
        let n = counts(&drain, &plan);
        assert_eq!((n[&1], n[&2], n.get(&3)), (6, 6, None));
        // ... but not while member 3 is down: its data cannot be copied
        let no3: HashSet<u64> = [1, 2].into();
        assert!(plan_moves(&drain, &[1, 2, 3], &no3, 8, true).is_empty());
        // a move in flight counts at its target
        let moving = apply(
            &c,
            &CatalogCommand::SetMoveTarget {
                topic_id: 1,
                partition: 0,
                expect_owner: 1,
                expect_epoch: 0,
                target: Some(MoveTarget {
                    id: 5,
                    node: 4,
                    since_ms: 0,
                    reason: "admin".into(),
                }),
            },
        )
        .unwrap()
        .0;
        let plan = plan_moves(&moving, &[1, 2, 3, 4], &all, 8, true);
        assert_eq!(plan.len(), 2, "{plan:?}");
        assert!(
            plan.iter()
                .all(|m| m.to == 4 && !(m.topic == "a" && m.partition == 0))
        );
        // an admin's move, completed, is pinned: balancing never moves it back, and moves
        // others instead; a decommission still takes it; unpinned, it is the planner's again
        let moved = apply(
            &moving,
            &CatalogCommand::CompleteMove {
                topic_id: 1,
                partition: 0,
                move_id: 5,
                source: 1,
                target: 4,
                expect_epoch: 0,
                token: 9,
            },
        )
        .unwrap()
        .0;
        assert!(moved.get("a").unwrap().pinned.contains(&0));
        // (4 has one now, 1 one fewer: the planner evens it out with other partitions)
        let plan = plan_moves(&moved, &[1, 2, 3, 4], &all, 8, true);
        assert!(
            plan.iter().all(|m| !(m.topic == "a" && m.partition == 0)),
            "{plan:?}"
        );
        let draining4 = apply(
            &moved,
            &CatalogCommand::SetDraining {
                node: 4,
                draining: true,
            },
        )
        .unwrap()
        .0;
        assert!(
            plan_moves(&draining4, &[1, 2, 3, 4], &all, 8, true)
                .iter()
                .any(|m| m.topic == "a" && m.partition == 0 && m.reason == "decommission")
        );
        let unpinned = apply(
            &moved,
            &CatalogCommand::Unpin {
                topic_id: 1,
                partition: 0,
            },
        )
        .unwrap()
        .0;
        assert!(unpinned.get("a").unwrap().pinned.is_empty());
    }

    proptest::proptest! {
        /// Any placement of up to 6 topics over 5 members, some down, some being
        /// decommissioned: every planned move takes a partition from its live owner to a
        /// live receiver, no partition twice; with no budget to speak of, nothing is left on
        /// a member being decommissioned (that is alive), receivers end at most one apart,
        /// and balancing takes the fewest moves that do it.
        #[test]
        fn every_plan_is_valid_complete_and_minimal(
            topics in proptest::collection::vec(proptest::collection::vec(1u64..=5, 1..9), 1..6),
            down in proptest::collection::btree_set(1u64..=5, 0..3),
            draining in proptest::collection::btree_set(1u64..=5, 0..3),
        ) {
            let cmds: Vec<CatalogCommand> = topics
                .iter()
                .enumerate()
                .map(|(i, owners)| topic(i as u64 + 1, &format!("t{i}"), owners))
                .collect();
            let mut c = catalog(&cmds);
            for &node in &draining {
                c = apply(&c, &CatalogCommand::SetDraining { node, draining: true }).unwrap().0;
            }
            let voters = [1, 2, 3, 4, 5];
            let alive: HashSet<u64> = voters.iter().copied().filter(|v| !down.contains(v)).collect();
            let receivers: Vec<u64> = voters
                .iter()
                .copied()
                .filter(|v| alive.contains(v) && !draining.contains(v))
                .collect();
            let plan = plan_moves(&c, &voters, &alive, usize::MAX, true);
            let mut seen = HashSet::new();
            for m in &plan {
                let t = c.get(&m.topic).unwrap();
                proptest::prop_assert_eq!(t.owners[m.partition as usize], m.from, "{:?}", m);
                proptest::prop_assert!(alive.contains(&m.from), "from a member that is down: {:?}", m);
                proptest::prop_assert!(receivers.contains(&m.to), "to a non-receiver: {:?}", m);
                proptest::prop_assert!(seen.insert((m.topic.clone(), m.partition)), "twice: {:?}", m);
            }
            if receivers.is_empty() {
                proptest::prop_assert!(plan.is_empty());
                return Ok(());
            }
            let after = counts(&c, &plan);
            for (&node, &n) in &after {
                proptest::prop_assert!(
                    !(draining.contains(&node) && alive.contains(&node)) || n == 0,
                    "{} left on {}, being decommissioned: {:?}", n, node, plan
                );
            }
            let of = |r: &u64| after.get(r).copied().unwrap_or(0);
            let hi = receivers.iter().map(of).max().unwrap();
            let lo = receivers.iter().map(of).min().unwrap();
            proptest::prop_assert!(hi <= lo + 1, "receivers {}..{} apart: {:?}", lo, hi, after);
            // balancing alone (the decommission moves aside): the fewest moves, given where
            // the decommission moves put their partitions
            let drained = plan.iter().filter(|m| m.reason == "decommission").count();
            let mut before: Vec<usize> = receivers.iter().map(|r| {
                of(r) + plan.iter().filter(|m| m.reason == "rebalance" && m.from == *r).count()
                    - plan.iter().filter(|m| m.reason == "rebalance" && m.to == *r).count()
            }).collect();
            before.sort_unstable();
            let total: usize = before.iter().sum();
            let (q, r) = (total / receivers.len(), total % receivers.len());
            let over: usize = before.iter().map(|&n| n.saturating_sub(q)).sum();
            let givers = before.iter().filter(|&&n| n > q).count();
            let fewest = over - r.min(givers);
            proptest::prop_assert_eq!(plan.len() - drained, fewest, "{:?}", plan);
        }
    }
}
