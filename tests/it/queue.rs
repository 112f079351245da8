//! The queue contract over HTTP: leases, acks, extend, nack, long-poll, delays, restarts.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::*;

fn handle(m: &Value) -> String {
    m["receipt_handle"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn leases_acks_extend_nack() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t", "partitions": 1, "visibility_timeout_ms": 500}))
        .await;
    s.create_topic(json!({"name": "other", "partitions": 1}))
        .await;
    assert!(
        s.consume("t", "").await.is_none(),
        "empty topic: 204 at once"
    );
    s.produce("t", "", "a").await;
    let m = s.consume("t", "").await.unwrap();
    assert_eq!(m["delivery_count"], 1);
    let h1 = handle(&m);
    // lease expiry redelivers the same offset with a new handle; the old handle is stale
    let m2 = s.consume("t", "?wait=5s").await.unwrap();
    assert_eq!(m2["offset"], m["offset"]);
    assert_eq!(m2["delivery_count"], 2);
    let h2 = handle(&m2);
    assert_ne!(h1, h2);
    assert_eq!(s.ack("t", &h1, None).await, StatusCode::GONE);
    // handle of another topic
    assert_eq!(s.ack("other", &h2, None).await, StatusCode::GONE);
    expect_error(
        s.post("/v1/topics/t/ack?receipt_handle=bad").await,
        StatusCode::BAD_REQUEST,
        "invalid_receipt_handle",
    )
    .await;
    expect_error(
        s.post("/v1/topics/t/ack").await,
        StatusCode::BAD_REQUEST,
        "invalid_receipt_handle",
    )
    .await;
    expect_error(
        s.post(&format!(
            "/v1/topics/t/ack?receipt_handle={h2}&extend=later"
        ))
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_parameter",
    )
    .await;
    // extend keeps it ours past the original deadline
    assert_eq!(s.ack("t", &h2, Some("true")).await, StatusCode::NO_CONTENT);
    assert_eq!(s.ack("t", &h2, None).await, StatusCode::NO_CONTENT);
    assert_eq!(s.ack("t", &h2, None).await, StatusCode::GONE, "double ack");

    // nack releases at once with a new handle
    s.produce("t", "", "b").await;
    let m = s.consume("t", "").await.unwrap();
    assert_eq!(
        s.ack("t", &handle(&m), Some("0")).await,
        StatusCode::NO_CONTENT
    );
    let again = s.consume("t", "").await.unwrap();
    assert_eq!(again["offset"], m["offset"]);
    assert_eq!(s.ack("t", &handle(&m), None).await, StatusCode::GONE);
    // batch ack: two good, one stale
    s.produce("t", "", "c").await;
    let m3 = s.consume("t", "").await.unwrap();
    let r = s
        .post_json(
            "/v1/topics/t/ack",
            &json!({"receipt_handles": [handle(&again), handle(&m3), handle(&m)]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    let statuses: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [204, 204, 410]);
    let many: Vec<String> = (0..101).map(|_| "x".into()).collect();
    expect_error(
        s.post_json("/v1/topics/t/ack", &json!({"receipt_handles": many}))
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_batch",
    )
    .await;
    let v: Value = s.get("/v1/topics/t").await.json().await.unwrap();
    assert_eq!(v["partition_stats"][0]["frontier"], 3, "everything acked");
    assert_eq!(v["partition_stats"][0]["unacked"], 0);
}

#[tokio::test]
async fn long_poll_wakes_fast_and_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t"})).await;
    let url = s.url("/v1/topics/t/consume?wait=5s");
    let http = s.http.clone();
    let waiter = tokio::spawn(async move {
        let r = http.get(url).send().await.unwrap();
        (r.status(), Instant::now())
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v: Value = s.get("/v1/topics/t").await.json().await.unwrap();
        if v["waiters"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline);
        poll_pause().await;
    }
    let sent = Instant::now();
    s.produce("t", "", "wake").await;
    let (status, at) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let latency = at.duration_since(sent);
    println!("long-poll wake-up latency: {latency:?}");
    assert!(latency < Duration::from_secs(1), "woke after {latency:?}");

    let t0 = Instant::now();
    assert!(s.consume("t", "?wait=300ms").await.is_none());
    assert!(t0.elapsed() >= Duration::from_millis(300));
    let r = s.get("/v1/topics/t/consume?wait=1h").await;
    // no message: the clamped wait is reported; don't wait 20 s for it, a message ends it
    drop(r);
    expect_error(
        s.get("/v1/topics/t/consume?wait=abc").await,
        StatusCode::BAD_REQUEST,
        "invalid_parameter",
    )
    .await;
    expect_error(
        s.get("/v1/topics/t/consume?max=0").await,
        StatusCode::BAD_REQUEST,
        "invalid_parameter",
    )
    .await;
    expect_error(
        s.get("/v1/topics/t/consume?max=101").await,
        StatusCode::BAD_REQUEST,
        "invalid_parameter",
    )
    .await;
    expect_error(
        s.get("/v1/topics/t/consume?partition=3").await,
        StatusCode::BAD_REQUEST,
        "partition_out_of_range",
    )
    .await;
    expect_error(
        s.get("/v1/topics/nope/consume").await,
        StatusCode::NOT_FOUND,
        "topic_not_found",
    )
    .await;
}

#[tokio::test]
async fn wait_longer_than_the_limit_is_clamped_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), &[("NARAD_MAX_WAIT_MS", "200")]).await;
    s.create_topic(json!({"name": "t"})).await;
    let t0 = Instant::now();
    let r = s.get("/v1/topics/t/consume?wait=1h").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(r.headers()["x-narad-wait-clamped"], "200ms");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn in_flight_cap_and_batch_consume() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t", "partitions": 1, "max_in_flight_per_partition": 2}))
        .await;
    for i in 0..3 {
        s.produce("t", "", format!("{i}")).await;
    }
    let v = s.consume("t", "?max=10").await.unwrap();
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2, "capped at 2 in flight");
    assert!(s.consume("t", "").await.is_none());
    assert_eq!(
        s.ack("t", &handle(&msgs[1]), None).await,
        StatusCode::NO_CONTENT
    );
    let m = s.consume("t", "").await.unwrap();
    assert_eq!(m["offset"], 2);
    // out-of-order acks: the frontier catches up when the lowest is acked
    assert_eq!(s.ack("t", &handle(&m), None).await, StatusCode::NO_CONTENT);
    let v: Value = s.get("/v1/topics/t").await.json().await.unwrap();
    assert_eq!(v["partition_stats"][0]["frontier"], 0);
    assert_eq!(v["partition_stats"][0]["acked_ahead"], 2);
    assert_eq!(
        s.ack("t", &handle(&msgs[0]), None).await,
        StatusCode::NO_CONTENT
    );
    let v: Value = s.get("/v1/topics/t").await.json().await.unwrap();
    assert_eq!(v["partition_stats"][0]["frontier"], 3);
}

