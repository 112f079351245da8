//! Issue 11: what trying to break the broker found, each reproduced through the binary.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

/// Security 2: a payload serde_json's `Value` cannot hold (`1e400`, 129 nested arrays) was
/// accepted by produce and then panicked the batch reply builder, forever blocking the healthy
/// messages behind it. Payloads are served verbatim by every read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_payloads_are_served_verbatim_by_batch_reads() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "poison", "partitions": 1}))
        .await;
    let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
    let bodies = [
        r#"{"n":1e400}"#.to_owned(),
        deep.clone(),
        r#"{"ok":1}"#.to_owned(),
    ];
    for b in &bodies {
        let r = s.produce("poison", "", b.clone()).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    for path in [
        "/v1/topics/poison/consume?partition=0&offset=0&max=10",
        "/v1/topics/poison/consume?max=10",
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let text = r.text().await.unwrap();
        // every payload comes back byte for byte; JSON that an ordinary reader cannot hold
        // (1e400, 129 levels) is served as a string, so the whole reply reads with one
        let v: Value = serde_json::from_str(&text).expect("the reply reads as plain JSON");
        let got: Vec<String> = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| match &m["payload"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        assert_eq!(got, bodies, "{path}");
        assert!(text.contains(r#""payload":{"ok":1}"#), "{path}: {text}");
    }
}

/// Security 1: any method token became a metric label, even on requests answered 401/404, so
/// made-up methods grew the broker and `/metrics` without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_and_deleted_topics_leave_no_metric_series() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    for i in 0..200 {
        let m = Method::from_bytes(format!("MADEUP{i}").as_bytes()).unwrap();
        let r = s.http.request(m, s.url("/v1/topics")).send().await.unwrap();
        assert!(r.status().is_client_error(), "{}", r.status());
    }
    s.create_topic(json!({"name": "short-lived", "partitions": 1}))
        .await;
    assert_eq!(
        s.produce("short-lived", "", "x").await.status(),
        StatusCode::ACCEPTED
    );
    let m = s.consume("short-lived", "").await.unwrap();
    let h = m["receipt_handle"].as_str().unwrap();
    assert_eq!(s.ack("short-lived", h, None).await, StatusCode::NO_CONTENT);
    let r = s
        .http
        .delete(s.url("/v1/topics/short-lived"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let text = s.get("/metrics").await.text().await.unwrap();
    assert!(!text.contains("MADEUP"), "a made-up method became a label");
    assert!(text.contains(r#"method="other""#));
    assert!(
        !text.contains(r#"topic="short-lived""#),
        "a deleted topic kept its series"
    );
}

/// Security 6: segments, metadata and archived Parquet were readable by every local user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("NARAD_SEGMENT_MAX_BYTES", "4096"),
        ("NARAD_TIERING_INTERVAL_MS", "50"),
    ];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "private", "partitions": 2}))
        .await;
    for i in 0..200 {
        let r = s.produce("private", "", format!("{{\"i\":{i}}}")).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    // wait until the archive holds a Parquet object
    let deadline = Instant::now() + Duration::from_secs(30);
    let archive = s.data_dir.join("archive");
    loop {
        if walk(&archive)
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "parquet"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "nothing was archived");
        poll_pause().await;
    }
    let mut checked = 0;
    for p in walk(&s.data_dir) {
        // (a file the server renamed or deleted since the walk listed it: nothing to check)
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("{}: {e}", p.display()),
        };
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            assert_eq!(mode, 0o700, "{} is {mode:o}", p.display());
        } else {
            assert_eq!(mode & 0o077, 0, "{} is {mode:o}", p.display());
        }
        checked += 1;
    }
    assert!(checked > 10, "walked only {checked} entries");
}

fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// Bug 2: a kill -9 that tears the last record, whose payload (client bytes) holds valid
/// frames, made recovery find the inner frame and refuse to open the partition, so the broker
/// could not start at all. A torn frame is a torn tail whatever its payload holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_record_holding_frames_does_not_stop_a_restart() {
    use narad_core::record::NewRecord;
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "frames", "partitions": 1}))
        .await;
    for i in 0..3 {
        let r = s.produce("frames", "", format!("m{i}")).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    // a payload of frames with the very offsets that would follow it
    let mut forged = Vec::new();
    for o in 4..8 {
        NewRecord {
            payload: bytes::Bytes::from_static(b"forged"),
            ..Default::default()
        }
        .encode(o, 1, &mut forged);
    }
    forged.extend_from_slice(&[b'z'; 100]);
    let r = s.produce("frames", "", forged).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    s.stop().await;
    // the tear a crash mid-write leaves: the record's last bytes never reached the disk
    let seg = walk(&s.data_dir)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .unwrap();
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 50)
        .unwrap();
    s.restart().await;
    let r = s
        .get("/v1/topics/frames/consume?partition=0&offset=0&max=10")
        .await;
    let v: Value = r.json().await.unwrap();
    let payloads: Vec<&str> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["payload"].as_str().unwrap())
        .collect();
    assert_eq!(payloads, ["m0", "m1", "m2"]);
    let r = s.produce("frames", "", "after").await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["offset"], 3);
}

const ROOT_PW: &str = "root-password-1";
const PW: &str = "user-password-1";

/// Security 9 and 10: the audit line names the user changed (the JSON log wrote two `target`
/// keys and the module path won), and a child topic never reveals its parent's name to a user
/// who may not see the parent (topic JSON, or the error for producing to a delay child).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_names_the_user_and_children_hide_their_parent() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_opts(
        dir.path(),
        false,
        &[("NARAD_ADMIN_PASSWORD", ROOT_PW)],
        None,
    )
    .await;
    let admin = ("admin", ROOT_PW);
    let r = call_as(
        &s,
        admin,
        Method::POST,
        "/v1/users",
        Some(json!({"username": "auditee", "password": PW,
            "grants": [{"action": "produce", "patterns": ["pub-*"]},
                       {"action": "consume", "patterns": ["pub-*"]}]})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
    let line = s
        .log()
        .lines()
        .find(|l| l.contains(r#""component":"audit""#) && l.contains("user_create"))
        .map(str::to_owned)
        .expect("an audit line");
    let v: Value = serde_json::from_str(&line).unwrap();
    let fields = if v["fields"].is_object() {
        &v["fields"]
    } else {
        &v
    };
    assert_eq!(fields["subject"], "auditee", "{line}");
    assert_eq!(fields["actor"], "admin", "{line}");

    for body in [
        json!({"name": "secret-parent", "partitions": 1}),
        json!({"name": "pub-child", "partitions": 1, "parent": "secret-parent", "fanout_delay_ms": 1000}),
    ] {
        let r = call_as(&s, admin, Method::POST, "/v1/topics", Some(body)).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
    }
    let user = ("auditee", PW);
    let r = call_as(&s, user, Method::GET, "/v1/topics/pub-child", None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.unwrap();
    assert!(!text.contains("secret-parent"), "{text}");
    let r = call_as(&s, user, Method::GET, "/v1/topics", None).await;
    let text = r.text().await.unwrap();
    assert!(
        text.contains("pub-child") && !text.contains("secret-parent"),
        "{text}"
    );
    let r = s
        .http
        .post(s.url("/v1/topics/pub-child/produce"))
        .basic_auth(user.0, Some(user.1))
        .body("x")
        .send()
        .await
        .unwrap();
    let (st, text) = (r.status(), r.text().await.unwrap());
    assert!(st.is_client_error(), "{st}");
    assert!(!text.contains("secret-parent"), "{text}");
    // the admin, who may see both, is shown the link
    let r = call_as(&s, admin, Method::GET, "/v1/topics/pub-child", None).await;
    assert!(r.text().await.unwrap().contains("secret-parent"));
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kb * 1024
}

/// Bug 6: one-message produces into a 64-partition topic grew the broker by ~8 KB per
/// message (cached records kept the whole request buffer alive while the cache counted only
/// the payload, and the cache budget was per partition). Memory now follows the node-wide
/// `tail_cache_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_produces_into_many_partitions_stay_within_the_cache_budget() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("NARAD_TAIL_CACHE_BYTES", "4194304")];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "wide", "partitions": 64}))
        .await;
    let pid = s.child.as_ref().unwrap().id();
    // warm up: connections, partitions' files, allocator arenas
    for _ in 0..500 {
        let r = s.produce("wide", "", vec![b'w'; 256]).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    let before = rss_bytes(pid);
    let total = 24_000;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (http, url) = (s.http.clone(), s.url("/v1/topics/wide/produce"));
            tokio::spawn(async move {
                for _ in 0..total / 16 {
                    let r = http.post(&url).body(vec![b'm'; 256]).send().await.unwrap();
                    assert_eq!(r.status(), StatusCode::ACCEPTED);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let grown = rss_bytes(pid).saturating_sub(before);
    println!("RSS grew {} KiB over {total} produces", grown / 1024);
    // 4 MiB of cache plus allocator slack; before the fix this was ~8 KB per message
    assert!(
        grown < 48 << 20,
        "RSS grew {} MiB for {total} messages of 256 B",
        grown >> 20
    );
}

/// Bug 6: request bodies in flight have one node-wide budget; a request that does not fit
/// is answered 503 server_busy with Retry-After, and the budget comes back when the requests
/// holding it end (even by hanging up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_in_flight_have_a_node_budget() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("NARAD_MAX_BATCH_BYTES", "1048576"),
        ("NARAD_MAX_REQUEST_BYTES_IN_FLIGHT", "16777216"),
    ];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "budget", "partitions": 1}))
        .await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    // two producers send all but the last byte of 8 MiB bodies and stop: 16 MiB - 2 held
    // (bytes are counted as they arrive)
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/topics/budget/produce HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            8 << 20
        );
        c.write_all(head.as_bytes()).await.unwrap();
        let mut body = vec![b' '; (8 << 20) - 1];
        body[0] = b'[';
        c.write_all(&body).await.unwrap();
        holders.push(c);
    }
    // the server has counted both
    let deadline = Instant::now() + Duration::from_secs(20);
    while budget_in_use(&s).await != (16 << 20) - 2 {
        assert!(Instant::now() < deadline, "the budget never filled");
        poll_pause().await;
    }
    let r = s.produce("budget", "", "{\"small\":1}").await;
    assert!(r.headers().contains_key("retry-after"));
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "server_busy").await;
    drop(holders);
    loop {
        let r = s.produce("budget", "", "{\"small\":2}").await;
        if r.status() == StatusCode::ACCEPTED {
            break;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "the budget was never given back");
        poll_pause().await;
    }
}

