//! The playbooks of docs/playbooks/, run end to end with two clusters on loopback (one node
//! each, HTTPS from test CAs): moving a topic to another cluster, a disaster-recovery copy
//! with a failover when the source is lost, and the failback once it returns; the same under
//! random load (`random`), and with fan-out children (`children`).

use std::collections::{BTreeSet, HashSet};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::remotes::{
    MIRROR_PW, ROOT_PW, Relay, SECRET, call, children_of, json_of, port_of, produce_seqs,
    replay_all, source, sub, target, target_with, until,
};
use crate::security::make_cert;
use crate::support::{Server, call_as, expect_error};

mod children;
mod random;

/// Takes (consumes and acks) up to `limit` records of `topic` on `s` in queue mode, as a
/// consumer that processes them would; returns their seqs.
async fn process(s: &Server, topic: &str, limit: usize) -> Vec<u64> {
    let mut got = Vec::new();
    while got.len() < limit {
        let max = (limit - got.len()).min(100);
        let r = call(
            s,
            Method::GET,
            &format!("/v1/topics/{topic}/consume?max={max}"),
            None,
        )
        .await;
        if r.status() == StatusCode::NO_CONTENT {
            break;
        }
        let v = json_of(r, StatusCode::OK).await;
        let msgs = v["messages"].as_array().unwrap().clone();
        if msgs.is_empty() {
            break;
        }
        let handles: Vec<Value> = msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
        got.extend(msgs.iter().map(|m| m["payload"]["seq"].as_u64().unwrap()));
        let r = call(
            s,
            Method::POST,
            &format!("/v1/topics/{topic}/ack"),
            Some(json!({ "receipt_handles": handles })),
        )
        .await;
        let acks = json_of(r, StatusCode::OK).await;
        assert!(
            acks["results"]
                .as_array()
                .unwrap()
                .iter()
                .all(|a| a["status"] == 204),
            "{acks}"
        );
    }
    got
}

