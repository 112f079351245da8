//! `narad-bench mirror`: a remote child's mirroring rate and lag (issue 15). Talks to the
//! source only (security on: `NARAD_USER`/`NARAD_PASSWORD`), which must have a remote (the
//! `--remote` name) whose target holds `--remote-topic`; `scripts/bench-mirror` sets both
//! clusters up. For each lane count: a fresh source topic with a remote child of that many
//! lanes, `count` messages produced in batches, the produce rate measured while the child
//! ships, and the mirroring rate until the child's lag is 0. Lane count 0 is the baseline: the
//! same topic without a remote child (the produce rate's cost). Then a steady run: messages at
//! `rate`/s for `seconds`, the child's `lag_seconds` (the age of the oldest record the target
//! has not accepted yet) sampled every 50 ms.

// A load generator paces producers and polls a real broker in real time: nothing here runs
// on a test clock, so the raw sleeps that clippy.toml bans elsewhere are what this is for.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use serde::Serialize;

use crate::narad::{Http, batch_body, json_body};
use crate::target::{BenchError, Result};
use crate::workload::payload;

#[derive(Debug, Clone, Serialize)]
pub struct MirrorResult {
    /// 0: no remote child (the baseline).
    pub lanes: u8,
    pub messages: u64,
    pub payload_bytes: usize,
    pub produce_msgs_per_s: f64,
    /// Records the target accepted per second, from the first produce until the lag was 0.
    pub mirror_msgs_per_s: f64,
    pub mirror_mb_per_s: f64,
    /// Time from the last produce's 2xx until the lag was 0.
    pub catch_up_s: f64,
    /// Messages the consumers on the source acked meanwhile.
    pub acked: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SteadyResult {
    pub lanes: u8,
    pub rate: u64,
    pub seconds: u64,
    pub produced: u64,
    pub lag_p50_ms: f64,
    pub lag_p99_ms: f64,
    pub lag_max_ms: f64,
}

/// What a mirror run needs of the source.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    pub addr: String,
    pub remote: String,
    pub remote_topic: String,
    pub partitions: u32,
}

const TOPIC: &str = "bench-mirror";

/// The source topic, fresh, with a remote child of `lanes` lanes (none for 0) to the remote
/// topic `<remote_topic>-<run>` (a fresh target each run: a target becomes the mirror of the
/// source topic that first shipped to it, and takes no other).
async fn setup(http: &mut Http, cfg: &MirrorConfig, lanes: u8, run: &str) -> Result<()> {
    let _ = http
        .request(
            Method::DELETE,
            &format!("/v1/topics/{TOPIC}?force=true"),
            Bytes::new(),
        )
        .await?;
    http.expect_2xx(
        Method::POST,
        "/v1/topics",
        json_body(&serde_json::json!({"name": TOPIC, "partitions": cfg.partitions})),
    )
    .await?;
    if lanes > 0 {
        http.expect_2xx(
            Method::POST,
            &format!("/v1/topics/{TOPIC}/children"),
            json_body(&serde_json::json!({
                "child": "to-remote", "remote": cfg.remote,
                "remote_topic": format!("{}-{run}", cfg.remote_topic),
                "lanes": lanes, "from": "attach",
            })),
        )
        .await?;
    }
    Ok(())
}

/// The remote child's lag: (records, seconds).
async fn lag(http: &mut Http) -> Result<(u64, f64)> {
    let body = http
        .expect_2xx(
            Method::GET,
            &format!("/v1/topics/{TOPIC}/children"),
            Bytes::new(),
        )
        .await?;
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| BenchError::new("bad response", e))?;
    let c = &v["children"][0];
    Ok((
        c["lag_messages"].as_u64().unwrap_or(0),
        c["remote"]["lag_seconds"].as_f64().unwrap_or(0.0),
    ))
}

async fn produce(
    cfg: &MirrorConfig,
    count: u64,
    connections: usize,
    batch: usize,
    size: usize,
    t0: Instant,
) -> Result<u64> {
    let remaining = Arc::new(AtomicU64::new(count.div_ceil(batch as u64)));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (remaining, addr) = (remaining.clone(), cfg.addr.clone());
        tasks.push(tokio::spawn(async move {
            let mut http = Http::connect(&addr).await?;
            let path = format!("/v1/topics/{TOPIC}/produce/batch");
            let mut sent = 0u64;
            let mut seq = 0u64;
            while remaining
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
                .is_ok()
            {
                let ps: Vec<Bytes> = (0..batch as u64)
                    .map(|i| payload(t0, seq + i, size))
                    .collect();
                seq += batch as u64;
                http.expect_2xx(Method::POST, &path, batch_body(&ps, None))
                    .await?;
                sent += batch as u64;
            }
            Ok::<u64, BenchError>(sent)
        }));
    }
    let mut produced = 0;
    for t in tasks {
        produced += t.await.map_err(|e| BenchError::new("task", e))??;
    }
    Ok(produced)
}

