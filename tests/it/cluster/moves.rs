//! Partition moves and members lost for good: moves under traffic, kills mid-copy, lapsed
//! freezes, cancels, flips outliving their leader, cut links, forget and rebuild.

use super::*;

/// Partitions move between members while producers and consumers go through all three:
/// each move copies the partition while it serves, freezes it for the tail, and flips its
/// owner; one moves back to the member it left (whose handles from before are stale). No
/// produce is refused, nothing acknowledged is lost, no message is leased to two readers at
/// once (leases the old owner handed out are held by the new one until they would end), and
/// the lifecycle checker finds the history clean with no fault window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_members_under_traffic_and_lose_nothing() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(root.path(), &[]).await;
    let traffic = Traffic::flowing(&nodes).await;
    let (before, _) = owners_and_moves(&nodes[0]).await;
    assert_eq!(before.len(), 6, "{before:?}");
    let next = |id: u64| id % 3 + 1;
    let plan = [
        (0u32, next(before[0])),
        (1, next(before[1])),
        (0, before[0]),
    ];
    for (i, &(p, to)) in plan.iter().enumerate() {
        let via = &nodes[i % 3];
        let (st, body) = via
            .call(
                ("x", "y"),
                Method::POST,
                "/v1/cluster/moves",
                Some(serde_json::json!({"topic": "c", "partition": p, "to": to})),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["to"], to, "{body}");
        let took = until(&format!("partition {p} on node {to}"), 90, async || {
            for n in &nodes {
                let (owners, moves) = owners_and_moves(n).await;
                if owners.get(p as usize) != Some(&to) || moves != 0 {
                    return false;
                }
            }
            true
        })
        .await;
        println!("partition {p} moved to node {to} in {took:?}");
        traffic
            .more(&format!("traffic after moving partition {p}"), 200)
            .await;
    }
    // a partition an admin moved stays where it went: pinned, left alone by a planning pass
    // (which balances with the others), until unpinned
    let pinned = async || -> Vec<u64> {
        let (_, m) = nodes[2]
            .call(("x", "y"), Method::GET, "/v1/cluster/moves", None)
            .await;
        let mut p: Vec<u64> = m["pinned"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["topic"] == "c")
            .filter_map(|p| p["partition"].as_u64())
            .collect();
        p.sort_unstable();
        p
    };
    assert_eq!(pinned().await, vec![0, 1]);
    let (st, plan) = nodes[1]
        .call(("x", "y"), Method::POST, "/v1/cluster/rebalance", None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{plan}");
    assert!(
        plan["moves"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["topic"] != "c" || m["partition"].as_u64().unwrap() > 1),
        "{plan}"
    );
    until("the planner's moves done", 90, async || {
        owners_and_moves(&nodes[0]).await.1 == 0
    })
    .await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    assert_eq!((owners[0], owners[1]), (before[0], next(before[1])));
    let unpin = async || {
        nodes[0]
            .call(
                ("x", "y"),
                Method::DELETE,
                "/v1/cluster/moves/c/0/pin",
                None,
            )
            .await
            .0
    };
    assert_eq!(unpin().await, StatusCode::NO_CONTENT);
    assert_eq!(unpin().await, StatusCode::NOT_FOUND);
    until("unpinned everywhere", 30, async || {
        pinned().await == vec![1]
    })
    .await;
    // a move to where the partition is, or to a stranger, is refused
    let (st, body) = nodes[0]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/moves",
            Some(serde_json::json!({"topic": "c", "partition": 0, "to": before[0]})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    let (st, body) = nodes[0]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/moves",
            Some(serde_json::json!({"topic": "c", "partition": 0, "to": 9})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.tally.rejected, 0, "{:?}", report.tally);
    // every member, SIGKILLed, starts again: the WAL names nothing in a partition directory
    // whose content a move replaced (its replay would write old frames into the new copy)
    let mut nodes = nodes;
    for n in nodes.iter_mut() {
        n.kill9();
        n.start().await;
        let n = &*n;
        until(
            &format!("node {} back; log:\n{}", n.id, n.log()),
            60,
            async || n.ready().await,
        )
        .await;
    }
    // the member partition 1 left holds none of its data any more
    let left = before[1];
    let n = nodes.iter().find(|n| n.id == left).unwrap();
    let topic_dir = std::fs::read_dir(n.dir.join("topics"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("c."))
        .unwrap()
        .path();
    let logs: u64 = std::fs::read_dir(topic_dir.join("p00001"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(logs, 0, "node {left} still holds partition 1's records");
}

/// Rebalance 3 → 4 and decommission under traffic: producers and consumers go through the
/// three first members; a fourth joins and gets its share of the partitions (counts within
/// ±1), then it is decommissioned: its partitions move back, it leaves the cluster, and the
/// three keep the lot. No produce is refused, nothing acknowledged is lost, no message is
/// leased twice, and the lifecycle checker finds the history clean with no fault window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_gets_its_share_and_a_decommissioned_member_drains_under_traffic() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "d", "partitions": 6})).await;
    let traffic = Traffic::flowing(&nodes).await;
    let mut fourth = Node::new(4, root.path(), &nodes[0].members, SECRET);
    fourth.start().await;
    until(
        &format!("the joiner ready; log:\n{}", fourth.log()),
        90,
        async || fourth.ready().await,
    )
    .await;
    let balanced = async |want: usize| {
        let counts = partition_counts(&nodes[0]).await;
        let voters: Vec<u64> = counts.iter().map(|c| c.1).collect();
        let (_, m) = nodes[0]
            .call(("x", "y"), Method::GET, "/v1/cluster/moves", None)
            .await;
        counts.len() == want
            && counts.iter().map(|c| c.1).sum::<u64>() == 12
            && voters.iter().max().unwrap() - voters.iter().min().unwrap() <= 1
            && m["moves"].as_array().is_some_and(Vec::is_empty)
    };
    let took = until("12 partitions spread over 4 members", 120, async || {
        balanced(4).await
    })
    .await;
    println!(
        "rebalanced onto the joiner in {took:?}: {:?}",
        partition_counts(&nodes[0]).await
    );
    assert!(
        partition_counts(&nodes[0])
            .await
            .iter()
            .any(|&(id, n)| id == 4 && n == 3),
        "{:?}",
        partition_counts(&nodes[0]).await
    );
    traffic.more("traffic after the rebalance", 200).await;
    // three voters are kept: a member of three cannot be decommissioned once node 4 left
    let (st, body) = nodes[1]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/members/4/decommission",
            None,
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["partitions_to_move"], 3, "{body}");
    let took = until("node 4 drained and removed", 120, async || {
        let counts = partition_counts(&nodes[0]).await;
        counts.len() == 3 && !counts.iter().any(|c| c.0 == 4) && balanced(3).await
    })
    .await;
    println!("node 4 decommissioned in {took:?}");
    traffic.more("traffic after the decommission", 200).await;
    let (st, body) = nodes[1]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/members/3/decommission",
            None,
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.tally.rejected, 0, "{:?}", report.tally);
    drop(fourth);
}

/// The phase and bytes copied of the move of partition `p` of `c`, as `n` reports it.
async fn move_phase(n: &Node, p: u32) -> Option<(String, u64)> {
    let (_, m) = n
        .call(("x", "y"), reqwest::Method::GET, "/v1/cluster/moves", None)
        .await;
    m["moves"].as_array()?.iter().find_map(|m| {
        (m["topic"] == "c" && m["partition"] == p).then(|| {
            (
                m["phase"].as_str().unwrap_or("waiting").to_owned(),
                m["bytes_copied"].as_u64().unwrap_or(0),
            )
        })
    })
}

/// A move whose source, and then whose target, is killed (SIGKILL) in the middle of the
/// copy: the copy starts again once each is back, and the move completes. The copy is paced
/// slow (`move_max_bytes_per_sec`) so that it is caught in the act. The lifecycle checker
/// finds the history clean (the kills are fault windows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_survives_its_source_and_its_target_killed_mid_copy() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes =
        three_ready_with(root.path(), &[("NARAD_MOVE_MAX_BYTES_PER_SEC", "8192")]).await;
    let traffic = Traffic::flowing(&nodes).await;
    // (enough that the paced copy of one partition takes several seconds)
    traffic.more("data to copy", 6000).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 0u32;
    let (source, target) = (owners[0], owners[0] % 3 + 1);
    // (members 1, 2, 3 at indices 0, 1, 2)
    let idx = |id: u64| (id - 1) as usize;
    let other = nodes
        .iter()
        .find(|n| n.id != source && n.id != target)
        .unwrap()
        .id;
    start_move(&nodes[idx(other)], p, target).await;
    for victim in [source, target] {
        let watcher = idx(other);
        until(
            &format!("the move copying before node {victim} is killed"),
            60,
            async || {
                move_phase(&nodes[watcher], p)
                    .await
                    .is_some_and(|(phase, bytes)| phase == "catch_up" && bytes > 0)
            },
        )
        .await;
        let i = idx(victim);
        let start = traffic.rec.now();
        nodes[i].kill9();
        traffic
            .more(&format!("traffic without node {victim}"), 100)
            .await;
        let (_, m) = nodes[watcher]
            .call(("x", "y"), reqwest::Method::GET, "/v1/cluster/moves", None)
            .await;
        assert_eq!(
            m["moves"].as_array().map(Vec::len),
            Some(1),
            "the move is still in flight: {m}"
        );
        nodes[i].start().await;
        traffic.moved(i, &nodes[i]);
        let n = &nodes[i];
        until(&format!("node {victim} ready again"), 60, async || {
            n.ready().await
        })
        .await;
        traffic.rec.fault(FaultKind::Kill, start, traffic.rec.now());
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let took = moved(&all, p, target, 120).await;
    println!("the move completed {took:?} after the second restart");
    traffic.more("traffic after the move", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A destination too slow for the freeze (it stalls once the source froze, longer than the
/// freeze's term): the source's freeze lapses, the source records the thaw through the
/// cluster and serves again (a flip naming that freeze can no longer commit), and the
/// destination's next attempt freezes anew and completes. No produce is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_that_lapses_thaws_through_the_cluster_and_the_move_tries_again() {
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(
        root.path(),
        &[
            ("NARAD_MOVE_FREEZE_TTL_MS", "1000"),
            ("NARAD_FAILPOINTS", "move.stall_frozen=4000"),
        ],
    )
    .await;
    let traffic = Traffic::flowing(&nodes).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 1u32;
    let (source, target) = (owners[1], owners[1] % 3 + 1);
    let src = nodes.iter().find(|n| n.id == source).unwrap();
    start_move(&nodes[0], p, target).await;
    until("the source thawed a lapsed freeze", 60, async || {
        src.metrics()
            .await
            .lines()
            .any(|l| l.starts_with("narad_move_thaws_total ") && !l.ends_with(" 0"))
    })
    .await;
    let all: Vec<&Node> = nodes.iter().collect();
    moved(&all, p, target, 60).await;
    traffic.more("traffic after the move", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.tally.rejected, 0, "{:?}", report.tally);
}

/// A move cancelled just as it asks its source to freeze, and at once replaced by a move of
/// the same partition to another member: the late freeze is refused (its move is not in
/// flight), and a freeze taken for a move no longer in flight is thawed through the cluster
/// at once, so the new move completes instead of waiting out the freeze's whole term (found
/// by a move/cancel storm: 30 s with every lease and produce of the partition held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_replacing_a_cancelled_one_is_not_held_by_its_freeze() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(
        root.path(),
        &[
            ("NARAD_MOVE_FREEZE_TTL_MS", "60000"),
            ("NARAD_FAILPOINTS", "move.stall_before_freeze=1500"),
        ],
    )
    .await;
    topic_everywhere(&nodes, serde_json::json!({"name": "c", "partitions": 3})).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 2u32;
    let source = owners[p as usize];
    let (first, second) = (source % 3 + 1, (source + 1) % 3 + 1);
    let target = nodes.iter().find(|n| n.id == first).unwrap();
    start_move(&nodes[0], p, first).await;
    until(
        "the first move about to freeze its source",
        60,
        async || {
            move_phase(target, p)
                .await
                .is_some_and(|(phase, _)| phase == "freeze")
        },
    )
    .await;
    // cancelled, then replaced, while its freeze request waits to go out
    let (st, body) = nodes[0]
        .call(
            ("x", "y"),
            Method::DELETE,
            &format!("/v1/cluster/moves/c/{p}"),
            None,
        )
        .await;
    assert!(st.is_success(), "{st} {body}");
    start_move(&nodes[0], p, second).await;
    let all: Vec<&Node> = nodes.iter().collect();
    // well inside the 60 s freeze term (the new move's own first attempt stalls 1.5 s)
    let took = moved(&all, p, second, 30).await;
    println!("the replacing move completed {took:?} after the cancel");
}

/// A move cancelled in the middle of its (paced) copy stops copying at once: the
/// destination reads no more of the partition for it, and a later move of the same
/// partition to the same member copies the partition once (its progress is its own, not
/// the cancelled move's bytes added to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_move_stops_copying() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(root.path(), &[("NARAD_MOVE_MAX_BYTES_PER_SEC", "16384")]).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "c", "partitions": 3})).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 1u32;
    let source = owners[p as usize];
    let to = source % 3 + 1;
    let target = nodes.iter().find(|n| n.id == to).unwrap();
    // ~240 KB in the partition: ~15 s of paced copy
    let big = "x".repeat(16 << 10);
    for _ in 0..15 {
        let (st, body) = nodes[0]
            .call(
                ("x", "y"),
                Method::POST,
                &format!("/v1/topics/c/produce?partition={p}"),
                Some(serde_json::json!(big)),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    }
    let copied = async || {
        let m = target.metrics().await;
        let v = m
            .lines()
            .find_map(|l| l.strip_prefix("narad_move_bytes_copied_total "))
            .map(|v| v.trim().parse::<f64>().unwrap() as u64);
        v.expect("the destination counts bytes copied")
    };
    let in_flight = async || {
        let m = target.metrics().await;
        m.lines()
            .find_map(|l| l.strip_prefix("narad_moves_in_flight "))
            .map(|v| v.trim().parse::<f64>().unwrap() as u64)
            .unwrap_or(0)
    };
    start_move(&nodes[0], p, to).await;
    until("the copy under way", 60, async || {
        move_phase(target, p)
            .await
            .is_some_and(|(phase, bytes)| phase == "catch_up" && bytes > 0)
    })
    .await;
    let (st, body) = nodes[0]
        .call(
            ("x", "y"),
            Method::DELETE,
            &format!("/v1/cluster/moves/c/{p}"),
            None,
        )
        .await;
    assert!(st.is_success(), "{st} {body}");
    let at_cancel = copied().await;
    until("the cancelled move wound down", 60, async || {
        in_flight().await == 0
    })
    .await;
    let after = copied().await - at_cancel;
    // (a chunk being read as the cancel landed may still arrive: one 16 KiB chunk, paced)
    assert!(
        after <= 2 * (16 << 10),
        "the cancelled move copied {after} bytes after its cancel"
    );
    let before = copied().await;
    start_move(&nodes[0], p, to).await;
    let all: Vec<&Node> = nodes.iter().collect();
    moved(&all, p, to, 120).await;
    let second = copied().await - before;
    assert!(
        second <= 15 * (16 << 10) + (64 << 10),
        "the second move copied {second} bytes of a ~240 KB partition"
    );
}

/// Ambiguous flips and stale owners: a move stalls right before its flip while the Raft
/// leader is killed, and the flip's answer is lost (fault injection): the destination
/// settles the outcome by asking the next leader (read index, then the catalog); and
/// another while its source is killed; that move completes without it, and the old owner,
/// back with its frozen copy, gives the partition up: it serves it no more and its copy is
/// gone. The lifecycle checker finds the history clean (the kills are fault windows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flip_outlives_its_leader_and_a_stale_source_gives_its_copy_up() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready_with(
        root.path(),
        &[(
            "NARAD_FAILPOINTS",
            "move.stall_flip=3000;move.lose_flip_reply",
        )],
    )
    .await;
    let traffic = Traffic::flowing(&nodes).await;
    let idx = |nodes: &[Node], id: u64| nodes.iter().position(|n| n.id == id).unwrap();
    // 1. the leader killed while a move it does not take part in waits to flip
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = (0..6u32).find(|&p| owners[p as usize] != leader).unwrap();
    let source = owners[p as usize];
    let target = [1, 2, 3]
        .into_iter()
        .find(|&t| t != leader && t != source)
        .unwrap();
    start_move(&nodes[idx(&nodes, target)], p, target).await;
    let watcher = idx(&nodes, target);
    until("the first move stalled before its flip", 60, async || {
        move_phase(&nodes[watcher], p)
            .await
            .is_some_and(|(phase, _)| phase == "stalled")
    })
    .await;
    let li = idx(&nodes, leader);
    let start = traffic.rec.now();
    nodes[li].kill9();
    let live: Vec<&Node> = nodes.iter().filter(|n| n.id != leader).collect();
    let took = moved(&live, p, target, 60).await;
    println!("flipped {took:?} after the leader's kill");
    // the flip's answer was lost: the target settled it by asking the cluster
    let t = &nodes[(target - 1) as usize];
    until("the target resolved the flip", 10, async || {
        t.log().contains("the flip's answer is treated as lost")
            && t.log().contains("partition moved here")
    })
    .await;
    nodes[li].start().await;
    traffic.moved(li, &nodes[li]);
    let n = &nodes[li];
    until("the old leader ready again", 60, async || n.ready().await).await;
    traffic.rec.fault(FaultKind::Kill, start, traffic.rec.now());
    traffic.more("traffic after the first move", 200).await;
    // 2. the source killed while its move waits to flip: the flip commits without it
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let q = (0..6u32).find(|&q| q != p).unwrap();
    let source = owners[q as usize];
    let target = source % 3 + 1;
    let watcher = idx(&nodes, target);
    start_move(&nodes[watcher], q, target).await;
    until("the second move stalled before its flip", 60, async || {
        move_phase(&nodes[watcher], q)
            .await
            .is_some_and(|(phase, _)| phase == "stalled")
    })
    .await;
    let si = idx(&nodes, source);
    let start = traffic.rec.now();
    nodes[si].kill9();
    let live: Vec<&Node> = nodes.iter().filter(|n| n.id != source).collect();
    moved(&live, q, target, 60).await;
    traffic
        .more("traffic while the old owner is down", 100)
        .await;
    nodes[si].start().await;
    traffic.moved(si, &nodes[si]);
    let n = &nodes[si];
    until("the old owner ready again", 60, async || n.ready().await).await;
    traffic.rec.fault(FaultKind::Kill, start, traffic.rec.now());
    // its copy goes once it follows the flip
    let topic_dir = std::fs::read_dir(n.dir.join("topics"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("c."))
        .unwrap()
        .path();
    let pdir = topic_dir.join(format!("p{q:05}"));
    until("the old owner gave its copy up", 30, async || {
        let logs: u64 = std::fs::read_dir(&pdir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                    .map(|e| e.metadata().map_or(0, |m| m.len()))
                    .sum()
            })
            .unwrap_or(0);
        logs == 0 && !pdir.join("move.frozen").exists()
    })
    .await;
    traffic
        .more("traffic after the old owner came back", 200)
        .await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A network partition between a move's source and its target (nftables, in a namespace the