/// Bug 4's class, for bodies: a client that announces a body and sends it slowly (or never)
/// is answered `408 body_timeout` in bounded time, and its share of the body budget returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_costs_bounded_time() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let env = [("NARAD_BODY_READ_TIMEOUT_MS", "500")];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "stall", "partitions": 1}))
        .await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    c.write_all(
        b"POST /v1/topics/stall/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"a\":",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = c.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
            if n == 0 || got.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "a stalled body held its request for 20 s");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(15));
    let r = s.produce("stall", "", "{\"after\":1}").await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}

/// Bytes of the node's body budget in use now (`narad_http_request_bytes_in_flight`).
fn budget_in(metrics: &str) -> u64 {
    sample(metrics, "narad_http_request_bytes_in_flight") as u64
}

async fn budget_in_use(s: &Server) -> u64 {
    budget_in(&s.get("/metrics").await.text().await.unwrap())
}

/// Polls until at least `at_least` bytes of the budget are in use, failing if ever
/// `below` or more are (a body counted for what it announced, not what it sent).
async fn wait_for_budget(s: &Server, at_least: u64, below: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held = budget_in_use(s).await;
        assert!(
            held < below,
            "bodies hold {held} bytes: more than they sent"
        );
        if held >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{held} bytes counted, not {at_least}"
        );
        poll_pause().await;
    }
}

