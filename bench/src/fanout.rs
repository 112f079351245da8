//! `narad-bench fanout`: the fan-out copy rate with N children and what adding children costs
//! producers. For each N: a fresh parent (4 partitions) with N children (2 partitions each),
//! then `count` messages produced in batches by `connections` producers; the produce rate is
//! measured while the children copy, and the copy rate until every child holds every record.

// A load generator paces producers, waits for consumers and lets readers park in real time
// against a real broker process: nothing here runs on a test clock, so the raw sleeps that
// clippy.toml bans elsewhere are what this module is for.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use narad_wire::{CreateTopic, TopicDetails};
use serde::Serialize;

use crate::narad::{Http, batch_body, json_body};
use crate::target::{BenchError, Result};
use crate::workload::payload;

#[derive(Debug, Clone, Serialize)]
pub struct FanoutResult {
    pub children: usize,
    pub messages: u64,
    pub produce_msgs_per_s: f64,
    /// Records written into children per second, from the first produce until every child
    /// holds every record.
    pub copy_records_per_s: f64,
    /// Time from the last produce's 2xx until the children caught up.
    pub catch_up_s: f64,
}

async fn total(http: &mut Http, topic: &str) -> Result<u64> {
    let body = http
        .expect_2xx(Method::GET, &format!("/v1/topics/{topic}"), Bytes::new())
        .await?;
    let t: TopicDetails =
        serde_json::from_slice(&body).map_err(|e| BenchError::new("bad response", e))?;
    Ok(t.partition_stats.iter().map(|p| p.next_offset).sum())
}

async fn recreate(
    http: &mut Http,
    name: &str,
    partitions: u32,
    parent: Option<&str>,
) -> Result<()> {
    let _ = http
        .request(Method::DELETE, &format!("/v1/topics/{name}"), Bytes::new())
        .await?;
    let mut body = CreateTopic::new(name);
    body.settings.partitions = Some(partitions);
    body.parent = parent.map(str::to_owned);
    http.expect_2xx(Method::POST, "/v1/topics", json_body(&body))
        .await
        .map(drop)
}

pub async fn run(
    addr: &str,
    children: usize,
    count: u64,
    connections: usize,
    batch: usize,
    size: usize,
) -> Result<FanoutResult> {
    let mut admin = Http::connect(addr).await?;
    let parent = "bench-fanout";
    // children first (a re-created parent would otherwise detach nothing), then the parent
    for i in 0..64 {
        let _ = admin
            .request(
                Method::DELETE,
                &format!("/v1/topics/{parent}-c{i}"),
                Bytes::new(),
            )
            .await?;
    }
    recreate(&mut admin, parent, 4, None).await?;
    for i in 0..children {
        recreate(&mut admin, &format!("{parent}-c{i}"), 2, Some(parent)).await?;
    }
    let t0 = Instant::now();
    let remaining = Arc::new(AtomicU64::new(count.div_ceil(batch as u64)));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (remaining, addr) = (remaining.clone(), addr.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut http = Http::connect(&addr).await?;
            let path = format!("/v1/topics/{parent}/produce/batch");
            let mut sent = 0u64;
            while remaining
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
                .is_ok()
            {
                let ps: Vec<Bytes> = (0..batch as u64).map(|i| payload(t0, i, size)).collect();
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
    let produce_time = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    for i in 0..children {
        let child = format!("{parent}-c{i}");
        while total(&mut admin, &child).await? < produced {
            if Instant::now() > deadline {
                return Err(BenchError::new(
                    "timeout",
                    format!("{child} never caught up"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let all = t0.elapsed();
    Ok(FanoutResult {
        children,
        messages: produced,
        produce_msgs_per_s: produced as f64 / produce_time.as_secs_f64(),
        copy_records_per_s: (produced * children as u64) as f64 / all.as_secs_f64(),
        catch_up_s: (all - produce_time).as_secs_f64(),
    })
}