/// `consumers` readers that take and ack the source topic's messages until `stop` (their
/// acks are the consumer progress a remote child ships); how many they acked.
fn spawn_consumers(
    cfg: &MirrorConfig,
    consumers: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Result<u64>>> {
    (0..consumers)
        .map(|_| {
            let (addr, stop) = (cfg.addr.clone(), stop.clone());
            tokio::spawn(async move {
                let mut http = Http::connect(&addr).await?;
                let mut acked = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let msgs =
                        crate::narad::consume(&mut http, TOPIC, 100, Duration::from_millis(200))
                            .await?;
                    let handles: Vec<String> =
                        msgs.into_iter().filter_map(|m| m.receipt_handle).collect();
                    if !handles.is_empty() {
                        crate::narad::ack(&mut http, TOPIC, &handles, crate::narad::Settle::Ack)
                            .await?;
                        acked += handles.len() as u64;
                    }
                }
                Ok(acked)
            })
        })
        .collect()
}

/// Throughput with `lanes` lanes (0: no remote child), with `consumers` readers acking on
/// the source meanwhile (their progress goes with the records).
pub async fn run(
    cfg: &MirrorConfig,
    lanes: u8,
    count: u64,
    connections: usize,
    batch: usize,
    size: usize,
    consumers: usize,
) -> Result<MirrorResult> {
    let mut admin = Http::connect(&cfg.addr).await?;
    setup(&mut admin, cfg, lanes, &lanes.to_string()).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers = spawn_consumers(cfg, consumers, stop.clone());
    let t0 = Instant::now();
    let produced = produce(cfg, count, connections, batch, size, t0).await?;
    let produce_time = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(900);
    if lanes > 0 {
        while lag(&mut admin).await?.0 > 0 {
            if Instant::now() > deadline {
                return Err(BenchError::new(
                    "timeout",
                    "the remote child never caught up",
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let all = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut acked = 0;
    for r in readers {
        acked += r.await.map_err(|e| BenchError::new("task", e))??;
    }
    Ok(MirrorResult {
        acked,
        lanes,
        messages: produced,
        payload_bytes: size,
        produce_msgs_per_s: produced as f64 / produce_time.as_secs_f64(),
        mirror_msgs_per_s: produced as f64 / all.as_secs_f64(),
        mirror_mb_per_s: (produced as f64 * size as f64) / all.as_secs_f64() / 1e6,
        catch_up_s: (all - produce_time).as_secs_f64(),
    })
}

/// Messages at `rate`/s (batches of 50 every 10 ms at 5,000/s) for `seconds`, the lag sampled
/// every 50 ms.
pub async fn steady(
    cfg: &MirrorConfig,
    lanes: u8,
    rate: u64,
    seconds: u64,
    size: usize,
) -> Result<SteadyResult> {
    let mut admin = Http::connect(&cfg.addr).await?;
    setup(&mut admin, cfg, lanes, "steady").await?;
    let t0 = Instant::now();
    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1) as usize;
    let addr = cfg.addr.clone();
    let producer = tokio::spawn(async move {
        let mut http = Http::connect(&addr).await?;
        let path = format!("/v1/topics/{TOPIC}/produce/batch");
        let mut next = Instant::now();
        let mut seq = 0u64;
        while t0.elapsed() < Duration::from_secs(seconds) {
            let ps: Vec<Bytes> = (0..per_tick as u64)
                .map(|i| payload(t0, seq + i, size))
                .collect();
            seq += per_tick as u64;
            http.expect_2xx(Method::POST, &path, batch_body(&ps, None))
                .await?;
            next += tick;
            tokio::time::sleep_until(next.into()).await;
        }
        Ok::<u64, BenchError>(seq)
    });
    let mut samples = Vec::new();
    while !producer.is_finished() {
        // the first second warms up the connections and the gate
        if t0.elapsed() > Duration::from_secs(1) {
            samples.push(lag(&mut admin).await?.1 * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let produced = producer.await.map_err(|e| BenchError::new("task", e))??;
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| {
        samples
            .get(((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    Ok(SteadyResult {
        lanes,
        rate,
        seconds,
        produced,
        lag_p50_ms: at(0.50),
        lag_p99_ms: at(0.99),
        lag_max_ms: samples.last().copied().unwrap_or(0.0),
    })
}
