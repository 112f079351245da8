//! kill -9 under load, three times: every message that got a 2xx must survive and be
//! delivered, and the lifecycle checker must find redeliveries only inside fault windows.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_bench::lifecycle::{FaultKind, MsgId, Recorder};
use narad_bench::narad::Http;
use narad_bench::soak::parse_id;
use serde_json::{Value, json};

use crate::lifecycle::{addr, consume_and_ack, produce_recorded};
use crate::support::*;

/// Producers (single and batch-of-20) and consumers (consume + batch ack), all recorded, until
/// `run_for` plus 2 s: they keep going through the kill, failing while the process is gone.
async fn load(a: String, round: u64, rec: Arc<Recorder>, run_for: Duration) {
    let stop_at = Instant::now() + run_for + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for w in 0..6u64 {
        let (a, rec) = (a.clone(), rec.clone());
        tasks.push(tokio::spawn(async move {
            let mut http = Http::connect(&a).await.unwrap();
            let mut i = 0u64;
            while Instant::now() < stop_at {
                i += 1;
                // ids are unique across rounds and workers
                let base = (round << 40) | (w << 32) | (i << 5);
                let ids: Vec<MsgId> = if w % 3 == 0 {
                    (base..base + 20).collect()
                } else {
                    vec![base]
                };
                if !produce_recorded(&mut http, "crash", &rec, &ids).await {
                    poll_pause().await;
                }
            }
        }));
    }
    for r in 0..2u32 {
        let (a, rec) = (a.clone(), rec.clone());
        tasks.push(tokio::spawn(async move {
            let mut http = Http::connect(&a).await.unwrap();
            while Instant::now() < stop_at {
                let wait = Duration::from_millis(100);
                if consume_and_ack(&mut http, "crash", &rec, r, wait).await == 0 {
                    poll_pause().await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Reads every partition from offset 0 with replay reads and returns the message ids.
async fn replay_all(s: &Server) -> HashSet<MsgId> {
    let v: Value = s.get("/v1/topics/crash").await.json().await.unwrap();
    let mut out = HashSet::new();
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
                out.insert(parse_id(m["payload"].as_str().unwrap()).unwrap());
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
    // default visibility 30 s; acks are persisted every 100 ms, 1 s covers scheduling slack
    let rec = Arc::new(Recorder::new(
        Duration::from_secs(30),
        Duration::from_secs(1),
    ));
    for round in 0..3u64 {
        let kill_after = Duration::from_millis(600 + 300 * round);
        let loader = tokio::spawn(load(addr(&s), round, rec.clone(), kill_after));
        // chaos timing: the load runs this long, in real time, before the kill
        #[allow(clippy::disallowed_methods)]
        tokio::time::sleep(kill_after).await;
        let killed_at = rec.now();
        s.kill9();
        loader.await.unwrap();
        s.restart().await;
        rec.fault(FaultKind::Kill, killed_at, rec.now());
        let present = replay_all(&s).await;
        let accepted = rec.accepted_ids();
        let missing: Vec<&MsgId> = accepted.iter().filter(|id| !present.contains(id)).collect();
        println!(
            "round {round}: {} accepted so far, {} stored, {} missing; {:?}",
            accepted.len(),
            present.len(),
            missing.len(),
            rec.tally()
        );
        assert!(
            missing.is_empty(),
            "acknowledged messages lost after kill -9: {:?}",
            &missing[..missing.len().min(10)]
        );
        assert!(s.log().contains("narad ready"));
    }
    // drain: the queue delivers everything not yet acked
    let mut http = Http::connect(&addr(&s)).await.unwrap();
    while consume_and_ack(&mut http, "crash", &rec, 9, Duration::ZERO).await > 0 {}
    let report = rec.check();
    println!("{report}");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.tally.outstanding, 0, "{:?}", report.tally);
    assert!(
        report.tally.accepted > 1000,
        "load too small to mean anything"
    );
}

/// Issue 12: a message consumed and never acked (its consumer crashed) and then the broker
/// killed with SIGKILL: after the restart it comes back with its delivery count, not as new,
/// however many times that happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_counts_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "poison", "partitions": 1, "visibility_timeout_ms": 100}))
        .await;
    assert_eq!(
        s.produce("poison", "", "crashes its consumer")
            .await
            .status(),
        202
    );
    for expected in 1..=3 {
        let m = s.consume("poison", "?wait=5s").await.unwrap();
        assert_eq!(m["offset"], 0);
        assert_eq!(m["delivery_count"], expected, "{m}");
        s.kill9();
        s.restart().await;
    }
    // within one life the count goes on as before: the lease expires, the message returns
    let m = s.consume("poison", "?wait=5s").await.unwrap();
    assert_eq!(m["delivery_count"], 4);
    let m = s.consume("poison", "?wait=5s").await.unwrap();
    assert_eq!(m["delivery_count"], 5);
    let handle = m["receipt_handle"].as_str().unwrap().to_owned();
    assert_eq!(s.ack("poison", &handle, None).await, StatusCode::NO_CONTENT);
}

/// A second broker on a data directory another one serves refuses to start (it would hand
/// out the same offsets and replay and delete the first one's write-ahead log); the first
/// one goes on, with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_broker_on_the_same_data_directory_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t", "partitions": 1})).await;
    let r = s.post_json("/v1/topics/t/produce", &json!("before")).await;
    assert_eq!(r.status(), reqwest::StatusCode::ACCEPTED);
    let log = dir.path().join("second.log");
    let mut second = std::process::Command::new(BIN)
        .args(["server", "start", "--dev", "--port", "0", "--data-dir"])
        .arg(&s.data_dir)
        .arg("--addr-file")
        .arg(dir.path().join("second.addr"))
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.path().join("second.err")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the second broker kept running");
        poll_pause().await;
    };
    assert!(!status.success());
    let said = std::fs::read_to_string(&log).unwrap()
        + &std::fs::read_to_string(dir.path().join("second.err")).unwrap();
    assert!(said.contains("in use by another narad process"), "{said}");
    // and it left no address for a script waiting on --addr-file to find
    assert!(
        !dir.path().join("second.addr").exists(),
        "the refused broker wrote its --addr-file"
    );
    let r = s.post_json("/v1/topics/t/produce", &json!("after")).await;
    assert_eq!(r.status(), reqwest::StatusCode::ACCEPTED);
    s.kill9();
    s.restart().await;
    let got = s
        .consume("t", "?partition=0&offset=0&max=10")
        .await
        .expect("records");
    let payloads: Vec<&Value> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["payload"])
        .collect();
    assert_eq!(payloads, [&json!("before"), &json!("after")]);
}
