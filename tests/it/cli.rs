//! The CLI against a live broker: topics, pub (single and batch), sub (--peek and acking),
//! replay.

use serde_json::{Value, json};

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
    let t: Value = serde_json::from_str(
        &narad(
            &s,
            &["topic", "add", "demo", "--partitions", "2", "-o", "json"],
        )
        .await,
    )
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
    // and no more than --max, in one partition's batch too
    for max in ["5", "1"] {
        let peeked = narad(&s, &["sub", "demo", "--peek", "--from", "0", "--max", max]).await;
        assert_eq!(peeked.lines().count().to_string(), max, "{peeked}");
    }
    let info: Value =
        serde_json::from_str(&narad(&s, &["topic", "info", "demo", "--output", "json"]).await)
            .unwrap();
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
    let info: Value =
        serde_json::from_str(&narad(&s, &["topic", "info", "demo", "--output", "json"]).await)
            .unwrap();
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

/// The CLI reads and prints human units (as the original's did): flags take `30s`, `7d`,
/// `2MiB` (a plain number is milliseconds or bytes, as in the API), tables print them with
/// their columns under their headers, and `--output json` is the server's JSON as is.
#[tokio::test]
async fn the_cli_speaks_human_units_in_aligned_tables() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let shown = narad(
        &s,
        &[
            "topic",
            "add",
            "a-topic-with-a-long-name",
            "--retention",
            "12h",
            "--visibility",
            "45s",
            "--max-message-bytes",
            "2MiB",
            "--retention-bytes",
            "1GiB",
            "--delay",
            "1500ms",
        ],
    )
    .await;
    for line in [
        "visibility       45s",
        "retention        12h",
        "max message      2MiB",
        "delay            1500ms",
        "retention bytes  1GiB",
    ] {
        assert!(shown.contains(line), "{line:?} in:\n{shown}");
    }
    let t: Value = s
        .get("/v1/topics/a-topic-with-a-long-name")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            &t["retention_ms"],
            &t["visibility_timeout_ms"],
            &t["max_message_bytes"],
            &t["retention_bytes"],
            &t["delay_ms"]
        ),
        (
            &json!(43_200_000),
            &json!(45_000),
            &json!(2_097_152),
            &json!(1_073_741_824u64),
            &json!(1500)
        )
    );
    // a message's delay in units (and the old flag in milliseconds)
    narad(
        &s,
        &["pub", "a-topic-with-a-long-name", "later", "--delay", "10m"],
    )
    .await;
    narad(
        &s,
        &[
            "pub",
            "a-topic-with-a-long-name",
            "later",
            "--delay-ms",
            "600000",
        ],
    )
    .await;
    let r = s
        .get("/v1/topics/a-topic-with-a-long-name/consume?wait=0s")
        .await;
    assert_eq!(
        r.status(),
        StatusCode::NO_CONTENT,
        "both are ten minutes away"
    );
    // the old flag names and plain numbers still work
    narad(
        &s,
        &[
            "topic",
            "add",
            "b",
            "--retention-ms",
            "604800000",
            "--visibility-timeout-ms",
            "30000",
        ],
    )
    .await;
    narad(&s, &["topic", "edit", "b", "--retention", "forever"]).await;
    let ls = narad(&s, &["topic", "ls"]).await;
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 3, "{ls}");
    let at = |l: &str, text: &str| l.find(text).unwrap_or_else(|| panic!("{text:?} in {l:?}"));
    for col in ["PARTITIONS", "VISIBILITY", "RETENTION", "ROLE"] {
        let x = at(lines[0], col);
        for l in &lines[1..] {
            assert_ne!(l.as_bytes()[x], b' ', "a value under {col}: {ls}");
            assert_eq!(l.as_bytes()[x - 1], b' ', "starts under {col}: {ls}");
        }
    }
    assert!(
        lines[1].contains("45s") && lines[1].contains("12h") && lines[1].contains("2MiB"),
        "{ls}"
    );
    assert!(
        lines[2].contains("30s") && lines[2].contains("forever"),
        "{ls}"
    );
    let json: Value =
        serde_json::from_str(&narad(&s, &["topic", "ls", "--output", "json"]).await).unwrap();
    assert_eq!(json[0]["retention_ms"], 43_200_000, "{json}");
    // a unit it does not know is refused before anything is sent
    let out = tokio::process::Command::new(BIN)
        .args(["topic", "add", "c", "--retention", "3 weeks"])
        .env("NARAD_ADDR", &s.base)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the units are"),
        "{out:?}"
    );
    assert_eq!(s.get("/v1/topics/c").await.status(), StatusCode::NOT_FOUND);
}

/// A reader that stops reading (`narad -o json topic ls | head -c 10`) ends the CLI quietly:
/// `println!` used to panic on the closed pipe, with a backtrace.
#[tokio::test]
async fn a_reader_that_stops_reading_ends_the_cli_quietly() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    // more output than a pipe holds (64 KiB), so the CLI is still writing when it closes
    for i in 0..250 {
        s.create_topic(json!({"name": format!("topic-with-a-long-name-{i:04}"), "partitions": 1}))
            .await;
    }
    let mut child = tokio::process::Command::new(BIN)
        .args(["-o", "json", "topic", "ls"])
        .env("NARAD_ADDR", &s.base)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 10];
    out.read_exact(&mut first).await.unwrap();
    drop(out);
    let done = child.wait_with_output().await.unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(done.status.success(), "{:?}: {err}", done.status);
}

