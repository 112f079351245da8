//! `narad-bench owner-loss`: what producers see while a partition owner is dead or frozen.
//!
//! Starts three members on loopback (security on), makes a topic whose partitions all three
//! own, and runs sequential keyless single-message producers through the two members that
//! stay (several per member, each waiting for its answer before sending the next). Then
//! SIGKILLs the third member (a follower, so no election muddies the figure), measures every
//! produce that starts in the next `window` seconds, restarts it, and does the same with
//! SIGSTOP (a frozen process: a paused VM) and SIGCONT. Figures per fault: produces, errors,
//! p50/p99/max latency, and the slowest produce; then every partition is read back and the
//! duplicates (a produce re-placed after its owner went silent may also have been written
//! there) are counted against the produces answered 202.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use parking_lot::Mutex;
use serde::Serialize;

use crate::cluster::{
    Error, Member, connect, err, get_json, ready, sleep_real, start_cluster, topic, until,
};
use crate::narad::Http;
pub use crate::stats::Latency;
use crate::stats::Stats;

pub struct OwnerLossConfig {
    /// The `narad` binary.
    pub binary: std::path::PathBuf,
    /// Sequential producers through each of the two members that stay.
    pub producers: usize,
    /// How long after each fault produces are measured.
    pub window: Duration,
    /// Where the members keep their data.
    pub dir: std::path::PathBuf,
}

#[derive(Debug, Serialize)]
pub struct FaultFigures {
    /// `SIGKILL` or `SIGSTOP`.
    pub fault: String,
    /// Produces that started within the window after the fault and were answered 202.
    pub latency_ms: Latency,
    /// Produces answered otherwise (status or transport error), by cause.
    pub errors: BTreeMap<String, u64>,
    /// Produces that took more than a second: (ms after the fault it started, ms it took),
    /// the first 20.
    pub over_1s: Vec<(f64, f64)>,
    pub over_1s_count: u64,
}

#[derive(Debug, Serialize)]
pub struct OwnerLossResult {
    /// Before any fault, the same producers (for scale).
    pub steady_ms: Latency,
    pub faults: Vec<FaultFigures>,
    /// Produces answered 202 over the whole run, records read back, and how many of those
    /// were a second copy of a message.
    pub accepted: u64,
    pub read_back: u64,
    pub duplicates: u64,
    /// Messages answered 202 that were not read back (must be 0).
    pub missing: u64,
}

/// What one producer saw: (start, latency, outcome) of each produce.
struct Sample {
    at: Instant,
    took: Duration,
    outcome: Result<(), String>,
}

struct Load {
    samples: Arc<Mutex<Vec<Sample>>>,
    accepted: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addrs: &[String], per_member: usize) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for addr in addrs {
            for _ in 0..per_member {
                let (samples, accepted, stop, next, addr) = (
                    samples.clone(),
                    accepted.clone(),
                    stop.clone(),
                    next.clone(),
                    addr.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let mut h: Option<Http> = None;
                    while !stop.load(Ordering::Relaxed) {
                        if h.is_none() {
                            h = connect(&addr).await.ok();
                        }
                        let Some(http) = h.as_mut() else {
                            sleep_real(Duration::from_millis(10)).await;
                            continue;
                        };
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        let body = Bytes::from(format!(r#"{{"i":{id}}}"#));
                        let at = Instant::now();
                        let r = http
                            .request(Method::POST, "/v1/topics/bench-loss/produce", body)
                            .await;
                        let took = at.elapsed();
                        let outcome = match r {
                            Ok((StatusCode::ACCEPTED, _)) => {
                                accepted.lock().push(id);
                                Ok(())
                            }
                            Ok((st, _)) => Err(format!("http {}", st.as_u16())),
                            Err(e) => {
                                h = None;
                                Err(format!("transport: {e}"))
                            }
                        };
                        samples.lock().push(Sample { at, took, outcome });
                    }
                }));
            }
        }
        Self {
            samples,
            accepted,
            stop,
            tasks,
        }
    }

    /// Latency and errors of the produces that started in `[from, to)`.
    fn figures(&self, from: Instant, to: Instant) -> (Latency, BTreeMap<String, u64>) {
        let mut s = Stats::default();
        for x in self
            .samples
            .lock()
            .iter()
            .filter(|x| x.at >= from && x.at < to)
        {
            match &x.outcome {
                Ok(()) => s.ok(x.took, 1, 0),
                Err(e) => s.error(e.clone()),
            }
        }
        let errors = s.errors.clone();
        (s.summary(to - from).latency_ms, errors)
    }

    async fn finish(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        std::mem::take(&mut *self.accepted.lock())
    }
}

