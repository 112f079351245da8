//! The SQS-compatible endpoint through real clients (tests/sqs/test_clients.py: boto3 and
//! the AWS CLI, which `.ci/run` installs), and its answers where no client goes.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

/// Whether boto3 is installed; where it is not, says the test is skipped (and fails it
/// when CI requires the SQS clients: `NARAD_REQUIRE_SQS_CLIENTS`).
pub(crate) fn boto3_or_skip(what: &str) -> bool {
    let has = std::process::Command::new("python3")
        .args(["-c", "import boto3"])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        assert!(
            std::env::var_os("NARAD_REQUIRE_SQS_CLIENTS").is_none(),
            "NARAD_REQUIRE_SQS_CLIENTS is set but boto3 is not installed"
        );
        eprintln!("boto3 not installed: {what} skipped");
    }
    has
}

/// Runs `program` on the script `script` (under tests/) with `args`, off the runtime's
/// threads, and fails unless it exits 0 having printed a line `OK` (a unittest run prints
/// its report to stderr, a node script to stdout).
pub(crate) async fn run_client(
    program: &str,
    script: &str,
    args: Vec<String>,
    env: &[(&str, std::ffi::OsString)],
) {
    let path = format!("{}/../tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut cmd = std::process::Command::new(program);
    cmd.arg(path).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // (unittest's last line: `OK`, or `OK (skipped=N)` where a client is not installed)
    let ok = |t: &str| {
        t.lines()
            .any(|l| l.trim() == "OK" || l.trim().starts_with("OK ("))
    };
    assert!(
        out.status.success() && (ok(&stdout) || ok(&stderr)),
        "{script} failed:\n{stdout}\n{stderr}"
    );
}

/// Every operation the endpoint serves, through boto3 and the AWS CLI, against a `--dev`
/// broker. Skipped, saying so, when boto3 is not installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_and_the_aws_cli_work_unchanged() {
    if !boto3_or_skip("the SQS client tests") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    run_client("python3", "sqs/test_clients.py", vec![s.base.clone()], &[]).await;
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

async fn sqs_call(s: &Server, target: &str, body: &str) -> (StatusCode, String, Value) {
    let r = s
        .http
        .post(s.url("/"))
        .header("x-amz-target", target)
        .header("content-type", "application/x-amz-json-1.0")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let query = r
        .headers()
        .get("x-amzn-query-error")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    assert_eq!(
        r.headers()["content-type"],
        "application/x-amz-json-1.0",
        "every SQS answer is AWS JSON"
    );
    (status, query, r.json().await.unwrap())
}

const ROOT_PW: &str = "root-password-1";
const PW: &str = "user-password-1";

async fn narad_as(s: &Server, user: &str, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .env("NARAD_ADDR", &s.base)
        .env("NARAD_USER", user)
        .env("NARAD_PASSWORD", if user == "admin" { ROOT_PW } else { PW })
        .output()
        .await
        .unwrap()
}

/// A request to the endpoint signed (or not) by the crate's own signer, at `at_s`.
async fn signed_call(
    s: &Server,
    key: (&str, &str),
    at_s: i64,
    body: &str,
    tamper: bool,
) -> (StatusCode, String) {
    let host = s.base.trim_start_matches("http://").to_owned();
    let amz = narad_sqs::sigv4::amz_date(at_s);
    let headers: Vec<(&str, &[u8])> = vec![
        ("content-type", b"application/x-amz-json-1.0"),
        ("host", host.as_bytes()),
        ("x-amz-date", amz.as_bytes()),
        ("x-amz-target", b"AmazonSQS.ListQueues"),
    ];
    let auth = narad_sqs::sigv4::sign(
        &narad_sqs::sigv4::Request {
            method: "POST",
            path: "/",
            query: "",
            headers: &headers,
            body: body.as_bytes(),
        },
        key.0,
        key.1,
        "us-east-1",
        &amz,
    );
    let sent = if tamper {
        format!("{body} ")
    } else {
        body.to_owned()
    };
    let r = s
        .http
        .post(s.url("/"))
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-date", &amz)
        .header("x-amz-target", "AmazonSQS.ListQueues")
        .header("authorization", auth)
        .body(sent)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let query = r
        .headers()
        .get("x-amzn-query-error")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, query)
}

/// The key id and secret an access key's creation answered.
fn key_pair(made: &Value) -> (String, String) {
    let field = |k: &str| made[k].as_str().unwrap().to_owned();
    (field("access_key_id"), field("secret_access_key"))
}