/// A remote named `name` on `on`, for the user `mirror` of the cluster at `port` (its own
/// or a relay's), trusting `ca`.
async fn add_remote(on: &Server, name: &str, port: u16, ca: &str) {
    let url = format!("https://127.0.0.1:{port}");
    let r = call(
        on,
        Method::POST,
        "/v1/remotes",
        Some(json!({"name": name, "url": url, "username": "mirror", "password": MIRROR_PW, "ca_pem": ca})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
}

async fn attach(on: &Server, parent: &str, child: &str, remote: &str, topic: &str, from: &str) {
    let r = call(
        on,
        Method::POST,
        &format!("/v1/topics/{parent}/children"),
        Some(json!({"child": child, "remote": remote, "remote_topic": topic, "lanes": 2, "from": from})),
    )
    .await;
    json_of(r, StatusCode::OK).await;
}

/// B, the copy (see [`target`]), with what it needs to link onward itself: a cluster secret
/// and `port` allowed as a remote's.
async fn copy_linking_to(dir: &std::path::Path, port: u16) -> (Server, String) {
    target_with(
        dir,
        &[
            (
                "NARAD_CLUSTER_SECRET",
                "the copy cluster's own secret, 32+ bytes",
            ),
            ("NARAD_REMOTES_ALLOWED_PORTS", &port.to_string()),
            ("NARAD_REMOTES_ALLOW_ADDRESSES", "127.0.0.0/8"),
        ],
    )
    .await
}

/// A planned switchover of `orders`: `from` is demoted, then `to` promoted once drained
/// (every record and ack of `from` there); the promote's answer.
async fn switch_over(from: &Server, to: &Server) -> Value {
    let r = call(from, Method::POST, "/v1/topics/orders/demote", None).await;
    json_of(r, StatusCode::OK).await;
    let r = call(
        to,
        Method::POST,
        "/v1/topics/orders/promote?wait_drained=true&timeout_ms=30000",
        None,
    )
    .await;
    json_of(r, StatusCode::OK).await
}

/// Creates topic `name` with `partitions` on `on`.
async fn create_topic(on: &Server, name: &str, partitions: u32) {
    let r = call(
        on,
        Method::POST,
        "/v1/topics",
        Some(json!({"name": name, "partitions": partitions})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
}

/// Waits until the remote child of `orders` on `on` shipped everything and runs.
async fn caught_up(on: &Server, what: &str) {
    until(what, async || {
        lag(on, "orders").await == (0, "running".into())
    })
    .await;
}

/// A topic's failover role and epoch on `on`.
async fn role_of(on: &Server, topic: &str) -> (String, u64) {
    let v = json_of(
        call(on, Method::GET, &format!("/v1/topics/{topic}"), None).await,
        StatusCode::OK,
    )
    .await;
    (
        v["failover"]["role"].as_str().unwrap().to_owned(),
        v["failover"]["epoch"].as_u64().unwrap(),
    )
}

/// `topic` on `on` refuses produces and consumes (a mirror, or demoted) but replays.
async fn expect_read_only(on: &Server, topic: &str) {
    let r = call(
        on,
        Method::POST,
        &format!("/v1/topics/{topic}/produce/batch"),
        Some(json!({"messages": [{"payload": {"seq": 999_999}}]})),
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "mirror_read_only").await;
    let r = call(
        on,
        Method::GET,
        &format!("/v1/topics/{topic}/consume"),
        None,
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "mirror_read_only").await;
    let r = call(
        on,
        Method::GET,
        &format!("/v1/topics/{topic}/consume?partition=0&offset=0&max=1"),
        None,
    )
    .await;
    assert!(
        matches!(r.status(), StatusCode::OK | StatusCode::NO_CONTENT),
        "replay of a read-only topic: {}",
        r.status()
    );
}

/// Records of mirror `topic` on `on` settled by its source's consumers' progress.
async fn settled_on(on: &Server, topic: &str) -> u64 {
    let prefix = format!("narad_mirror_settled_records_total{{topic=\"{topic}\"}} ");
    metrics_text(on)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(|v| v.parse().unwrap()))
        .unwrap_or(0)
}

async fn metrics_text(on: &Server) -> String {
    call(on, Method::GET, "/metrics", None)
        .await
        .text()
        .await
        .unwrap()
}

/// The lag and state of `parent`'s (first) remote child on `on`.
async fn lag(on: &Server, parent: &str) -> (u64, String) {
    let c = children_of(on, parent).await;
    let c = c["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| !c["remote"].is_null())
        .expect("a remote child")
        .clone();
    (
        c["lag_messages"].as_u64().unwrap(),
        c["remote"]["state"].as_str().unwrap().to_owned(),
    )
}

/// docs/playbooks/move-topic.md: producers and consumers move from A to B, and every record
/// is processed at least once (on A before the move, or on B after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_topic_to_another_cluster_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let a = source(dir.path(), port_of(&b)).await;
    create_topic(&a, "orders", 2).await;
    // life before the move: A's producers write, A's consumers process part of it
    assert_eq!(produce_seqs(&a, "orders", 0..300).await.len(), 300);
    let mut processed_on_a = process(&a, "orders", 180).await;
    assert_eq!(processed_on_a.len(), 180);
    // 1. mirror what A's consumers have not acked yet, and everything new
    add_remote(&a, "b", port_of(&b), &ca).await;
    let r = call(&a, Method::POST, "/v1/remotes/b/test?topic=orders", None).await;
    assert_eq!(json_of(r, StatusCode::OK).await["ok"], true);
    attach(&a, "orders", "to-b", "b", "orders", "unconsumed").await;
    // B's topic is now A's mirror: it takes records only from A's link, and replay
    assert_eq!(role_of(&b, "orders").await, ("mirror".into(), 0));
    expect_read_only(&b, "orders").await;
    // A's settings and a new JSON Schema version follow to B, before the records that need
    // them (which B would refuse against its older schema)
    let r = call(
        &a,
        Method::PATCH,
        "/v1/topics/orders",
        Some(json!({"visibility_timeout_ms": 45000, "schema": {
            "type": "object", "required": ["seq"], "properties": {"seq": {"type": "integer"}}
        }})),
    )
    .await;
    json_of(r, StatusCode::OK).await;
    // 2. producers keep writing to A, and A's consumers keep processing, until the switch
    assert_eq!(produce_seqs(&a, "orders", 300..350).await.len(), 50);
    processed_on_a.extend(process(&a, "orders", 20).await);
    // (a planned promote refuses while A still takes records)
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/orders/promote?wait_drained=true&timeout_ms=300",
        None,
    )
    .await;
    let v = json_of(r, StatusCode::CONFLICT).await;
    assert_eq!(v["code"], "not_drained", "{v}");
    assert_eq!(role_of(&b, "orders").await, ("mirror".into(), 0));
    // 3. the switch: A stops taking produces and leases, its link drains, B is promoted
    let r = call(&a, Method::POST, "/v1/topics/orders/demote", None).await;
    assert_eq!(
        json_of(r, StatusCode::OK).await["failover"]["role"],
        "demoted"
    );
    expect_read_only(&a, "orders").await;
    // (promote waits until every record and ack of the demoted A is on B: one command)
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/orders/promote?wait_drained=true&timeout_ms=30000",
        None,
    )
    .await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(v["failover"]["role"], "primary", "{v}");
    assert_eq!(v["failover"]["epoch"], 1, "{v}");
    assert_eq!(v["changed"], true, "{v}");
    let report = &v["report"];
    assert_eq!(report["drained"], true, "{v}");
    assert_eq!(report["partitions"].as_array().unwrap().len(), 2, "{v}");
    for p in report["partitions"].as_array().unwrap() {
        assert_eq!(p["unreceived"], 0, "{v}");
        assert_eq!(p["source_demoted"], true, "{v}");
    }
    assert_eq!(
        settled_on(&b, "orders").await,
        20,
        "A's consumers' 20 acks after the attach"
    );
    let t = json_of(
        call(&b, Method::GET, "/v1/topics/orders", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(t["schema_version"], 1, "{t}");
    assert_eq!(t["visibility_timeout_ms"], 45000, "{t}");
    assert_eq!(lag(&a, "orders").await.0, 0);
    // (a promote is idempotent)
    let r = call(&b, Method::POST, "/v1/topics/orders/promote", None).await;
    assert_eq!(json_of(r, StatusCode::OK).await["changed"], false);
    // 4. producers and consumers on B
    assert_eq!(produce_seqs(&b, "orders", 1000..1100).await.len(), 100);
    let processed_on_b = process(&b, "orders", 10_000).await;
    let all: HashSet<u64> = processed_on_a
        .iter()
        .chain(&processed_on_b)
        .copied()
        .collect();
    for s in (0..350).chain(1000..1100) {
        assert!(all.contains(&s), "record {s} was never processed");
    }
    // nothing was processed twice: A's consumers' progress reached B before the promote
    let on_a: HashSet<u64> = processed_on_a.iter().copied().collect();
    let twice = processed_on_b.iter().filter(|s| on_a.contains(s)).count();
    assert_eq!(twice, 0, "records processed on both sides");
    // 5. the link is drained: it detaches without force, and A's topic can go
    let r = call(&a, Method::DELETE, "/v1/topics/orders/children/to-b", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = call(&a, Method::DELETE, "/v1/topics/orders", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

/// A secure node with HTTPS from its own test CA and a cluster secret, allowing remotes on
/// loopback at `port`: (server, its CA).
async fn tls_node(dir: &std::path::Path, name: &str, secret: &str, port: u16) -> (Server, String) {
    let (ca, chain, key) = make_cert();
    let d = sub(dir, name);
    let (cert_file, key_file) = (d.join("cert.pem"), d.join("key.pem"));
    std::fs::write(&cert_file, &chain).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let port = port.to_string();
    let s = Server::start_opts(
        &d,
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            ("NARAD_CLUSTER_SECRET", secret),
            ("NARAD_REMOTES_ALLOWED_PORTS", &format!("443,{port}")),
            ("NARAD_REMOTES_ALLOW_ADDRESSES", "127.0.0.0/8"),
            ("NARAD_TLS_CERT_FILE", cert_file.to_str().unwrap()),
            ("NARAD_TLS_KEY_FILE", key_file.to_str().unwrap()),
        ],
        Some(ca.as_bytes()),
    )
    .await;
    (s, ca)
}

/// docs/playbooks/disaster-recovery.md and failback.md: A mirrors to B; A is lost with
/// records B never got (the at-risk window, which A's lag showed); B's consumers take over;
/// A returns and ships its tail; B's own records go back to A over a B→A link without A's
/// records coming back; consumers and producers return to A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cluster_fails_over_to_its_copy_and_back() {
    let dir = tempfile::tempdir().unwrap();
    // the regions' link: each reaches the other through a relay the test can cut (A's
    // relay keeps its port when A restarts on another)
    let (relay, to_a) = (Relay::start(0).await, Relay::start(0).await);
    let (b, b_ca) = copy_linking_to(dir.path(), to_a.port).await;
    relay.set_target(port_of(&b));
    let (mut a, a_ca) = tls_node(dir.path(), "a", SECRET, relay.port).await;
    to_a.set_target(port_of(&a));
    // A has the user B's link will act as, and B allows A's port as a remote
    for (body, path) in [
        (json!({"name": "orders", "partitions": 2}), "/v1/topics"),
        (
            json!({"username": "mirror", "password": MIRROR_PW, "grants": [
                {"action": "produce", "patterns": ["orders"]},
                {"action": "replicate", "patterns": ["orders"]},
            ]}),
            "/v1/users",
        ),
    ] {
        json_of(
            call(&a, Method::POST, path, Some(body)).await,
            StatusCode::CREATED,
        )
        .await;
    }
    // peacetime: A→B from the start
    add_remote(&a, "b", relay.port, &b_ca).await;
    attach(&a, "orders", "dr", "b", "orders", "attach").await;
    assert_eq!(role_of(&b, "orders").await, ("mirror".into(), 0));
    assert_eq!(produce_seqs(&a, "orders", 0..500).await.len(), 500);
    let processed_on_a = process(&a, "orders", 400).await;
    until("the copy caught up", async || {
        lag(&a, "orders").await.0 == 0
    })
    .await;
    until("A's consumers' progress on B", async || {
        settled_on(&b, "orders").await == 400
    })
    .await;
    expect_read_only(&b, "orders").await;
    // the regions' link fails first: A keeps taking records B does not get; A's lag is the
    // at-risk window
    relay.set_cut(true);
    assert_eq!(produce_seqs(&a, "orders", 500..600).await.len(), 100);
    until("A shows 100 at risk", async || {
        let (n, state) = lag(&a, "orders").await;
        n == 100 && state != "running"
    })
    .await;
    // A is lost
    a.kill9();
    // failover: B is promoted; its consumers start on the copy; producers move to B
    let copy: BTreeSet<u64> = replay_all(&b, "orders", 2)
        .await
        .iter()
        .map(|r| r.2)
        .collect();
    assert_eq!(copy, (0..500).collect(), "B holds exactly what A shipped");
    let r = call(&b, Method::POST, "/v1/topics/orders/promote", None).await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(v["failover"]["epoch"], 1, "{v}");
    // the report: A's partitions as A last told them (before the cut: nothing missing then,
    // and the at-risk 100 came after it, which the age of that progress shows)
    let parts = v["report"]["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{v}");
    let received: u64 = parts
        .iter()
        .map(|p| p["received_to"].as_u64().unwrap())
        .sum();
    assert_eq!(received, 500, "{v}");
    assert!(parts.iter().all(|p| p["progress_age_ms"].is_u64()), "{v}");
    assert_eq!(v["report"]["drained"], false, "{v}");
    // one of B's consumers takes a record and never finishes it (it is released later): the
    // others' acks land above it, out of order
    let held = json_of(
        call(&b, Method::GET, "/v1/topics/orders/consume?max=1", None).await,
        StatusCode::OK,
    )
    .await;
    let held_seq = held["messages"][0]["payload"]["seq"].as_u64().unwrap();
    let held_handle = held["messages"][0]["receipt_handle"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut processed_on_b = process(&b, "orders", 10_000).await;
    let processed_a: HashSet<u64> = processed_on_a.iter().copied().collect();
    assert_eq!(
        processed_on_b
            .iter()
            .copied()
            .chain([held_seq])
            .collect::<BTreeSet<u64>>(),
        (0..500).filter(|s| !processed_a.contains(s)).collect(),
        "exactly the shipped records A's consumers had not processed"
    );
    assert_eq!(produce_seqs(&b, "orders", 2000..2050).await.len(), 50);
    processed_on_b.extend(process(&b, "orders", 10_000).await);
    // A returns with its disk: its link is fenced by B (epoch 1), so A demotes its topic
    // (no produces, no leases) and ships the at-risk tail to B as late records
    a.restart().await;
    to_a.set_target(port_of(&a));
    relay.set_cut(false);
    until("A's tail reached B", async || {
        lag(&a, "orders").await.0 == 0
    })
    .await;
    assert_eq!(role_of(&a, "orders").await, ("demoted".into(), 0));
    expect_read_only(&a, "orders").await;
    let m = metrics_text(&b).await;
    assert!(
        m.lines()
            .any(|l| l == "narad_mirror_late_records_total{topic=\"orders\"} 100"),
        "B counts A's tail as late records"
    );
    processed_on_b.extend(process(&b, "orders", 10_000).await);
    let on_b: HashSet<u64> = processed_on_b.iter().copied().collect();
    for s in (0..600).chain(2000..2050).filter(|s| *s != held_seq) {
        assert!(
            on_b.contains(&s) || processed_a.contains(&s),
            "{s} was processed nowhere"
        );
    }
    let twice = processed_on_b
        .iter()
        .filter(|s| processed_a.contains(s))
        .count();
    assert_eq!(twice, 0, "records processed on A and again on B");
    // failback: B-native records go to A over B→A (from what B's consumers have not acked,
    // and all new ones); A-origin records never go back (one hop)
    add_remote(&b, "a", to_a.port, &a_ca).await;
    // (its test names the loop rule while A's topic still mirrors to B, with or without
    // the topic it would mirror)
    for q in ["topic=orders", "topic=orders&parent=orders"] {
        let r = call(&b, Method::POST, &format!("/v1/remotes/a/test?{q}"), None).await;
        let v = json_of(r, StatusCode::OK).await;
        assert_eq!(v["state"], "loop_detected", "{v}");
    }
    let r = call(
        &a,
        Method::POST,
        "/v1/users",
        Some(json!({"username": "x", "password": "x's password!"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // the loop rule: B→A is refused while A's topic mirrors to B
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/orders/children",
        Some(
            json!({"child": "back", "remote": "a", "remote_topic": "orders", "from": "unconsumed"}),
        ),
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "loop_detected").await;
    // A's link shipped its tail (lag 0): it goes, without force
    let r = call(&a, Method::DELETE, "/v1/topics/orders/children/dr", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // a demoted topic is not promoted alone
    let r = call(&a, Method::POST, "/v1/topics/orders/promote", None).await;
    expect_error(r, StatusCode::CONFLICT, "role_conflict").await;
    attach(&b, "orders", "back", "a", "orders", "unconsumed").await;
    assert_eq!(role_of(&a, "orders").await, ("mirror".into(), 1));
    assert_eq!(produce_seqs(&b, "orders", 3000..3030).await.len(), 30);
    // switch back: B stops taking produces, its link drains, A is promoted (epoch 2)
    // the held record is released unprocessed: it goes back to A with the rest
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/orders/ack",
        Some(json!({"receipt_handles": [held_handle], "extend": 0})),
    )
    .await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(v["results"][0]["status"], 204, "{v}");
    // (A waits for every record and ack of the demoted B, and for the acks of A's own
    // records B's consumers processed during the failover, handed back)
    let v = switch_over(&b, &a).await;
    assert_eq!(v["failover"]["epoch"], 2, "{v}");
    assert_eq!(v["report"]["drained"], true, "{v}");
    // a B→A→B loop is impossible: A's own records are not on A twice, B's are there once
    let on_a: Vec<u64> = replay_all(&a, "orders", 2)
        .await
        .iter()
        .map(|r| r.2)
        .collect();
    let mut counts = std::collections::HashMap::new();
    for s in &on_a {
        *counts.entry(*s).or_insert(0) += 1;
    }
    assert!(
        (0..600).all(|s| counts.get(&s) == Some(&1)),
        "A's records came back to A"
    );
    assert!(
        (3000..3030).all(|s| counts.get(&s) == Some(&1)),
        "B's stragglers on A once"
    );
    // (records B's consumers processed go to A only above a partition's ack frontier: the
    // held record kept one back, so `unconsumed` starts there; A settles them from B's
    // progress and never delivers them, below)
    assert!(
        (2000..2050).all(|s| counts.get(&s).is_none_or(|n| *n == 1)),
        "B's processed records on A at most once"
    );
    // consumers return to A: they get B's stragglers only. A's own records were processed
    // once, on A before the loss or on B during the failover (B handed their acks back)
    let back_on_a = process(&a, "orders", 10_000).await;
    let back: BTreeSet<u64> = back_on_a.iter().copied().collect();
    assert_eq!(
        back,
        (3000..3030).chain([held_seq]).collect(),
        "after the failback A's consumers get only what nobody processed"
    );
    // producers back on A; the B→A link drained, it goes
    let r = call(&b, Method::DELETE, "/v1/topics/orders/children/back", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // and A is B's copy source again: A→B attaches now that B mirrors nowhere, and B (demoted
    // at epoch 1) becomes A's mirror at epoch 2
    attach(&a, "orders", "dr", "b", "orders", "attach").await;
    assert_eq!(role_of(&b, "orders").await, ("mirror".into(), 2));
    // (the forged-origin rule still holds on A after all this)
    let forged = json!({"messages": [{"payload": {"seq": 1}, "headers": {"narad-origin": "0000000000000001/0000000000000001/0/0"}}]});
    let r = call_as(
        &a,
        ("x", "x's password!"),
        Method::POST,
        "/v1/topics/orders/produce/batch",
        Some(forged),
    )
    .await;
    expect_error(r, StatusCode::FORBIDDEN, "forbidden").await;
}

/// An old primary that takes no produces learns from its own consumers' progress that its
/// mirror was promoted, and stops leasing: no produce has to come first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_old_primary_is_fenced_by_its_progress() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let a = source(dir.path(), port_of(&b)).await;
    create_topic(&a, "orders", 2).await;
    add_remote(&a, "b", port_of(&b), &ca).await;
    attach(&a, "orders", "to-b", "b", "orders", "attach").await;
    assert_eq!(produce_seqs(&a, "orders", 0..20).await.len(), 20);
    caught_up(&a, "the copy caught up").await;
    let r = call(&b, Method::POST, "/v1/topics/orders/promote", None).await;
    json_of(r, StatusCode::OK).await;
    // nothing is produced to A: its link hears `fenced` on its next progress
    until("A demoted itself", async || {
        role_of(&a, "orders").await.0 == "demoted"
    })
    .await;
    expect_read_only(&a, "orders").await;
}

/// An attach this cluster refuses changes nothing on the remote: the checks' last step
/// makes the target topic the parent's mirror, so every local refusal comes before them (a
/// refused attach had left the target read-only, its producers and consumers refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attach_leaves_the_target_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let a = source(dir.path(), port_of(&b)).await;
    for name in ["p", "q"] {
        let r = call(
            &a,
            Method::POST,
            "/v1/topics",
            Some(json!({"name": name, "partitions": 1})),
        )
        .await;
        json_of(r, StatusCode::CREATED).await;
    }
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/p/children",
        Some(json!({"child": "q"})),
    )
    .await;
    json_of(r, StatusCode::OK).await;
    add_remote(&a, "b", port_of(&b), &ca).await;
    // a fan-out child takes no children; a parent has a child of that name already
    for (parent, child) in [("q", "dr"), ("p", "q")] {
        let r = call(
            &a,
            Method::POST,
            &format!("/v1/topics/{parent}/children"),
            Some(json!({"child": child, "remote": "b", "remote_topic": "orders"})),
        )
        .await;
        expect_error(r, StatusCode::CONFLICT, "fanout_conflict").await;
        assert_eq!(role_of(&b, "orders").await, ("primary".into(), 0));
    }
    assert_eq!(produce_seqs(&b, "orders", 0..1).await.len(), 1);
    // two attaches racing for one child name, to two topics: one wins, the other's target
    // is left as it was
    create_topic(&b, "other", 1).await;
    let r = call(
        &b,
        Method::POST,
        "/v1/users",
        Some(
            json!({"username": "mirror2", "password": MIRROR_PW, "grants": [
                {"action": "produce", "patterns": ["other"]},
                {"action": "replicate", "patterns": ["other"]},
            ]}),
        ),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes",
        Some(json!({"name": "b2", "url": format!("https://127.0.0.1:{}", port_of(&b)), "username": "mirror2", "password": MIRROR_PW, "ca_pem": ca})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let race = |remote: &'static str, topic: &'static str| {
        call(
            &a,
            Method::POST,
            "/v1/topics/p/children",
            Some(json!({"child": "race", "remote": remote, "remote_topic": topic})),
        )
    };
    let (one, two) = tokio::join!(race("b", "orders"), race("b2", "other"));
    let won: Vec<bool> = [one.status(), two.status()]
        .iter()
        .map(|s| *s == StatusCode::OK)
        .collect();
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    let (winner, loser) = if won[0] {
        ("orders", "other")
    } else {
        ("other", "orders")
    };
    assert_eq!(role_of(&b, winner).await.0, "mirror");
    assert_eq!(role_of(&b, loser).await, ("primary".into(), 0));
}

/// A planned switchover whose new primary is killed (-9). Killed while its promote waits for
/// the drain, nothing changed: after a restart it is still the mirror, and the same command
/// promotes it. Killed the moment it answered, what the old primary's consumers processed
/// stays settled (the promote made it durable before the role changed): none of it is
/// delivered again, and nothing else is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_survives_a_kill_of_the_new_primary() {
    let dir = tempfile::tempdir().unwrap();
    let relay = Relay::start(0).await;
    // (B writes its queue state seldom: only the promote itself can have made its settles
    // durable before the kill)
    let (mut b, ca) = target_with(dir.path(), &[("NARAD_ACK_FLUSH_INTERVAL_MS", "60000")]).await;
    relay.set_target(port_of(&b));
    let a = source(dir.path(), relay.port).await;
    create_topic(&a, "orders", 2).await;
    add_remote(&a, "b", relay.port, &ca).await;
    attach(&a, "orders", "dr", "b", "orders", "attach").await;
    assert_eq!(produce_seqs(&a, "orders", 0..400).await.len(), 400);
    let processed_on_a: HashSet<u64> = process(&a, "orders", 300).await.into_iter().collect();
    until("A's copy and its progress on B", async || {
        lag(&a, "orders").await.0 == 0 && settled_on(&b, "orders").await == 300
    })
    .await;
    // killed while its promote waits (A is still the primary: nothing is drained)
    let pid = b.child.as_ref().unwrap().id().to_string();
    let waiting = b
        .http
        .post(b.url("/v1/topics/orders/promote?wait_drained=true&timeout_ms=30000"))
        .basic_auth("admin", Some(ROOT_PW))
        .send();
    let kill = async {
        until("the promote waits for the drain", async || {
            b.log()
                .contains("the promote waits until its source is drained")
        })
        .await;
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap();
        assert!(killed.success());
    };
    let (answer, ()) = tokio::join!(waiting, kill);
    assert!(answer.is_err(), "a killed promote answered: {answer:?}");
    b.kill9();
    b.restart().await;
    relay.set_target(port_of(&b));
    assert_eq!(role_of(&b, "orders").await, ("mirror".into(), 0));
    // the planned switchover, again: A stops taking produces, B waits for its last records
    // and acks, and is killed the moment it answers
    let v = switch_over(&a, &b).await;
    b.kill9();
    assert_eq!(v["report"]["drained"], true, "{v}");
    b.restart().await;
    assert_eq!(role_of(&b, "orders").await, ("primary".into(), 1));
    let on_b: Vec<u64> = process(&b, "orders", 10_000).await;
    let twice: Vec<u64> = on_b
        .iter()
        .copied()
        .filter(|s| processed_on_a.contains(s))
        .collect();
    assert!(twice.is_empty(), "processed on A and again on B: {twice:?}");
    let all: BTreeSet<u64> = on_b.iter().copied().chain(processed_on_a).collect();
    assert_eq!(all, (0..400).collect(), "every record processed once");
}

/// Re-protection: B mirrors A and has a link of its own to C, set up in peacetime. While B
/// is a mirror the link holds A's records (its lag counts them: they are not on C); once A
/// is lost and B promoted, they go to C with B's own, each once, naming B as its origin and
/// A as its earlier hop, and B's consumers' progress follows them there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_copy_protects_what_it_inherited_on_a_third_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (c, c_ca) = target(&sub(dir.path(), "third")).await;
    let (b, b_ca) = copy_linking_to(dir.path(), port_of(&c)).await;
    let mut a = source(dir.path(), port_of(&b)).await;
    create_topic(&a, "orders", 2).await;
    add_remote(&a, "b", port_of(&b), &b_ca).await;
    attach(&a, "orders", "dr", "b", "orders", "attach").await;
    assert_eq!(produce_seqs(&a, "orders", 0..300).await.len(), 300);
    let processed_on_a: HashSet<u64> = process(&a, "orders", 100).await.into_iter().collect();
    until("A's copy and its progress on B", async || {
        lag(&a, "orders").await.0 == 0 && settled_on(&b, "orders").await == 100
    })
    .await;
    // peacetime: B's own link to C; B is a mirror, so A's records wait (and show as lag)
    add_remote(&b, "c", port_of(&c), &c_ca).await;
    attach(&b, "orders", "onward", "c", "orders", "earliest").await;
    until("B's link to C stands by with A's records", async || {
        lag(&b, "orders").await == (300, "standby".into())
    })
    .await;
    assert!(replay_all(&c, "orders", 2).await.is_empty());
    // A is lost; B is promoted and its link forwards what it inherited
    a.kill9();
    let r = call(&b, Method::POST, "/v1/topics/orders/promote", None).await;
    assert_eq!(json_of(r, StatusCode::OK).await["failover"]["epoch"], 1);
    caught_up(&b, "B's link to C caught up").await;
    let on_b = replay_all(&b, "orders", 2).await;
    let a_cluster = on_b[0].3.split('/').next().unwrap().to_owned();
    let mut on_c = Vec::new();
    for p in 0..2 {
        let mut offset = 0;
        loop {
            let r = call(
                &c,
                Method::GET,
                &format!("/v1/topics/orders/consume?partition={p}&offset={offset}&max=100"),
                None,
            )
            .await;
            if r.status() == StatusCode::NO_CONTENT {
                break;
            }
            let v = json_of(r, StatusCode::OK).await;
            for m in v["messages"].as_array().unwrap() {
                offset = m["offset"].as_u64().unwrap() + 1;
                on_c.push(m.clone());
            }
        }
    }
    let seqs: BTreeSet<u64> = on_c
        .iter()
        .map(|m| m["payload"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(on_c.len(), 300, "each of A's records once on C");
    assert_eq!(seqs, (0..300).collect());
    let b_cluster = on_c[0]["headers"]["narad-origin"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    assert_ne!(b_cluster, a_cluster);
    for m in &on_c {
        let origin = m["headers"]["narad-origin"].as_str().unwrap();
        let via = m["headers"]["narad-via"].as_str().unwrap();
        assert!(origin.starts_with(&format!("{b_cluster}/")), "{m}");
        assert!(via.starts_with(&format!("{a_cluster}/")), "{m}");
        assert!(!via.contains(','), "one earlier hop: {m}");
    }
    assert_eq!(role_of(&c, "orders").await, ("mirror".into(), 1));
    // B's consumers take what A's had not processed; B's progress settles it all on C
    let on_b_processed: BTreeSet<u64> = process(&b, "orders", 10_000).await.into_iter().collect();
    assert_eq!(
        on_b_processed,
        (0..300).filter(|s| !processed_on_a.contains(s)).collect()
    );
    until("B's progress settled every record on C", async || {
        settled_on(&c, "orders").await == 300
    })
    .await;
    // (when the mirror last heard its source's progress: what the stale-progress alert reads)
    assert!(
        metrics_text(&c)
            .await
            .lines()
            .any(|l| l.starts_with("narad_mirror_progress_timestamp_seconds{topic=\"orders\"} ")),
        "C shows when its progress came"
    );
    // and B, promoted, no longer expects any
    assert!(
        !metrics_text(&b)
            .await
            .contains("narad_mirror_progress_timestamp_seconds{topic=\"orders\"}"),
        "B was promoted"
    );
    // B's own records follow
    assert_eq!(produce_seqs(&b, "orders", 300..350).await.len(), 50);
    until("B's own records on C", async || {
        lag(&b, "orders").await == (0, "running".into())
            && replay_all(&c, "orders", 2).await.len() == 350
    })
    .await;
    // the hops a record went through come only from a link, in the one form a link
    // writes, and never name the cluster that takes them
    create_topic(&b, "plain", 1).await;
    let r = call(
        &b,
        Method::POST,
        "/v1/users",
        Some(json!({"username": "p", "password": "p's password, long enough", "grants": [{"action": "produce", "patterns": ["plain"]}]})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let foreign = "00000000000000aa/00000000000000bb/0/1";
    let with = |headers: Value| json!({"messages": [{"payload": {"seq": 1}, "headers": headers}]});
    let r = call_as(
        &b,
        ("p", "p's password, long enough"),
        Method::POST,
        "/v1/topics/plain/produce/batch",
        Some(with(json!({"Narad-Via": foreign}))),
    )
    .await;
    expect_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    for bad in [
        json!({"narad-via": foreign}),
        json!({"narad-origin": foreign, "narad-via": "not an origin"}),
        json!({"narad-origin": foreign, "narad-via": ([foreign; 8].join(","))}),
    ] {
        let r = call(
            &b,
            Method::POST,
            "/v1/topics/plain/produce/batch",
            Some(with(bad)),
        )
        .await;
        expect_error(r, StatusCode::BAD_REQUEST, "invalid_headers").await;
    }
    let own_hop = format!("{b_cluster}/00000000000000bb/0/1");
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/plain/produce/batch",
        Some(with(
            json!({"narad-origin": foreign, "narad-via": format!("{foreign},{own_hop}")}),
        )),
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "loop_detected").await;
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/plain/produce/batch",
        Some(with(
            json!({"narad-origin": foreign, "narad-via": ([foreign; 7].join(","))}),
        )),
    )
    .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}

/// A copy with a link of its own onward: a primary that ships onward is not made another's
/// mirror (the loop rule), but once demoted it is, and its link then stands by with what it
/// mirrors and forwards it once it is promoted. So re-protection can be set up in either
/// order, and a failback's old primary can protect itself again on a copy that kept its own
/// onward link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_copy_with_a_link_onward_becomes_a_mirror_again() {
    let dir = tempfile::tempdir().unwrap();
    let (c, c_ca) = target(&sub(dir.path(), "third")).await;
    let (b, b_ca) = copy_linking_to(dir.path(), port_of(&c)).await;
    let a = source(dir.path(), port_of(&b)).await;
    create_topic(&a, "orders", 2).await;
    // B's link to C first, while B is a primary with records of its own
    add_remote(&b, "c", port_of(&c), &c_ca).await;
    attach(&b, "orders", "onward", "c", "orders", "attach").await;
    assert_eq!(produce_seqs(&b, "orders", 1000..1010).await.len(), 10);
    caught_up(&b, "B's own records on C").await;
    // more of B's own records wait behind a paused link
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/orders/children/onward/pause",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(produce_seqs(&b, "orders", 1010..1015).await.len(), 5);
    // A→B would make a primary that ships onward a mirror: refused, nothing changed
    add_remote(&a, "b", port_of(&b), &b_ca).await;
    let refused_attach = async || {
        let r = call(
            &a,
            Method::POST,
            "/v1/topics/orders/children",
            Some(json!({"child": "dr", "remote": "b", "remote_topic": "orders", "from": "attach"})),
        )
        .await;
        json_of(r, StatusCode::CONFLICT).await
    };
    let v = refused_attach().await;
    assert_eq!(v["code"], "loop_detected", "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("demote it there first")),
        "{v}"
    );
    assert_eq!(role_of(&b, "orders").await, ("primary".into(), 0));
    // demoted, B still owes C its tail: as A's mirror it could never ship it, so not yet
    let r = call(&b, Method::POST, "/v1/topics/orders/demote", None).await;
    json_of(r, StatusCode::OK).await;
    let v = refused_attach().await;
    assert_eq!(v["code"], "remote_check_failed", "{v}");
    assert_eq!(role_of(&b, "orders").await, ("demoted".into(), 0));
    let r = call(
        &b,
        Method::POST,
        "/v1/topics/orders/children/onward/resume",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    caught_up(&b, "B's tail on C").await;
    // then B becomes A's mirror; its link to C stands by with A's records
    attach(&a, "orders", "dr", "b", "orders", "attach").await;
    assert_eq!(role_of(&b, "orders").await.0, "mirror");
    assert_eq!(produce_seqs(&a, "orders", 0..50).await.len(), 50);
    until("B's link to C stands by with A's records", async || {
        lag(&a, "orders").await.0 == 0 && lag(&b, "orders").await == (50, "standby".into())
    })
    .await;
    // (every check of the attach passes again, as at a resume: B's link goes elsewhere)
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes/b/test?topic=orders&parent=orders",
        None,
    )
    .await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(v["state"], "running", "{v}");
    // B promoted: A's records go on to C, each once, beside B's own
    let r = call(&b, Method::POST, "/v1/topics/orders/promote", None).await;
    json_of(r, StatusCode::OK).await;
    caught_up(&b, "A's records on C").await;
    let on_c: Vec<u64> = replay_all(&c, "orders", 2)
        .await
        .iter()
        .map(|r| r.2)
        .collect();
    let set: BTreeSet<u64> = on_c.iter().copied().collect();
    assert_eq!(on_c.len(), 65, "each once: {on_c:?}");
    assert_eq!(set, (0..50).chain(1000..1015).collect());
}

/// A planned switchover twice along a chain, then back to the start: A→B→C (B's link to C
/// set up in peacetime), A demoted and B promoted, B demoted and C promoted, then C→A and A
/// promoted. Records of A's processed on B or on C reach A as processed, though they came
/// back through a hop in between (their origin names B, A is an earlier hop): A's
/// consumers get only what nobody processed (before, the acks of records whose origin did
/// not name A itself were not handed back, and A processed them again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failback_along_a_chain_hands_back_what_was_processed_two_hops_away() {
    let dir = tempfile::tempdir().unwrap();
    let (to_a, to_b, to_c) = (
        Relay::start(0).await,
        Relay::start(0).await,
        Relay::start(0).await,
    );
    let peer = |secret: &'static str, port: u16| {
        vec![
            ("NARAD_CLUSTER_SECRET", secret),
            (
                "NARAD_REMOTES_ALLOWED_PORTS",
                Box::leak(port.to_string().into_boxed_str()) as &str,
            ),
            ("NARAD_REMOTES_ALLOW_ADDRESSES", "127.0.0.0/8"),
        ]
    };
    let (c, c_ca) = target_with(
        &sub(dir.path(), "third"),
        &peer("the third cluster's own secret, 32+ bytes", to_a.port),
    )
    .await;
    let (b, b_ca) = target_with(
        dir.path(),
        &peer("the copy cluster's own secret, 32+ bytes", to_c.port),
    )
    .await;
    let (a, a_ca) = tls_node(dir.path(), "a", SECRET, to_b.port).await;
    to_a.set_target(port_of(&a));
    to_b.set_target(port_of(&b));
    to_c.set_target(port_of(&c));
    for (body, path) in [
        (json!({"name": "orders", "partitions": 2}), "/v1/topics"),
        (
            json!({"username": "mirror", "password": MIRROR_PW, "grants": [
                {"action": "produce", "patterns": ["orders"]},
                {"action": "replicate", "patterns": ["orders"]},
            ]}),
            "/v1/users",
        ),
    ] {
        json_of(
            call(&a, Method::POST, path, Some(body)).await,
            StatusCode::CREATED,
        )
        .await;
    }
    for (on, name, relay, ca) in [
        (&a, "b", &to_b, &b_ca),
        (&b, "c", &to_c, &c_ca),
        (&c, "a", &to_a, &a_ca),
    ] {
        let r = call(
            on,
            Method::POST,
            "/v1/remotes",
            Some(json!({"name": name, "url": format!("https://127.0.0.1:{}", relay.port), "username": "mirror", "password": MIRROR_PW, "ca_pem": ca})),
        )
        .await;
        json_of(r, StatusCode::CREATED).await;
    }
    attach(&a, "orders", "dr", "b", "orders", "attach").await;
    attach(&b, "orders", "onward", "c", "orders", "earliest").await;
    assert_eq!(produce_seqs(&a, "orders", 0..100).await.len(), 100);
    let mut processed: Vec<u64> = process(&a, "orders", 30).await;
    until("A's copy and its progress on B", async || {
        lag(&a, "orders").await.0 == 0 && settled_on(&b, "orders").await == 30
    })
    .await;
    // A → B
    json_of(
        call(&a, Method::POST, "/v1/topics/orders/demote", None).await,
        StatusCode::OK,
    )
    .await;
    let promote = "/v1/topics/orders/promote?wait_drained=true&timeout_ms=30000";
    let v = json_of(call(&b, Method::POST, promote, None).await, StatusCode::OK).await;
    assert_eq!(v["report"]["drained"], true, "{v}");
    processed.extend(process(&b, "orders", 20).await);
    until("B's copy and its progress on C", async || {
        lag(&b, "orders").await == (0, "running".into()) && settled_on(&c, "orders").await == 50
    })
    .await;
    // B → C
    json_of(
        call(&b, Method::POST, "/v1/topics/orders/demote", None).await,
        StatusCode::OK,
    )
    .await;
    let v = json_of(call(&c, Method::POST, promote, None).await, StatusCode::OK).await;
    assert_eq!(v["report"]["drained"], true, "{v}");
    processed.extend(process(&c, "orders", 25).await);
    // C → A: A (demoted, its link drained) becomes C's mirror, then is promoted back
    let r = call(&a, Method::DELETE, "/v1/topics/orders/children/dr", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    attach(&c, "orders", "back", "a", "orders", "unconsumed").await;
    json_of(
        call(&c, Method::POST, "/v1/topics/orders/demote", None).await,
        StatusCode::OK,
    )
    .await;
    let v = json_of(call(&a, Method::POST, promote, None).await, StatusCode::OK).await;
    assert_eq!(v["report"]["drained"], true, "{v}");
    let once: HashSet<u64> = processed.iter().copied().collect();
    assert_eq!(once.len(), 75, "each processed once so far");
    let back: BTreeSet<u64> = process(&a, "orders", 10_000).await.into_iter().collect();
    assert_eq!(
        back,
        (0..100).filter(|s| !once.contains(s)).collect(),
        "A's consumers get only what nobody processed"
    );
}

/// A link whose cursor started while its parent was a primary follows the parent to the
/// epoch a promote gives it, even when its target is down at the promote: once the target
/// is back the link brings it to the new epoch by itself (no pause or resume), and ships.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_follows_its_parent_to_a_new_epoch_once_its_target_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let to_c = Relay::start(0).await;
    let (mut c, c_ca) = target(&sub(dir.path(), "third")).await;
    to_c.set_target(port_of(&c));
    let (b, b_ca) = copy_linking_to(dir.path(), to_c.port).await;
    let a = source(dir.path(), port_of(&b)).await;
    create_topic(&a, "orders", 2).await;
    // B's link to C while B is a primary, then B becomes A's mirror
    add_remote(&b, "c", to_c.port, &c_ca).await;
    attach(&b, "orders", "onward", "c", "orders", "attach").await;
    assert_eq!(produce_seqs(&b, "orders", 1000..1010).await.len(), 10);
    caught_up(&b, "B's own records on C").await;
    let r = call(&b, Method::POST, "/v1/topics/orders/demote", None).await;
    json_of(r, StatusCode::OK).await;
    add_remote(&a, "b", port_of(&b), &b_ca).await;
    attach(&a, "orders", "dr", "b", "orders", "attach").await;
    assert_eq!(produce_seqs(&a, "orders", 0..30).await.len(), 30);
    caught_up(&a, "A's records on B").await;
    // C is down when B is promoted: the link cannot bring it to the new epoch then
    c.kill9();
    let r = call(&b, Method::POST, "/v1/topics/orders/promote", None).await;
    json_of(r, StatusCode::OK).await;
    assert_eq!(produce_seqs(&b, "orders", 2000..2020).await.len(), 20);
    until("B's gate for C open", async || {
        metrics_text(&b)
            .await
            .lines()
            .any(|l| l == "narad_remote_gates_open 1")
    })
    .await;
    c.restart().await;
    to_c.set_target(port_of(&c));
    caught_up(&b, "B's link followed B to its new epoch by itself").await;
    assert_eq!(role_of(&c, "orders").await, ("mirror".into(), 1));
    let on_c: BTreeSet<u64> = replay_all(&c, "orders", 2)
        .await
        .iter()
        .map(|r| r.2)
        .collect();
    assert_eq!(on_c, (0..30).chain(1000..1010).chain(2000..2020).collect());
}