fn signal(m: &Member, sig: &str) -> Result<(), Error> {
    let pid = m
        .child
        .as_ref()
        .ok_or_else(|| err("the member is not running"))?
        .id();
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()?
        .success();
    ok.then_some(())
        .ok_or_else(|| err(format!("kill -{sig} {pid} failed")))
}

pub async fn run(cfg: OwnerLossConfig) -> Result<OwnerLossResult, Error> {
    let root_pw = std::env::var("NARAD_PASSWORD")
        .map_err(|_| err("set NARAD_USER=admin and NARAD_PASSWORD (the members' root password)"))?;
    let (mut members, list, secret) =
        start_cluster(&cfg.binary, 3, &cfg.dir, &root_pw, &[]).await?;
    let leader = get_json(&members[0].addr, "/v1/cluster")
        .await
        .and_then(|s| s["leader"].as_u64())
        .ok_or_else(|| err("no leader"))?;
    // the victim: a follower that owns partitions
    let owners = topic(&members, "bench-loss", 6).await?;
    let v = members
        .iter()
        .position(|m| m.id != leader && owners.contains(&m.id))
        .ok_or_else(|| err("no follower owns a partition"))?;
    let addrs: Vec<String> = (0..3)
        .filter(|&i| i != v)
        .map(|i| members[i].addr.clone())
        .collect();
    let load = Load::start(&addrs, cfg.producers);
    let t0 = Instant::now();
    sleep_real(Duration::from_secs(3)).await;
    let (steady_ms, _) = load.figures(t0 + Duration::from_secs(1), Instant::now());
    let mut faults = Vec::new();
    for fault in ["SIGKILL", "SIGSTOP"] {
        let at = Instant::now();
        if fault == "SIGKILL" {
            members[v].kill9();
        } else {
            signal(&members[v], "STOP")?;
        }
        sleep_real(cfg.window).await;
        let (latency_ms, errors) = load.figures(at, at + cfg.window);
        let slow: Vec<(f64, f64)> = load
            .samples
            .lock()
            .iter()
            .filter(|x| x.at >= at && x.at < at + cfg.window && x.took > Duration::from_secs(1))
            .map(|x| {
                let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
                (ms(x.at - at), ms(x.took))
            })
            .collect();
        faults.push(FaultFigures {
            fault: fault.into(),
            latency_ms,
            errors,
            over_1s_count: slow.len() as u64,
            over_1s: slow.into_iter().take(20).collect(),
        });
        if fault == "SIGKILL" {
            members[v]
                .start(&cfg.binary, &list, &secret, &root_pw)
                .await?;
        } else {
            signal(&members[v], "CONT")?;
        }
        let addr = members[v].addr.clone();
        until("the member ready again", 60, async || ready(&addr).await).await?;
        // a while back in service before the next fault
        sleep_real(Duration::from_secs(3)).await;
    }
    let accepted = load.finish().await;
    // every partition read back through one member that stayed
    let mut h = connect(&addrs[0]).await?;
    let mut copies: HashMap<u64, u64> = HashMap::new();
    for p in 0..owners.len() {
        let mut from = 0u64;
        loop {
            let path = format!("/v1/topics/bench-loss/consume?partition={p}&offset={from}&max=100");
            let (st, body) = h
                .request(Method::GET, &path, Bytes::new())
                .await
                .map_err(|e| err(e.to_string()))?;
            if st == StatusCode::NO_CONTENT {
                break;
            }
            if st != StatusCode::OK {
                return Err(err(format!(
                    "reading partition {p} back: {st} {}",
                    String::from_utf8_lossy(&body)
                )));
            }
            let r: serde_json::Value = serde_json::from_slice(&body)?;
            let msgs = r["messages"].as_array().cloned().unwrap_or_default();
            for m in &msgs {
                if let Some(i) = m["payload"]["i"].as_u64() {
                    *copies.entry(i).or_insert(0) += 1;
                }
                from = from.max(m["offset"].as_u64().unwrap_or(0) + 1);
            }
            if msgs.is_empty() {
                break;
            }
        }
    }
    let read_back = copies.values().sum();
    let duplicates = copies.values().map(|c| c - 1).sum();
    let missing = accepted.iter().filter(|i| !copies.contains_key(i)).count() as u64;
    drop(members);
    Ok(OwnerLossResult {
        steady_ms,
        faults,
        accepted: accepted.len() as u64,
        read_back,
        duplicates,
        missing,
    })
}
