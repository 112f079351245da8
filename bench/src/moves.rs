//! `narad-bench moves`: what moving partitions costs, measured on real processes.
//!
//! Starts four members on loopback (security on, the planner off so only the moves asked
//! for happen), then measures
//! - move throughput: one partition of `partition_mib` MiB moved to another member, from the
//!   request to the flip seen by every member (MB/s), and the produce latency (single
//!   256-byte keyless messages through every member) during that move against the same
//!   load without a move;
//! - the freeze, as producers see it: a small partition moved back and forth `freezes`
//!   times while a producer pinned to it runs; each move's worst produce latency (the time
//!   its producer waited through the freeze and the flip), p50 and p99 over the moves; and
//!   the sources' own freeze time (the `narad_move_freeze_seconds` mean);
//! - decommission: a member holding `decommission_partitions` partitions drained and removed,
//!   from the request until it is no longer a voter.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;

use crate::cluster::{Error, Member, connect, err, get_json, start_cluster, topic, until};
use crate::narad::Http;
use crate::stats::{Latency, Stats};

pub struct MovesBenchConfig {
    pub binary: PathBuf,
    /// Size of the partition whose move is timed.
    pub partition_mib: u64,
    /// Moves of the small partition for the freeze figures.
    pub freezes: usize,
    /// Partitions the decommissioned member holds.
    pub decommission_partitions: usize,
    pub dir: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct MovesBenchResult {
    pub partition_mib: u64,
    pub move_seconds: f64,
    pub move_mb_per_s: f64,
    /// Single produces through every member, without a move and during the big move.
    pub produce_without_move: Latency,
    pub produce_during_move: Latency,
    /// Produces refused (any non-202) during the big move.
    pub produce_failures_during_move: u64,
    /// Per move of the small partition: the worst latency its pinned producer saw.
    pub freeze_seen_by_producers_ms: Latency,
    /// Produces to the small partition refused while it moved.
    pub freeze_produce_failures: u64,
    /// The sources' freeze (freeze to flip, seen by the targets), mean over every move, ms.
    pub freeze_mean_ms: f64,
    pub decommission_partitions: usize,
    pub decommission_seconds: f64,
}

async fn request(
    h: &mut Http,
    method: Method,
    path: &str,
    body: &str,
) -> Result<(StatusCode, Bytes), Error> {
    h.request(method, path, Bytes::from(body.to_owned()))
        .await
        .map_err(|e| err(e.to_string()))
}

async fn owners(addr: &str, t: &str) -> Option<(Vec<u64>, usize)> {
    let topic = get_json(addr, &format!("/v1/topics/{t}")).await?;
    let moves = get_json(addr, "/v1/cluster/moves").await?;
    Some((
        serde_json::from_value(topic["partition_owners"].clone()).ok()?,
        moves["moves"].as_array()?.len(),
    ))
}

/// Moves partition `p` of `t` to `to` and waits until every member sees the flip.
async fn move_and_wait(
    members: &[Member],
    t: &str,
    p: u32,
    to: u64,
    secs: u64,
) -> Result<Duration, Error> {
    let mut h = connect(&members[0].addr).await?;
    let start = Instant::now();
    let body = format!(r#"{{"topic": "{t}", "partition": {p}, "to": {to}}}"#);
    let (st, b) = request(&mut h, Method::POST, "/v1/cluster/moves", &body).await?;
    if st != StatusCode::ACCEPTED {
        return Err(err(format!("move: {st} {}", String::from_utf8_lossy(&b))));
    }
    until("the move", secs, async || {
        for m in members {
            match owners(&m.addr, t).await {
                Some((o, 0)) if o.get(p as usize) == Some(&to) => {}
                _ => return false,
            }
        }
        true
    })
    .await?;
    Ok(start.elapsed())
}

/// Keyless single produces (256 bytes) through every member until `stop`.
fn load(
    members: &[Member],
    stop: Arc<AtomicBool>,
    path: String,
) -> Vec<tokio::task::JoinHandle<Stats>> {
    members
        .iter()
        .map(|m| {
            let (addr, stop, path) = (m.addr.clone(), stop.clone(), path.clone());
            tokio::spawn(async move {
                let mut s = Stats::default();
                let Ok(mut h) = Http::connect(&addr).await else {
                    s.error("connect");
                    return s;
                };
                let payload = Bytes::from(vec![b'x'; 256]);
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match h.request(Method::POST, &path, payload.clone()).await {
                        Ok((StatusCode::ACCEPTED, _)) => s.ok(t.elapsed(), 1, 256),
                        Ok((st, _)) => s.error(format!("http {}", st.as_u16())),
                        Err(e) => s.error(e.to_string()),
                    }
                }
                s
            })
        })
        .collect()
}

async fn gather(runs: Vec<tokio::task::JoinHandle<Stats>>) -> Stats {
    let mut all = Stats::default();
    for r in runs {
        if let Ok(s) = r.await {
            all.merge(&s);
        }
    }
    all
}

/// The mean of histogram `name` over `members`' `/metrics`, in ms.
async fn mean_ms(members: &[Member], name: &str) -> f64 {
    let (mut sum, mut count) = (0.0, 0.0);
    for m in members {
        let Ok(mut h) = connect(&m.addr).await else {
            continue;
        };
        let Ok((_, body)) = h.request(Method::GET, "/metrics", Bytes::new()).await else {
            continue;
        };
        for line in String::from_utf8_lossy(&body).lines() {
            let v = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            if line.starts_with(&format!("{name}_sum ")) {
                sum += v(line).unwrap_or(0.0);
            } else if line.starts_with(&format!("{name}_count ")) {
                count += v(line).unwrap_or(0.0);
            }
        }
    }
    if count > 0.0 {
        sum / count * 1000.0
    } else {
        0.0
    }
}

pub async fn run(cfg: MovesBenchConfig) -> Result<MovesBenchResult, Error> {
    let root_pw = std::env::var("NARAD_PASSWORD")
        .map_err(|_| err("set NARAD_USER=admin and NARAD_PASSWORD (the members' root password)"))?;
    let (members, _, _) = start_cluster(
        &cfg.binary,
        4,
        &cfg.dir,
        &root_pw,
        &[("NARAD_CLUSTER_AUTO_REBALANCE", "false")],
    )
    .await?;
    // the big partition: partition 0 of `bench-move`, filled with 1 MiB batches
    let owners0 = topic(&members, "bench-move", 4).await?;
    let mut h = connect(&members[(owners0[0] - 1) as usize].addr).await?;
    let one = format!(
        r#"{{"payload": "{}", "payload_encoding": "utf8", "partition": 0}}"#,
        "x".repeat(10 * 1024)
    );
    let batch = format!(r#"{{"messages": [{}]}}"#, vec![one; 100].join(","));
    for _ in 0..cfg.partition_mib {
        let (st, b) = request(
            &mut h,
            Method::POST,
            "/v1/topics/bench-move/produce/batch",
            &batch,
        )
        .await?;
        if st != StatusCode::ACCEPTED {
            return Err(err(format!(
                "filling: {st} {}",
                String::from_utf8_lossy(&b)
            )));
        }
    }
    // produce latency without a move, then during the big move
    let window = Duration::from_secs(10);
    let stop = Arc::new(AtomicBool::new(false));
    let runs = load(
        &members,
        stop.clone(),
        "/v1/topics/bench-move/produce".into(),
    );
    crate::cluster::sleep_real(window).await;
    stop.store(true, Ordering::Relaxed);
    let without = gather(runs).await.summary(window);
    let stop = Arc::new(AtomicBool::new(false));
    let runs = load(
        &members,
        stop.clone(),
        "/v1/topics/bench-move/produce".into(),
    );
    let to = owners0[0] % 4 + 1;
    let took = move_and_wait(&members, "bench-move", 0, to, 3600).await?;
    stop.store(true, Ordering::Relaxed);
    let during = gather(runs).await.summary(took);
    let bytes = (cfg.partition_mib << 20) as f64;
    // the freeze as producers see it: a small partition moved back and forth
    let small = topic(&members, "bench-freeze", 4).await?;
    let (a, b) = (small[0], small[0] % 4 + 1);
    let mut seen = Stats::default();
    let mut freeze_failures = 0;
    for i in 0..cfg.freezes {
        let stop = Arc::new(AtomicBool::new(false));
        let runs = load(
            &members[..1],
            stop.clone(),
            "/v1/topics/bench-freeze/produce?partition=0".into(),
        );
        crate::cluster::sleep_real(Duration::from_millis(200)).await;
        move_and_wait(
            &members,
            "bench-freeze",
            0,
            if i % 2 == 0 { b } else { a },
            120,
        )
        .await?;
        crate::cluster::sleep_real(Duration::from_millis(200)).await;
        stop.store(true, Ordering::Relaxed);
        let s = gather(runs).await;
        freeze_failures += s.errors.values().sum::<u64>();
        let worst = s.summary(Duration::from_secs(1)).latency_ms.max;
        seen.record(Duration::from_secs_f64(worst / 1000.0));
    }
    let freeze_mean_ms = mean_ms(&members, "narad_move_freeze_seconds").await;
    // decommission a member holding `decommission_partitions` partitions (not the leader)
    let n = cfg.decommission_partitions;
    topic(&members, "bench-decom", 4 * n).await?;
    let status = get_json(&members[0].addr, "/v1/cluster")
        .await
        .ok_or_else(|| err("status"))?;
    let leader = status["leader"].as_u64().unwrap_or(0);
    let victim = (1..=4u64).rev().find(|&id| id != leader).unwrap_or(4);
    let held = |s: &serde_json::Value| -> u64 {
        s["members"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["node_id"] == victim)
            .and_then(|m| m["partitions"].as_u64())
            .unwrap_or(0)
    };
    let holding = held(&status);
    let via = members
        .iter()
        .find(|m| m.id != victim)
        .ok_or_else(|| err("no member"))?;
    let mut h = connect(&via.addr).await?;
    let t = Instant::now();
    let (st, body) = request(
        &mut h,
        Method::POST,
        &format!("/v1/cluster/members/{victim}/decommission"),
        "{}",
    )
    .await?;
    if st != StatusCode::ACCEPTED {
        return Err(err(format!(
            "decommission: {st} {}",
            String::from_utf8_lossy(&body)
        )));
    }
    let addr = via.addr.clone();
    until("the member decommissioned", 3600, async || {
        get_json(&addr, "/v1/cluster").await.is_some_and(|s| {
            !s["members"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["node_id"] == victim)
        })
    })
    .await?;
    let decommission_seconds = t.elapsed().as_secs_f64();
    let failures = |l: &crate::stats::Summary| l.errors.values().sum::<u64>();
    Ok(MovesBenchResult {
        partition_mib: cfg.partition_mib,
        move_seconds: took.as_secs_f64(),
        move_mb_per_s: bytes / 1e6 / took.as_secs_f64(),
        produce_failures_during_move: failures(&during),
        produce_without_move: without.latency_ms,
        produce_during_move: during.latency_ms,
        freeze_seen_by_producers_ms: seen.summary(Duration::from_secs(1)).latency_ms,
        freeze_produce_failures: freeze_failures,
        freeze_mean_ms,
        decommission_partitions: holding as usize,
        decommission_seconds,
    })
}
