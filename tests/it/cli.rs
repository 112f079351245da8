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
