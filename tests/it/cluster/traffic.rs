//! Faults under traffic, checked by the lifecycle recorder: kills, a lost quorum, and network
//! partitions and loss made with namespaces and nftables.

use super::*;

/// The lifecycle checker over a cluster under faults: producers and consumers through all
/// three members while a partition owner, then the Raft leader, is killed with SIGKILL and
/// restarted. Nothing acknowledged is lost, no message is leased to two readers at once
/// outside a fault's window, no ack is forgotten outside one, and every accepted message is
/// consumed and acked in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_under_traffic_lose_nothing_and_never_lease_twice() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    // node 3 (a partition owner) killed, then the Raft leader of the time; traffic goes on
    // without each, and each comes back
    for round in 0..2 {
        let i = if round == 0 {
            2
        } else {
            // (a member just restarted: an election may be under way)
            let mut leader = None;
            until("a leader", 30, async || {
                leader = nodes[0].status().await.as_ref().and_then(leader_of);
                leader.is_some()
            })
            .await;
            nodes.iter().position(|n| Some(n.id) == leader).unwrap()
        };
        let start = traffic.rec.now();
        nodes[i].kill9();
        traffic
            .more(&format!("traffic without node {}", nodes[i].id), 200)
            .await;
        nodes[i].start().await;
        traffic.moved(i, &nodes[i]);
        let n = &nodes[i];
        until(&format!("node {} ready again", n.id), 60, async || {
            n.ready().await
        })
        .await;
        traffic.rec.fault(FaultKind::Kill, start, traffic.rec.now());
        traffic
            .more(&format!("traffic with node {} back", n.id), 200)
            .await;
    }
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    assert!(report.tally.accepted >= 1100, "{:?}", report.tally);
}

