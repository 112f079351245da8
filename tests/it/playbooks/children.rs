//! Fan-out and delay children failing over and back with what their consumers processed.

use super::*;

/// Attaches a fan-out child `child` (created with `partitions`) to `parent` on `on`.
async fn fanout_child(on: &Server, parent: &str, child: &str, partitions: u32, delay_ms: i64) {
    let r = call(
        on,
        Method::POST,
        "/v1/topics",
        Some(json!({"name": child, "partitions": partitions, "parent": parent, "fanout_delay_ms": delay_ms})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
}

/// A topic with fan-out children fails over with them and back: the mirror carries the
/// children's definitions, and what each child's consumers processed (in the parent's
/// offsets), and its promote attaches them, leaving out of each what its consumers had
/// processed: a child processed to its end delivers none of it again, one not processed at
/// all delivers all of it, one processed in part delivers the rest. A's children serve no
/// queue once A is demoted. Failing back, A's children (deleted: a mirror has none) come
/// back the same way, leaving out A's own records that B's children processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_children_fail_over_and_back_with_what_they_processed() {
    let dir = tempfile::tempdir().unwrap();
    let to_a = Relay::start(0).await;
    let (b, b_ca) = copy_linking_to(dir.path(), to_a.port).await;
    let (a, a_ca) = tls_node(dir.path(), "a", SECRET, port_of(&b)).await;
    to_a.set_target(port_of(&a));
    let r = call(
        &a,
        Method::POST,
        "/v1/users",
        Some(
            json!({"username": "mirror", "password": MIRROR_PW, "grants": [
                {"action": "produce", "patterns": ["orders"]},
                {"action": "replicate", "patterns": ["orders", "audit", "work", "later"]},
            ]}),
        ),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    create_topic(&a, "orders", 3).await;
    fanout_child(&a, "orders", "audit", 2, 0).await;
    fanout_child(&a, "orders", "work", 2, 0).await;
    fanout_child(&a, "orders", "later", 1, 1500).await;
    // (one B's link user may not replicate to: not carried, and B's topic of that name is
    // left alone)
    fanout_child(&a, "orders", "private", 1, 0).await;
    create_topic(&b, "private", 1).await;
    add_remote(&a, "b", port_of(&b), &b_ca).await;
    attach(&a, "orders", "dr", "b", "orders", "earliest").await;
    // batches the children's cursors copy one at a time
    let child_lag = async |on: &Server, child: &str| {
        children_of(on, "orders").await["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == child)
            .unwrap()["lag_messages"]
            .as_u64()
            .unwrap()
    };
    for i in 0..10u64 {
        produce_seqs(&a, "orders", i * 30..(i + 1) * 30).await;
        until("the children copied the batch", async || {
            child_lag(&a, "audit").await == 0 && child_lag(&a, "work").await == 0
        })
        .await;
    }
    until("the delay child copied everything", async || {
        child_lag(&a, "later").await == 0
    })
    .await;
    caught_up(&a, "B holds every record").await;
    let t = json_of(
        call(&b, Method::GET, "/v1/topics/orders", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        t["carried_children"],
        json!([
            {"name": "audit", "delay_ms": 0, "partitions": 2},
            {"name": "later", "delay_ms": 1500, "partitions": 1},
            {"name": "work", "delay_ms": 0, "partitions": 2},
        ]),
        "{t}"
    );
    // A's consumers: all of audit, part of work, nothing of later (ten at a time: each take
    // starts at the next partition, so the child's partitions are processed evenly, as by
    // consumers that keep up; a floor is where every copy below it was processed, so uneven
    // progress only costs more duplicates)
    assert_eq!(process(&a, "audit", 1000).await.len(), 300);
    let mut worked_on_a = HashSet::new();
    for _ in 0..12 {
        worked_on_a.extend(process(&a, "work", 10).await);
    }
    assert_eq!(worked_on_a.len(), 120);
    let v = switch_over(&a, &b).await;
    assert_eq!(v["report"]["drained"], true, "{v}");
    let children = v["children"].as_array().expect("the children attached");
    assert_eq!(children.len(), 3, "{v}");
    for c in children {
        assert_eq!(
            (c["attached"].as_bool(), c["created"].as_bool()),
            (Some(true), Some(true)),
            "{v}"
        );
        assert!(c["unknown_partitions"].is_null(), "{v}");
    }
    // A's children serve no queue now
    assert_eq!(
        role_of(&b, "private").await,
        ("primary".into(), 0),
        "not carried"
    );
    let t = json_of(
        call(&b, Method::GET, "/v1/topics/private", None).await,
        StatusCode::OK,
    )
    .await;
    assert!(t["parent"].is_null(), "{t}");
    for child in ["audit", "work", "later", "private"] {
        let r = call(
            &a,
            Method::GET,
            &format!("/v1/topics/{child}/consume"),
            None,
        )
        .await;
        expect_error(r, StatusCode::CONFLICT, "mirror_read_only").await;
    }
    // B's children: the delay child as defined, each with what A's consumers left
    let t = json_of(
        call(&b, Method::GET, "/v1/topics/later", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (&t["parent"], &t["fanout_delay_ms"], &t["partitions"]),
        (&json!("orders"), &json!(1500), &json!(1)),
        "{t}"
    );
    let all: HashSet<u64> = (0..300).collect();
    let mut later = HashSet::new();
    until("B's delay child has every record", async || {
        later.extend(process(&b, "later", 1000).await);
        later == all
    })
    .await;
    let mut work = HashSet::new();
    until("B's work child has what A's consumers left", async || {
        for _ in 0..3 {
            work.extend(process(&b, "work", 10).await);
        }
        all.difference(&worked_on_a).all(|s| work.contains(s)) || work.len() >= 90
    })
    .await;
    // (B's consumers process part of it: the failback below leaves that out on A)
    let worked_on_b = work.clone();
    let twice = worked_on_b.intersection(&worked_on_a).count();
    eprintln!(
        "work: processed on A {}, then on B {}, twice {twice}",
        worked_on_a.len(),
        worked_on_b.len()
    );
    assert!(
        twice < 30,
        "{twice} of the {} processed on A delivered again",
        worked_on_a.len()
    );
    // audit was processed to its end: B's copy delivers only what comes after
    produce_seqs(&b, "orders", 300..330).await;
    let mut audit = HashSet::new();
    until("B's audit child has the new records", async || {
        audit.extend(process(&b, "audit", 1000).await);
        (300..330).all(|s| audit.contains(&s))
    })
    .await;
    assert_eq!(
        audit,
        (300..330).collect(),
        "audit delivered what A's consumers processed"
    );

    // failback: A's topic becomes B's mirror once its own children are gone (they hold
    // nothing B's children do not)
    caught_up(&a, "A's link shipped everything").await;
    let r = call(&a, Method::DELETE, "/v1/topics/orders/children/dr", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    add_remote(&b, "a", to_a.port, &a_ca).await;
    let back =
        json!({"child": "back", "remote": "a", "remote_topic": "orders", "from": "unconsumed"});
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/orders/children",
        Some(back.clone()),
    )
    .await;
    let e = json_of(r, StatusCode::CONFLICT).await;
    assert_eq!(e["code"], "remote_check_failed", "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("has fan-out children"),
        "{e}"
    );
    for child in ["audit", "work", "later", "private"] {
        let r = call(&a, Method::DELETE, &format!("/v1/topics/{child}"), None).await;
        assert_eq!(r.status(), StatusCode::NO_CONTENT, "{child}");
    }
    let r = call(&b, Method::POST, "/v1/topics/orders/children", Some(back)).await;
    json_of(r, StatusCode::OK).await;
    assert_eq!(role_of(&a, "orders").await.0, "mirror");
    produce_seqs(&b, "orders", 330..340).await;
    let v = switch_over(&b, &a).await;
    assert_eq!(v["report"]["drained"], true, "{v}");
    assert_eq!(v["children"].as_array().map(Vec::len), Some(3), "{v}");
    // A's children: what B's consumers had not processed, A's own records included
    let drain = async |child: &str, want: &HashSet<u64>| {
        let mut got = HashSet::new();
        until(
            &format!("A's {child} has what B's consumers left"),
            async || {
                got.extend(process(&a, child, 1000).await);
                want.iter().all(|s| got.contains(s))
            },
        )
        .await;
        got
    };
    let new: HashSet<u64> = (330..340).collect();
    assert_eq!(
        drain("audit", &new).await,
        new,
        "audit on A after the failback"
    );
    let later_left: HashSet<u64> = (300..340).collect();
    assert_eq!(
        drain("later", &later_left).await,
        later_left,
        "later on A after the failback"
    );
    let work_left: HashSet<u64> = (0..340)
        .filter(|s| !worked_on_a.contains(s) && !worked_on_b.contains(s))
        .collect();
    let work_on_a = drain("work", &work_left).await;
    let twice = work_on_a.len() - work_left.len();
    eprintln!(
        "work after the failback: {} left, delivered {}, twice {twice}",
        work_left.len(),
        work_on_a.len()
    );
    assert!(
        twice < 30,
        "{twice} processed on A or B delivered again on A"
    );
}