/// test makes) while the target copies: its calls fail, the attempt starts again with
/// backoff, and once the link heals the move completes. Both members keep serving their
/// clients meanwhile; the lifecycle checker finds the history clean with no fault window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_across_a_cut_link_waits_and_completes_once_healed() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = three_with(root.path(), |n| {
        n.netns = Some((ns.name.clone(), ns.ip.clone()));
        n.env = vec![
            ("NARAD_CLUSTER_AUTO_REBALANCE".into(), "false".into()),
            ("NARAD_MOVE_MAX_BYTES_PER_SEC".into(), "8192".into()),
        ];
    })
    .await;
    all_ready(&nodes).await;
    let traffic = Traffic::flowing(&nodes).await;
    traffic.more("data to copy", 6000).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 2u32;
    let (source, target) = (owners[2], owners[2] % 3 + 1);
    let (s, t) = (&nodes[(source - 1) as usize], &nodes[(target - 1) as usize]);
    start_move(t, p, target).await;
    until("the move copying", 60, async || {
        move_phase(t, p)
            .await
            .is_some_and(|(phase, bytes)| phase == "catch_up" && bytes > 0)
    })
    .await;
    ns.cut(s.rpc_port(), t.rpc_port());
    until("the move failing across the cut", 60, async || {
        move_phase(t, p)
            .await
            .is_some_and(|(phase, _)| phase == "retrying")
    })
    .await;
    traffic.more("traffic across the cut", 300).await;
    assert_eq!(owners_and_moves(t).await.0[p as usize], source);
    ns.heal();
    let all: Vec<&Node> = nodes.iter().collect();
    let took = moved(&all, p, target, 90).await;
    println!("moved {took:?} after the heal");
    traffic.more("traffic after the move", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A member lost for good (SIGKILL, then its data directory deleted): `forget` hands its
/// partition to a live member, rebuilt from the archive. Every archived record is read
/// again through any member, the records the archive did not hold are reported lost with
/// their offset range, new records get offsets after every one a client was told, and the
/// refusals hold (a member that answers, a stranger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_member_is_forgotten_and_its_partition_rebuilt_from_the_archive() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    // the real S3-compatible server when the test command started one, else local files
    let url = match std::env::var("NARAD_TEST_S3_URL") {
        Ok(base) => format!("{base}/forget-{}", std::process::id()),
        Err(_) => format!("file://{}", root.path().join("archive").display()),
    };
    let archive = narad_tiering::archive::Archive::open(&narad_tiering::archive::ArchiveSettings {
        url: url.clone(),
        ..Default::default()
    })
    .unwrap();
    let mut nodes = three_with(root.path(), |n| {
        n.archive = Some(url.clone());
        n.env = vec![
            ("NARAD_SEGMENT_MAX_AGE_MS".into(), "1000".into()),
            ("NARAD_TIERING_INTERVAL_MS".into(), "100".into()),
            ("NARAD_CLUSTER_AUTO_REBALANCE".into(), "false".into()),
        ];
    })
    .await;
    all_ready(&nodes).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "arch", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    // a partition whose owner does not lead (its loss keeps the quorum's leader)
    let p = (0..3u32).find(|&p| owners[p as usize] != leader).unwrap();
    let lost = owners[p as usize];
    let via = nodes.iter().position(|n| n.id != lost).unwrap();
    let produce = async |i: usize| {
        let n = &nodes[via];
        let r = n
            .http
            .post(format!("{}/v1/topics/arch/produce?partition={p}", n.base))
            .body(format!("p{p}-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    };
    // three produced, consumed and acked, then seven more nobody consumes
    for i in 0..3 {
        produce(i).await;
    }
    let (st, got) = nodes[via]
        .call(
            ("x", "y"),
            Method::GET,
            &format!("/v1/topics/arch/consume?partition={p}&max=3&wait=2s"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{got}");
    let handles: Vec<String> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["receipt_handle"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(handles.len(), 3, "{got}");
    let (st, res) = nodes[via]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/topics/arch/ack",
            Some(serde_json::json!({"receipt_handles": handles})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{res}");
    for i in 3..10 {
        produce(i).await;
    }
    let archived = async || {
        archive
            .load_manifest("arch", p)
            .await
            .ok()
            .flatten()
            .map(|m| m.next_offset)
    };
    until("the first ten archived", 60, async || {
        archived().await == Some(10)
    })
    .await;
    // the archive heard of the acks with the segment (they came first)
    let manifest = archive.load_manifest("arch", p).await.unwrap().unwrap();
    assert_eq!(manifest.queue_frontier, Some(3), "{manifest:?}");
    // five more, then the owner is gone before it seals them (a segment seals after 1 s)
    for i in 10..15 {
        produce(i).await;
    }
    let li = (lost - 1) as usize;
    nodes[li].kill9();
    assert_eq!(
        archived().await,
        Some(10),
        "the last five must not be archived"
    );
    std::fs::remove_dir_all(&nodes[li].dir).unwrap();
    // refused: a member that answers, and a node that is no member
    let other = nodes
        .iter()
        .find(|n| n.id != lost && n.id != nodes[via].id)
        .unwrap();
    let (st, body) = nodes[via]
        .call(
            ("x", "y"),
            Method::POST,
            &format!("/v1/cluster/members/{}/forget", other.id),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    let (st, body) = nodes[via]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/members/9/forget",
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{body}");
    let (st, body) = nodes[via]
        .call(
            ("x", "y"),
            Method::POST,
            &format!("/v1/cluster/members/{lost}/forget"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let parts = body["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 1, "{body}");
    let f = &parts[0];
    assert_eq!(
        (
            f["partition"].as_u64(),
            f["archived_below"].as_u64(),
            f["lost_from"].as_u64(),
            f["lost_to"].as_u64(),
            f["lost_at_least"].as_u64()
        ),
        (Some(u64::from(p)), Some(10), Some(10), Some(15), Some(5)),
        "{body}"
    );
    assert_eq!(f["redeliver_from"], 3, "{body}");
    let to = f["to"].as_u64().unwrap();
    assert_ne!(to, lost);
    let live: Vec<&Node> = nodes.iter().filter(|n| n.id != lost).collect();
    until(
        "the partition owned by a live member everywhere",
        30,
        async || {
            for n in &live {
                let (_, t) = n
                    .call(("x", "y"), Method::GET, "/v1/topics/arch", None)
                    .await;
                if t["partition_owners"][p as usize] != to {
                    return false;
                }
            }
            true
        },
    )
    .await;
    // every archived record, through every live member (once the rebuild is in: until
    // then the partition answers 503 partition_moving, never an empty history)
    let want: Vec<String> = (0..10).map(|i| format!("p{p}-{i}")).collect();
    for n in &live {
        let replayed = async || {
            let (st, got) = n
                .call(
                    ("x", "y"),
                    Method::GET,
                    &format!("/v1/topics/arch/consume?partition={p}&offset=0&max=100"),
                    None,
                )
                .await;
            if st == StatusCode::SERVICE_UNAVAILABLE {
                assert_eq!(got["code"], "partition_moving", "{got}");
                return None;
            }
            assert_eq!(st, StatusCode::OK, "{got}");
            Some(
                got["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["payload"].as_str().unwrap().to_owned())
                    .collect::<Vec<String>>(),
            )
        };
        until("the archived records replayed", 60, async || {
            replayed().await.is_some()
        })
        .await;
        assert_eq!(replayed().await.unwrap(), want, "node {}", n.id);
    }
    // new records go after every offset a client was told of, and are consumed
    let r = live[0]
        .http
        .post(format!(
            "{}/v1/topics/arch/produce?partition={p}",
            live[0].base
        ))
        .body("after")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let made: Value = r.json().await.unwrap();
    assert_eq!(made["offset"], 15, "{made}");
    // queue consumers get every archived record the lost owner's consumers had not acked,
    // then the new one: nothing acknowledged and archived is skipped
    let mut consumed: Vec<String> = Vec::new();
    until(
        "the unacked archived records and the new one consumed",
        30,
        async || {
            let (st, got) = live[1]
                .call(
                    ("x", "y"),
                    Method::GET,
                    &format!("/v1/topics/arch/consume?partition={p}&max=10&wait=1s"),
                    None,
                )
                .await;
            assert_eq!(st, StatusCode::OK, "{got}");
            let msgs = got["messages"].as_array().cloned().unwrap_or_default();
            let handles: Vec<String> = msgs
                .iter()
                .map(|m| m["receipt_handle"].as_str().unwrap().to_owned())
                .collect();
            consumed.extend(
                msgs.iter()
                    .map(|m| m["payload"].as_str().unwrap().to_owned()),
            );
            if !handles.is_empty() {
                let (st, res) = live[1]
                    .call(
                        ("x", "y"),
                        Method::POST,
                        "/v1/topics/arch/ack",
                        Some(serde_json::json!({"receipt_handles": handles})),
                    )
                    .await;
                assert_eq!(st, StatusCode::OK, "{res}");
            }
            consumed.len() >= 8
        },
    )
    .await;
    let mut expected: Vec<String> = (3..10).map(|i| format!("p{p}-{i}")).collect();
    expected.push("after".into());
    assert_eq!(consumed, expected);
    let metrics: String = live[0].metrics().await + &live[1].metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("narad_partition_records_lost_total 5")),
        "the loss is counted"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("narad_partition_records_rebuilt_total 10")),
        "the records put back are counted"
    );
    // once the new record is archived the archive records the lost tail as a gap, so a
    // replay from inside it goes on past it even when only the archive holds the range
    until(
        "the lost tail recorded as a gap in the archive",
        30,
        async || {
            archive
                .load_manifest("arch", p)
                .await
                .ok()
                .flatten()
                .is_some_and(|m| m.gaps == [(10, 15)] && m.next_offset == 16)
        },
    )
    .await;
}