/// Sends `head` and then `body` in `chunks` pieces `every` apart, and returns the reply's
/// status line, or what the connection gave before it closed.
async fn paced_request(
    addr: &str,
    head: &str,
    body: &[u8],
    chunks: usize,
    every: Duration,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = c.into_split();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if got.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&got).into_owned();
        text.lines().next().unwrap_or_default().to_owned()
    });
    wr.write_all(head.as_bytes()).await.unwrap();
    let size = body.len().div_ceil(chunks.max(1)).max(1);
    for piece in body.chunks(size) {
        if reader.is_finished() || wr.write_all(piece).await.is_err() {
            break;
        }
        // the client being slow on purpose, not a wait for a condition
        #[allow(clippy::disallowed_methods)]
        tokio::time::sleep(every).await;
    }
    tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .expect("no answer within 30 s")
        .unwrap()
}

/// A producer that announces a body and then stops, or sends it slower than
/// `body_min_bytes_per_s`, is cut after `body_grace_ms` (not after `body_read_timeout_ms`,
/// here a minute), so its connection and what it sent of the body budget come back; one
/// that sends in pauses but faster than that rate on average is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_behind_the_minimum_rate_is_cut_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("NARAD_BODY_GRACE_MS", "1500"),
        ("NARAD_BODY_MIN_BYTES_PER_S", "1000"),
    ];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "pace", "partitions": 1}))
        .await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    // announces a megabyte and sends 5 bytes: holds the 5 bytes until cut
    let stalled = {
        let addr = addr.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let head = "POST /v1/topics/pace/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{\"a\":";
            let line = paced_request(&addr, head, b"", 1, Duration::ZERO).await;
            (line, started.elapsed())
        })
    };
    wait_for_budget(&s, 5, 1_000_000).await;
    let (line, took) = stalled.await.unwrap();
    assert!(line.starts_with("HTTP/1.1 408"), "{line}");
    assert!(
        took < Duration::from_secs(20),
        "a stalled body held its request {took:?}"
    );
    // 3,000 bytes at ~300 B/s: behind 1,000 B/s once the grace is spent
    let body = format!("{{\"p\":\"{}\"}}", "x".repeat(2990));
    let head = format!(
        "POST /v1/topics/pace/produce HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let started = Instant::now();
    let line = paced_request(
        &addr,
        &head,
        body.as_bytes(),
        30,
        Duration::from_millis(333),
    )
    .await;
    assert!(
        line.starts_with("HTTP/1.1 408"),
        "a trickle was served: {line}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
    // 24,000 bytes in 6 pieces 400 ms apart (6,000 B/s, past the grace): served
    let body = format!("{{\"p\":\"{}\"}}", "y".repeat(23990));
    let head = format!(
        "POST /v1/topics/pace/produce HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let line = paced_request(&addr, &head, body.as_bytes(), 6, Duration::from_millis(400)).await;
    assert!(
        line.starts_with("HTTP/1.1 202"),
        "a paced body was cut: {line}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while budget_in_use(&s).await != 0 {
        assert!(Instant::now() < deadline, "the budget was not given back");
        poll_pause().await;
    }
}

/// Bug 3: with a 1 s visibility timeout, A leases and never acks, B long-polls and gets it at
/// ~1 s and never acks, C long-polls: C must get it when B's lease ends (~2 s), not a 204 when
/// its own wait runs out (leases made inside a dispatch did not re-arm the topic's timer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_expires_serves_the_reader_in_line() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "expiry", "partitions": 1, "visibility_timeout_ms": 1000}))
        .await;
    assert_eq!(
        s.produce("expiry", "", "x").await.status(),
        StatusCode::ACCEPTED
    );
    let started = Instant::now();
    let a = s.consume("expiry", "").await.expect("A leases");
    assert_eq!(a["delivery_count"], 1);
    let b = s
        .consume("expiry", "?wait=8s")
        .await
        .expect("B is served on expiry");
    assert_eq!(b["delivery_count"], 2);
    let c = s
        .consume("expiry", "?wait=8s")
        .await
        .expect("C was not served when B's lease ended");
    assert_eq!(c["delivery_count"], 3);
    // (C's wait alone would have run to ~1 s + 8 s)
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let text = s.get("/metrics").await.text().await.unwrap();
    assert!(
        text.contains(r#"narad_lease_expiries_total{topic="expiry"} 2"#),
        "expiries not counted when they happened"
    );
}

/// Bug 4's class, for responses: a client that asks for a large reply and never reads it is
/// disconnected once the socket has taken nothing for `response_write_timeout_ms`, and its
/// connection slot (and the reply's memory) come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_costs_bounded_time() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let env = [("NARAD_RESPONSE_WRITE_TIMEOUT_MS", "500")];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "unread", "partitions": 1, "max_message_bytes": 1048576}))
        .await;
    for i in 0..8 {
        let body = format!("\"{}{i}\"", "x".repeat(1_000_000));
        assert_eq!(
            s.produce("unread", "", body).await.status(),
            StatusCode::ACCEPTED
        );
    }
    let addr: std::net::SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut c = sock.connect(addr).await.unwrap();
    // ~4 MiB of replay, several times over, and never a byte read
    for _ in 0..4 {
        c.write_all(
            b"GET /v1/topics/unread/consume?partition=0&offset=0&max=100 HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await
        .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let closed = r#"narad_http_connections_closed_total{reason="write_timeout"} 1"#;
    while !s
        .get("/metrics")
        .await
        .text()
        .await
        .unwrap()
        .contains(closed)
    {
        assert!(
            Instant::now() < deadline,
            "a client that never reads kept its connection"
        );
        poll_pause().await;
    }
    drop(c);
}

/// From the black-box review: replies were capped by payload bytes only, so messages of one
/// byte of payload and 1 MiB of headers (escaped 6× in JSON) made a single replay reply of
/// hundreds of MiB. Replies are capped by what they weigh on the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_capped_by_their_size_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "heavy", "partitions": 1}))
        .await;
    let value = "\u{1}".repeat(16 * 1024);
    let headers: serde_json::Map<String, Value> =
        (0..64).map(|i| (format!("h{i}"), json!(value))).collect();
    // 6 MiB of request JSON per message (escaped), two per batch
    let msgs: Vec<Value> = (0..2)
        .map(|_| json!({"payload": 1, "headers": headers}))
        .collect();
    for _ in 0..10 {
        let r = s
            .post_json("/v1/topics/heavy/produce/batch", &json!({"messages": msgs}))
            .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{:?}", r.text().await);
    }
    for path in [
        "/v1/topics/heavy/consume?partition=0&offset=0&max=100",
        "/v1/topics/heavy/consume?max=100",
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status(), StatusCode::OK);
        let len = r.bytes().await.unwrap().len();
        // 4 MiB of weight plus one message (~6 MiB escaped), not 60 × 6 MiB
        assert!(len < 12 << 20, "{path}: a {} MiB reply", len >> 20);
    }
    // an escape-heavy text payload is served as base64, not 6× its size
    let r = s.produce("heavy", "", vec![1u8; 1 << 20]).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let v: Value = r.json().await.unwrap();
    let offset = v["offset"].as_u64().unwrap();
    let r = s
        .get(&format!(
            "/v1/topics/heavy/consume?partition=0&offset={offset}"
        ))
        .await;
    let text = r.text().await.unwrap();
    assert!(text.len() < (1 << 20) * 3 / 2, "{} bytes", text.len());
    assert!(text.contains(r#""payload_encoding":"base64""#));
}

/// From the black-box reviews: a body's `Content-Length` was reserved from the node's budget
/// before the route's limit or the caller's permission was checked, so 16 silent sockets of
/// any user held the whole budget; then produce routes alone reserved it (after the produce
/// grant), and 16 producers announcing 16 MiB and sending 3 bytes, reconnecting each time
/// they were cut, held it all the same. Every route now counts only bytes that arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_bodies_cannot_lock_out_producers() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("NARAD_MAX_BATCH_BYTES", "1048576"),
        ("NARAD_MAX_REQUEST_BYTES_IN_FLIGHT", "16777216"),
    ];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "open", "partitions": 1}))
        .await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    // many JSON-route bodies announced (even far over the route's limit) but not sent
    // hold nothing
    let mut holders = Vec::new();
    for _ in 0..32 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(b"POST /v1/topics HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n{")
            .await
            .unwrap();
        holders.push(c);
    }
    // and produce bodies announced at their routes' limits, a few bytes sent
    for path in ["produce", "produce/batch"] {
        for _ in 0..16 {
            let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "POST /v1/topics/open/{path} HTTP/1.1\r\nHost: x\r\nContent-Length: 16777216\r\n\r\n{{\"a\""
            );
            c.write_all(head.as_bytes()).await.unwrap();
            holders.push(c);
        }
    }
    // (each has been read as far as it was sent: 32 × 4 bytes)
    wait_for_budget(&s, 128, 1 << 20).await;
    let r = s.produce("open", "", "{\"still\":\"served\"}").await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let held = budget_in_use(&s).await;
    assert!(held < 4096, "announced bodies took budget: {held}");
    drop(holders);
}

