//! Soak: sends, reads and acks nonstop against one broker, tracking every message in the
//! lifecycle [`Recorder`] before it is sent, and prints a running tally. At the end producers
//! stop, consumers drain the queue, and the whole history is checked.

// A load generator paces producers, waits for consumers and lets readers park in real time
// against a real broker process: nothing here runs on a test clock, so the raw sleeps that
// clippy.toml bans elsewhere are what this module is for.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use narad_wire::{CreateTopic, Messages, ProduceBatch, ProduceMessage, Settle};
use serde::Serialize;

use crate::lifecycle::{MsgId, Recorder, Report, Tally, Violation};
use crate::narad::{self, Http};
use crate::target::{BenchError, Result};

#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// `host:port` of the broker.
    pub addr: String,
    pub topic: String,
    pub duration: Duration,
    /// Total messages per second offered by all producers.
    pub rate: f64,
    pub report_every: Duration,
    pub visibility_ms: u64,
    pub payload_bytes: usize,
}

/// A running or final count, printed as one line (or JSON).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TallyLine {
    pub elapsed_s: u64,
    #[serde(flatten)]
    pub tally: Tally,
    /// Accepted more than a minute ago and still never delivered: lost unless delivered later.
    pub overdue: u64,
    pub replayed: u64,
}

impl std::fmt::Display for TallyLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.tally;
        write!(
            f,
            "[{:>6}s] sent {} accepted {} acked {} outstanding {} overdue {} duplicated {} replayed {}",
            self.elapsed_s,
            t.sent,
            t.accepted,
            t.acked,
            t.outstanding,
            self.overdue,
            t.duplicates,
            self.replayed
        )
    }
}

const OVERDUE: Duration = Duration::from_secs(60);

fn body(id: MsgId, size: usize) -> String {
    let mut s = format!("soak:{id}:");
    if s.len() < size {
        s.extend(std::iter::repeat_n('x', size - s.len()));
    }
    s
}

/// The id a soak payload carries, if it is one.
pub fn parse_id(payload: &str) -> Option<MsgId> {
    payload
        .strip_prefix("soak:")?
        .split(':')
        .next()?
        .parse()
        .ok()
}

struct Shared {
    cfg: SoakConfig,
    rec: Recorder,
    next_id: AtomicU64,
    producing: AtomicBool,
    draining: AtomicBool,
    stop: AtomicBool,
    replayed: AtomicU64,
    replay_errors: parking_lot::Mutex<Vec<Violation>>,
}

impl Shared {
    fn ids(&self, n: u64) -> std::ops::Range<MsgId> {
        let first = self.next_id.fetch_add(n, Ordering::Relaxed);
        first..first + n
    }
}

