//! Topic roles between clusters, driven through the API as a link and an admin would: a
//! mirror takes only its link's batches at its epoch, refuses produces and leases, a promote
//! fences the old source but still takes its tail, and readers parked on a topic that
//! becomes a mirror are answered at once.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::remotes::{MIRROR_PW, ROOT_PW, target};
use crate::support::{Server, call_as, expect_error};

const ROOT: (&str, &str) = ("admin", ROOT_PW);
const MIRROR: (&str, &str) = ("mirror", MIRROR_PW);
/// The source cluster and topic the test's link claims to come from.
const SRC: &str = "00000000000000c1/00000000000000a1";

async fn body(r: reqwest::Response, status: StatusCode) -> Value {
    let got = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(got, status, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// A link's batch of `n` records with origins, as `who`, carrying `link` (if any).
async fn link_batch(
    s: &Server,
    who: (&str, &str),
    link: Option<&str>,
    n: u64,
) -> reqwest::Response {
    let messages: Vec<Value> = (0..n)
        .map(
            |i| json!({"payload": {"seq": i}, "headers": {"narad-origin": format!("{SRC}/0/{i}")}}),
        )
        .collect();
    let mut r = s
        .http
        .request(Method::POST, s.url("/v1/topics/orders/produce/batch"))
        .basic_auth(who.0, Some(who.1))
        .json(&json!({ "messages": messages }));
    if let Some(l) = link {
        r = r.header("narad-link", l);
    }
    r.send().await.unwrap()
}

async fn mirror(s: &Server, cluster: &str, epoch: u64) -> reqwest::Response {
    call_as(
        s,
        MIRROR,
        Method::POST,
        "/v1/topics/orders/mirror",
        Some(
            json!({"source_cluster": cluster, "source_topic": "00000000000000a1", "epoch": epoch}),
        ),
    )
    .await
}

fn late_records(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("narad_mirror_late_records_total{topic=\"orders\"} "))
        .map(|v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_takes_only_its_links_batches_and_a_promote_fences_the_old_source() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _) = target(dir.path()).await;
    // a reader parked on the primary is answered as soon as the topic becomes a mirror
    let parked = {
        let (http, url) = (b.http.clone(), b.url("/v1/topics/orders/consume?wait=20"));
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            let r = http
                .get(url)
                .basic_auth(ROOT.0, Some(ROOT.1))
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap(), t.elapsed())
        })
    };
    crate::remotes::until("the reader is parked", async || {
        let m = call_as(&b, ROOT, Method::GET, "/metrics", None)
            .await
            .text()
            .await
            .unwrap();
        m.contains("narad_consume_waiters{topic=\"orders\"} 1")
    })
    .await;
    let v = body(mirror(&b, "00000000000000c1", 3).await, StatusCode::OK).await;
    assert_eq!(v["failover"]["role"], "mirror", "{v}");
    assert_eq!(v["failover"]["epoch"], 3);
    assert_eq!(v["failover"]["mirror_of"]["cluster"], "00000000000000c1");
    assert_eq!(v["changed"], true);
    let (status, text, took) = parked.await.unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(text.contains("mirror_read_only"), "{text}");
    assert!(took.as_secs() < 10, "the parked reader waited {took:?}");
    // a planned switchover with no source link running: said within seconds, not at the
    // timeout (60 s by default), and nothing changes
    let t = std::time::Instant::now();
    let r = call_as(
        &b,
        ROOT,
        Method::POST,
        "/v1/topics/orders/promote?wait_drained=true",
        None,
    )
    .await;
    let v = body(r, StatusCode::CONFLICT).await;
    assert_eq!(v["code"], "not_drained", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("heard nothing from its source"),
        "{v}"
    );
    assert!(
        t.elapsed().as_secs() < 20,
        "answered after {:?}",
        t.elapsed()
    );
    // a dry run changes nothing; an epoch past the largest is refused
    let r = call_as(
        &b,
        MIRROR,
        Method::POST,
        "/v1/topics/orders/mirror",
        Some(json!({"source_cluster": "00000000000000c1", "source_topic": "00000000000000a1", "epoch": 4, "dry_run": true})),
    )
    .await;
    assert_eq!(body(r, StatusCode::OK).await["changed"], false);
    let r = call_as(
        &b,
        MIRROR,
        Method::POST,
        "/v1/topics/orders/mirror",
        Some(
            json!({"source_cluster": "00000000000000c1", "source_topic": "00000000000000a1", "epoch": u64::MAX}),
        ),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_field").await;
    // asked again: unchanged; another source: refused
    let v = body(mirror(&b, "00000000000000c1", 3).await, StatusCode::OK).await;
    assert_eq!(v["changed"], false);
    expect_error(
        mirror(&b, "00000000000000c2", 9).await,
        StatusCode::CONFLICT,
        "not_your_mirror",
    )
    .await;
    // plain produces and leases are refused; the link's batches at its epoch are taken
    let r = call_as(
        &b,
        ROOT,
        Method::POST,
        "/v1/topics/orders/produce/batch",
        Some(json!({"messages": [{"payload": "x"}]})),
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "mirror_read_only").await;
    let r = call_as(&b, ROOT, Method::GET, "/v1/topics/orders/consume", None).await;
    expect_error(r, StatusCode::CONFLICT, "mirror_read_only").await;
    let link = format!("{SRC}/3");
    // progress that claims more than the mirror holds is not believed beyond what it holds
    // (else these records, when they come, would be settled unprocessed)
    let r = b
        .http
        .post(b.url("/v1/topics/orders/progress"))
        .basic_auth(MIRROR.0, Some(MIRROR.1))
        .header("narad-link", link.clone())
        .json(&json!({"partition": 0, "frontier": 1_000_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let v = body(
        link_batch(&b, MIRROR, Some(&link), 5).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(v["accepted"], 5);
    // an older epoch, another source, a malformed header, a user without replicate
    let r = link_batch(&b, MIRROR, Some(&format!("{SRC}/2")), 1).await;
    let v = body(r, StatusCode::CONFLICT).await;
    assert_eq!(v["code"], "fenced", "{v}");
    assert_eq!(v["role"]["epoch"], 3, "{v}");
    let r = link_batch(&b, MIRROR, Some("00000000000000c2/00000000000000a1/3"), 1).await;
    expect_error(r, StatusCode::CONFLICT, "not_your_mirror").await;
    for bad in [
        "c1/a1/3",
        "00000000000000c1/00000000000000a1/-1",
        &format!("{SRC}/3/late"),
        &format!("{SRC}/18446744073709551615"),
    ] {
        let r = link_batch(&b, MIRROR, Some(bad), 1).await;
        expect_error(r, StatusCode::BAD_REQUEST, "invalid_headers").await;
    }
    let r = call_as(
        &b,
        ROOT,
        Method::POST,
        "/v1/users",
        Some(
            json!({"username": "writer", "password": "the writer's password", "grants": [
            {"action": "produce", "patterns": ["orders"]}]}),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = b
        .http
        .post(b.url("/v1/topics/orders/produce/batch"))
        .basic_auth("writer", Some("the writer's password"))
        .header("narad-link", &link)
        .json(&json!({"messages": [{"payload": "x"}]}))
        .send()
        .await
        .unwrap();
    expect_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    // the header twice, or on a single produce: refused
    let r = b
        .http
        .post(b.url("/v1/topics/orders/produce/batch"))
        .basic_auth(MIRROR.0, Some(MIRROR.1))
        .header("narad-link", &link)
        .header("narad-link", "00000000000000c2/00000000000000a1/3")
        .json(&json!({"messages": [{"payload": "x"}]}))
        .send()
        .await
        .unwrap();
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_headers").await;
    let r = b
        .http
        .post(b.url("/v1/topics/orders/produce"))
        .basic_auth(MIRROR.0, Some(MIRROR.1))
        .header("narad-link", &link)
        .body("x")
        .send()
        .await
        .unwrap();
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_headers").await;
    // the source's consumers acked origins 0, 1 and 3: those are settled on the mirror
    let progress = |link: String, body: Value| {
        b.http
            .post(b.url("/v1/topics/orders/progress"))
            .basic_auth(MIRROR.0, Some(MIRROR.1))
            .header("narad-link", link)
            .json(&body)
            .send()
    };
    let r = progress(
        link.clone(),
        // (and records that came from elsewhere are never "returned": only a topic's own)
        json!({"partition": 0, "frontier": 2, "acked": [[3, 4]], "returned": [[0, 0, 100], [1, 0, 100]]}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{:?}", r.text().await);
    let r = progress(
        link.clone(),
        json!({"partition": 0, "frontier": 2, "acked": [[1, 4]]}),
    )
    .await
    .unwrap();
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_field").await;
    let r = progress(format!("{SRC}/2"), json!({"partition": 0, "frontier": 5}))
        .await
        .unwrap();
    assert_eq!(body(r, StatusCode::CONFLICT).await["code"], "fenced");
    // only an admin promotes; a promote fences the link's epoch but takes its tail
    let r = call_as(&b, MIRROR, Method::POST, "/v1/topics/orders/promote", None).await;
    expect_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    let v = body(
        call_as(&b, ROOT, Method::POST, "/v1/topics/orders/promote", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(v["failover"]["role"], "primary", "{v}");
    assert_eq!(v["failover"]["epoch"], 4);
    assert_eq!(v["failover"]["promoted_from"]["topic"], "00000000000000a1");
    let v = body(
        link_batch(&b, MIRROR, Some(&link), 1).await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_eq!(v["code"], "fenced", "{v}");
    assert_eq!(
        v["role"]["promoted_from"]["cluster"], "00000000000000c1",
        "{v}"
    );
    let v = body(
        mirror(&b, "00000000000000c1", 3).await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_eq!(v["code"], "fenced", "{v}");
    let metrics = |b: &Server| {
        let (http, url) = (b.http.clone(), b.url("/metrics"));
        async move {
            http.get(url)
                .basic_auth(ROOT.0, Some(ROOT.1))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    assert_eq!(late_records(&metrics(&b).await).unwrap_or(0), 0);
    let v = body(
        link_batch(&b, MIRROR, Some(&format!("{link}/tail")), 7).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(v["accepted"], 7);
    let m = metrics(&b).await;
    assert_eq!(late_records(&m), Some(7), "late records counted");
    assert!(m.contains("narad_topic_epoch{topic=\"orders\"} 4"));
    assert!(m.contains("narad_topic_read_only{topic=\"orders\"} 0"));
    // the primary takes produces and leases again: the mirrored records are in its queue
    let mut leased = 0;
    loop {
        let r = call_as(
            &b,
            ROOT,
            Method::GET,
            "/v1/topics/orders/consume?max=100",
            None,
        )
        .await;
        if r.status() == StatusCode::NO_CONTENT {
            break;
        }
        leased += body(r, StatusCode::OK).await["messages"]
            .as_array()
            .unwrap()
            .len();
    }
    // 5 mirrored (3 settled by the progress) and the 7 of the tail
    assert_eq!(leased, 9);
    assert!(
        m.contains("narad_mirror_settled_records_total{topic=\"orders\"} 3"),
        "{m}"
    );
    // a promoted primary follows no other source; a fan-out child mirrors nothing
    expect_error(
        mirror(&b, "00000000000000c2", 9).await,
        StatusCode::CONFLICT,
        "role_conflict",
    )
    .await;
    for body in [
        json!({"name": "parent", "partitions": 1}),
        json!({"name": "kid", "partitions": 1, "parent": "parent"}),
    ] {
        let r = call_as(&b, ROOT, Method::POST, "/v1/topics", Some(body)).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
    }
    let r = call_as(
        &b,
        ROOT,
        Method::POST,
        "/v1/topics/kid/mirror",
        Some(json!({"source_cluster": "00000000000000c1", "source_topic": "00000000000000a1", "epoch": 0})),
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "role_conflict").await;
    // demote: read-only again; a demoted topic is promoted only with force
    let v = body(
        call_as(&b, ROOT, Method::POST, "/v1/topics/orders/demote", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(v["failover"]["role"], "demoted");
    let r = call_as(&b, ROOT, Method::POST, "/v1/topics/orders/promote", None).await;
    expect_error(r, StatusCode::CONFLICT, "role_conflict").await;
    let v = body(
        call_as(
            &b,
            ROOT,
            Method::POST,
            "/v1/topics/orders/promote?force=true",
            None,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(v["failover"]["epoch"], 5);
    // the role survives a crash
    let mut b = b;
    b.kill9();
    b.restart().await;
    let v = body(
        call_as(&b, ROOT, Method::GET, "/v1/topics/orders", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(v["failover"]["role"], "primary", "{v}");
    assert_eq!(v["failover"]["epoch"], 5, "{v}");
}
