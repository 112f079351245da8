//! The lifecycle checker over real runs: a fault-free run must deliver and ack every message
//! exactly once; the soak (sends, batches, delays, nacks, expiring leases, replay reads) must
//! end with nothing lost and no contract violated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use narad_bench::lifecycle::{MsgId, Recorder};
use narad_bench::narad::{self as client, Http};
use narad_bench::soak::{self, SoakConfig, parse_id};
use serde_json::json;

use crate::support::*;

pub fn addr(s: &Server) -> String {
    s.base.trim_start_matches("http://").to_owned()
}

/// Produces `ids` (one request per id, or one batch), recording sends and 2xx answers.
/// Transport errors are tolerated (the outcome is unknown: returns false); any other non-2xx
/// panics.
pub async fn produce_recorded(http: &mut Http, topic: &str, rec: &Recorder, ids: &[MsgId]) -> bool {
    let now = rec.now();
    for &id in ids {
        rec.sent(id, now, Duration::ZERO);
    }
    let res = if let [id] = ids {
        let path = format!("/v1/topics/{topic}/produce?key=k{}", id % 7);
        http.request(Method::POST, &path, Bytes::from(format!("soak:{id}:")))
            .await
    } else {
        let msgs: Vec<_> = ids
            .iter()
            .map(|id| json!({"payload": format!("soak:{id}:"), "payload_encoding": "utf8"}))
            .collect();
        let body = Bytes::from(json!({ "messages": msgs }).to_string());
        http.request(
            Method::POST,
            &format!("/v1/topics/{topic}/produce/batch"),
            body,
        )
        .await
    };
    let status = match res {
        Ok((st, _)) if st.is_success() => Some(st.as_u16()),
        Ok((st, b)) => panic!("produce answered {st}: {}", String::from_utf8_lossy(&b)),
        Err(_) => None,
    };
    rec.produce_outcome(ids, status);
    status.is_some()
}

/// One consume (up to 10, waiting up to `wait`) and a batch ack of everything received,
/// recorded. Returns how many messages came back; transport errors count as none.
pub async fn consume_and_ack(
    http: &mut Http,
    topic: &str,
    rec: &Recorder,
    reader: u32,
    wait: Duration,
) -> usize {
    let req_at = rec.now();
    let Ok(msgs) = client::consume(http, topic, 10, wait).await else {
        return 0;
    };
    let resp_at = rec.now();
    let mut handles = Vec::new();
    for m in &msgs {
        let p = m.payload_str().unwrap_or_default();
        let p = p.as_ref();
        let h = m.receipt_handle.clone().unwrap();
        rec.delivered(
            parse_id(p),
            p,
            reader,
            req_at,
            resp_at,
            m.partition,
            m.offset,
            &h,
        );
        if let Some(id) = parse_id(p) {
            handles.push((id, h));
        }
    }
    if handles.is_empty() {
        return msgs.len();
    }
    let hs: Vec<String> = handles.iter().map(|(_, h)| h.clone()).collect();
    let sent_at = rec.now();
    let res = client::ack(http, topic, &hs, client::Settle::Ack).await;
    rec.settle_outcome(&handles, sent_at, res.as_deref().ok(), true);
    msgs.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_free_run_delivers_and_acks_every_message_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "once", "partitions": 4, "visibility_timeout_ms": 60000}))
        .await;
    let rec = Arc::new(Recorder::new(
        Duration::from_secs(60),
        Duration::from_secs(1),
    ));
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for w in 0..4u64 {
        let (rec, next, a) = (rec.clone(), next.clone(), addr(&s));
        producers.push(tokio::spawn(async move {
            let mut http = Http::connect(&a).await.unwrap();
            for _ in 0..100 {
                let n = if w % 2 == 0 { 1 } else { 10 };
                let first = next.fetch_add(n, Ordering::Relaxed);
                let ids: Vec<MsgId> = (first..first + n).collect();
                produce_recorded(&mut http, "once", &rec, &ids).await;
            }
        }));
    }
    let mut consumers = Vec::new();
    for r in 0..3 {
        let (rec, done, a) = (rec.clone(), done.clone(), addr(&s));
        consumers.push(tokio::spawn(async move {
            let mut http = Http::connect(&a).await.unwrap();
            while !done.load(Ordering::Relaxed) {
                consume_and_ack(&mut http, "once", &rec, r, Duration::from_millis(200)).await;
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while rec.tally().outstanding > 0 {
        assert!(Instant::now() < deadline, "not drained: {:?}", rec.tally());
        poll_pause().await;
    }
    done.store(true, Ordering::Relaxed);
    for c in consumers {
        c.await.unwrap();
    }
    let report = rec.check();
    println!("{report}");
    assert!(report.is_clean(), "{report}");
    let t = report.tally;
    assert_eq!(t.sent, 2200);
    assert_eq!((t.accepted, t.delivered, t.acked), (2200, 2200, 2200));
    assert_eq!(t.duplicates, 0, "no fault, no expiry: exactly once");
}

/// The soak for `NARAD_SOAK_SECS` (default 60 s): what CI runs on every change. Run it for
/// days with `narad-bench soak --duration 3d` against a release broker (docs/benchmarks.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_loses_nothing_and_keeps_the_contract() {
    let secs: u64 = std::env::var("NARAD_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let cfg = SoakConfig {
        addr: addr(&s),
        topic: "soak".into(),
        duration: Duration::from_secs(secs),
        rate: 500.0,
        report_every: Duration::from_secs(10),
        visibility_ms: 2000,
        payload_bytes: 128,
    };
    let report = soak::soak(cfg, |t| println!("{t}")).await.unwrap();
    println!("{report}");
    assert!(report.is_clean(), "{report}");
    let t = report.tally;
    assert!(t.accepted > secs * 300, "the soak barely ran: {t:?}");
    assert_eq!(t.outstanding, 0, "{t:?}");
    assert!(
        t.duplicates > 0,
        "nacks and expired leases must redeliver: {t:?}"
    );
}