/// A signed SendMessage of `size` bytes to `queue` as raw HTTP: its head and its body.
fn signed_send(s: &Server, key: (&str, &str), queue: &str, size: usize) -> (String, Vec<u8>) {
    let host = s.base.trim_start_matches("http://").to_owned();
    let body = json!({
        "QueueUrl": format!("http://{host}/000000000000/{queue}"),
        "MessageBody": "x".repeat(size),
    })
    .to_string()
    .into_bytes();
    let amz = narad_sqs::sigv4::amz_date(wall_clock_ms() / 1000);
    let headers: Vec<(&str, &[u8])> = vec![
        ("content-type", b"application/x-amz-json-1.0"),
        ("host", host.as_bytes()),
        ("x-amz-date", amz.as_bytes()),
        ("x-amz-target", b"AmazonSQS.SendMessage"),
    ];
    let auth = narad_sqs::sigv4::sign(
        &narad_sqs::sigv4::Request {
            method: "POST",
            path: "/",
            query: "",
            headers: &headers,
            body: &body,
        },
        key.0,
        key.1,
        "us-east-1",
        &amz,
    );
    let head = format!(
        "POST / HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/x-amz-json-1.0\r\nx-amz-date: {amz}\r\nx-amz-target: AmazonSQS.SendMessage\r\nauthorization: {auth}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    (head, body)
}

/// With security on, access keys sign requests: made and removed through the CLI and the
/// API, the secret shown once and kept only sealed; boto3 signs with them, and the users'
/// grants decide each operation (tests/sqs/test_signed.py); a signature outside the
/// 15-minute window, over another body, or by a removed key is refused in AWS's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_security_on_access_keys_sign_requests() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_opts(
        dir.path(),
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            (
                "NARAD_CLUSTER_SECRET",
                "the SQS tests' cluster secret, 32+ bytes",
            ),
        ],
        None,
    )
    .await;
    let admin = ("admin", ROOT_PW);
    for (name, grants) in [
        (
            "alice",
            json!([{"action": "create", "patterns": ["sq*"]}, {"action": "produce", "patterns": ["sq*"]}, {"action": "consume", "patterns": ["sq*"]}]),
        ),
        ("bob", json!([{"action": "consume", "patterns": ["sq*"]}])),
    ] {
        let r = call_as(
            &s,
            admin,
            reqwest::Method::POST,
            "/v1/users",
            Some(json!({"username": name, "password": PW, "grants": grants})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    // unsigned: refused before anything else
    let (status, query, _) = sqs_call(&s, "AmazonSQS.ListQueues", "{}").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(query, "MissingAuthenticationToken;Sender");

    // alice makes her own key with the CLI; an admin makes bob's
    let out = narad_as(
        &s,
        "alice",
        &["user", "key", "add", "alice", "--output", "json"],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made: Value = serde_json::from_slice(&out.stdout).unwrap();
    let alice = key_pair(&made);
    let r = call_as(
        &s,
        admin,
        reqwest::Method::POST,
        "/v1/users/bob/access-keys",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let made: Value = r.json().await.unwrap();
    let bob = key_pair(&made);
    // bob may not manage alice's keys; a user holds two at most
    let r = call_as(
        &s,
        ("bob", PW),
        reqwest::Method::GET,
        "/v1/users/alice/access-keys",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = call_as(
        &s,
        admin,
        reqwest::Method::POST,
        "/v1/users/bob/access-keys",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = call_as(
        &s,
        admin,
        reqwest::Method::POST,
        "/v1/users/bob/access-keys",
        None,
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "too_many_access_keys").await;
    let out = narad_as(&s, "alice", &["user", "key", "ls", "alice"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains(&alice.0));

    // the secrets are nowhere in clear
    let users_file = std::fs::read_to_string(s.data_dir.join("users.json")).unwrap();
    for secret in [&alice.1, &bob.1] {
        assert!(!users_file.contains(secret.as_str()));
        assert!(!s.log().contains(secret.as_str()));
    }

    if boto3_or_skip("the signed client tests") {
        let keys = dir.path().join("keys.json");
        std::fs::write(
            &keys,
            json!({"alice": [alice.0, alice.1], "bob": [bob.0, bob.1]}).to_string(),
        )
        .unwrap();
        let args = vec![s.base.clone(), keys.display().to_string()];
        run_client("python3", "sqs/test_signed.py", args, &[]).await;
    }

    // a key removed while a request's body is on its way: the request is refused
    let r = call_as(
        &s,
        ("alice", PW),
        reqwest::Method::POST,
        "/v1/users/alice/access-keys",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let made: Value = r.json().await.unwrap();
    let late = key_pair(&made);
    let (head, body) = signed_send(&s, (&late.0, &late.1), "sq-grants", 20_000);
    let mut conn = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    use tokio::io::AsyncWriteExt as _;
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&body[..1000]).await.unwrap();
    let r = call_as(
        &s,
        ("alice", PW),
        reqwest::Method::DELETE,
        &format!("/v1/users/alice/access-keys/{}", late.0),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    conn.write_all(&body[1000..]).await.unwrap();
    let (status, head, _) = read_http_response(&mut conn).await.expect("an answer");
    assert_eq!(status, 403, "{head}");
    assert!(head.contains("invalidclienttokenid;sender"), "{head}");

    let now = wall_clock_ms() / 1000;
    let key = (alice.0.as_str(), alice.1.as_str());
    assert_eq!(
        signed_call(&s, key, now, "{}", false).await,
        (StatusCode::OK, String::new())
    );
    for skew in [-16 * 60, 16 * 60] {
        assert_eq!(
            signed_call(&s, key, now + skew, "{}", false).await,
            (StatusCode::BAD_REQUEST, "RequestExpired;Sender".to_owned()),
            "{skew}"
        );
    }
    assert_eq!(
        signed_call(&s, key, now, "{}", true).await,
        (
            StatusCode::FORBIDDEN,
            "SignatureDoesNotMatch;Sender".to_owned()
        )
    );
    // removed: refused at once
    let out = narad_as(&s, "alice", &["user", "key", "rm", "alice", &alice.0]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        signed_call(&s, key, now, "{}", false).await,
        (
            StatusCode::FORBIDDEN,
            "InvalidClientTokenId;Sender".to_owned()
        )
    );
    let r = call_as(
        &s,
        ("alice", PW),
        reqwest::Method::DELETE,
        &format!("/v1/users/alice/access-keys/{}", alice.0),
        None,
    )
    .await;
    expect_error(r, StatusCode::NOT_FOUND, "access_key_not_found").await;
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

/// A node without a cluster secret cannot seal a key's secret: it makes none, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_cluster_secret_no_access_key_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_opts(
        dir.path(),
        false,
        &[("NARAD_ADMIN_PASSWORD", ROOT_PW)],
        None,
    )
    .await;
    let r = call_as(
        &s,
        ("admin", ROOT_PW),
        reqwest::Method::POST,
        "/v1/users/admin/access-keys",
        None,
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "credential_unavailable").await;
}

/// SQS requests are counted in the request metrics under their own route, and answers carry
/// a request id and a length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_requests_are_counted_and_framed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let (status, query, body) = sqs_call(&s, "AmazonSQS.GetQueueUrl", r#"{"QueueName":"x"}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(query, "AWS.SimpleQueueService.NonExistentQueue;Sender");
    let (status, _, body) = sqs_call(&s, "AmazonSQS.ListQueues", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, serde_json::json!({}));
    let r = s
        .http
        .post(s.url("/"))
        .header("x-amz-target", "AmazonSQS.ListQueues")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(r.headers().contains_key("x-amzn-requestid"));
    assert_eq!(r.headers()["content-length"], "2");
    let metrics = s.get("/metrics").await.text().await.unwrap();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("narad_http_requests_total{")
                && l.contains("route=\"/\"")
                && l.contains("status=\"200\"")
        })
        .unwrap_or_else(|| panic!("no SQS request counted:\n{metrics}"));
    assert!(line.ends_with(" 2"), "{line}");
}

/// Bodies made from botocore's model of SQS (tests/sqs/fuzz.py: every operation, members
/// present or missing, right and wrong types, extremes) and bodies that are no request at
/// all: every answer a 2xx or an AWS-shaped 4xx, never a 5xx, and the broker stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqs_endpoint_survives_fuzzing() {
    if !boto3_or_skip("SQS fuzzing") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let args = vec![s.base.clone(), "2000".into()];
    run_client("python3", "sqs/fuzz.py", args, &[]).await;
    assert_eq!(s.get("/healthz").await.status(), StatusCode::OK);
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

/// Where the AWS SDK for JavaScript is installed (`.ci/run` puts it there), if it is.
fn js_sdk_modules() -> Option<std::path::PathBuf> {
    let dir = match std::env::var_os("XDG_CACHE_HOME") {
        Some(c) => std::path::PathBuf::from(c),
        None => std::path::PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    }
    .join("narad/sqs-js/node_modules");
    dir.join("@aws-sdk/client-sqs").is_dir().then_some(dir)
}

/// The AWS SDK for JavaScript v3, which checks the MD5s of every body and attribute map it
/// sends and receives (tests/sqs/js/sqs_test.cjs): send, batch, long-poll receive,
/// visibility, delete. Skipped, saying so, where the SDK is not installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_sdk_checks_our_md5s_and_works() {
    let Some(modules) = js_sdk_modules() else {
        assert!(
            std::env::var_os("NARAD_REQUIRE_SQS_CLIENTS").is_none(),
            "NARAD_REQUIRE_SQS_CLIENTS is set but the JavaScript SDK is not installed"
        );
        eprintln!("@aws-sdk/client-sqs not installed: the JavaScript SDK test skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let env = [("NODE_PATH", modules.into_os_string())];
    run_client("node", "sqs/js/sqs_test.cjs", vec![s.base.clone()], &env).await;
    assert!(!s.log().contains("panicked"), "{}", s.log());
}