/// A server with a 16 MiB budget (8 MiB of it the replies' share) and six 1 MB messages in
/// topic `big`.
async fn big_replies_server(dir: &std::path::Path, reply_stall_ms: &str) -> Server {
    let env = [
        ("NARAD_MAX_BATCH_BYTES", "1048576"),
        ("NARAD_MAX_REQUEST_BYTES_IN_FLIGHT", "16777216"),
        ("NARAD_REPLY_STALL_MS", reply_stall_ms),
    ];
    let s = Server::start_with(dir, &env).await;
    s.create_topic(json!({"name": "big", "partitions": 1, "max_message_bytes": 1048576}))
        .await;
    for i in 0..6 {
        let body = format!("\"{}{i}\"", "x".repeat(1_000_000));
        assert_eq!(
            s.produce("big", "", body).await.status(),
            StatusCode::ACCEPTED
        );
    }
    s
}

/// A connection with a small receive buffer that has asked for a ~4 MB replay of `big`.
async fn replay_reader(s: &Server) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let addr: std::net::SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut c = sock.connect(addr).await.unwrap();
    c.write_all(
        b"GET /v1/topics/big/consume?partition=0&offset=0&max=100 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await
    .unwrap();
    c
}

/// Four connections that each ask for a ~4 MB replay and read nothing of it (those replies
/// that fit in the share are held; the others are refused, or take the room of an earlier
/// one stalled for `reply_stall_ms`): returned once replies hold most of the share.
async fn unread_replies_hold_the_share(s: &Server) -> Vec<tokio::net::TcpStream> {
    let mut readers = Vec::new();
    for _ in 0..4 {
        readers.push(replay_reader(s).await);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held = budget_in_use(s).await;
        assert!(
            held <= 8 << 20,
            "replies hold {held} bytes, past their share"
        );
        if held > 7_000_000 {
            return readers;
        }
        assert!(
            Instant::now() < deadline,
            "unread replies hold {held} bytes"
        );
        poll_pause().await;
    }
}