/// Runs the soak and returns the final report; `on_tally` sees every running tally line.
pub async fn soak(cfg: SoakConfig, mut on_tally: impl FnMut(&TallyLine)) -> Result<Report> {
    let mut admin = Http::connect(&cfg.addr).await?;
    let path = format!("/v1/topics/{}", cfg.topic);
    let _ = admin.request(Method::DELETE, &path, Bytes::new()).await?;
    let mut create = CreateTopic::new(&cfg.topic);
    create.settings.partitions = Some(4);
    create.settings.visibility_timeout_ms = i64::try_from(cfg.visibility_ms).ok();
    create.settings.max_in_flight_per_partition = Some(100_000);
    admin
        .expect_2xx(Method::POST, "/v1/topics", narad::json_body(&create))
        .await?;

    let visibility = Duration::from_millis(cfg.visibility_ms);
    let sh = Arc::new(Shared {
        // acks are persisted every 100 ms; no faults are injected by the soak itself
        rec: Recorder::new(visibility, Duration::from_secs(1)),
        cfg: cfg.clone(),
        next_id: AtomicU64::new(0),
        producing: AtomicBool::new(true),
        draining: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        replayed: AtomicU64::new(0),
        replay_errors: parking_lot::Mutex::default(),
    });
    let mut tasks = Vec::new();
    // 40% single produces (2 workers), 50% batches of 20, 10% delayed batches of 5
    for w in 0..2 {
        tasks.push(tokio::spawn(single_producer(sh.clone(), cfg.rate * 0.2, w)));
    }
    tasks.push(tokio::spawn(batch_producer(
        sh.clone(),
        cfg.rate * 0.5 / 20.0,
        20,
        false,
    )));
    tasks.push(tokio::spawn(batch_producer(
        sh.clone(),
        cfg.rate * 0.1 / 5.0,
        5,
        true,
    )));
    let consumers: Vec<_> = (0..3)
        .map(|r| tokio::spawn(consumer(sh.clone(), r)))
        .collect();
    let replayer = tokio::spawn(replayer(sh.clone()));

    let started = Instant::now();
    let tally = |sh: &Shared| TallyLine {
        elapsed_s: started.elapsed().as_secs(),
        tally: sh.rec.tally(),
        overdue: sh.rec.overdue(OVERDUE),
        replayed: sh.replayed.load(Ordering::Relaxed),
    };
    let mut compacted: Vec<Violation> = Vec::new();
    let mut next_report = started + cfg.report_every;
    let mut next_compact = started + Duration::from_secs(30);
    while started.elapsed() < cfg.duration {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if Instant::now() >= next_report {
            on_tally(&tally(&sh));
            next_report += cfg.report_every;
        }
        if Instant::now() >= next_compact {
            compacted.extend(sh.rec.compact(Duration::from_secs(60)));
            next_compact += Duration::from_secs(30);
        }
    }
    // stop producing, then drain: consumers ack everything from now on
    sh.producing.store(false, Ordering::Relaxed);
    for t in tasks {
        t.await.map_err(|e| BenchError::new("task", e))??;
    }
    sh.draining.store(true, Ordering::Relaxed);
    let drain_deadline = Instant::now() + visibility * 3 + Duration::from_secs(20);
    while sh.rec.tally().outstanding > 0 && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sh.stop.store(true, Ordering::Relaxed);
    for c in consumers {
        c.await.map_err(|e| BenchError::new("task", e))??;
    }
    replayer.await.map_err(|e| BenchError::new("task", e))??;
    on_tally(&tally(&sh));
    let mut report = sh.rec.check();
    let mut extra = compacted;
    extra.extend(sh.replay_errors.lock().drain(..));
    // after the drain nothing may remain unacked: a message delivered once and then dropped
    // by the broker is lost too, even though it was delivered
    extra.extend(
        sh.rec
            .unacked()
            .into_iter()
            .filter(|v| !report.violations.iter().any(|w| w.id == v.id)),
    );
    for v in &extra {
        report.count(v.rule);
    }
    report.violations.extend(extra);
    Ok(report)
}

struct Pace {
    next: Instant,
    interval: Duration,
}

impl Pace {
    fn new(per_second: f64) -> Self {
        Self {
            next: Instant::now(),
            interval: Duration::from_secs_f64(1.0 / per_second.max(0.01)),
        }
    }

    async fn tick(&mut self) {
        // never "catch up" with a burst after a stall: the soak is about correctness
        let now = Instant::now();
        if self.next < now {
            self.next = now;
        }
        tokio::time::sleep_until(self.next.into()).await;
        self.next += self.interval;
    }
}

async fn single_producer(sh: Arc<Shared>, rate: f64, worker: u32) -> Result<()> {
    let mut http = Http::connect(&sh.cfg.addr).await?;
    let mut pace = Pace::new(rate);
    while sh.producing.load(Ordering::Relaxed) {
        pace.tick().await;
        let id = sh.ids(1).start;
        let path = format!(
            "/v1/topics/{}/produce?key=k{}-{}",
            sh.cfg.topic,
            worker,
            id % 16
        );
        sh.rec.sent(id, sh.rec.now(), Duration::ZERO);
        let res = http
            .request(
                Method::POST,
                &path,
                Bytes::from(body(id, sh.cfg.payload_bytes)),
            )
            .await;
        record_produce(&sh, &[id], res);
    }
    Ok(())
}

