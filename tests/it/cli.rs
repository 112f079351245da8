//! The CLI against a live broker: topics, pub (single and batch), sub (--peek and acking),
//! replay.

use serde_json::Value;

use crate::support::*;

pub async fn narad(s: &Server, args: &[&str]) -> String {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("NARAD_ADDR", &s.base)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "narad {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn topic_pub_sub_replay() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let t: Value =
        serde_json::from_str(&narad(&s, &["topic", "add", "demo", "--partitions", "2"]).await)
            .unwrap();
    assert_eq!(t["partitions"], 2);
    assert!(narad(&s, &["topic", "ls"]).await.contains("demo"));
    let one: Value =
        serde_json::from_str(&narad(&s, &["pub", "demo", "first", "--partition", "0"]).await)
            .unwrap();
    assert_eq!(
        (one["partition"].as_u64(), one["offset"].as_u64()),
        (Some(0), Some(0))
    );
    narad(&s, &["pub", "demo", "{\"n\":1}", "--count", "9"]).await;
    narad(
        &s,
        &["pub", "demo", "batched", "--count", "20", "--batch", "10"],
    )
    .await;

    // --peek reads everything and reserves nothing
    let peeked = narad(&s, &["sub", "demo", "--peek", "--from", "0", "--max", "30"]).await;
    assert_eq!(peeked.lines().count(), 30);
    let info: Value = serde_json::from_str(&narad(&s, &["topic", "info", "demo"]).await).unwrap();
    let stats = info["partition_stats"].as_array().unwrap();
    assert_eq!(
        stats
            .iter()
            .map(|p| p["in_flight"].as_u64().unwrap())
            .sum::<u64>(),
        0
    );
    assert_eq!(
        stats
            .iter()
            .map(|p| p["next_offset"].as_u64().unwrap())
            .sum::<u64>(),
        30
    );

    // a real consumer leases and acks
    let consumed = narad(&s, &["sub", "demo", "--max", "30"]).await;
    assert_eq!(consumed.lines().count(), 30);
    assert!(
        consumed
            .lines()
            .all(|l| serde_json::from_str::<Value>(l).unwrap()["receipt_handle"].is_string())
    );
    let info: Value = serde_json::from_str(&narad(&s, &["topic", "info", "demo"]).await).unwrap();
    for p in info["partition_stats"].as_array().unwrap() {
        assert_eq!(p["frontier"], p["next_offset"], "everything acked: {p}");
    }

    let p0 = info["partition_stats"][0]["next_offset"].as_u64().unwrap();
    let replayed = narad(&s, &["replay", "demo", "--partition", "0", "--from", "0"]).await;
    assert_eq!(replayed.lines().count() as u64, p0);
    let first: Value = serde_json::from_str(replayed.lines().next().unwrap()).unwrap();
    assert_eq!(first["payload"], "first");

    narad(&s, &["topic", "rm", "demo"]).await;
    assert!(!narad(&s, &["topic", "ls"]).await.contains("demo"));
}

/// From the black-box review: valid JSON that an ordinary reader cannot hold (`1e400`, deep
/// nesting, a lone surrogate) made the CLI's `sub` and `replay` abort on every run, leaving the
/// good messages leased and unacked. Such payloads are served as text, and the CLI reads on.
#[tokio::test]
async fn the_cli_reads_past_payloads_a_strict_parser_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    narad(&s, &["topic", "add", "odd", "--partitions", "1"]).await;
    let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
    for p in [
        r#"{"good":1}"#,
        r#"{"n":1e400}"#,
        deep.as_str(),
        r#""\ud800""#,
        r#"{"good":3}"#,
    ] {
        let r = s.produce("odd", "", p.to_owned()).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    let out = narad(
        &s,
        &[
            "replay",
            "odd",
            "--partition",
            "0",
            "--from",
            "0",
            "--to",
            "5",
        ],
    )
    .await;
    assert!(
        out.contains("good\":3") || out.contains("\"good\": 3"),
        "{out}"
    );
    let out = narad(&s, &["sub", "odd", "--max", "10", "--idle-exit", "1"]).await;
    assert!(out.contains("1e400"), "{out}");
    let v: Value = s.get("/v1/topics/odd").await.json().await.unwrap();
    assert_eq!(
        v["partition_stats"][0]["unacked"], 0,
        "the CLI acked everything: {v}"
    );
}

#[tokio::test]
async fn cluster_status_on_a_single_node_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let out = narad(&s, &["cluster", "status"]).await;
    assert!(out.contains("single node"), "{out}");
}