/// From the black-box review: concurrent large replies had no node-wide bound (16 replays of
/// hundreds of MiB reached 10 GB). A reply's bytes are held against the same budget as
/// request bodies until written; a consume whose reply does not fit (its readers not stalled
/// for `reply_stall_ms`, here an hour) is answered 503 and its leases are given back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_in_flight_share_the_node_budget() {
    let dir = tempfile::tempdir().unwrap();
    let s = big_replies_server(dir.path(), "3600000").await;
    let readers = unread_replies_hold_the_share(&s).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = s.get("/v1/topics/big/consume?max=100").await;
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "server_busy").await;
    let v: Value = s.get("/v1/topics/big").await.json().await.unwrap();
    assert_eq!(v["partition_stats"][0]["in_flight"], 0, "leases kept: {v}");
    // and what replies cannot take is the producers' (a black-box review held the whole
    // budget with unread replies and refused every produce)
    let body = format!("\"{}\"", "p".repeat(1_000_000));
    assert_eq!(
        s.produce("big", "", body).await.status(),
        StatusCode::ACCEPTED
    );
    drop(readers);
    // the budget comes back and the messages are delivered, counted once
    loop {
        let r = s.get("/v1/topics/big/consume?max=1").await;
        if r.status() == StatusCode::OK {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["messages"][0]["delivery_count"], 1);
            break;
        }
        assert!(Instant::now() < deadline, "the budget never came back");
        poll_pause().await;
    }
}