async fn batch_producer(sh: Arc<Shared>, rate: f64, size: u64, delayed: bool) -> Result<()> {
    let mut http = Http::connect(&sh.cfg.addr).await?;
    let mut pace = Pace::new(rate);
    let path = format!("/v1/topics/{}/produce/batch", sh.cfg.topic);
    while sh.producing.load(Ordering::Relaxed) {
        pace.tick().await;
        let ids: Vec<MsgId> = sh.ids(size).collect();
        let messages = ids
            .iter()
            .map(|&id| {
                let delay = if delayed {
                    [200, 500, 1000][(id % 3) as usize]
                } else {
                    0
                };
                sh.rec.sent(id, sh.rec.now(), Duration::from_millis(delay));
                let mut m = ProduceMessage::text(&body(id, sh.cfg.payload_bytes));
                m.key = Some(format!("k{}", id % 64));
                m.delay_ms = Some(delay);
                m
            })
            .collect();
        let b = narad::json_body(&ProduceBatch { messages });
        let res = http.request(Method::POST, &path, b).await;
        record_produce(&sh, &ids, res);
    }
    Ok(())
}

fn record_produce(sh: &Shared, ids: &[MsgId], res: Result<(StatusCode, Bytes)>) {
    sh.rec
        .produce_outcome(ids, res.ok().map(|(s, _)| s.as_u16()));
}

async fn consumer(sh: Arc<Shared>, reader: u32) -> Result<()> {
    let mut http = Http::connect(&sh.cfg.addr).await?;
    while !sh.stop.load(Ordering::Relaxed) {
        let req_at = sh.rec.now();
        let msgs =
            match narad::consume(&mut http, &sh.cfg.topic, 10, Duration::from_millis(500)).await {
                Ok(m) => m,
                Err(_) => continue,
            };
        let resp_at = sh.rec.now();
        let draining = sh.draining.load(Ordering::Relaxed);
        let (mut acks, mut nacks) = (Vec::new(), Vec::new());
        for m in &msgs {
            let payload = m.payload_str().unwrap_or_default();
            let payload = payload.as_ref();
            let id = parse_id(payload);
            let handle = m.receipt_handle.clone().unwrap_or_default();
            sh.rec.delivered(
                id,
                payload,
                reader,
                req_at,
                resp_at,
                m.partition,
                m.offset,
                &handle,
            );
            let Some(id) = id else { continue };
            let first = m.delivery_count == Some(1);
            if !draining && first && id % 200 == 3 {
                // leave it leased: it must come back after the visibility timeout
            } else if !draining && first && id % 50 == 7 {
                nacks.push((id, handle));
            } else {
                acks.push((id, handle));
            }
        }
        settle(&sh, &mut http, acks, Settle::Ack).await;
        settle(&sh, &mut http, nacks, Settle::Nack).await;
    }
    Ok(())
}

async fn settle(sh: &Shared, http: &mut Http, items: Vec<(MsgId, String)>, how: Settle) {
    if items.is_empty() {
        return;
    }
    let handles: Vec<String> = items.iter().map(|(_, h)| h.clone()).collect();
    let sent_at = sh.rec.now();
    let res = narad::ack(http, &sh.cfg.topic, &handles, how).await;
    sh.rec
        .settle_outcome(&items, sent_at, res.as_deref().ok(), how == Settle::Ack);
}

/// Replays every partition from offset 0 as it grows: offsets must be dense and every payload
/// one the soak sent.
async fn replayer(sh: Arc<Shared>) -> Result<()> {
    let mut http = Http::connect(&sh.cfg.addr).await?;
    let mut next = [0u64; 4];
    while !sh.stop.load(Ordering::Relaxed) {
        let mut idle = true;
        for (p, next) in next.iter_mut().enumerate() {
            let path = format!(
                "/v1/topics/{}/consume?partition={p}&offset={next}&max=100",
                sh.cfg.topic
            );
            let Ok((status, b)) = http.request(Method::GET, &path, Bytes::new()).await else {
                continue;
            };
            if status != StatusCode::OK {
                continue;
            }
            let Ok(msgs) = serde_json::from_slice::<Messages>(&b) else {
                continue;
            };
            idle = false;
            for m in msgs.messages {
                let sent = m
                    .payload_str()
                    .as_deref()
                    .and_then(parse_id)
                    .is_some_and(|id| id < sh.next_id.load(Ordering::Relaxed));
                if m.offset != *next || !sent {
                    sh.replay_errors.lock().push(Violation {
                        rule: crate::lifecycle::Rule::Phantom,
                        id: 0,
                        detail: format!(
                            "replay of partition {p}: expected offset {next}, got offset {} with payload {}",
                            m.offset,
                            m.payload.get().chars().take(40).collect::<String>()
                        ),
                    });
                }
                *next = m.offset + 1;
                sh.replayed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if idle {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}