/// Quorum lost (two of three members killed): the survivor keeps serving its own partitions
/// (keyless produces land there, consume and ack work), while metadata writes answer a
/// retryable 503 and `/readyz` says why; with the others back, metadata writes work again
/// and nothing produced meanwhile is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_the_live_owner_serves_and_metadata_writes_wait() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "qa", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    nodes[1].kill9();
    nodes[2].kill9();
    let one = &nodes[0];
    // keyless produces find node 1's partition (the first calls to the dead owners may wait
    // for the call deadline, then they are passed over)
    let mut kept = Vec::new();
    for i in 0..6 {
        let r = one
            .http
            .post(format!("{}/v1/topics/qa/produce", one.base))
            .body(format!("alone-{i}"))
            .send()
            .await
            .unwrap();
        let (st, r) = (r.status(), r.json::<Value>().await.unwrap());
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
        assert_eq!(owners[r["partition"].as_u64().unwrap() as usize], 1, "{r}");
        kept.push(format!("alone-{i}"));
    }
    // consumed and acked on the survivor; the last one is left unacked
    for _ in 0..5 {
        let (st, m) = one
            .call(("x", "y"), Method::GET, "/v1/topics/qa/consume", None)
            .await;
        assert_eq!(st, StatusCode::OK, "{m}");
        let (st, _) = one
            .ack("qa", m["receipt_handle"].as_str().unwrap(), "")
            .await;
        assert_eq!(st, StatusCode::NO_CONTENT);
    }
    // metadata writes wait for a quorum, then answer a retryable 503
    let r = one
        .http
        .post(format!("{}/v1/topics", one.base))
        .json(&serde_json::json!({"name": "later"}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let (st, first) = (r.status(), r.text().await.unwrap());
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{first}");
    assert!(first.contains("\"cluster_unavailable\""), "{first}");
    // A create the leader appended but could not commit may still commit once the quorum is
    // back (the answer says so): then a retry finds the topic made.
    // (the answer for a change sent but not confirmed: "it may or may not have taken effect")
    let unknown = |body: &str| body.contains("may or may not have taken effect");
    let mut may_take_effect = unknown(&first);
    let r = one
        .http
        .get(format!("{}/readyz", one.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    // the quorum back: metadata writes work, and the unacked message is still there
    nodes[1].start().await;
    nodes[2].start().await;
    for n in &nodes {
        until(&format!("node {} ready", n.id), 60, async || {
            n.ready().await
        })
        .await;
    }
    until("the create taken", 30, async || {
        let (st, body) = nodes[1]
            .call(
                ("x", "y"),
                Method::POST,
                "/v1/topics",
                Some(serde_json::json!({"name": "later"})),
            )
            .await;
        if st == StatusCode::SERVICE_UNAVAILABLE {
            may_take_effect |= unknown(&body.to_string());
            return false;
        }
        // an earlier attempt answered "may or may not have taken effect" did
        let earlier = st == StatusCode::CONFLICT && body["code"] == "topic_exists";
        assert!(
            st == StatusCode::CREATED || (earlier && may_take_effect),
            "{st} {body}"
        );
        true
    })
    .await;
    let (st, body) = nodes[1]
        .call(("x", "y"), Method::GET, "/v1/topics/later", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let (st, m) = nodes[2]
        .call(
            ("x", "y"),
            Method::GET,
            "/v1/topics/qa/consume?wait=5s",
            None,
        )
        .await;
    assert_eq!(
        (st, m["payload"].as_str()),
        (StatusCode::OK, Some("alone-5")),
        "{m}"
    );
}

/// The Raft leader cut off from the other two by nftables while producers and consumers go
/// through every member: the majority elects a new leader and takes metadata writes (one
/// topic per write, retried or not), the isolated one refuses them with a retryable 503 and
/// is not ready, and it keeps serving its own partitions meanwhile. Healed, it follows what
/// it missed, and the lifecycle checker finds nothing lost and no message leased twice,
/// with no fault to excuse anything: nothing crashed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_gives_way_and_traffic_loses_nothing() {
    use reqwest::Method;
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let l = nodes.iter().position(|n| n.id == leader).unwrap();
    ns.isolate(nodes[l].rpc_port());
    let cut = &nodes[l];
    let other = &nodes[(l + 1) % 3];
    // the majority takes a metadata write once it has a new leader
    create_when_writable(other, "during", "a create through the majority").await;
    // the cut-off one refuses writes (retryable, after its 10 s deadline) and says it is
    // not ready
    let r = cut
        .http
        .post(format!("{}/v1/topics", cut.base))
        .json(&serde_json::json!({"name": "nope"}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "cluster_unavailable").await;
    until("the cut-off member not ready", 30, async || {
        !cut.ready().await
    })
    .await;
    traffic.more("traffic while cut", 200).await;
    ns.heal();
    until("the healed member ready", 60, async || cut.ready().await).await;
    until(
        "the healed member has the topic made without it",
        30,
        async || {
            cut.call(("x", "y"), Method::GET, "/v1/topics/during", None)
                .await
                .0
                == StatusCode::OK
        },
    )
    .await;
    traffic.more("traffic healed", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    // one topic per write; the refused one was never made
    for n in &nodes {
        let (st, list) = n.call(("x", "y"), Method::GET, "/v1/topics", None).await;
        assert_eq!(st, StatusCode::OK);
        let names: Vec<&str> = list["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["c", "during"], "node {}", n.id);
    }
}

/// A member that is not the leader cut off by nftables while producers and consumers go
/// through every member: its partitions' producers through the others are placed on live
/// partitions (a message its owner wrote after all, arriving late, is a second copy, never a
/// gap), it keeps serving its own clients on its own partitions, and it is not ready; healed,
/// it is ready again, and the lifecycle checker finds the history clean with no fault to
/// excuse anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_keeps_serving_its_clients_and_loses_nothing() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let i = nodes.iter().position(|n| n.id != leader).unwrap();
    ns.isolate(nodes[i].rpc_port());
    let cut = &nodes[i];
    until("the cut-off member not ready", 30, async || {
        !cut.ready().await
    })
    .await;
    traffic.more("traffic while an owner is cut off", 300).await;
    ns.heal();
    until("the healed member ready", 60, async || cut.ready().await).await;
    traffic.more("traffic healed", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// The Raft leader made mute (the others stop hearing it; it still hears them) while
/// producers and consumers go through every member: the others elect a new leader, the
/// mute one cannot take metadata writes and goes not ready, and healed it rejoins without
/// unseating anyone for good. Nothing acknowledged is lost and nothing is leased twice,
/// with no fault to excuse anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_be_heard_gives_way_and_traffic_loses_nothing() {
    use reqwest::Method;
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let l = nodes.iter().position(|n| n.id == leader).unwrap();
    ns.mute(nodes[l].rpc_port());
    let mute = &nodes[l];
    let other = &nodes[(l + 1) % 3];
    create_when_writable(other, "during", "a create through the others").await;
    until("the mute member not ready", 30, async || {
        !mute.ready().await
    })
    .await;
    traffic.more("traffic while the leader is mute", 200).await;
    ns.heal();
    until("the healed member ready", 60, async || mute.ready().await).await;
    until(
        "every member has the topic made meanwhile",
        30,
        async || {
            for n in &nodes {
                let (st, _) = n
                    .call(("x", "y"), Method::GET, "/v1/topics/during", None)
                    .await;
                if st != StatusCode::OK {
                    return false;
                }
            }
            true
        },
    )
    .await;
    // a metadata write goes through (one leader, whoever it is)
    let (st, body) = mute
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "after"})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    traffic.more("traffic healed", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A follower cut off from the leader only (it still reaches the third member) while
/// producers and consumers go through every member: the cluster keeps taking metadata
/// writes through the member that hears both (the cut follower's elections must not take
/// the cluster down for good), and the lifecycle checker finds nothing lost and nothing
/// leased twice, with no fault window. Healed, every member is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_the_leader_only_loses_nothing() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let l = nodes.iter().position(|n| n.id == leader).unwrap();
    let (f, bridge) = ((l + 1) % 3, (l + 2) % 3);
    ns.cut(nodes[l].rpc_port(), nodes[f].rpc_port());
    traffic
        .more("traffic while a follower is cut from the leader", 200)
        .await;
    for (i, name) in ["partial-1", "partial-2"].into_iter().enumerate() {
        let through = &nodes[if i == 0 { bridge } else { l }];
        let what = format!("a create through node {}", through.id);
        create_when_writable(through, name, &what).await;
    }
    traffic.more("more traffic while cut", 100).await;
    ns.heal();
    for n in &nodes {
        until(
            &format!("node {} ready after the heal", n.id),
            60,
            async || n.ready().await,
        )
        .await;
    }
    traffic.more("traffic healed", 100).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A fourth member joins while a fifth of every cluster datagram is lost and traffic goes
/// through the three: it becomes a voter and ready (the join's calls and the snapshot it
/// installs are retried through the loss), and the lifecycle checker finds nothing lost or
/// leased twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_through_random_loss() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    ns.lossy(20);
    let mut fourth = Node::new(4, root.path(), &nodes[0].members, SECRET);
    fourth.netns = Some((ns.name.clone(), ns.ip.clone()));
    fourth.start().await;
    traffic.more("traffic while a member joins", 200).await;
    joined(&nodes, &fourth, 90).await;
    assert!(ns.dropped() > 20, "the loss rule dropped little");
    ns.heal();
    traffic.more("traffic healed", 100).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A fifth of every cluster datagram lost at random, between all members, the whole time
/// producers and consumers go through every member: retransmission hides it. Nothing
/// acknowledged is lost, nothing is leased twice, and metadata writes still go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_loss_between_members_loses_nothing() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    ns.lossy(20);
    traffic.more("traffic with 20% loss", 300).await;
    create_when_writable(&nodes[1], "lossy", "a create with 20% loss").await;
    let dropped = ns.dropped();
    assert!(
        dropped > 20,
        "the loss rule dropped only {dropped} datagrams"
    );
    ns.heal();
    traffic.more("traffic healed", 100).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}