/// From the fourth black-box review: readers that asked for replies and read nothing held
/// the replies' share until `response_write_timeout_ms` (a minute), and every other consume
/// and replay was 503 meanwhile. A reply that finds no room now closes the connection whose
/// reader has read nothing for longest, once it has for `reply_stall_ms`, and takes its room.
/// From the fifth: a connection so closed lived on as an orphan holding megabytes of its
/// reply in the kernel; it is now reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_without_room_takes_it_from_a_reader_that_stopped() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let s = big_replies_server(dir.path(), "600").await;
    let mut readers = unread_replies_hold_the_share(&s).await;
    // (the response write timeout, a minute, is far off)
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        // (503 while the readers have been stalled for less than 600 ms)
        let r = s.get("/v1/topics/big/consume?max=100").await;
        if r.status() == StatusCode::OK {
            break r.json::<Value>().await.unwrap();
        }
        expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "server_busy").await;
        assert!(
            Instant::now() < deadline,
            "no room was made for a reader that reads"
        );
        poll_pause().await;
    };
    let msgs = got["messages"].as_array().unwrap();
    assert!(!msgs.is_empty());
    assert!(msgs.iter().all(|m| m["delivery_count"] == 1), "{got:.200}");
    assert!(budget_in_use(&s).await <= 8 << 20, "past the share");
    let metrics = s.get("/metrics").await.text().await.unwrap();
    let cut = sample(
        &metrics,
        r#"narad_http_connections_closed_total{reason="stalled_reply"}"#,
    ) as u64;
    assert!(cut >= 1, "{cut}");
    // those readers' connections are reset (the kernel drops the rest of their replies, not
    // kept in an orphaned socket)
    let mut reset = 0;
    for c in &mut readers {
        let mut sink = vec![0u8; 1 << 16];
        loop {
            match tokio::time::timeout(Duration::from_millis(500), c.read(&mut sink)).await {
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    reset += 1;
                    break;
                }
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(_)) => {}
                // open, its reply still coming (or a 503 kept alive): not one of them
                Err(_) => break,
            }
        }
    }
    assert!(reset as u64 >= cut.min(4), "{reset} of {cut} reset");
}

/// From the second black-box review: routes that need a body's content to check a permission
/// (creating a topic) count it as it arrives, so a user with no grants at all could fill the
/// node's byte budget with stalled bodies and starve every producer. One user now holds at
/// most a quarter of the budget (at least one largest body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_grants_cannot_starve_producers() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("NARAD_ADMIN_PASSWORD", ROOT_PW),
        ("NARAD_MAX_BATCH_BYTES", "1048576"),
        ("NARAD_MAX_REQUEST_BYTES_IN_FLIGHT", "16777216"),
    ];
    let s = Server::start_opts(dir.path(), false, &env, None).await;
    let admin = ("admin", ROOT_PW);
    let r = call_as(
        &s,
        admin,
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "t", "partitions": 1})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = call_as(
        &s,
        admin,
        Method::POST,
        "/v1/users",
        Some(json!({"username": "nog", "password": PW, "grants": []})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let auth = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("nog:{PW}")
        )
    );
    let addr = s.base.trim_start_matches("http://").to_owned();
    // 16 stalled bodies of ~1 MiB each: the whole 16 MiB budget if nothing capped them
    let mut stalled = Vec::new();
    for _ in 0..16 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/topics HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Length: 1048576\r\n\r\n"
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(&vec![b' '; 1_048_000]).await.unwrap();
        stalled.push(c);
    }
    // the server has taken what it will of them (one user's share): every stalled request
    // was either refused (its answer is on its socket) or holds its whole body, waiting for
    // the rest. (How many fit depends on how their chunks interleaved: a request refused
    // part-way gives its bytes back.)
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut answered = vec![false; stalled.len()];
    let mut last = None;
    loop {
        for (c, done) in stalled.iter().zip(answered.iter_mut()) {
            let mut buf = [0u8; 512];
            if matches!(c.try_read(&mut buf), Ok(n) if n > 0) {
                *done = true;
            }
        }
        let text = call_as(&s, admin, Method::GET, "/metrics", None)
            .await
            .text()
            .await
            .unwrap();
        let held = budget_in(&text);
        let waiting = answered.iter().filter(|a| !**a).count() as u64;
        let settled = held > 0 && held == waiting * 1_048_000;
        if settled && last == Some(held) {
            assert!(held <= 8 << 20, "one user holds {held} bytes");
            break;
        }
        last = settled.then_some(held);
        assert!(
            Instant::now() < deadline,
            "the stalled bodies did not settle: {held} bytes held, {waiting} requests unanswered"
        );
        poll_pause().await;
    }
    let r = s
        .http
        .post(s.url("/v1/topics/t/produce"))
        .basic_auth(admin.0, Some(admin.1))
        .body(vec![b'p'; 1 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED, "a producer was starved");
    drop(stalled);
}