/// With no broker listening, a command says so plainly (and how to start one), not the
/// HTTP library's chain of errors.
#[tokio::test]
async fn no_broker_is_said_plainly() {
    // a port nobody listens on: bound, then closed
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = tokio::process::Command::new(BIN)
        .args(["topic", "ls"])
        .env("NARAD_ADDR", format!("http://127.0.0.1:{port}"))
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "no broker at http://127.0.0.1:{port}: is it running?"
        )) && err.contains("narad server start --dev"),
        "{err}"
    );
    // a bare host is the broker's port, not http's 80
    let out = tokio::process::Command::new(BIN)
        .args(["-s", "127.0.0.9", "topic", "ls"])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no broker at http://127.0.0.9:7942"), "{err}");
}

/// A dev broker's log written to a file (not a terminal) has no colour codes.
#[tokio::test]
async fn a_dev_log_to_a_file_is_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    narad(&s, &["topic", "add", "plain"]).await;
    let log = s.log();
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file: {log}");
}

/// Every command honours `-o`: JSON under `-o json` (parsable), a table or fields for a
/// person otherwise (never raw JSON).
#[tokio::test]
async fn every_command_honours_the_output_format() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let json = async |args: &[&str]| -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = narad(&s, &all).await;
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} -o json: {e}: {out}"))
    };
    let table = async |args: &[&str]| -> String {
        let out = narad(&s, args).await;
        assert!(
            !out.trim_start().starts_with('{') && !out.trim_start().starts_with('['),
            "{args:?} printed JSON for a table: {out}"
        );
        out
    };
    narad(&s, &["topic", "add", "p"]).await;
    narad(&s, &["topic", "add", "c"]).await;
    narad(&s, &["topic", "add", "d"]).await;
    assert_eq!(json(&["cluster", "status"]).await["single_node"], true);
    assert!(table(&["cluster", "status"]).await.contains("single node"));
    table(&["topic", "attach", "p", "c"]).await;
    json(&["topic", "attach", "p", "d", "--delay", "5s"]).await;
    let t = table(&["topic", "children", "p"]).await;
    assert!(
        t.contains("NAME") && t.contains("fan-out") && t.contains("delay") && t.contains("5s"),
        "{t}"
    );
    let v = json(&["topic", "children", "p"]).await;
    assert_eq!(v["children"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(
        json(&["topic", "detach", "p", "c"]).await,
        json!({"parent": "p", "detached": "c"})
    );
    assert!(
        table(&["topic", "detach", "p", "d"])
            .await
            .contains("detached d from p")
    );
    assert_eq!(json(&["topic", "rm", "d"]).await, json!({"deleted": "d"}));
}

/// What operators configure: the root password from a file, a config file's port kept when
/// no --port is given, and a rotation's previous-secret file that is gone is no reason not
/// to start.
#[tokio::test]
async fn operators_set_the_root_password_by_file_and_the_port_by_config() {
    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("admin-password");
    std::fs::write(&pw_file, "a password from a file\n").unwrap();
    let secure = dir.path().join("secure");
    std::fs::create_dir_all(&secure).unwrap();
    let s = Server::start_opts(
        &secure,
        false,
        &[
            ("NARAD_ADMIN_PASSWORD_FILE", pw_file.to_str().unwrap()),
            (
                "NARAD_CLUSTER_SECRET",
                "a cluster secret of at least 32 bytes!",
            ),
            (
                "NARAD_CLUSTER_SECRET_PREVIOUS_FILE",
                dir.path().join("gone").to_str().unwrap(),
            ),
        ],
        None,
    )
    .await;
    let r = call_as(
        &s,
        ("admin", "a password from a file"),
        reqwest::Method::GET,
        "/v1/topics",
        None,
    )
    .await;
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    assert!(
        s.log()
            .contains("cluster_secret_previous_file names no file")
    );
    // a config file's port, with no --port
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.path().join("narad.toml");
    std::fs::write(&cfg, format!("listen_addr = \"127.0.0.1:{port}\"\n")).unwrap();
    let addr_file = dir.path().join("c.addr");
    let mut child = tokio::process::Command::new(BIN)
        .args(["server", "start", "--dev", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("c"))
        .arg("--addr-file")
        .arg(&addr_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let addr = loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            break a;
        }
        assert!(std::time::Instant::now() < deadline, "never listened");
        poll_pause().await;
    };
    assert_eq!(addr.trim(), format!("127.0.0.1:{port}"));
    child.kill().await.unwrap();
}

/// `pub --rate` keeps several requests in flight, and says when it cannot reach the rate (a
/// million single messages a second is beyond any broker here).
#[tokio::test]
async fn a_rate_not_reached_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    narad(&s, &["topic", "add", "r"]).await;
    let out = tokio::process::Command::new(BIN)
        .args(["pub", "r", "x", "--count", "200", "--rate", "1000000"])
        .env("NARAD_ADDR", &s.base)
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("published 200 messages") && err.contains("--rate 1000000 was not reached"),
        "{err}"
    );
    let v: Value = s.get("/v1/topics/r").await.json().await.unwrap();
    let total: u64 = v["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 200);
}

/// A --server the CLI cannot use is said plainly: another scheme is refused, and https://
/// against a plain HTTP broker says to use http://.
#[tokio::test]
async fn a_server_address_the_cli_cannot_use_is_said_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let run = async |server: &str| {
        let out = tokio::process::Command::new(BIN)
            .args(["-s", server, "topic", "ls"])
            .output()
            .await
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("ftp://127.0.0.1:1").await;
    assert!(
        err.contains("must be http:// or https://, not ftp://"),
        "{err}"
    );
    let tls = s.base.replacen("http://", "https://", 1);
    let err = run(&tls).await;
    assert!(
        err.contains("does not speak TLS there: use http://"),
        "{err}"
    );
}
