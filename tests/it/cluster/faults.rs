//! Faults a black-box review of the cluster found answered wrongly: each test fails on the
//! build before its fix.

use super::*;

/// A partition owned by `owner`, of a topic made through `nodes` (3 partitions, `extra`
/// settings added): the topic's name and the partition.
async fn topic_owned_by(nodes: &[Node], name: &str, owner: u64, extra: Value) -> u32 {
    let mut body = serde_json::json!({"name": name, "partitions": 3});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let made = topic_everywhere(nodes, body).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let p = owners
        .iter()
        .position(|&o| o == owner)
        .expect("an owned partition");
    u32::try_from(p).unwrap()
}

/// Produces `payload` on partition `p` of `topic` through `n`.
async fn produce_on(n: &Node, topic: &str, p: u32, payload: Value) {
    let (st, r) = n
        .call(
            ("x", "y"),
            reqwest::Method::POST,
            &format!("/v1/topics/{topic}/produce?partition={p}"),
            Some(payload),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
}

/// Leases one message of `topic` through `n`: its receipt handle.
async fn lease_one(n: &Node, topic: &str) -> String {
    let (st, r) = n
        .call(
            ("x", "y"),
            reqwest::Method::GET,
            &format!("/v1/topics/{topic}/consume?max=1&wait=5s"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    r["messages"][0]["receipt_handle"]
        .as_str()
        .unwrap_or_else(|| panic!("no message leased: {r}"))
        .to_owned()
}

/// An ack forwarded to the member holding the lease while that member is frozen: the
/// forwarding member cannot know whether it was applied, so it must not answer `503` ("not
/// applied"), and the owner, resumed after the caller's deadline, must not apply it (before,
/// the answer was `503 cluster_unavailable` and the owner applied the ack on resume: a retry
/// then found the lease gone). The same for a nack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_to_a_frozen_owner_is_answered_unknown_and_not_applied_late() {
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let owner = &nodes[1];
    let p = topic_owned_by(
        &nodes,
        "settle",
        owner.id,
        serde_json::json!({"visibility_timeout_ms": 120_000}),
    )
    .await;
    for (i, extra) in ["", "&extend=0"].into_iter().enumerate() {
        produce_on(owner, "settle", p, serde_json::json!({"n": i})).await;
        let handle = lease_one(owner, "settle").await;
        owner.signal("STOP");
        let t = Instant::now();
        let (st, body) = nodes[0].ack("settle", &handle, extra).await;
        owner.signal("CONT");
        assert_eq!(
            (st, body["code"].as_str()),
            (StatusCode::GATEWAY_TIMEOUT, Some("outcome_unknown")),
            "a settle{extra} the frozen owner did not answer, after {:?}: {body}",
            t.elapsed()
        );
        // the owner, resumed, refused the late settle: the lease is still held, so the
        // retry settles it (it was `410 lease_gone`: applied on resume)
        let mut last = (StatusCode::OK, Value::Null);
        until("the retried settle is answered", 20, async || {
            last = nodes[0].ack("settle", &handle, extra).await;
            last.0 != StatusCode::SERVICE_UNAVAILABLE && last.0 != StatusCode::GATEWAY_TIMEOUT
        })
        .await;
        assert_eq!(
            last.0,
            StatusCode::NO_CONTENT,
            "the retried settle{extra} after the late one: {}",
            last.1
        );
        if extra == "&extend=0" {
            // nacked once, so leasable again at once
            let again = lease_one(&nodes[0], "settle").await;
            assert_eq!(
                nodes[0].ack("settle", &again, "").await.0,
                StatusCode::NO_CONTENT
            );
        }
    }
    assert!(
        owner
            .log()
            .contains("settle refused: it arrived after its caller's deadline"),
        "the owner logs the late settle it refused"
    );
}

/// `forget` of a member that just restarted and answers: it must be refused every time (it
/// was declared lost, its records counted lost and its partitions reassigned, when the
/// forgetting member still remembered failed dials from while it was down and did not dial
/// again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_refuses_a_member_that_restarted_and_answers() {
    let root = tempfile::tempdir().unwrap();
    let url = format!("file://{}", root.path().join("archive").display());
    let mut nodes = three_with(root.path(), |n| {
        n.archive = Some(url.clone());
        n.env = vec![("NARAD_CLUSTER_AUTO_REBALANCE".into(), "false".into())];
    })
    .await;
    all_ready(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    // the restarted member does not lead; the forgetting one is the third
    let back = nodes.iter().position(|n| n.id != leader).unwrap();
    let via = (0..3).find(|&i| i != back).unwrap();
    let p = topic_owned_by(&nodes, "fg", nodes[back].id, serde_json::json!({})).await;
    produce_on(&nodes[via], "fg", p, serde_json::json!({"before": true})).await;
    nodes[back].kill9();
    // the forgetting member fails to reach it, and remembers so
    until("the owner is taken for down", 20, async || {
        let (st, _) = nodes[via]
            .call(
                ("x", "y"),
                reqwest::Method::POST,
                &format!("/v1/topics/fg/produce?partition={p}"),
                Some(serde_json::json!({"during": true})),
            )
            .await;
        st == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    nodes[back].start().await;
    until("the restarted member is ready", 30, async || {
        nodes[back].ready().await
    })
    .await;
    let forget = format!("/v1/cluster/members/{}/forget", nodes[back].id);
    for attempt in 0..2 {
        let (st, body) = nodes[via]
            .call(("x", "y"), reqwest::Method::POST, &forget, None)
            .await;
        assert_eq!(
            (st, body["code"].as_str()),
            (StatusCode::CONFLICT, Some("member_not_removable")),
            "forget of a member that answers (attempt {attempt}): {body}"
        );
    }
    let m = nodes[via].metrics().await;
    assert!(
        !m.lines()
            .any(|l| l.starts_with("narad_partition_records_lost_total")
                && !l.trim_end().ends_with(" 0")),
        "nothing was declared lost:\n{m}"
    );
}