/// Found by a black-box review: hex was read with `from_str_radix`, which takes a leading
/// `+`. A `%+1` in a query string decoded to byte 1 and a `Narad-Topic-Id` of `+` and 15 hex
/// digits named an incarnation. Both are malformed: a 400 naming what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hex_with_a_sign_is_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "hx", "partitions": 1})).await;
    let r = s.produce("hx", "?key=%+1", "x").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "invalid_query", "{body}");
    // the incarnation a batch reply names is accepted back; with a sign in front it is not
    let batch = json!({"messages": [{"payload": "a"}]});
    let r = s.post_json("/v1/topics/hx/produce/batch", &batch).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.headers()["narad-topic-id"].to_str().unwrap().to_owned();
    let send = async |id: &str| {
        s.http
            .post(s.url("/v1/topics/hx/produce/batch"))
            .header("narad-topic-id", id)
            .json(&batch)
            .send()
            .await
            .unwrap()
    };
    assert_eq!(send(&id).await.status(), StatusCode::ACCEPTED);
    // (before the fix: the same incarnation if its first digit is 0, else topic_replaced)
    let signed = format!("+{}", &id[1..]);
    let r = send(&signed).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "invalid_request", "{body}");
}

/// A damaged record is a `500 storage_failed` that names the segment file and the position,
/// but under `<data-dir>`: the server's absolute path goes to its log, not to clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_error_names_the_file_not_the_host_path() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("NARAD_SEGMENT_MAX_BYTES", "4096"),
        ("NARAD_TAIL_CACHE_BYTES", "0"),
    ];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "dmg", "partitions": 1}))
        .await;
    for i in 0..40 {
        let r = s
            .produce("dmg", "", format!("{i:03}-{}", "p".repeat(200)))
            .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    // flip a byte inside the first frame of the first (sealed) segment
    let data = dir.path().join("data");
    let mut logs: Vec<_> = walk(&data)
        .into_iter()
        .filter(|p| {
            p.extension().is_some_and(|x| x == "log") && p.to_string_lossy().contains("dmg")
        })
        .collect();
    logs.sort();
    assert!(logs.len() >= 2, "segments rolled: {logs:?}");
    let mut bytes = std::fs::read(&logs[0]).unwrap();
    bytes[40] ^= 0x01;
    std::fs::write(&logs[0], &bytes).unwrap();
    let r = s.get("/v1/topics/dmg/consume").await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "storage_failed", "{body}");
    let msg = body["error"].as_str().unwrap();
    let host = data.to_str().unwrap();
    assert!(!msg.contains(host), "{msg}");
    assert!(msg.contains("<data-dir>/topics/"), "{msg}");
    assert!(msg.contains(".log"), "{msg}");
    // the server's log has the whole path
    assert!(s.log().contains(host), "{}", s.log());
}
