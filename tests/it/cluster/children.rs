//! Fan-out children and mirrors across members: children whose partitions other members own,
//! a three-member source mirroring every partition, a mirror partition moved mid-failover.

use super::*;

/// A child partition's owner down while a cursor copies keyed records: the cursor retries
/// its slab, and each retry sends only to the child partitions that have not taken their
/// share yet. With the owner back, the child holds every record exactly once (before, each
/// retry appended the slab again to the live partitions: 13 copies after a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_partition_owner_down_costs_the_others_no_duplicates() {
    use reqwest::Method;
    use std::collections::BTreeMap;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "p", "partitions": 1})).await;
    let x = nodes
        .iter()
        .position(|n| Some(n.id) == made["partition_owners"][0].as_u64())
        .unwrap();
    let child = topic_everywhere(&nodes, serde_json::json!({"name": "c", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(child["partition_owners"].clone()).unwrap();
    let d = nodes
        .iter()
        .position(|n| n.id != nodes[x].id && owners.contains(&n.id))
        .unwrap();
    let (st, r) = nodes[x]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/topics/p/children",
            Some(serde_json::json!({"child": "c"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    nodes[d].kill9();
    let msgs: Vec<Value> = (0..30)
        .map(|i| serde_json::json!({"payload": format!("m{i}"), "payload_encoding": "utf8", "key": format!("key-{i}")}))
        .collect();
    let (st, r) = nodes[x]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/topics/p/produce/batch",
            Some(serde_json::json!({ "messages": msgs })),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    // the cursor has failed and retried a few times
    let errors = async || -> u64 {
        nodes[x]
            .metrics()
            .await
            .lines()
            .filter(|l| l.starts_with("narad_fanout_cursor_errors_total{") && l.contains("\"c\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    until("three failed copies", 60, async || errors().await >= 3).await;
    nodes[d].start().await;
    until("the member back ready", 60, async || nodes[d].ready().await).await;
    let mut got = BTreeMap::new();
    until("every record in the child", 30, async || {
        drain_into(&nodes[x], "c", &mut got).await;
        got.len() == 30
    })
    .await;
    assert!(got.values().all(|&n| n == 1), "copies per record: {got:?}");
}

/// Produces `range` as one batch through `n` (payloads `m<i>`, keyed `k<i % 5>`), all 202.
async fn produce_range(n: &Node, topic: &str, range: std::ops::Range<u32>) {
    let msgs: Vec<Value> = range
        .map(|i| serde_json::json!({"payload": format!("m{i}"), "payload_encoding": "utf8", "key": format!("k{}", i % 5)}))
        .collect();
    let (st, r) = n
        .call(
            ("x", "y"),
            reqwest::Method::POST,
            &format!("/v1/topics/{topic}/produce/batch"),
            Some(serde_json::json!({ "messages": msgs })),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "through node {}: {r}", n.id);
}

/// Consumes and acks through `n` what `topic` has now, counting each payload's copies.
async fn drain_into(n: &Node, topic: &str, got: &mut std::collections::BTreeMap<u32, u32>) {
    use reqwest::Method;
    loop {
        let (st, body) = n
            .call(
                ("x", "y"),
                Method::GET,
                &format!("/v1/topics/{topic}/consume?max=100"),
                None,
            )
            .await;
        if st != StatusCode::OK {
            return;
        }
        let msgs = body["messages"].as_array().unwrap();
        let mut handles = Vec::new();
        for m in msgs {
            let i: u32 = m["payload"]
                .as_str()
                .and_then(|p| p.strip_prefix('m')?.parse().ok())
                .unwrap_or_else(|| panic!("not a test record: {m}"));
            *got.entry(i).or_default() += 1;
            handles.push(m["receipt_handle"].as_str().unwrap().to_owned());
        }
        let (st, res) = n
            .call(
                ("x", "y"),
                Method::POST,
                &format!("/v1/topics/{topic}/ack"),
                Some(serde_json::json!({"receipt_handles": handles})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{res}");
    }
}

/// The cursor files of `child` under every member's data directory.
fn cursor_files(nodes: &[Node], child: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, prefix, out);
            } else if e.file_name().to_string_lossy().starts_with(prefix) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    for n in nodes {
        walk(&n.dir.join("topics"), &format!("fanout-{child}."), &mut out);
    }
    out
}

/// Fan-out in a cluster: the cursors run on the parent partitions' owners and copy to child
/// partitions whichever member owns them. A standalone topic attached from the earliest
/// record (through one member), a child made in one step from the tail (through another),
/// and a delay child each get exactly their records; an owner killed and restarted loses
/// none of them (copies to its partitions wait for it); the children's lag is summed over
/// the owners from any member; a detach stops the copies everywhere and removes the cursor
/// files on every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_children_in_a_cluster_get_every_record_whichever_members_own_them() {
    use reqwest::Method;
    use std::collections::BTreeMap;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    topic_everywhere(&nodes, serde_json::json!({"name": "p", "partitions": 6})).await;
    produce_range(&nodes[0], "p", 0..40).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "all", "partitions": 4})).await;
    let (st, r) = nodes[2]
        .call(
            anyone,
            Method::POST,
            "/v1/topics/p/children",
            Some(serde_json::json!({"child": "all", "from": "earliest"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    let (st, r) = nodes[1]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "new", "parent": "p"})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    assert_eq!(
        (r["role"].as_str(), r["partitions"].as_u64()),
        (Some("child"), Some(6)),
        "{r}"
    );
    let (st, r) = nodes[0]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "later", "parent": "p", "fanout_delay_ms": 1500})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    for (i, n) in nodes.iter().enumerate() {
        produce_range(n, "p", 40 + 20 * i as u32..60 + 20 * i as u32).await;
    }
    let want = |r: std::ops::Range<u32>| -> Vec<u32> { r.collect() };
    let (mut all, mut new, mut later) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    until("every record in 'all' and 'new'", 30, async || {
        drain_into(&nodes[0], "all", &mut all).await;
        drain_into(&nodes[2], "new", &mut new).await;
        all.keys().copied().collect::<Vec<_>>() == want(0..100)
            && new.keys().copied().collect::<Vec<_>>() == want(40..100)
    })
    .await;
    until("every due record in 'later'", 30, async || {
        drain_into(&nodes[1], "later", &mut later).await;
        later.keys().copied().collect::<Vec<_>>() == want(40..100)
    })
    .await;
    // no failure: each record at most twice (a copy whose answer took longer than the
    // 3 s call deadline, on a machine this busy, is sent again: a duplicate is allowed)
    for (name, got) in [("all", &all), ("new", &new), ("later", &later)] {
        assert!(got.values().all(|&c| c <= 2), "{name}: {got:?}");
    }
    // the lag, from any member, is every owner's cursors' summed
    until("no lag seen from node 2", 10, async || {
        let (st, r) = nodes[1]
            .call(anyone, Method::GET, "/v1/topics/p/children", None)
            .await;
        st == StatusCode::OK
            && r["children"].as_array().unwrap().len() == 3
            && r["children"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["lag_messages"] == 0)
            && r.get("partitions_unavailable").is_none()
    })
    .await;
    // a child attached from the tail just before node 2 is killed: node 2's cursors for it
    // have copied nothing, so no cursor file; restarted, they start where the link in the
    // catalog says (not at the oldest record, not past what comes next)
    let (st, r) = nodes[0]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "fresh", "parent": "p"})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    until("the link followed on node 2", 10, async || {
        let (st, r) = nodes[1]
            .call(anyone, Method::GET, "/v1/topics/fresh", None)
            .await;
        st == StatusCode::OK && r["role"] == "child"
    })
    .await;
    // an owner killed: the parent keeps taking keyless records on the others; copies to
    // the dead member's child partitions wait for it, and nothing is lost
    nodes[1].kill9();
    for i in 100..130 {
        let (st, r) = nodes[i % 2 * 2]
            .call(
                anyone,
                Method::POST,
                "/v1/topics/p/produce/batch",
                Some(serde_json::json!({"messages": [
                    {"payload": format!("m{i}"), "payload_encoding": "utf8"}
                ]})),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    }
    let (st, r) = nodes[0]
        .call(anyone, Method::GET, "/v1/topics/p/children", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert!(r["partitions_unavailable"].is_array(), "{r}");
    nodes[1].start().await;
    until("node 2 ready again", 60, async || nodes[1].ready().await).await;
    until(
        "the records produced meanwhile in 'all' and 'new'",
        30,
        async || {
            drain_into(&nodes[2], "all", &mut all).await;
            drain_into(&nodes[0], "new", &mut new).await;
            all.keys().copied().collect::<Vec<_>>() == want(0..130)
                && new.keys().copied().collect::<Vec<_>>() == want(40..130)
        },
    )
    .await;
    // the parent grown through node 3: the new partitions' owners start cursors for them
    // (from their first record: all of it came after the attach)
    let (st, r) = nodes[2]
        .call(
            anyone,
            Method::PATCH,
            "/v1/topics/p",
            Some(serde_json::json!({"partitions": 9})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    // (read-your-writes holds on the member that answered; node 1 follows shortly)
    until("node 1 has the new partitions", 10, async || {
        let (_, r) = nodes[0]
            .call(anyone, Method::GET, "/v1/topics/p", None)
            .await;
        r["partitions"] == 9
    })
    .await;
    for i in 130..148u32 {
        // (pinned: a 503 while the member restarted above is still taken for down is
        // retried, as a client would)
        until("a pinned produce to a new partition", 30, async || {
            let (st, r) = nodes[0]
                .call(
                    anyone,
                    Method::POST,
                    "/v1/topics/p/produce/batch",
                    Some(serde_json::json!({"messages": [
                        {"payload": format!("m{i}"), "payload_encoding": "utf8", "partition": 6 + i % 3}
                    ]})),
                )
                .await;
            assert!(
                [StatusCode::ACCEPTED, StatusCode::SERVICE_UNAVAILABLE].contains(&st),
                "{st} {r}"
            );
            st == StatusCode::ACCEPTED
        })
        .await;
    }
    until(
        "the new partitions' records in 'all' and 'new'",
        30,
        async || {
            drain_into(&nodes[0], "all", &mut all).await;
            drain_into(&nodes[1], "new", &mut new).await;
            all.keys().copied().collect::<Vec<_>>() == want(0..148)
                && new.keys().copied().collect::<Vec<_>>() == want(40..148)
        },
    )
    .await;
    // detached through node 1: every member stops its cursors and removes their files
    assert!(!cursor_files(&nodes, "all").is_empty());
    let (st, r) = nodes[0]
        .call(anyone, Method::DELETE, "/v1/topics/p/children/all", None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{r}");
    until("no cursor file of 'all' on any member", 10, async || {
        cursor_files(&nodes, "all").is_empty()
    })
    .await;
    produce_range(&nodes[1], "p", 148..170).await;
    until("the new records in 'new'", 30, async || {
        drain_into(&nodes[1], "new", &mut new).await;
        new.keys().copied().collect::<Vec<_>>() == want(40..170)
    })
    .await;
    drain_into(&nodes[2], "all", &mut all).await;
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        want(0..148),
        "a detached child got records"
    );
    let mut fresh = BTreeMap::new();
    until("every record since its attach in 'fresh'", 30, async || {
        drain_into(&nodes[2], "fresh", &mut fresh).await;
        fresh.keys().copied().collect::<Vec<_>>() == want(100..170)
    })
    .await;
    let (st, r) = nodes[2]
        .call(anyone, Method::GET, "/v1/topics/all", None)
        .await;
    assert_eq!(
        (st, r["role"].as_str()),
        (StatusCode::OK, Some("standalone")),
        "{r}"
    );
}

/// A remote child on a three-member source: each parent partition's owner ships its own
/// partition to the target; every record arrives (per-key order kept) and a SIGKILLed owner,
/// restarted, ships what it had not (duplicates allowed, no gap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_source_mirrors_every_partition_from_its_owner() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let (b, ca) = crate::remotes::target(root.path()).await;
    let b_port = crate::remotes::port_of(&b);
    let mut nodes = three_with(root.path(), |n| {
        n.secure = true;
        n.env
            .push(("NARAD_REMOTES_ALLOWED_PORTS".into(), b_port.to_string()));
        n.env
            .push(("NARAD_REMOTES_ALLOW_ADDRESSES".into(), "127.0.0.0/8".into()));
    })
    .await;
    all_ready(&nodes).await;
    let admin = ("admin", ROOT_PW);
    let (st, body) = nodes[0]
        .call(
            admin,
            Method::POST,
            "/v1/remotes",
            Some(serde_json::json!({"name": "b", "url": format!("https://127.0.0.1:{b_port}"), "username": "mirror", "password": crate::remotes::MIRROR_PW, "ca_pem": ca})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let (st, body) = nodes[0]
        .call(
            admin,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "src", "partitions": 6})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let owners: std::collections::BTreeSet<u64> = body["partition_owners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(owners.len(), 3, "partitions on every member: {body}");
    let (st, body) = nodes[1]
        .call(
            admin,
            Method::POST,
            "/v1/topics/src/children",
            Some(serde_json::json!({"child": "to-b", "remote": "b", "remote_topic": "orders", "lanes": 2})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let produce = async |n: &Node, seqs: std::ops::Range<u64>| {
        let msgs: Vec<Value> = seqs
            .map(|s| serde_json::json!({"key": format!("k{}", s % 30), "payload": {"seq": s}}))
            .collect();
        n.call(
            admin,
            Method::POST,
            "/v1/topics/src/produce/batch",
            Some(serde_json::json!({ "messages": msgs })),
        )
        .await
        .0
    };
    for (i, start) in (0..600).step_by(100).enumerate() {
        let st = produce(&nodes[i % 3], start..start + 100).await;
        assert_eq!(st, StatusCode::ACCEPTED);
    }
    let have = async || -> std::collections::HashSet<u64> {
        crate::remotes::replay_all(&b, "orders", 2)
            .await
            .iter()
            .map(|r| r.2)
            .collect()
    };
    until("600 records on the target", 60, async || {
        have().await.len() >= 600
    })
    .await;
    crate::remotes::check_key_order(&crate::remotes::replay_all(&b, "orders", 2).await);
    // the lag, summed over the owners, reaches 0 and every owner's cursors run
    until("lag 0 everywhere", 30, async || {
        let (st, c) = nodes[2]
            .call(admin, Method::GET, "/v1/topics/src/children", None)
            .await;
        st == StatusCode::OK
            && c["children"][0]["lag_messages"] == 0
            && c["children"][0]["remote"]["state"] == "running"
            && c.get("partitions_unavailable").is_none()
    })
    .await;
    // an owner killed while records it owns wait to be shipped: after its restart they are
    // on the target
    nodes[2].kill9();
    let mut acked = Vec::new();
    for start in (600..900).step_by(100) {
        if produce(&nodes[0], start..start + 100).await == StatusCode::ACCEPTED {
            acked.extend(start..start + 100);
        }
    }
    nodes[2].start().await;
    all_ready(&nodes).await;
    until("every acked record on the target", 60, async || {
        let h = have().await;
        acked.iter().all(|s| h.contains(s))
    })
    .await;
    assert!(!acked.is_empty());
    // a pause answered by one member holds on every owner: nothing more ships until the
    // resume, answered once every owner applied it too
    // (a 503 says an owner has not confirmed yet, e.g. a member restarted just now: the
    // change is recorded, and a retry waits again)
    until("the pause confirmed by every owner", 30, async || {
        let (st, _) = nodes[1]
            .call(
                admin,
                Method::POST,
                "/v1/topics/src/children/to-b/pause",
                None,
            )
            .await;
        st == StatusCode::NO_CONTENT
    })
    .await;
    let before = have().await.len();
    for (i, start) in (1000..1300).step_by(100).enumerate() {
        assert_eq!(
            produce(&nodes[i % 3], start..start + 100).await,
            StatusCode::ACCEPTED
        );
    }
    until("300 waiting, paused", 30, async || {
        let (_, c) = nodes[0]
            .call(admin, Method::GET, "/v1/topics/src/children", None)
            .await;
        c["children"][0]["lag_messages"] == 300 && c["children"][0]["remote"]["state"] == "paused"
    })
    .await;
    assert_eq!(have().await.len(), before, "nothing shipped while paused");
    // (a 503 says an owner has not confirmed yet, e.g. a member restarted just now: the
    // change is recorded, and a retry waits again)
    until("the resume confirmed by every owner", 30, async || {
        let (st, _) = nodes[2]
            .call(
                admin,
                Method::POST,
                "/v1/topics/src/children/to-b/resume",
                None,
            )
            .await;
        st == StatusCode::NO_CONTENT
    })
    .await;
    until("the paused records shipped", 60, async || {
        let h = have().await;
        (1000..1300).all(|s| h.contains(&s))
    })
    .await;
}

/// Makes `topic` (through `n`) the mirror of [`SRC`] at epoch 0.
async fn mirror_of_src(n: &Node, topic: &str) {
    let (st, v) = n
        .call(
            ("x", "y"),
            reqwest::Method::POST,
            &format!("/v1/topics/{topic}/mirror"),
            Some(serde_json::json!({"source_cluster": "00000000000000c1", "source_topic": "00000000000000a1", "epoch": 0})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
}

/// A request as [`SRC`]'s link at epoch 0 makes it (dev mode: no user needed).
fn link_post(
    n: &Node,
    path: &str,
    body: Value,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    n.http
        .post(format!("{}{path}", n.base))
        .header("narad-link", format!("{SRC}/0"))
        .json(&body)
        .send()
}

/// `count` records of [`SRC`]'s partition 0 (origin offsets and `seq` 0..count, keyed apart
/// so they spread over the mirror's partitions), taken by `topic` through `n` as its link
/// sends them.
async fn take_from_src(n: &Node, topic: &str, count: u64) {
    let messages: Vec<Value> = (0..count)
        .map(|i| serde_json::json!({"key": format!("k{i}"), "payload": {"seq": i}, "headers": {"narad-origin": format!("{SRC}/0/{i}")}}))
        .collect();
    let r = link_post(
        n,
        &format!("/v1/topics/{topic}/produce/batch"),
        serde_json::json!({ "messages": messages }),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED, "{:?}", r.text().await);
}

/// Consumes and acks everything `topic` delivers through `n` (until three empty answers):
/// the `seq` of each record, none delivered twice.
async fn take_all(n: &Node, topic: &str) -> std::collections::BTreeSet<u64> {
    let mut got = std::collections::BTreeSet::new();
    let mut empty = 0;
    while empty < 3 {
        let (st, v) = n
            .call(
                ("x", "y"),
                reqwest::Method::GET,
                &format!("/v1/topics/{topic}/consume?max=100"),
                None,
            )
            .await;
        if st == StatusCode::NO_CONTENT {
            empty += 1;
            continue;
        }
        assert_eq!(st, StatusCode::OK, "{v}");
        let msgs = v["messages"].as_array().unwrap();
        let handles: Vec<Value> = msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
        for m in msgs {
            assert!(
                got.insert(m["payload"]["seq"].as_u64().unwrap()),
                "delivered twice: {m}"
            );
        }
        let (st, a) = n
            .call(
                ("x", "y"),
                reqwest::Method::POST,
                &format!("/v1/topics/{topic}/ack"),
                Some(serde_json::json!({ "receipt_handles": handles })),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{a}");
    }
    got
}

/// Failover meets a partition move (item 9 of the failover design): a mirror's partition
/// holding records the source's consumers had not acked moves to another member between two
/// progress messages. What the first progress settled moves with the partition's queue, the
/// second settles on the new owner (which indexes the partition afresh), and after the
/// promote the new primary's consumers get exactly what the source's had not acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_partition_moved_mid_failover_keeps_its_progress() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(root.path(), &[]).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "m", "partitions": 3})).await;
    mirror_of_src(&nodes[0], "m").await;
    take_from_src(&nodes[0], "m", 90).await;
    let progress = |frontier: u64| serde_json::json!({"partition": 0, "frontier": frontier, "end": 90, "shipped": 90, "leased": 0, "partitions": 1});
    let r = link_post(&nodes[1], "/v1/topics/m/progress", progress(40))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{:?}", r.text().await);
    // partition 0 of the mirror moves to a member that does not own it
    let owners_of = async |n: &Node| -> (Vec<u64>, usize) {
        let (_, t) = n.call(("x", "y"), Method::GET, "/v1/topics/m", None).await;
        let owners = t["partition_owners"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let (_, m) = n
            .call(("x", "y"), Method::GET, "/v1/cluster/moves", None)
            .await;
        (owners, m["moves"].as_array().map_or(usize::MAX, Vec::len))
    };
    let from = owners_of(&nodes[0]).await.0[0];
    let to = nodes.iter().map(|n| n.id).find(|&id| id != from).unwrap();
    let (st, body) = nodes[2]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/moves",
            Some(serde_json::json!({"topic": "m", "partition": 0, "to": to})),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    until("partition 0 moved", 60, async || {
        for n in &nodes {
            let (owners, moves) = owners_of(n).await;
            if owners.first() != Some(&to) || moves != 0 {
                return false;
            }
        }
        true
    })
    .await;
    // the source's consumers acked up to 70 since: the progress reaches another member
    let r = link_post(&nodes[2], "/v1/topics/m/progress", progress(70))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{:?}", r.text().await);
    let (st, v) = nodes[1]
        .call(("x", "y"), Method::POST, "/v1/topics/m/promote", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["report"]["partitions"][0]["received_to"], 90, "{v}");
    assert_eq!(v["report"]["partitions"][0]["acked_frontier"], 70, "{v}");
    let got = take_all(&nodes[0], "m").await;
    assert_eq!(got, (70..90).collect());
}

/// A mirror whose partitions three members own: the source's progress reaches one member,
/// and every member settles the records of its own partitions that the source's consumers
/// acked; a promote through a third member reports and settles them all (before, only the
/// partitions of the member the progress reached were settled: the rest were delivered
/// again after the promote).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirrors_progress_settles_the_partitions_of_every_member() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "m", "partitions": 6})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let distinct: std::collections::BTreeSet<u64> = owners.iter().copied().collect();
    assert!(distinct.len() >= 2, "{owners:?}");
    mirror_of_src(&nodes[0], "m").await;
    // 60 records of the source's partition 0, spread over the mirror's partitions by key
    take_from_src(&nodes[0], "m", 60).await;
    // the source's consumers acked the first 40; the progress reaches one member
    let r = link_post(
        &nodes[1],
        "/v1/topics/m/progress",
        serde_json::json!({"partition": 0, "frontier": 40, "end": 60, "shipped": 60, "leased": 0, "partitions": 1}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{:?}", r.text().await);
    // the promote, through another member, reports and settles what every member holds
    let (st, v) = nodes[2]
        .call(("x", "y"), Method::POST, "/v1/topics/m/promote", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["report"]["partitions"][0]["received_to"], 60, "{v}");
    assert_eq!(v["report"]["partitions"][0]["acked_frontier"], 40, "{v}");
    assert_eq!(v["report"]["partitions"][0]["unreceived"], 0, "{v}");
    // the new primary's consumers get exactly what the source's had not acked
    let got = take_all(&nodes[0], "m").await;
    assert_eq!(got, (40..60).collect());
}
