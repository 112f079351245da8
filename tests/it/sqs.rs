//! The SQS-compatible endpoint through real clients (tests/sqs/test_clients.py: boto3 and
//! the AWS CLI, which `.ci/run` installs), and its answers where no client goes.

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::*;

/// Every operation the endpoint serves, through boto3 and the AWS CLI, against a `--dev`
/// broker. Skipped, saying so, when boto3 is not installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_and_the_aws_cli_work_unchanged() {
    let has_boto3 = std::process::Command::new("python3")
        .args(["-c", "import boto3"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_boto3 {
        eprintln!("boto3 not installed: SQS client tests skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/sqs/test_clients.py");
    let base = s.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(base)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "SQS client tests failed:\n{report}");
    // (the suite's own count: it must have run, not skipped everything)
    assert!(report.contains("\nOK"), "{report}");
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

/// With security on, a request is refused in AWS's words (no access keys can be issued yet),
/// before its body is read: never a 5xx, never the native API's error shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_security_on_requests_are_refused_in_awss_words() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_opts(
        dir.path(),
        false,
        &[("NARAD_ADMIN_PASSWORD", "root-password-1")],
        None,
    )
    .await;
    let (status, query, body) = sqs_call(&s, "AmazonSQS.ListQueues", "{}").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(query, "InvalidClientTokenId;Sender");
    assert!(body["__type"].as_str().unwrap().contains('#'), "{body}");
    assert!(body["message"].as_str().unwrap().contains("security"));
    // the native API is unchanged beside it
    let r = s.get("/v1/topics").await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
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
