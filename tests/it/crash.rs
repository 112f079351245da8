//! kill -9 under load: every message that got a 202 must survive, and be delivered.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::*;

/// Ids whose produce got a 202, shared by the producer tasks.
type Acked = std::sync::Mutex<Vec<String>>;

async fn load(
    http: reqwest::Client,
    base: String,
    round: usize,
    acked: Arc<Acked>,
    run_for: Duration,
) -> (u64, u64) {
    let mut tasks = Vec::new();
    let stop_at = Instant::now() + run_for;
    for w in 0..6 {
        let (http, base, acked) = (http.clone(), base.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, 0u64);
            let mut i = 0u64;
            // keep sending through the kill: requests fail once the process is gone
            while Instant::now() < stop_at + Duration::from_secs(2) {
                i += 1;
                let ids: Vec<String> = if w % 3 == 0 {
                    (0..20).map(|j| format!("r{round}-w{w}-{i}-{j}")).collect()
                } else {
                    vec![format!("r{round}-w{w}-{i}")]
                };
                let req = if ids.len() == 1 {
                    http.post(format!("{base}/v1/topics/crash/produce?key={}", ids[0]))
                        .body(ids[0].clone())
                } else {
                    let msgs: Vec<Value> = ids
                        .iter()
                        .map(|id| json!({"payload": id, "payload_encoding": "utf8", "key": id}))
                        .collect();
                    http.post(format!("{base}/v1/topics/crash/produce/batch"))
                        .json(&json!({"messages": msgs}))
                };
                match req.timeout(Duration::from_secs(5)).send().await {
                    Ok(r) if r.status() == StatusCode::ACCEPTED => {
                        ok += ids.len() as u64;
                        acked.lock().unwrap().extend(ids);
                    }
                    Ok(r) => panic!("unexpected status {}", r.status()),
                    Err(_) => {
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (ok, failed)
        }));
    }
    let mut totals = (0, 0);
    for t in tasks {
        let (ok, failed) = t.await.unwrap();
        totals.0 += ok;
        totals.1 += failed;
    }
    totals
}

/// Reads every partition from offset 0 with replay reads and returns the payload strings.
async fn replay_all(s: &Server) -> Vec<String> {
    let v: Value = s.get("/v1/topics/crash").await.json().await.unwrap();
    let mut out = Vec::new();
    for p in v["partition_stats"].as_array().unwrap() {
        let (part, end) = (
            p["partition"].as_u64().unwrap(),
            p["next_offset"].as_u64().unwrap(),
        );
        let mut next = 0;
        while next < end {
            let m = s
                .consume("crash", &format!("?partition={part}&offset={next}&max=100"))
                .await
                .unwrap();
            for m in m["messages"].as_array().unwrap() {
                out.push(m["payload"].as_str().unwrap().to_owned());
                next = m["offset"].as_u64().unwrap() + 1;
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "crash", "partitions": 4}))
        .await;
    let acked: Arc<Acked> = Arc::default();
    for round in 0..3 {
        let kill_after = Duration::from_millis(600 + 300 * round as u64);
        let loader = tokio::spawn(load(
            s.http.clone(),
            s.base.clone(),
            round,
            acked.clone(),
            kill_after,
        ));
        tokio::time::sleep(kill_after).await;
        s.kill9();
        let (ok, failed) = loader.await.unwrap();
        println!("round {round}: {ok} messages got 202, {failed} requests failed around the kill");
        s.restart().await;
        let present: HashSet<String> = replay_all(&s).await.into_iter().collect();
        let acked_now = acked.lock().unwrap().clone();
        let missing: Vec<&String> = acked_now
            .iter()
            .filter(|id| !present.contains(*id))
            .collect();
        println!(
            "round {round}: {} acknowledged in total, {} stored, {} missing",
            acked_now.len(),
            present.len(),
            missing.len()
        );
        assert!(
            missing.is_empty(),
            "acknowledged messages lost after kill -9: {:?}",
            &missing[..missing.len().min(10)]
        );
        assert!(s.log().contains("narad ready"));
    }
    // and the queue delivers every one of them
    let mut delivered = HashSet::new();
    while let Some(v) = s.consume("crash", "?max=100").await {
        let mut handles = Vec::new();
        for m in v["messages"].as_array().unwrap() {
            delivered.insert(m["payload"].as_str().unwrap().to_owned());
            handles.push(m["receipt_handle"].as_str().unwrap().to_owned());
        }
        s.post_json("/v1/topics/crash/ack", &json!({"receipt_handles": handles}))
            .await;
    }
    let acked_all = acked.lock().unwrap().clone();
    let undelivered = acked_all
        .iter()
        .filter(|id| !delivered.contains(*id))
        .count();
    println!(
        "queue: {} acknowledged, {} delivered, {undelivered} undelivered",
        acked_all.len(),
        delivered.len()
    );
    assert_eq!(undelivered, 0);
}