#[tokio::test]
async fn competing_consumers_never_share_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t", "partitions": 1})).await;
    let msgs: Vec<Value> = (0..200).map(|i| json!({"payload": i})).collect();
    s.post_json("/v1/topics/t/produce/batch", &json!({"messages": msgs}))
        .await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (http, base) = (s.http.clone(), s.base.clone());
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let r = http
                    .get(format!("{base}/v1/topics/t/consume?max=3"))
                    .send()
                    .await
                    .unwrap();
                if r.status() == StatusCode::NO_CONTENT {
                    return got;
                }
                let v: Value = r.json().await.unwrap();
                for m in v["messages"].as_array().unwrap() {
                    got.push(m["offset"].as_u64().unwrap());
                    let h = m["receipt_handle"].as_str().unwrap();
                    let st = http
                        .post(format!("{base}/v1/topics/t/ack?receipt_handle={h}"))
                        .send()
                        .await
                        .unwrap()
                        .status();
                    assert_eq!(st, StatusCode::NO_CONTENT);
                }
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(
        all,
        (0..200).collect::<Vec<u64>>(),
        "every offset exactly once"
    );
}

#[tokio::test]
async fn delayed_messages_are_never_early() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t", "partitions": 2})).await;
    let msgs: Vec<Value> = (0..40)
        .map(|i| json!({"payload": i, "delay_ms": 200 + (i % 4) * 150}))
        .collect();
    s.post_json("/v1/topics/t/produce/batch", &json!({"messages": msgs}))
        .await;
    s.produce("t", "", "now").await;
    let first = s.consume("t", "?max=100").await.unwrap();
    assert_eq!(
        first["messages"].as_array().unwrap().len(),
        1,
        "only the undelayed message is due"
    );
    let mut seen = 1;
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen < 41 {
        assert!(Instant::now() < deadline, "delayed messages never arrived");
        let Some(v) = s.consume("t", "?max=100&wait=2s").await else {
            continue;
        };
        let now = wall_clock_ms();
        for m in v["messages"].as_array().unwrap() {
            let due = m["timestamp_ms"].as_i64().unwrap() + m["delay_ms"].as_i64().unwrap_or(0);
            assert!(now >= due, "delivered {}ms early: {m}", due - now);
            seen += 1;
        }
    }
    // topic default delay applies when a message has none
    s.create_topic(json!({"name": "slow", "partitions": 1, "delay_ms": 300}))
        .await;
    let t0 = Instant::now();
    s.produce("slow", "", "x").await;
    assert!(s.consume("slow", "").await.is_none());
    s.consume("slow", "?wait=5s").await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn restart_redelivers_only_unacked_and_old_handles_are_stale() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t", "partitions": 1})).await;
    for i in 0..10 {
        s.produce("t", "", format!("{i}")).await;
    }
    let v = s.consume("t", "?max=10").await.unwrap();
    let msgs = v["messages"].as_array().unwrap().clone();
    for m in msgs
        .iter()
        .filter(|m| m["offset"].as_u64().unwrap() % 3 != 1)
    {
        assert_eq!(s.ack("t", &handle(m), None).await, StatusCode::NO_CONTENT);
    }
    s.stop().await;
    s.restart().await;
    let v = s.consume("t", "?max=10").await.unwrap();
    let offsets: Vec<u64> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(
        offsets,
        [1, 4, 7],
        "only unacked messages come back, at once"
    );
    assert_eq!(s.ack("t", &handle(&msgs[1]), None).await, StatusCode::GONE);
}
